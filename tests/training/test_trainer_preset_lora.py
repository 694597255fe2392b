"""Differential LoRA (``--preset_lora_path`` / ``--preset_lora_model``): the preset is merged into the frozen base.

The preset is a diffusers-layout LoRA made with peft (another layout than the trainer writes). Training with it
merged must equal training on a base whose weights diffusers merged by hand (``fuse_lora``), one-stage, offloaded and
split alike, and the LoRA trained must load into diffusers on top of that merged base.
"""

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID
from diffsynth.training.config.errors import FlagError
from diffsynth.training.entry import main
from tests.conftest import load_lora_into_diffusers, reset_accelerate_state
from tests.training.conftest import lora, max_difference
from tests.training.test_trainer import COMMON, PATTERN, raw

PRESET_TARGETS = ["to_q", "to_k", "img_mlp.net.2", "txt_mod.1"]  # overlaps the trained targets in part


def diffusers_pipeline(root: Path):
    from diffusers import QwenImagePipeline as DiffusersQwenImagePipeline

    pipe = DiffusersQwenImagePipeline.from_pretrained(str(root / QWEN_IMAGE_MODEL_ID), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def preset(tiny_root, tmp_path_factory) -> Path:
    """A random rank-2 LoRA of the tiny transformer in diffusers' layout (``transformer.`` keys)."""
    from diffusers import QwenImagePipeline as DiffusersQwenImagePipeline
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    transformer = diffusers_pipeline(tiny_root).transformer
    torch.manual_seed(0)
    transformer.add_adapter(LoraConfig(r=2, lora_alpha=2, target_modules=PRESET_TARGETS, init_lora_weights="gaussian"))
    with torch.no_grad():
        for name, param in transformer.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05)
    folder = tmp_path_factory.mktemp("preset")
    DiffusersQwenImagePipeline.save_lora_weights(str(folder), transformer_lora_layers=get_peft_model_state_dict(
        transformer))
    return folder / "pytorch_lora_weights.safetensors"


@pytest.fixture(scope="module")
def merged_root(tiny_root, preset, tmp_path_factory) -> Path:
    """The tiny repos with Qwen-Image's transformer replaced by one diffusers merged the preset into."""
    pipe = diffusers_pipeline(tiny_root)
    pipe.load_lora_weights(str(preset))
    pipe.fuse_lora()
    pipe.unload_lora_weights()
    root = tmp_path_factory.mktemp("merged")
    repo = root / QWEN_IMAGE_MODEL_ID
    repo.mkdir(parents=True)
    for item in (tiny_root / QWEN_IMAGE_MODEL_ID).iterdir():
        if item.name != "transformer":
            (repo / item.name).symlink_to(item, target_is_directory=item.is_dir())
    pipe.transformer.save_pretrained(str(repo / "transformer"))
    return root


def train(dataset, output, *extra, stage=None):
    argv = [*COMMON, "--output_path", str(output), "--num_epochs", "1", "--dataset_repeat", "2", *extra]
    argv = raw(dataset, *argv) if stage != "sft:train" else argv
    try:
        return main(QwenImagePipeline, [*argv, *(["--task", stage] if stage else [])])
    finally:
        reset_accelerate_state()


@pytest.fixture(scope="module")
def with_preset(dataset, preset, tiny_root, tmp_path_factory):
    """The LoRA trained with the preset merged by the trainer (one stage, plain)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        output = tmp_path_factory.mktemp("with_preset") / "out"
        train(dataset, output, "--preset_lora_path", str(preset), "--preset_lora_model", "dit")
    return lora(output, "epoch-0")


def test_training_with_a_preset_equals_training_on_the_base_merged_by_hand(with_preset, dataset, merged_root,
                                                                          tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(merged_root))
    train(dataset, tmp_path / "merged")
    assert max_difference(lora(tmp_path / "merged", "epoch-0"), with_preset) < 1e-5


@pytest.mark.parametrize("mode", ["offload", "split"])
def test_the_offloader_and_stage_two_see_the_merged_weights(with_preset, dataset, preset, tiny_root, tmp_path, mode,
                                                            monkeypatch):
    monkeypatch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
    flags = ["--preset_lora_path", str(preset), "--preset_lora_model", "dit"]
    if mode == "offload":
        train(dataset, tmp_path / "out", *flags, "--enable_model_cpu_offload")
    else:
        # As the reference's split scripts do, both stages get the same flags; stage 1 never runs the transformer.
        train(dataset, tmp_path / "cache", *flags, "--offload_models", PATTERN["dit"], stage="sft:data_process")
        train(None, tmp_path / "out", "--dataset_base_path", str(tmp_path / "cache"), *flags, "--offload_models",
              f"{PATTERN['text_encoder']},{PATTERN['vae']}", stage="sft:train")
    assert max_difference(lora(tmp_path / "out", "epoch-0"), with_preset) < 1e-5


def test_the_lora_loads_into_diffusers_on_the_merged_base(with_preset, merged_root, tmp_path):
    save_file(with_preset, str(tmp_path / "lora.safetensors"))
    pipe = diffusers_pipeline(merged_root)

    def generate():
        return pipe("a red square", height=32, width=32, num_inference_steps=2, true_cfg_scale=1.0,
                    generator=torch.Generator().manual_seed(0), output_type="pt").images

    before = generate()
    warnings = load_lora_into_diffusers(pipe, tmp_path / "lora.safetensors", "differential")
    assert not warnings, warnings
    loaded = [name for name, _ in pipe.transformer.named_parameters() if "lora_A" in name]
    assert len(loaded) == len([key for key in with_preset if "lora_A" in key])
    assert (generate() - before).abs().max() > 1e-4


def test_a_preset_that_does_not_fit_fails_before_the_weights_load(dataset, tmp_path, base, monkeypatch,
                                                                 fresh_accelerate_state):
    from diffsynth.core.loader import loading

    monkeypatch.setattr(loading, "load_model_from_files", lambda *a, **k: pytest.fail("weights were loaded"))
    prefix = "transformer.transformer_blocks.0.attn.to_q"
    save_file({f"{prefix}.lora_A.weight": torch.randn(2, 7), f"{prefix}.lora_B.weight": torch.randn(32, 2)},
              str(tmp_path / "other.safetensors"))
    argv = [*raw(dataset), *COMMON, "--output_path", str(tmp_path / "out"), "--preset_lora_path",
            str(tmp_path / "other.safetensors"), "--preset_lora_model", "dit"]
    with pytest.raises(FlagError, match=r"--preset_lora_path .*other.safetensors cannot be merged into dit "
                                        r"\(QwenImageTransformer2DModel\): .*does not fit"):
        main(QwenImagePipeline, argv)
    with pytest.raises(FlagError, match=r"--preset_lora_model vae2: \['vae2'\] name no loaded model"):
        main(QwenImagePipeline, [*argv[:-1], "vae2"])
    with pytest.raises(SystemExit):  # argparse's usage error: the flags alone conflict
        main(QwenImagePipeline, argv[:-2])
