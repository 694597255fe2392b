"""Qwen-Image-Layered: decomposition into RGBA layers equals diffusers' ``QwenImageLayeredPipeline`` on the tiny
repos (the transformer and four-channel VAE of the tiny Layered repo, the text encoder of the tiny Qwen-Image repo, as
the reference's scripts load them), and bad input stops early.

diffusers sizes the output from a 640 x 640 (or 1024 x 1024) pixel bucket, which costs the tiny VAE seconds on a CPU:
the test lowers it to the 48 x 32 pixels given to this pipeline. Every other step runs as at full size.
"""

import pytest
import torch
from PIL import Image

from diffsynth.core.loader import ModelConfig
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS
from diffsynth.testing.tiny_qwen_layered import QWEN_IMAGE_LAYERED_MODEL_ID, build_tiny_qwen_image_layered

PROMPT, NEGATIVE = "a poster with a red square", "blurry"
HEIGHT, WIDTH, LAYERS = 32, 48, 2


def rgba_image(seed: int) -> Image.Image:
    """A 48 x 32 RGBA image of random pixels with a transparent band."""
    pixels = torch.randint(0, 256, (HEIGHT, WIDTH, 4), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    pixels[:, : WIDTH // 3, 3] = 0
    return Image.fromarray(pixels.numpy(), "RGBA")


@pytest.fixture(scope="module")
def layered_root(tiny_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("layered")
    build_tiny_qwen_image_layered(root)
    return root


@pytest.fixture(scope="module")
def ours(tiny_root, layered_root):
    layered = layered_root / QWEN_IMAGE_LAYERED_MODEL_ID
    qwen = tiny_root / QWEN_IMAGE_MODEL_ID
    return QwenImagePipeline.from_pretrained(torch.float32, "cpu", [
        ModelConfig(path=sorted(str(p) for p in (layered / "transformer").glob("*.safetensors"))),
        ModelConfig(path=sorted(str(p) for p in (qwen / "text_encoder").glob("*.safetensors"))),
        ModelConfig(path=str(layered / "vae" / "diffusion_pytorch_model.safetensors")),
    ], tokenizer_config=ModelConfig(path=str(qwen / QWEN_IMAGE_PATTERNS["tokenizer"])))


@pytest.fixture(scope="module")
def reference(tiny_root, layered_root):
    from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageLayeredPipeline,
                           QwenImageTransformer2DModel)
    from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2Tokenizer

    layered, qwen = layered_root / QWEN_IMAGE_LAYERED_MODEL_ID, tiny_root / QWEN_IMAGE_MODEL_ID
    return QwenImageLayeredPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler.from_pretrained(layered / "scheduler"),
        vae=AutoencoderKLQwenImage.from_pretrained(layered / "vae"),
        text_encoder=Qwen2_5_VLForConditionalGeneration.from_pretrained(qwen / "text_encoder"),
        tokenizer=Qwen2Tokenizer.from_pretrained(qwen / "tokenizer"), processor=None,
        transformer=QwenImageTransformer2DModel.from_pretrained(layered / "transformer"),
    )


def render(pipe, image, seed=3):
    return pipe(PROMPT, negative_prompt=NEGATIVE, cfg_scale=2.5, layer_input_image=image, layer_num=LAYERS,
                height=HEIGHT, width=WIDTH, num_inference_steps=2, seed=seed, output_type="pt", progress_bar=False)


def test_layers_equal_diffusers_layered_pipeline(ours, reference, monkeypatch):
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_layered

    # diffusers' 640 x 640 bucket lowered to the size this pipeline is given
    monkeypatch.setattr(pipeline_qwenimage_layered, "calculate_dimensions", lambda area, ratio: (WIDTH, HEIGHT))
    image = rgba_image(0)
    expected = reference(image=image, prompt=PROMPT, negative_prompt=NEGATIVE, true_cfg_scale=2.5, layers=LAYERS,
                         num_inference_steps=2, generator=torch.Generator().manual_seed(3), output_type="pt").images[0]
    frames = render(ours, image)
    assert frames.shape == (LAYERS + 1, 4, HEIGHT, WIDTH) and expected.shape == (LAYERS, 4, HEIGHT, WIDTH)
    difference = (frames[1:] - expected).abs().max().item()
    assert difference < 1e-5, difference
    # teeth: another input image (which the tiny random transformer reads weakly) or seed moves the layers far more
    # than the tolerance
    assert (render(ours, rgba_image(1))[1:] - expected).abs().max().item() > 1e-3
    assert (render(ours, image, seed=4)[1:] - expected).abs().max().item() > 1e-2


def test_pil_output_is_the_composite_then_each_rgba_layer(ours):
    images = ours(PROMPT, cfg_scale=1, layer_input_image=rgba_image(0), layer_num=LAYERS, num_inference_steps=1,
                  height=HEIGHT, width=WIDTH, progress_bar=False)
    assert [(image.mode, image.size) for image in images] == [("RGBA", (WIDTH, HEIGHT))] * (LAYERS + 1)


@pytest.mark.parametrize(("layer_num", "image", "message"), [
    (2, None, "needs both"), (None, "image", "needs both"), (-1, "image", "or 0 to extract one layer"),
])
def test_bad_layer_inputs_are_refused_before_denoising(ours, layer_num, image, message):
    with pytest.raises(ValueError, match=message):
        ours(PROMPT, layer_input_image=rgba_image(0) if image else None, layer_num=layer_num, progress_bar=False)


def test_a_training_sample_keeps_alpha_and_trains_every_frame(ours, tmp_path):
    from diffsynth.core.data.dataset import UnifiedDataset
    from diffsynth.core.data.example_layered_dataset import build_example_layered_dataset

    metadata = build_example_layered_dataset(tmp_path, num_samples=1, num_layers=LAYERS)
    dataset = UnifiedDataset(tmp_path, metadata, data_file_keys=("image", "layer_input_image"), max_pixels=48 * 32,
                             required_columns=("image", "prompt", "layer_num", "layer_input_image"), keep_alpha=True)
    sample = dataset[0]
    assert [image.mode for image in sample["image"]] == ["RGBA"] * (LAYERS + 1)
    assert sample["layer_input_image"].mode == "RGBA"
    shared, posi, nega = ours.training_inputs(sample, ("layer_num", "layer_input_image"))
    shared, posi, nega = ours.run_units(shared, posi, nega)
    latents = shared["input_latents"]
    assert latents.shape[:3] == (1, 16, LAYERS + 1) and shared["layer_input_latents"].shape[:2] == (1, 16)
    # each frame is its own image's latents: the composite, then each layer (the transparent ones differ from it)
    assert torch.allclose(latents[:, :, 0], ours.encode_image(sample["image"][0]), atol=1e-6)
    assert (latents[:, :, 2] - latents[:, :, 0]).abs().max() > 1e-2
    prediction = ours.model_fn(latents=latents, timestep=torch.tensor([500.0]), **posi,
                               layer_input_latents=shared["layer_input_latents"])
    assert prediction.shape == latents.shape
    with pytest.raises(ValueError, match="image list of 3"):
        ours.training_inputs({**sample, "image": sample["image"][:2]}, ("layer_num", "layer_input_image"))
