"""The reference's Ideogram 4 training commands (``examples/ideogram4/model_training/``: LoRA on the bf16 repackage,
fp8 and NF4 releases, full on the bf16 repackage) stop with one line naming Ideogram 4 before anything loads: no
reader takes its released layouts yet."""

from __future__ import annotations

import pytest

from diffsynth.pipelines.z_image.pipeline import ZImagePipeline
from tests.pipelines.family_helpers import refused_before_loading

DATA = ["--dataset_base_path", "data/d", "--dataset_metadata_path", "data/d/metadata.json", "--max_pixels", "1048576",
        "--data_file_keys", "image"]
FILES = ("transformer/diffusion_pytorch_model.safetensors", "text_encoder/model.safetensors",
         "vae/diffusion_pytorch_model.safetensors")
LORA = ("--lora_base_model", "dit", "--lora_rank", "32", "--lora_target_modules",
        "attention.qkv,attention.o,feed_forward.w1,feed_forward.w2,feed_forward.w3,adaln_modulation")


def models(model_id: str) -> str:
    return ",".join(f"{model_id}:{pattern}" for pattern in FILES)


@pytest.mark.parametrize("model_id, task", [
    ("DiffSynth-Studio/ideogram-4-bf16-repackage", LORA),
    ("ideogram-ai/ideogram-4-fp8", LORA),
    ("ideogram-ai/ideogram-4-nf4", LORA),
    ("DiffSynth-Studio/ideogram-4-bf16-repackage", ("--trainable_models", "dit")),
])
def test_the_reference_commands_are_refused_by_name(model_id, task, workdir, capsys):
    argv = [*DATA, "--model_id_with_origin_paths", models(model_id), "--remove_prefix_in_ckpt", "pipe.dit.",
            "--use_gradient_checkpointing", "--find_unused_parameters", *task]
    line = refused_before_loading(ZImagePipeline, argv, workdir, capsys)
    assert "Ideogram 4 does not train here yet" in line, line
