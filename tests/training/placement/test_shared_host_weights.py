"""Two processes on one machine share one host copy of the frozen weights (``--shared_host_weights``): with offload
and block swap on the tiny Qwen-Image and Wan, the LoRA is bit for bit the one each process trains with its own copy,
the processes' proportional shares of the copy add up to one copy, and a killed run leaves nothing behind."""

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from diffsynth.core.data.example_dataset import build_example_video_dataset
from diffsynth.testing.tiny_models import (
    FLUX1_DEV_MODEL_ID,
    QWEN_IMAGE_MODEL_ID,
    QWEN_IMAGE_PATTERNS,
    WAN_MODEL_ID,
    WAN_PATTERNS,
)
from diffsynth.core.shared_weights import SEGMENT_PREFIX, memory_files_supported
from tests.training.conftest import lora, max_difference
from tests.launching import accelerate_launch

pytestmark = pytest.mark.skipif(not memory_files_supported(), reason="needs Linux memory files")

REPO = Path(__file__).resolve().parents[3]
RUN = Path(__file__).resolve().with_name("shared_weights_run.py")
PAGE = 4096


def models(model_id, patterns):
    return ["--model_id_with_origin_paths", ",".join(f"{model_id}:{patterns[name]}"
                                                     for name in ("dit", "text_encoder", "vae"))]


QWEN = [*models(QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS), "--lora_base_model", "dit", "--lora_target_modules",
        "to_q,to_k,to_v,img_mlp.net.2", "--lora_rank", "4", "--learning_rate", "1e-3", "--torch_dtype", "float32",
        "--seed", "3", "--max_pixels", "4096", "--use_gradient_checkpointing", "--num_epochs", "1",
        "--dataset_repeat", "2"]
WAN = [*models(WAN_MODEL_ID, WAN_PATTERNS), "--lora_base_model", "dit", "--lora_target_modules", "q,k,v,ffn.0",
       "--lora_rank", "4", "--learning_rate", "1e-3", "--torch_dtype", "float32", "--seed", "5", "--max_pixels",
       "4096", "--num_frames", "5", "--num_epochs", "1", "--dataset_repeat", "2"]
FLUX = ["--model_id_with_origin_paths", ",".join(f"{FLUX1_DEV_MODEL_ID}:{pattern}" for pattern in (
    "flux1-dev.safetensors", "text_encoder/model.safetensors", "text_encoder_2/*.safetensors", "ae.safetensors")),
        "--lora_base_model", "dit", "--lora_target_modules", "a_to_qkv,to_qkv_mlp", "--lora_rank", "4",
        "--learning_rate", "1e-3", "--torch_dtype", "float32", "--seed", "3", "--max_pixels", "4096",
        "--use_gradient_checkpointing", "--num_epochs", "1", "--dataset_repeat", "2"]
QWEN_MODES = {"offload": ["--enable_model_cpu_offload"],
              "offload_fp8": ["--enable_model_cpu_offload", "--fp8_models",
                              f"{QWEN_IMAGE_MODEL_ID}:{QWEN_IMAGE_PATTERNS['dit']}"],
              "block_swap": ["--blocks_to_swap", "1"]}
WAN_MODES = {"offload": ["--enable_model_cpu_offload"], "block_swap": ["--blocks_to_swap", "1"],
             "h2d_streaming": ["--blocks_to_swap", "2", "--block_swap_h2d_only", "--block_swap_ring_size", "1"]}


