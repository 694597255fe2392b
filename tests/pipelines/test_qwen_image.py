"""Qwen-Image: output parity with diffusers' own pipeline on the tiny repo, unit declarations, bad input."""

import logging

import pytest
import torch
from PIL import Image

from diffsynth.core.loader.errors import ModelFilesNotFoundError
from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS
from diffsynth.pipelines.qwen_image.pipeline import ModelConfig, QwenImagePipeline, pack_latents, unpack_latents
from tests.pipelines.family_helpers import load_ours, load_theirs, noised_input_image

PROMPT, NEGATIVE = "a red cube on a blue table", "blurry, low quality"


def configs(*names):
    return [ModelConfig(model_id=QWEN_IMAGE_MODEL_ID, origin_file_pattern=QWEN_IMAGE_PATTERNS[n]) for n in names]


@pytest.fixture(scope="module")
def pipes(tiny_root):
    from diffusers import QwenImagePipeline as DiffusersQwenImagePipeline

    return (load_ours(tiny_root, "qwen_image"),
            load_theirs(tiny_root, DiffusersQwenImagePipeline, QWEN_IMAGE_MODEL_ID))


# CFG with a negative prompt is the family kit's case (tests/pipelines/test_family_kit.py).
@pytest.mark.parametrize("cfg_scale", [1.0])
def test_matches_diffusers_pipeline(pipes, cfg_scale):
    ours, theirs = pipes
    size = dict(height=48, width=80, num_inference_steps=4)
    image = ours(PROMPT, negative_prompt=NEGATIVE, cfg_scale=cfg_scale, seed=7, output_type="pt",
                 progress_bar=False, **size)
    reference = theirs(PROMPT, negative_prompt=NEGATIVE if cfg_scale > 1 else None, true_cfg_scale=cfg_scale,
                       generator=torch.Generator().manual_seed(7), output_type="pt", **size).images
    assert image.shape == reference.shape == (1, 3, 48, 80)
    assert (image - reference).abs().max() < 1e-4
    # The check has teeth: another seed, or CFG off where it was on, changes the image well beyond the tolerance.
    other = ours(PROMPT, negative_prompt=NEGATIVE, cfg_scale=cfg_scale, seed=8, output_type="pt", progress_bar=False,
                 **size)
    assert (other - reference).abs().max() > 1e-2


def test_cfg_changes_the_output(pipes):
    ours, _ = pipes
    kwargs = dict(height=32, width=32, num_inference_steps=2, seed=0, output_type="pt", progress_bar=False)
    assert (ours(PROMPT, cfg_scale=1.0, **kwargs) - ours(PROMPT, cfg_scale=4.0, **kwargs)).abs().max() > 1e-3


def test_returns_a_pil_image_of_the_rounded_size(pipes, caplog):
    ours, _ = pipes
    with caplog.at_level(logging.WARNING, logger="diffsynth.pipelines.qwen_image.pipeline"):
        image = ours(PROMPT, cfg_scale=1.0, height=40, width=70, num_inference_steps=1, seed=0, progress_bar=False)
    assert isinstance(image, Image.Image) and image.size == (64, 48)
    assert "height=40 is not a multiple of 16; using 48" in caplog.text
    assert "width=70 is not a multiple of 16; using 64" in caplog.text


def test_image_to_image_starts_from_the_input(pipes):
    ours, _ = pipes
    kwargs = dict(cfg_scale=1.0, height=32, width=32, num_inference_steps=4, seed=0, output_type="pt",
                  progress_bar=False)
    white, black = Image.new("RGB", (32, 32), "white"), Image.new("RGB", (32, 32), "black")
    from_white = ours(PROMPT, input_image=white, denoising_strength=0.25, **kwargs)
    from_black = ours(PROMPT, input_image=black, denoising_strength=0.25, **kwargs)
    # A quarter of the schedule keeps part of the input; full strength ignores the input entirely.
    assert (from_white - from_black).abs().max() > 1e-3
    full_white = ours(PROMPT, input_image=white, denoising_strength=1.0, **kwargs)
    assert torch.equal(full_white, ours(PROMPT, **kwargs))


