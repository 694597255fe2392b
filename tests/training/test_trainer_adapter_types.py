"""``--lora_type loha|lokr`` and ``--use_dora`` on the tiny Z-Image: each run's file, merged by this project's loader,
read into a fresh peft model, or loaded by ComfyUI's emulation, changes every weight exactly as peft's own merge of
the trained adapter does; resume and ``--lora_checkpoint`` continue each type, and a file of another type is refused
with the flags that fit it."""

import copy

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from diffsynth.core.data.example_dataset import build_example_dataset
from diffsynth.lora import inspect_lora, load_lora, naming_for, read_lora
from diffsynth.lora.peft_adapters import peft_values
from diffsynth.lora.tools import tool_layers
from diffsynth.pipelines.z_image.pipeline import ZImagePipeline
from diffsynth.testing.tiny_z_image import Z_IMAGE_PATTERNS, Z_IMAGE_TURBO_MODEL_ID
from diffsynth.training.config.errors import FlagError
from diffsynth.training.entry import main
from diffsynth.training.objective.adapter import AdapterSettings, DoraBaseWeights, inject_adapter
from tests.conftest import reset_accelerate_state

TARGETS = "to_q,to_k,to_v,to_out.0,w1,w2,w3"
LAYERS = 7 * 4
# Whole LoKr factors at rank 8 (ComfyUI ignores alpha there), decomposed ones at rank 1; alpha != rank everywhere.
CASES = {
    "loha": ["--lora_type", "loha", "--lora_rank", "4", "--lora_alpha", "2"],
    "lokr_whole": ["--lora_type", "lokr", "--lora_rank", "8", "--lora_alpha", "2"],
    "lokr_decomposed": ["--lora_type", "lokr", "--lora_rank", "1", "--lora_alpha", "2"],
    "dora": ["--use_dora", "--lora_rank", "4", "--lora_alpha", "2"],
}
SETTINGS = {"loha": AdapterSettings("loha", 4, 2.0), "lokr_whole": AdapterSettings("lokr", 8, 2.0),
            "lokr_decomposed": AdapterSettings("lokr", 1, 2.0), "dora": AdapterSettings("lora", 4, 2.0, True)}


def flags(root, output, *extra):
    models = ",".join(f"{Z_IMAGE_TURBO_MODEL_ID}:{Z_IMAGE_PATTERNS[n]}" for n in ("dit", "text_encoder", "vae"))
    return ["--dataset_base_path", str(root / "images"), "--dataset_metadata_path", str(root / "images/metadata.csv"),
            "--model_id_with_origin_paths", models, "--lora_base_model", "dit", "--lora_target_modules", TARGETS,
            "--learning_rate", "1e-2", "--torch_dtype", "float32", "--seed", "1", "--height", "32", "--width", "32",
            "--output_path", str(output), "--num_epochs", "1", *extra]  # fmt: skip


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    folder = tmp_path_factory.mktemp("adapter_types")
    build_example_dataset(folder / "images", num_images=2)
    return folder


@pytest.fixture(scope="module")
def runs(root, tiny_root):
    """Each case trained once: ``{case: (its epoch-0 file, the trained dit with its peft adapter)}``."""
    done = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        for case, extra in CASES.items():
            result = main(ZImagePipeline, flags(root, root / case, *extra))
            reset_accelerate_state()
            done[case] = (root / case / "epoch-0.safetensors", result["module"].pipe.dit)
    return done


def base_dit(tiny_root):
    from diffusers import ZImageTransformer2DModel

    return ZImageTransformer2DModel.from_pretrained(str(tiny_root / Z_IMAGE_TURBO_MODEL_ID / "transformer"))


def peft_deltas(dit) -> dict[str, torch.Tensor]:
    """Each adapted layer's weight change by peft's own merge of the trained adapter."""
    merged, deltas = copy.deepcopy(dit), {}
    for name, module in merged.named_modules():
        if hasattr(module, "merge") and hasattr(module, "get_base_layer"):
            before = module.get_base_layer().weight.detach().clone()
            module.merge()
            deltas[name] = module.get_base_layer().weight.detach() - before
    assert len(deltas) == LAYERS
    return deltas


def largest(first: dict, second: dict) -> float:
    assert first.keys() == second.keys()
    return max(float((first[name] - second[name]).abs().max()) for name in first)


