"""Each pipeline's default ``--lora_target_modules`` (what an unset flag trains) names layers of its own model."""

import pytest

from diffsynth.core.loader import ModelConfig, load_skeleton
from diffsynth.pipelines.flux.pipeline import FluxPipeline
from diffsynth.pipelines.flux2_klein.pipeline import Flux2KleinPipeline
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
from diffsynth.pipelines.z_image.pipeline import ZImagePipeline
from diffsynth.testing.tiny_flux2 import FLUX2_KLEIN_BASE_4B_MODEL_ID, FLUX2_KLEIN_BASE_9B_MODEL_ID, FLUX2_PATTERNS
from diffsynth.testing.tiny_models import (
    FLUX1_DEV_MODEL_ID,
    FLUX1_PATTERNS,
    QWEN_IMAGE_EDIT_2509_MODEL_ID,
    QWEN_IMAGE_EDIT_PATTERNS,
    QWEN_IMAGE_MODEL_ID,
    QWEN_IMAGE_PATTERNS,
    WAN22_A14B_PATTERNS,
    WAN22_T2V_MODEL_ID,
    WAN_I2V_MODEL_ID,
    WAN_MODEL_ID,
    WAN_ORIGINAL_MODEL_ID,
    WAN_ORIGINAL_PATTERNS,
    WAN_PATTERNS,
)
from diffsynth.testing.tiny_z_image import Z_IMAGE_MODEL_ID, Z_IMAGE_OMNI_MODEL_ID, Z_IMAGE_PATTERNS
from diffsynth.training.config.errors import split_csv
from diffsynth.training.objective.lora_targets import resolve_lora_targets

# One release of each layout a pipeline trains: its denoiser and what its targets must select at the least.
RELEASES = {
    "qwen-image": (QwenImagePipeline, QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS["dit"], "txt_mod.1"),
    "qwen-image-edit-2509": (QwenImagePipeline, QWEN_IMAGE_EDIT_2509_MODEL_ID, QWEN_IMAGE_EDIT_PATTERNS["dit"],
                             "img_mlp.net.2"),
    "wan-diffusers": (WanVideoPipeline, WAN_MODEL_ID, WAN_PATTERNS["dit"], "ffn.net.2"),
    "wan-i2v": (WanVideoPipeline, WAN_I2V_MODEL_ID, WAN_PATTERNS["dit"], "attn1.to_q"),
    "wan-original": (WanVideoPipeline, WAN_ORIGINAL_MODEL_ID, WAN_ORIGINAL_PATTERNS["dit"], "attn2.to_out.0"),
    "wan2.2-a14b": (WanVideoPipeline, WAN22_T2V_MODEL_ID, WAN22_A14B_PATTERNS["dit"], "ffn.net.0.proj"),
    "flux.1-dev": (FluxPipeline, FLUX1_DEV_MODEL_ID, FLUX1_PATTERNS["dit"], "single_transformer_blocks.0.proj_out"),
    "flux.2-klein-4b": (Flux2KleinPipeline, FLUX2_KLEIN_BASE_4B_MODEL_ID, FLUX2_PATTERNS["dit"],
                        "single_transformer_blocks.19.attn.to_out"),
    "flux.2-klein-9b": (Flux2KleinPipeline, FLUX2_KLEIN_BASE_9B_MODEL_ID, FLUX2_PATTERNS["dit"],
                        "single_transformer_blocks.0.attn.to_qkv_mlp_proj"),
    "z-image": (ZImagePipeline, Z_IMAGE_MODEL_ID, Z_IMAGE_PATTERNS["dit"], "feed_forward.w2"),
    "z-image-omni-base": (ZImagePipeline, Z_IMAGE_OMNI_MODEL_ID, Z_IMAGE_PATTERNS["dit"], "attention.to_out.0"),
}


@pytest.mark.parametrize("release", RELEASES)
def test_each_pipelines_default_targets_resolve_on_its_model(base, release):
    pipeline, model_id, pattern, expected = RELEASES[release]
    model = load_skeleton(ModelConfig(model_id=model_id, origin_file_pattern=pattern))
    targets = split_csv(pipeline.default_lora_target_modules)
    # Each entry matches a layer the LoRA files can name (resolve refuses any other), the family's typical one among
    # them.
    resolved = resolve_lora_targets(model, targets, pipeline.lora_target_aliases, "dit")
    trained = [name for name, _ in model.named_modules()
               if any(name == target or name.endswith(f".{target}") for target in resolved)]
    assert any(name.endswith(expected) for name in trained), (expected, resolved)