def test_pack_and_unpack_are_inverse():
    latents = torch.randn(2, 16, 6, 10)
    tokens = pack_latents(latents)
    assert tokens.shape == (2, 15, 64)
    # A token holds the 2x2 patch of every channel, channel-major (diffusers' layout).
    assert torch.equal(tokens[0, 1, :4], latents[0, 0, 0:2, 2:4].reshape(-1))
    assert torch.equal(unpack_latents(tokens, 6, 10), latents)


def test_image_to_image_noises_the_input_to_the_first_timestep(pipes):
    ours, _ = pipes
    ours.scheduler.set_timesteps(4, 0.5, image_seq_len=4)
    sigma, _ = noised_input_image(ours, PROMPT)
    assert 0.4 < sigma < 0.6


def test_loads_any_subset_of_models(tiny_root, monkeypatch):
    monkeypatch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
    pipe = QwenImagePipeline.from_pretrained(torch.bfloat16, "cpu", configs("dit"))
    assert pipe.text_encoder is None and pipe.tokenizer is None and pipe.vae is None
    assert {p.dtype for p in pipe.dit.parameters()} == {torch.bfloat16}
    assert pipe.model_names() == ["dit"]


def test_unknown_model_id_fails_fast(tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tmp_path))
    monkeypatch.setenv("DIFFSYNTH_SKIP_DOWNLOAD", "true")
    bad = ModelConfig(model_id="nobody/NoSuchModel", origin_file_pattern="transformer/*.safetensors")
    with pytest.raises(ModelFilesNotFoundError, match="nobody/NoSuchModel"):
        QwenImagePipeline.from_pretrained(torch.float32, "cpu", [bad])


def test_a_model_without_a_slot_is_named(tiny_root, monkeypatch):
    from diffsynth.testing.tiny_models import WAN_MODEL_ID, WAN_PATTERNS

    monkeypatch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
    wan_dit = ModelConfig(model_id=WAN_MODEL_ID, origin_file_pattern=WAN_PATTERNS["dit"])
    with pytest.raises(ValueError, match="WanTransformer3DModel, which QwenImagePipeline has no slot for"):
        QwenImagePipeline.from_pretrained(torch.float32, "cpu", [wan_dit])
    with pytest.raises(ValueError, match="second dit"):
        QwenImagePipeline.from_pretrained(torch.float32, "cpu", configs("dit", "dit"))


def test_bad_call_arguments(pipes):
    ours, _ = pipes
    with pytest.raises(TypeError, match="one string"):
        ours([PROMPT, PROMPT])
    with pytest.raises(ValueError, match="output_type='np'"):
        ours(PROMPT, output_type="np")
    with pytest.raises(ValueError, match="height=-16 must be a positive"):
        ours(PROMPT, height=-16, width=32, num_inference_steps=1, progress_bar=False)


def test_units_do_what_they_declare(pipes):
    from tests.pipelines.declarations import check_declarations

    ours, _ = pipes
    ours.scheduler.set_timesteps(2, 0.5, image_seq_len=4)
    shared = {"cfg_scale": 2.0, "height": 32, "width": 32, "seed": 0, "rand_device": "cpu",
              "input_image": Image.new("RGB", (32, 32)), "denoising_strength": 0.5, "max_sequence_length": 64,
              "context_image": Image.new("RGB", (48, 48))}
    assert check_declarations(ours, shared, {"prompt": PROMPT}, {"negative_prompt": NEGATIVE}) == {}


def test_declaration_check_catches_a_lying_unit(pipes):
    from diffsynth.diffusion import PipelineUnit
    from tests.pipelines.declarations import check_declarations

    class Liar(PipelineUnit):
        def __init__(self):
            super().__init__(take_over=True, input_params=("height",), output_params=("area", "unused"))

        def process(self, pipe, inputs_shared, inputs_posi, inputs_nega):
            inputs_shared["area"] = inputs_shared["height"] * inputs_shared["width"]
            return inputs_shared, inputs_posi, inputs_nega

    ours, _ = pipes
    pipe = QwenImagePipeline(torch_dtype=torch.float32)
    pipe.units = [Liar()]
    problems = check_declarations(pipe, {"height": 2, "width": 3}, {}, {})["Liar"]
    assert "reads undeclared [('shared', 'width')]" in problems
    assert any(p.startswith("never writes declared") and "'unused'" in p for p in problems)