@pytest.mark.parametrize("case", list(CASES))
def test_the_file_changes_the_weights_as_peft_merges_the_trained_adapter(case, runs, tiny_root):
    path, dit = runs[case]
    want = peft_deltas(dit)
    with safe_open(str(path), "pt") as handle:
        metadata = handle.metadata()
    assert metadata["diffsynth.lora.type"] == SETTINGS[case].kind
    assert not list(path.parent.glob("*.diffusers.safetensors"))  # diffusers reads none of these types
    base, merged = base_dit(tiny_root), base_dit(tiny_root)
    assert load_lora(merged, path) == LAYERS
    weights = dict(merged.named_modules())
    loaded = {name: weights[name].weight.detach() - base.get_submodule(name).weight.detach() for name in want}
    assert largest(loaded, want) < 1e-5  # (1) this project's loader
    # (2) the file in a fresh peft-injected model, its names mapped back to peft's
    from peft import set_peft_model_state_dict

    fresh, settings = base_dit(tiny_root), SETTINGS[case]
    inject_adapter(fresh, settings, sorted(want))
    values = peft_values(read_lora(path, list(want), naming_for(fresh)), settings.scale, DoraBaseWeights(fresh),
                         adapter=None)
    assert not set_peft_model_state_dict(fresh, values).unexpected_keys
    assert largest(peft_deltas(fresh), want) < 1e-5
    # (3) ComfyUI's emulation: every key used, the same change
    tensors = load_file(str(path))
    shapes = {name: base.get_submodule(name).weight.shape for name in want}
    applied, unused = tool_layers("ComfyUI", tensors, metadata, "ZImageTransformer2DModel", shapes)
    assert not unused and applied.keys() == want.keys()
    comfy = {name: applied[name].delta(base=base.get_submodule(name).weight.detach()) for name in want}
    assert largest(comfy, want) < 1e-5
    inspection = inspect_lora(path)
    assert not inspection.failing(), inspection.format()
    assert not inspection.result("diffusers").ok and not inspection.result("DiffSynth-Studio").ok


@pytest.mark.parametrize("case", ["loha", "lokr_decomposed", "dora"])
def test_lora_checkpoint_and_resume_continue_each_type(case, runs, root, tiny_root, monkeypatch, tmp_path):
    monkeypatch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
    path, dit = runs[case]
    # --lora_checkpoint starts the adapter at the file's change: a run that takes no optimizer step with it keeps it.
    started = main(ZImagePipeline, flags(root, tmp_path / "from_file", *CASES[case], "--lora_checkpoint", str(path),
                                         "--max_train_steps", "1", "--learning_rate", "1e-12"))
    reset_accelerate_state()
    assert largest(peft_deltas(started["module"].pipe.dit), peft_deltas(dit)) < 1e-4
    # Resume: a run cut after one step continues from its checkpoint to the end.
    output = tmp_path / "resumed"
    assert main(ZImagePipeline, flags(root, output, *CASES[case], "--max_train_steps", "1"))["global_step"] == 1
    reset_accelerate_state()
    resumed = main(ZImagePipeline, flags(root, output, *CASES[case], "--resume_from_checkpoint", "latest"))
    reset_accelerate_state()
    assert resumed["global_step"] == 2 and (output / "epoch-0.safetensors").is_file()
    other = ["--lora_rank", "4"] if case != "loha" else ["--lora_type", "lokr", "--lora_rank", "1"]
    with pytest.raises(FlagError, match="the checkpoint .* was trained with --lora_"):
        main(ZImagePipeline, flags(root, output, *other, "--resume_from_checkpoint", "latest"))
    reset_accelerate_state()


def test_a_file_of_another_type_is_refused_with_the_flags_that_fit_it(runs, root, tiny_root, monkeypatch, tmp_path):
    monkeypatch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
    loha, _ = runs["loha"]
    with pytest.raises(FlagError, match=r"is a LoHa file, and this run trains a LoRA: pass --lora_type loha"):
        main(ZImagePipeline, flags(root, tmp_path / "a", "--lora_checkpoint", str(loha)))
    reset_accelerate_state()
    dora, _ = runs["dora"]
    with pytest.raises(FlagError, match=r"is a DoRA \(a LoRA with --use_dora\) file.*pass --lora_type lora "
                                        r"--use_dora"):
        main(ZImagePipeline, flags(root, tmp_path / "b", "--lora_type", "lokr", "--lora_checkpoint", str(dora)))
    reset_accelerate_state()
    whole, _ = runs["lokr_whole"]
    with pytest.raises(FlagError, match="factors .* another --lora_rank or --lokr_factor"):
        main(ZImagePipeline, flags(root, tmp_path / "c", "--lora_type", "lokr", "--lora_rank", "1",
                                   "--lora_checkpoint", str(whole)))
    reset_accelerate_state()
