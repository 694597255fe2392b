"""Loading once per machine: two processes share one copy equal to what each would load, fp8 included, a packed NF4
release's plain tensors only; failures on the loading process reach the others; one process alone loads as usual."""

import gc
import logging
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from diffsynth.core.fp8 import holds_fp8_layers, store_model_in_fp8
from diffsynth.core.loader import ModelLoadError, load_model_from_files
from diffsynth.core.loader.loading import _empty_model
from diffsynth.core.loader.shared_loading import SharedLoad, load_shared, plan_segment
from diffsynth.core.loader.state_dict import plan_keys, read_headers
from diffsynth.testing.tiny_ideogram4 import NF4_ID
from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID, WAN_MODEL_ID
from diffsynth.core.shared_weights import LocalGroup, is_shared_host, memory_files_supported, shared_span
from diffsynth.core.shared_weights.pss import segment_pss
from tests.core.shared_weights.processes import run_ranks

pytestmark = pytest.mark.skipif(not memory_files_supported(), reason="needs Linux memory files")

FOLDERS = {"qwen_dit": (QWEN_IMAGE_MODEL_ID, "transformer"), "wan_dit": (WAN_MODEL_ID, "transformer"),
           "wan_text_encoder": (WAN_MODEL_ID, "text_encoder")}
# Wan's transformer keeps its time embedder and norms in float32 at bf16; UMT5 ties its embedding.
SCENARIOS = [("qwen_dit", False), ("qwen_dit", True), ("wan_dit", False), ("wan_dit", True), ("wan_text_encoder", False)]


def shards(root: str, name: str) -> list[Path]:
    model_id, component = FOLDERS[name]
    return sorted((Path(root) / model_id / component).glob("*.safetensors"))


def identical(first: torch.nn.Module, second: torch.nn.Module) -> bool:
    a, b = first.state_dict(), second.state_dict()
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def every_scenario(root: str) -> dict:
    """Rank body of the one two-process run the tests below share (spawning processes costs seconds)."""
    results = {f"{name}-{fp8}": load_both_ways(root, name, fp8) for name, fp8 in SCENARIOS}
    nf4 = {"nf4": share_packed(root)} if (Path(root) / NF4_ID).is_dir() else {}
    return {**results, **nf4, "one block": share_one_block(root), "failure": fail_while_filling(root)}


def share_packed(root: str) -> dict:
    """Rank body: Ideogram 4's NF4 release shares its plain tensors; its packed 4-bit weights each process loads as
    bitsandbytes layers of its own."""
    import diffsynth.pipelines  # noqa: F401 - registers the families' original-layout readers in this process

    gc.collect()
    file = [Path(root) / NF4_ID / "transformer" / "diffusion_pytorch_model.safetensors"]
    model = load_model_from_files(file, torch.float32, shared=SharedLoad(LocalGroup.of_this_process()))
    packed = {name for name, module in model.named_modules() if type(module).__name__ == "Linear4bit"}
    return {"shared": sorted(n for n, p in model.named_parameters() if is_shared_host(p)),
            "packed_shared": [n for n, p in model.named_parameters() if is_shared_host(p) and
                              n.removesuffix(".weight") in packed], "packed": len(packed),
            "identical": identical(model, load_model_from_files(file, torch.float32))}


def test_a_packed_4bit_release_shares_its_plain_tensors_only(two_ranks):
    if "nf4" not in two_ranks[0]:
        pytest.skip("the tiny NF4 release needs bitsandbytes")
    for rank in (rank["nf4"] for rank in two_ranks):
        assert rank["packed"] > 0 and rank["identical"] and rank["packed_shared"] == []
        assert "layers.0.attention.norm_q.weight" in rank["shared"]  # teeth: the plain ones are shared


@pytest.fixture(scope="module")
def two_ranks(tiny_root, tmp_path_factory) -> list[dict]:
    return run_ranks(every_scenario, 2, tmp_path_factory.mktemp("ranks"), str(tiny_root))


def load_both_ways(root: str, name: str, fp8: bool) -> dict:
    """Rank body: the shared load against this process's own load (converted to fp8 after loading, as the trainer
    converts), and this process's share of the segment."""
    gc.collect()  # the models of the scenario before, held by reference cycles, unmap their segments
    group = LocalGroup.of_this_process()
    warnings = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("transformers").addHandler(handler)
    try:
        shared = load_model_from_files(shards(root, name), torch.bfloat16, shared=SharedLoad(group, fp8=fp8))
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    own = load_model_from_files(shards(root, name), torch.bfloat16)
    if fp8:
        own.requires_grad_(False)
        store_model_in_fp8(own)
    params = dict(shared.named_parameters())
    nbytes = plan_segment(shared, list(params))[1]
    dist.barrier()  # both ranks have read every shared page (comparing) before either measures
    pss = segment_pss(name=type(shared).__name__)
    dist.barrier()  # and neither drops its mapping (returning frees the model) before both have measured
    return {"group": [group.size, group.rank], "identical": identical(shared, own),
            "tied": len(list(shared.parameters())) == len(list(own.parameters())), "warnings": warnings,
            "shared": sorted(n for n, p in params.items() if is_shared_host(p)), "params": sorted(params),
            "frozen": not any(p.requires_grad for p in params.values()),
            "buffers_shared": any(is_shared_host(b) for b in shared.buffers()),
            "fp8_layers": holds_fp8_layers(shared),
            "segment_pss": pss, "nbytes": nbytes}


