"""FLUX.2 [klein]: output parity with diffusers' own Flux2KleinPipeline on the tiny repos (distilled and base, with and
without CFG, with one and two reference images), the tiny repos themselves, the schedule, and bad input."""

import numpy as np
import pytest
import torch
from PIL import Image

from diffsynth.core.loader import ModelConfig
from diffsynth.testing.tiny_flux2 import (
    FLUX2_KLEIN_4B_MODEL_ID,
    FLUX2_KLEIN_9B_MODEL_ID,
    FLUX2_KLEIN_BASE_4B_MODEL_ID,
    FLUX2_KLEIN_BASE_9B_MODEL_ID,
    FLUX2_PATTERNS,
)
from diffsynth.pipelines.flux2_klein.pipeline import Flux2KleinPipeline, flux2_empirical_mu, patchify, unpatchify
from tests.pipelines.family_helpers import load_ours, load_theirs

PROMPT = "a red cube on a blue table"
# Each base model reads the text encoder and VAE of its distilled sibling, as the reference's scripts load them.
SHARED_PARTS = {FLUX2_KLEIN_BASE_4B_MODEL_ID: FLUX2_KLEIN_4B_MODEL_ID,
                FLUX2_KLEIN_BASE_9B_MODEL_ID: FLUX2_KLEIN_9B_MODEL_ID}


def configs(model_id, *names):
    parts = SHARED_PARTS.get(model_id, model_id)
    return [ModelConfig(model_id=model_id if name == "dit" else parts, origin_file_pattern=FLUX2_PATTERNS[name])
            for name in names]


def reference_image(seed, width, height):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def pipes(tiny_root):
    from diffusers import Flux2KleinPipeline as DiffusersFlux2KleinPipeline

    return {model_id: (load_ours(tiny_root, "flux2_klein", [f"{config.model_id}:{config.origin_file_pattern}" for config
                                                            in configs(model_id, "dit", "text_encoder", "vae")]),
                       load_theirs(tiny_root, DiffusersFlux2KleinPipeline, model_id))
            for model_id in (FLUX2_KLEIN_4B_MODEL_ID, FLUX2_KLEIN_BASE_4B_MODEL_ID, FLUX2_KLEIN_BASE_9B_MODEL_ID)}


def render_both(pipes, model_id, cfg_scale, images, seed=7, **size):
    ours, theirs = pipes[model_id]
    image = ours(PROMPT, cfg_scale=cfg_scale, edit_image=images, seed=seed, num_inference_steps=3, output_type="pt",
                 progress_bar=False, **size)
    reference = theirs(prompt=PROMPT, image=images, guidance_scale=cfg_scale, num_inference_steps=3,
                       generator=torch.Generator().manual_seed(seed), output_type="pt", **size).images
    return image, reference


@pytest.mark.parametrize("references", [0, 1, 2])
@pytest.mark.parametrize(("model_id", "cfg_scale"), [(FLUX2_KLEIN_4B_MODEL_ID, 1.0),
                                                     (FLUX2_KLEIN_BASE_4B_MODEL_ID, 1.0),
                                                     (FLUX2_KLEIN_BASE_4B_MODEL_ID, 3.5)])
def test_matches_diffusers_pipeline(pipes, model_id, cfg_scale, references):
    images = [reference_image(0, 88, 72), reference_image(1, 64, 64)][:references] or None
    size = {} if images else dict(height=48, width=80)
    image, reference = render_both(pipes, model_id, cfg_scale, images, **size)
    # With references the output takes the first one's size, its sides cut down to multiples of 16.
    assert image.shape == reference.shape == ((1, 3, 64, 80) if images else (1, 3, 48, 80))
    assert (image - reference).abs().max() < 1e-4
    # Teeth: another seed, or another first reference image, moves the output far beyond the tolerance.
    other_seed = pipes[model_id][0](PROMPT, cfg_scale=cfg_scale, edit_image=images, seed=8, num_inference_steps=3,
                                    output_type="pt", progress_bar=False, **size)
    assert (other_seed - reference).abs().max() > 1e-2
    if images:
        other_images = [Image.new("RGB", (88, 72), "white"), *images[1:]]
        moved = pipes[model_id][0](PROMPT, cfg_scale=cfg_scale, edit_image=other_images, seed=7,
                                   num_inference_steps=3, output_type="pt", progress_bar=False)
        # A random transformer reads reference tokens weakly: ten times the tolerance, and far beyond the actual gap.
        assert (moved - reference).abs().max() > max(1e-3, 50 * (image - reference).abs().max())


def test_the_9b_base_model_matches_with_cfg(pipes):
    image, reference = render_both(pipes, FLUX2_KLEIN_BASE_9B_MODEL_ID, 4.0, None, height=32, width=48)
    assert (image - reference).abs().max() < 1e-4