def launch(family, runs, tiny_root, **popen):
    """``accelerate launch`` of two processes running ``shared_weights_run.py`` over ``runs`` (lists of flags)."""
    flags = [arg for index, run in enumerate(runs) for arg in ([*run] if index == 0 else ["--then", *run])]
    command = [*accelerate_launch(2), str(RUN), family, *flags]
    env = {**os.environ, "DIFFSYNTH_MODEL_BASE_PATH": str(tiny_root), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return command, env


def train_each_mode_shared_and_not(family, modes, data, tiny_root, folder):
    """Every mode twice in one launch, with and without the shared copy; returns ``{(mode, sharing): output}``."""
    outputs = {(mode, sharing): folder / f"{mode}-{sharing}" for mode in modes for sharing in ("auto", "off")}
    runs = [[*data, *{"qwen": QWEN, "wan": WAN, "flux": FLUX}[family], *modes[mode], "--shared_host_weights", sharing,
             "--output_path", str(output)] for (mode, sharing), output in outputs.items()]
    command, env = launch(family, runs, tiny_root)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return outputs, done.stderr


def held(output):
    return [json.loads((output / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.fixture(scope="module")
def qwen_runs(dataset, tiny_root, tmp_path_factory):
    data = ["--dataset_base_path", str(dataset), "--dataset_metadata_path", str(dataset / "metadata.csv")]
    return train_each_mode_shared_and_not("qwen", QWEN_MODES, data, tiny_root, tmp_path_factory.mktemp("qwen"))


@pytest.fixture(scope="module")
def flux_runs(dataset, tiny_root, tmp_path_factory):
    # The single-file transformer: the fused qkv / linear1 tensors are split while they load into the shared copy.
    data = ["--dataset_base_path", str(dataset), "--dataset_metadata_path", str(dataset / "metadata.csv")]
    return train_each_mode_shared_and_not("flux", {"offload": ["--enable_model_cpu_offload"]}, data, tiny_root,
                                          tmp_path_factory.mktemp("flux"))


@pytest.fixture(scope="module")
def wan_runs(tiny_root, tmp_path_factory):
    videos = tmp_path_factory.mktemp("videos")
    build_example_video_dataset(videos, num_videos=2, num_frames=6)
    data = ["--dataset_base_path", str(videos), "--dataset_metadata_path", str(videos / "metadata.csv")]
    return train_each_mode_shared_and_not("wan", WAN_MODES, data, tiny_root, tmp_path_factory.mktemp("wan"))


def assert_one_copy(ranks):
    """Both processes hold the same shared weights, and their proportional shares of the copy add up to one copy
    (its bytes plus alignment, rounded up to pages); nothing else is in a segment."""
    assert ranks[0]["shared"] == ranks[1]["shared"] and ranks[0]["shared_bytes"] > 0
    total, nbytes = sum(rank["segment_pss"] for rank in ranks), ranks[0]["shared_bytes"]
    assert nbytes <= total <= nbytes * 1.02 + 3 * PAGE


@pytest.mark.parametrize("family, mode", [("qwen", "offload"), ("qwen", "offload_fp8"), ("wan", "offload"),
                                          ("flux", "offload")])
def test_offloaded_models_share_one_copy_and_train_the_per_process_lora(request, family, mode):
    outputs, log = request.getfixturevalue(f"{family}_runs")
    shared, own = held(outputs[(mode, "auto")]), held(outputs[(mode, "off")])
    assert max_difference(lora(outputs[(mode, "auto")], "epoch-0"), lora(outputs[(mode, "off")], "epoch-0")) == 0
    # Every frozen weight of every model (the stage-1 text encoder and VAE too) is in the one shared copy.
    models = {"dit", "text_encoder", "vae"} | ({"text_encoder_2"} if family == "flux" else set())
    assert shared[0]["shared"] == shared[0]["frozen"] and {name.split(".")[0] for name in shared[0]["frozen"]} \
        == models
    assert_one_copy(shared)
    assert own[0]["shared"] == [] and own[0]["segment_pss"] == own[1]["segment_pss"] == 0
    assert "once for the 2 processes on this machine" in log


@pytest.mark.parametrize("family, mode", [("wan", "block_swap"), ("wan", "h2d_streaming"), ("qwen", "block_swap")])
def test_block_swap_shares_the_blocks_it_keeps_in_host_memory(request, family, mode):
    outputs, _ = request.getfixturevalue(f"{family}_runs")
    shared = held(outputs[(mode, "auto")])
    assert max_difference(lora(outputs[(mode, "auto")], "epoch-0"), lora(outputs[(mode, "off")], "epoch-0")) == 0
    blocks = {"block_swap": {1}, "h2d_streaming": {0, 1}}[mode]  # of two: the last one; two spread over two
    prefix = {"wan": "dit.blocks.", "qwen": "dit.transformer_blocks."}[family]
    assert shared[0]["shared"] == [name for name in shared[0]["frozen"]
                                   if name.startswith(prefix) and int(name[len(prefix):].split(".")[0]) in blocks]
    assert_one_copy(shared)
    assert held(outputs[(mode, "off")])[0]["shared"] == []


def decisions(run, *flags, processes=2):
    """``{pattern: SharedLoad}`` for the models of a Wan2.2 A14B run that load into the shared copy, or None."""
    from diffsynth.core.loader import parse_model_configs
    from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
    from diffsynth.training.config.parsers import parse_args
    from diffsynth.training.placement.shared_host_weights import shared_loads

    config = parse_args([*run, *flags], video=True)
    configs = parse_model_configs(config.model.model_paths, config.model.model_id_with_origin_paths)
    how = shared_loads(config.placement, config.model, config.training, WanVideoPipeline, configs, processes)
    if how is None:
        return None
    return {config.origin_file_pattern: how(config) for config in configs if how(config) is not None}


def test_what_each_placement_shares(base):
    from diffsynth.testing.tiny_models import WAN22_A14B_PATTERNS, WAN22_T2V_MODEL_ID

    patterns = {name: WAN22_A14B_PATTERNS[name] for name in ("dit", "dit2", "text_encoder")}
    run = ["--model_id_with_origin_paths", ",".join(f"{WAN22_T2V_MODEL_ID}:{p}" for p in patterns.values()),
           "--lora_base_model", "dit", "--lora_target_modules", "q", "--dataset_metadata_path", "m.csv"]
    offload = decisions(run, "--enable_model_cpu_offload", "--fp8_models", f"{WAN22_T2V_MODEL_ID}:{patterns['dit2']}")
    # Every model, both experts included; the fp8 entry's copy is the fp8 one.
    assert sorted(offload) == sorted(patterns.values()) and all(load.select is None for load in offload.values())
    assert [pattern for pattern, load in offload.items() if load.fp8] == [patterns["dit2"]]
    # Block swap swaps dit, not the second expert (it goes to the GPU whole): only dit's host blocks are shared.
    swap = decisions(run, "--blocks_to_swap", "1")
    assert list(swap) == [patterns["dit"]] and swap[patterns["dit"]].select is not None
    # A model trained in full keeps its weights per process.
    assert sorted(decisions(run, "--enable_model_cpu_offload", "--trainable_models", "dit2")) == sorted(
        [patterns["dit"], patterns["text_encoder"]])
    assert decisions(run, "--enable_model_cpu_offload", "--shared_host_weights", "off") is None
    assert decisions(run, "--enable_model_cpu_offload", processes=1) is None
    assert decisions(run) is None  # weights on the GPU: nothing in host memory to share


def processes_with(marker):
    """Ids of the processes whose environment holds ``marker``: the launched run's processes, which all inherit it,
    even one orphaned by the launcher's exit."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue  # gone meanwhile, or not ours to read
    return found


def processes_mapping(name, marker):
    """Ids of the run's processes (``processes_with``) that map a segment whose name starts with ``name``. Only the
    run counts: this test process may still map a segment an earlier test left to the garbage collector."""
    found = []
    for pid in processes_with(marker):
        try:
            if f"/memfd:{SEGMENT_PREFIX}:{name}" in Path(f"/proc/{pid}/maps").read_text():
                found.append(pid)
        except OSError:
            continue  # gone meanwhile
    return found


def rank_of(pid):
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((int(item[5:]) for item in environ if item.startswith(b"RANK=")), None)


def test_a_killed_rank_leaves_no_segment_behind(dataset, tiny_root, tmp_path):
    data = ["--dataset_base_path", str(dataset), "--dataset_metadata_path", str(dataset / "metadata.csv")]
    run = [*data, *QWEN, "--enable_model_cpu_offload", "--num_epochs", "1000", "--output_path", str(tmp_path / "out")]
    command, env = launch("qwen", [run], tiny_root)
    env["DIFFSYNTH_TEST_RUN"] = uuid.uuid4().hex
    marker = f"DIFFSYNTH_TEST_RUN={env['DIFFSYNTH_TEST_RUN']}"
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    log = (tmp_path / "log.txt").open("w")
    launcher = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        ranks = {}
        # Both ranks map the shared copies and training has begun.
        while not (len(ranks) == 2 and "training:" in (tmp_path / "log.txt").read_text()):
            assert launcher.poll() is None and time.monotonic() < deadline, (tmp_path / "log.txt").read_text()[-3000:]
            ranks = {rank_of(pid): pid for pid in processes_mapping("QwenImageTransformer2DModel", marker)}
            ranks.pop(None, None)
            time.sleep(0.5)
        os.kill(ranks[1], signal.SIGKILL)
        launcher.wait(timeout=240)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
        log.close()
        left = processes_with(marker)
        for pid in left:  # torch starts each rank in a session of its own, out of reach of the killpg above
            os.kill(pid, signal.SIGKILL)
    assert launcher.returncode != 0
    assert left == [], "ranks outlived their launcher"
    # No process maps a segment any more, so the kernel has freed them; no file was ever made for one.
    assert processes_mapping("", marker) == []
    assert (set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()) == shm_before