@pytest.mark.parametrize("name, fp8", SCENARIOS)
def test_two_processes_share_one_copy_equal_to_their_own(two_ranks, name, fp8):
    ranks = [rank[f"{name}-{fp8}"] for rank in two_ranks]
    assert [rank["group"] for rank in ranks] == [[2, 0], [2, 1]]
    for rank in ranks:
        assert rank["identical"] and rank["tied"] and rank["frozen"] and not rank["buffers_shared"]
        assert rank["warnings"] == []  # transformers is told which weights the checkpoint lacked, shared ones not
        assert rank["shared"] == rank["params"]  # tied weights (UMT5's embedding) included
        assert rank["fp8_layers"] == fp8
    # One copy on the machine: the processes' proportional shares of the segment add up to its size (in pages).
    total, nbytes = sum(rank["segment_pss"] for rank in ranks), ranks[0]["nbytes"]
    assert nbytes <= total < nbytes + 8192


def share_one_block(root: str) -> dict:
    """Rank body: only the second block goes into the shared copy; its weights form one span."""
    group = LocalGroup.of_this_process()

    def second_block(model):
        return lambda name: name.startswith("transformer_blocks.1.")

    model = load_model_from_files(shards(root, "qwen_dit"), torch.float32,
                                  shared=SharedLoad(group, select=second_block))
    shared = [name for name, p in model.named_parameters() if is_shared_host(p)]
    block = [p.data for p in model.transformer_blocks[1].parameters()]
    offsets, end = [], 0
    for tensor in block:
        offsets.append(-(-end // 64) * 64)
        end = offsets[-1] + tensor.numel() * tensor.element_size()
    return {"shared": shared, "expected": [f"transformer_blocks.1.{n}" for n, _ in
                                           model.transformer_blocks[1].named_parameters()],
            "span": shared_span(block, offsets, end) is not None}


def test_a_selection_shares_only_its_parameters_laid_out_as_one_span(two_ranks):
    for rank in two_ranks:
        assert rank["one block"]["shared"] == rank["one block"]["expected"] and rank["one block"]["span"]


def fail_while_filling(root: str) -> dict:
    """Rank body: a checkpoint entry whose conversion fails; only the local main process converts."""
    group = LocalGroup.of_this_process()
    files = shards(root, "qwen_dit")
    library, model, _, _ = _empty_model(files, torch.float32)
    plan = plan_keys(read_headers(files), model.state_dict())

    def broken(tensor):
        raise ModelLoadError("img_in.weight cannot be converted")

    plan["img_in.weight"] = type(plan["img_in.weight"])(**{**vars(plan["img_in.weight"]), "convert": broken})
    try:
        load_shared(model, plan, torch.float32, (), SharedLoad(group))
    except ModelLoadError as error:
        return {"raised": str(error)}
    return {"raised": None}


def test_a_failure_while_filling_reaches_every_process(two_ranks):
    ranks = [rank["failure"] for rank in two_ranks]
    assert ranks[0]["raised"] == "img_in.weight cannot be converted"
    assert "local main process failed" in ranks[1]["raised"] and "img_in.weight" in ranks[1]["raised"]


def load_slowly(root: str, seconds: float) -> dict:
    """Rank body: the local main process takes ``seconds`` to convert one tensor while filling."""
    group = LocalGroup.of_this_process()
    files = shards(root, "qwen_dit")
    _, model, _, _ = _empty_model(files, torch.float32)
    plan = plan_keys(read_headers(files), model.state_dict())

    def slow(tensor):
        time.sleep(seconds)
        return tensor

    plan["img_in.weight"] = type(plan["img_in.weight"])(**{**vars(plan["img_in.weight"]), "convert": slow})
    rest = load_shared(model, plan, torch.float32, (), SharedLoad(group))
    return {"shared": "img_in.weight" not in rest}


def test_the_others_wait_for_a_slow_fill_without_a_collective_timing_out(tiny_root, tmp_path):
    ranks = run_ranks(load_slowly, 2, tmp_path, str(tiny_root), 6.0, collective_timeout=3)
    assert [rank["shared"] for rank in ranks] == [True, True]


def test_a_process_alone_loads_its_own_copy(tiny_root, caplog):
    model = load_model_from_files(shards(str(tiny_root), "qwen_dit"), torch.float32,
                                  shared=SharedLoad(LocalGroup()))
    assert not any(is_shared_host(p) for p in model.parameters())
    assert identical(model, load_model_from_files(shards(str(tiny_root), "qwen_dit"), torch.float32))
    assert "shared" not in caplog.text