def test_cfg_is_used_by_base_models_and_ignored_by_distilled_ones(pipes, caplog):
    kwargs = dict(height=32, width=32, num_inference_steps=2, seed=0, output_type="pt", progress_bar=False)
    base, distilled = pipes[FLUX2_KLEIN_BASE_4B_MODEL_ID][0], pipes[FLUX2_KLEIN_4B_MODEL_ID][0]
    assert not base.is_distilled and distilled.is_distilled  # read from model_index.json
    assert (base(PROMPT, cfg_scale=1.0, **kwargs) - base(PROMPT, cfg_scale=4.0, **kwargs)).abs().max() > 1e-3
    with caplog.at_level("WARNING", logger="diffsynth.pipelines.flux2_klein.pipeline"):
        ignored = distilled(PROMPT, cfg_scale=4.0, **kwargs)
    assert torch.equal(ignored, distilled(PROMPT, cfg_scale=1.0, **kwargs))
    assert "cfg_scale=4 is ignored" in caplog.text


def test_the_tiny_repos_share_text_encoder_and_vae_per_size(tiny_root):
    for base, distilled in SHARED_PARTS.items():
        for name in ("text_encoder/config.json", "vae/diffusion_pytorch_model.safetensors", "tokenizer/tokenizer.json"):
            assert (tiny_root / base / name).read_bytes() == (tiny_root / distilled / name).read_bytes()
    assert (tiny_root / FLUX2_KLEIN_4B_MODEL_ID / "text_encoder/config.json").read_bytes() != \
        (tiny_root / FLUX2_KLEIN_9B_MODEL_ID / "text_encoder/config.json").read_bytes()  # the 9B encoder is wider
    assert len(list((tiny_root / FLUX2_KLEIN_4B_MODEL_ID / "transformer").glob("*.safetensors"))) > 1  # sharded


def test_empirical_mu_is_diffusers():
    from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu

    for tokens, steps in [(4, 3), (256, 4), (4096, 50), (4301, 28), (16384, 4)]:
        assert flux2_empirical_mu(tokens, steps) == pytest.approx(compute_empirical_mu(tokens, steps), abs=1e-9)


def test_patchify_is_diffusers_and_inverts():
    from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline as Reference

    latents = torch.randn(2, 32, 6, 10)
    assert torch.equal(patchify(latents), Reference._patchify_latents(latents))
    assert torch.equal(unpatchify(patchify(latents)), latents)


def test_is_distilled_falls_back_to_the_repository_id(tmp_path):
    from diffsynth.pipelines.flux2_klein.pipeline import _is_distilled

    # No files under an empty base path: the id decides.
    assert _is_distilled(ModelConfig(model_id="black-forest-labs/FLUX.2-klein-9B", origin_file_pattern="x/",
                                     skip_download=True))
    assert not _is_distilled(ModelConfig(model_id="black-forest-labs/FLUX.2-klein-base-9B", origin_file_pattern="x/",
                                         skip_download=True))


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(edit_image=Image.new("RGB", (32, 80))), "too small: FLUX.2 needs both sides of at least 64"),
    (dict(edit_image=Image.new("RGB", (64, 640))), "too elongated"),
    (dict(edit_image=["reference.png"]), "add edit_image to --data_file_keys"),
    (dict(edit_image=[]), "empty list"),
    (dict(output_type="np"), "output_type='np' must be 'pil' or 'pt'"),
    (dict(max_sequence_length=513), "max_sequence_length=513 must lie in [1, 512]"),
])  # fmt: skip
def test_bad_input_is_refused_with_the_fix(pipes, kwargs, message):
    ours = pipes[FLUX2_KLEIN_4B_MODEL_ID][0]
    with pytest.raises(ValueError) as error:
        ours(PROMPT, height=32, width=32, num_inference_steps=1, progress_bar=False, **kwargs)
    assert message in str(error.value)


def test_a_prompt_list_and_a_missing_text_encoder_are_refused(pipes, tiny_root, monkeypatch):
    with pytest.raises(TypeError, match="call once per prompt"):
        pipes[FLUX2_KLEIN_4B_MODEL_ID][0]([PROMPT], num_inference_steps=1)
    monkeypatch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
    without_encoder = Flux2KleinPipeline.from_pretrained(torch.float32, "cpu",
                                                         configs(FLUX2_KLEIN_4B_MODEL_ID, "dit", "vae"))
    with pytest.raises(ValueError, match="needs the text encoder and tokenizer"):
        without_encoder(PROMPT, height=32, width=32, num_inference_steps=1, progress_bar=False)
