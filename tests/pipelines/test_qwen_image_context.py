"""Qwen-Image's ``context_image`` (In-Context-Control-Union, Layered-Control V2) equals an independent plain-torch
statement of the reference's token concatenation on diffusers' own pipelines and transformer (same tiny weights,
fp32): diffusers' ``QwenImagePipeline`` / ``QwenImageLayeredPipeline`` run with their transformer's forward wrapped
to append the control image's tokens after the generated ones (with their own ``img_shapes`` entry) and to drop
their prediction. Without a context image the output is diffusers' own.
"""

import numpy
import pytest
import torch
from PIL import Image

from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID
from diffsynth.testing.tiny_qwen_layered import (
    QWEN_IMAGE_LAYERED_CONTROL_MODEL_ID,
    QWEN_IMAGE_LAYERED_MODEL_ID,
    build_tiny_qwen_image_layered,
    build_tiny_qwen_image_layered_control,
)
from diffsynth.pipelines.qwen_image.layered import unpack_frames
from tests.pipelines.family_helpers import load_ours, load_theirs
from tests.pipelines.test_qwen_image_layered import rgba_image

PROMPT, NEGATIVE = "a dancer under the stars", "blurry"
HEIGHT, WIDTH, TOLERANCE = 32, 48, 2e-6


