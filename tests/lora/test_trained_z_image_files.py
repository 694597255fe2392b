"""The trainer's Z-Image LoRA files in the tools users generate with, at the trained strength (alpha != rank).

diffusers runs for real (``ZImagePipeline.load_lora_weights``); ComfyUI and DiffSynth-Studio are emulated from their
loading code (:mod:`diffsynth.lora.tools`). ComfyUI's NextDiT fuses ``attention.qkv``; its Lumina2 key map takes the
diffusers names the file uses and lands ``to_q``/``to_k``/``to_v`` on slices of it.
"""

import pytest
import torch

from diffsynth.core.data.example_dataset import build_example_dataset
from diffsynth.testing.tiny_z_image import Z_IMAGE_PATTERNS, Z_IMAGE_TURBO_MODEL_ID
from diffsynth.lora import inspect_lora, load_lora
from diffsynth.lora.__main__ import main as lora_cli
from diffsynth.pipelines.z_image.pipeline import ZImagePipeline
from diffsynth.training.entry import main
from tests.conftest import load_lora_into_diffusers, reset_accelerate_state

RANK, ALPHA = 4, 2  # scale 0.5: a file read without its scale is off by 2x


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_root):
    root = tmp_path_factory.mktemp("z_image_lora")
    build_example_dataset(root / "images", num_images=2)
    models = ",".join(f"{Z_IMAGE_TURBO_MODEL_ID}:{Z_IMAGE_PATTERNS[n]}" for n in ("dit", "text_encoder", "vae"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        main(ZImagePipeline, [
            "--dataset_base_path", str(root / "images"), "--dataset_metadata_path", str(root / "images/metadata.csv"),
            "--model_id_with_origin_paths", models, "--lora_base_model", "dit", "--lora_target_modules",
            "to_q,to_k,to_v,to_out.0,w1,w2,w3", "--lora_rank", str(RANK), "--lora_alpha", str(ALPHA),
            "--learning_rate", "1e-2", "--torch_dtype", "float32", "--seed", "1", "--height", "32", "--width", "32",
            "--output_path", str(root / "out"), "--num_epochs", "1", "--remove_prefix_in_ckpt", "pipe.dit.",
        ])  # fmt: skip
        reset_accelerate_state()
    return root / "out" / "epoch-0.safetensors"


def test_every_tool_maps_every_layer_at_strength_one(trained):
    inspection = inspect_lora(trained)
    assert not inspection.failing(), inspection.format()  # diffsynth, diffusers, ComfyUI, DiffSynth-Studio
    for tool in ("diffsynth", "diffusers", "ComfyUI", "DiffSynth-Studio"):
        result = inspection.result(tool)
        assert result.mapped == result.total == 7 * 4 and abs(result.strength - 1.0) < 1e-3, result
    assert not list(trained.parent.glob("*.diffusers.safetensors"))  # the one file serves diffusers too


def test_comfyui_reads_kohya_keys_by_nextdit_names_only(trained, tmp_path):
    converted = tmp_path / "kohya.safetensors"
    assert lora_cli(["convert", str(trained), str(converted), "--to", "kohya"]) == 0
    comfy = inspect_lora(converted).result("ComfyUI")
    # lora_unet_ keys must follow NextDiT's module names (attention.qkv, attention.out), which a kohya file of the
    # diffusers names does not: only the feed-forward layers land. The trainer's own files use the diffusers names.
    assert comfy.mapped == 3 * 4 and comfy.unloaded and all("_attention_to_" in key for key in comfy.unloaded)


def render(pipe):
    return pipe("a red cube", height=32, width=32, num_inference_steps=2, guidance_scale=0.0, output_type="pt",
                generator=torch.Generator().manual_seed(0)).images


def test_diffusers_load_lora_weights_renders_what_the_merged_weights_render(trained, tiny_root):
    from diffusers import ZImagePipeline as DiffusersZImagePipeline

    folder = str(tiny_root / Z_IMAGE_TURBO_MODEL_ID)
    with_lora = DiffusersZImagePipeline.from_pretrained(folder, dtype=torch.float32)
    with_lora.set_progress_bar_config(disable=True)
    base = render(with_lora)
    messages = load_lora_into_diffusers(with_lora, trained, "trained")
    assert not [m for m in messages if "missing" in m or "unexpected" in m or "No LoRA keys" in m], messages
    assert sum(1 for _, module in with_lora.transformer.named_modules() if hasattr(module, "scaling")) == 7 * 4
    merged = DiffusersZImagePipeline.from_pretrained(folder, dtype=torch.float32)
    merged.set_progress_bar_config(disable=True)
    assert load_lora(merged.transformer, trained) == 7 * 4
    image = render(with_lora)
    assert (image - render(merged)).abs().max() < 1e-5
    assert (image - base).abs().max() > 1e-4  # the LoRA changes the render