def control_image(seed: int, mode: str = "RGB") -> Image.Image:
    pixels = torch.randint(0, 256, (HEIGHT, WIDTH, 3), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    return Image.fromarray(pixels.numpy(), "RGB").convert(mode)


def context_tokens(vae, image: Image.Image) -> torch.Tensor:
    """The reference's context tokens: the image in [-1, 1] through the VAE (mode), normalised with the VAE's latent
    statistics, packed 2x2 as ``B C (H P) (W Q) -> B (H W) (C P Q)``."""
    pixels = torch.from_numpy(numpy.asarray(image, dtype=numpy.float32)) / 255 * 2 - 1
    latents = vae.encode(pixels.permute(2, 0, 1)[None, :, None]).latent_dist.mode()[:, :, 0]
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1)
    latents = (latents - mean) / std
    batch, channels, height, width = latents.shape
    packed = latents.reshape(batch, channels, height // 2, 2, width // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return packed.reshape(batch, height // 2 * width // 2, channels * 4)


def append_context(monkeypatch, transformer, tokens: torch.Tensor, frames: int) -> None:
    """Wraps ``transformer.forward``: ``tokens`` go after the first ``frames`` generated frames' tokens, with an
    ``img_shapes`` entry after theirs; the prediction for them is dropped."""
    forward = type(transformer).forward

    def wrapped(hidden_states, *args, img_shapes, **kwargs):
        generated = sum(f * h * w for f, h, w in img_shapes[0][:frames])
        context = tokens.expand(hidden_states.shape[0], -1, -1)
        shape = (1, HEIGHT // 16, WIDTH // 16)
        hidden_states = torch.cat([hidden_states[:, :generated], context, hidden_states[:, generated:]], dim=1)
        img_shapes = [[*shapes[:frames], shape, *shapes[frames:]] for shapes in img_shapes]
        output = forward(transformer, hidden_states, *args, img_shapes=img_shapes, **kwargs)
        kept = torch.cat([output[0][:, :generated], output[0][:, generated + context.shape[1]:]], dim=1)
        return (kept, *output[1:])

    monkeypatch.setattr(transformer, "forward", wrapped)


def render(pipe, **kwargs):
    return pipe(PROMPT, negative_prompt=NEGATIVE, height=HEIGHT, width=WIDTH, num_inference_steps=2, seed=3,
                output_type="pt", progress_bar=False, **kwargs)


@pytest.fixture(scope="module")
def ours(tiny_root):
    return load_ours(tiny_root, "qwen_image")


def test_context_image_equals_the_reference_concatenation_on_diffusers_qwen_image(ours, tiny_root, monkeypatch):
    from diffusers import QwenImagePipeline as DiffusersQwenImagePipeline

    theirs = load_theirs(tiny_root, DiffusersQwenImagePipeline, QWEN_IMAGE_MODEL_ID)
    call = dict(prompt=PROMPT, negative_prompt=NEGATIVE, true_cfg_scale=2.5, height=HEIGHT, width=WIDTH,
                num_inference_steps=2, output_type="pt")
    plain = theirs(generator=torch.Generator().manual_seed(3), **call).images
    assert (render(ours, cfg_scale=2.5) - plain).abs().max() < TOLERANCE  # no context image: diffusers' own output
    control = control_image(0)
    with torch.no_grad():
        append_context(monkeypatch, theirs.transformer, context_tokens(theirs.vae, control), frames=1)
    expected = theirs(generator=torch.Generator().manual_seed(3), **call).images
    image = render(ours, cfg_scale=2.5, context_image=control)
    assert image.shape == expected.shape == (1, 3, HEIGHT, WIDTH)
    assert (image - expected).abs().max() < TOLERANCE
    # teeth: another control image moves the image far beyond the tolerance
    # teeth: another control image moves the image far beyond the tolerance
    assert (render(ours, cfg_scale=2.5, context_image=Image.new("RGB", (WIDTH, HEIGHT), "white")) - expected).abs().max() > 100 * TOLERANCE


class _Stop(Exception):
    pass


def final_latents(pipe, num_inference_steps: int, **call) -> torch.Tensor:
    """A diffusers pipeline's latents after its last step, before it decodes them."""
    def stop(_, step, __, tensors):
        if step == num_inference_steps - 1:
            raise _Stop(tensors["latents"])
        return {}

    with pytest.raises(_Stop) as stopped:
        pipe(num_inference_steps=num_inference_steps, callback_on_step_end=stop, **call)
    return stopped.value.args[0]


@pytest.fixture(scope="module")
def layered_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("layered_control")
    build_tiny_qwen_image_layered(root)
    build_tiny_qwen_image_layered_control(root)
    return root


def test_layered_control_v2_extracts_one_layer_as_the_reference(tiny_root, layered_root, monkeypatch):
    """Layered-Control: ``layer_num=0`` generates one RGBA frame; V2 reads a context image (a mask) between that frame
    and the image to decompose, as diffusers' Layered pipeline (``layers=0``) with the concatenation added."""
    from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageLayeredPipeline,
                           QwenImageTransformer2DModel)
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_layered
    from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2Tokenizer

    control, layered, qwen = (layered_root / QWEN_IMAGE_LAYERED_CONTROL_MODEL_ID,
                              layered_root / QWEN_IMAGE_LAYERED_MODEL_ID, tiny_root / QWEN_IMAGE_MODEL_ID)
    ours = load_ours(layered_root, "qwen_image", [
        f"{QWEN_IMAGE_LAYERED_CONTROL_MODEL_ID}:transformer/diffusion_pytorch_model*.safetensors",
        f"{QWEN_IMAGE_LAYERED_MODEL_ID}:vae/diffusion_pytorch_model.safetensors"])
    ours.text_encoder, ours.tokenizer = (Qwen2_5_VLForConditionalGeneration.from_pretrained(qwen / "text_encoder"),
                                         Qwen2Tokenizer.from_pretrained(qwen / "tokenizer"))
    theirs = QwenImageLayeredPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler.from_pretrained(layered / "scheduler"),
        vae=AutoencoderKLQwenImage.from_pretrained(layered / "vae"), text_encoder=ours.text_encoder,
        tokenizer=ours.tokenizer, processor=None,
        transformer=QwenImageTransformer2DModel.from_pretrained(control / "transformer"))
    monkeypatch.setattr(pipeline_qwenimage_layered, "calculate_dimensions", lambda area, ratio: (WIDTH, HEIGHT))
    image, mask = rgba_image(0), control_image(5, "RGBA")
    with torch.no_grad():
        append_context(monkeypatch, theirs.transformer, context_tokens(theirs.vae, mask), frames=1)
    # diffusers decodes the layers after frame 0, which layer_num=0 lacks (and its "latent" output fails): its final
    # latents, taken at the last step, decoded by our VAE step
    tokens = final_latents(theirs, image=image, prompt=PROMPT, negative_prompt=NEGATIVE, true_cfg_scale=2.5, layers=0,
                           num_inference_steps=2, generator=torch.Generator().manual_seed(3))
    expected = ours.decode({"latents": unpack_frames(tokens, 1, HEIGHT // 8, WIDTH // 8)}, {}, {})
    frames = render(ours, cfg_scale=2.5, layer_input_image=image, layer_num=0, context_image=mask)
    assert frames.shape == expected.shape == (1, 4, HEIGHT, WIDTH)
    assert (frames - expected).abs().max() < TOLERANCE
    other = render(ours, cfg_scale=2.5, layer_input_image=image, layer_num=0, context_image=Image.new("RGBA", (WIDTH, HEIGHT)))
    assert (other - expected).abs().max() > 100 * TOLERANCE


def test_a_training_sample_encodes_its_context_image_at_the_target_size(ours):
    sample = {"image": control_image(2), "prompt": PROMPT, "context_image": control_image(3).resize((24, 16))}
    shared, posi, _ = ours.run_units(*ours.training_inputs(sample, ("context_image",)))
    expected = ours.encode_image(sample["context_image"].resize((WIDTH, HEIGHT)))
    assert torch.equal(shared["context_latents"], expected)
    latents = shared["input_latents"]
    with_context = ours.model_fn(latents=latents, timestep=torch.tensor([500.0]), **posi,
                                 context_latents=shared["context_latents"])
    assert with_context.shape == latents.shape
    assert (with_context - ours.model_fn(latents=latents, timestep=torch.tensor([500.0]), **posi)).abs().max() > 1e-4


def test_a_context_image_that_is_no_image_is_refused_before_denoising(ours):
    with pytest.raises(ValueError, match=r"context_image='pose.png' must be a PIL image.*Image.open"):
        ours(PROMPT, context_image="pose.png", progress_bar=False)
