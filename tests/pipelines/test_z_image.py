"""Z-Image and Z-Image-Turbo: output parity with diffusers' own pipeline on the tiny repos (both releases' schedules,
CFG with its normalisation and truncation options), the schedule, the model function, bad input."""

import pytest
import torch

from diffsynth.testing.tiny_z_image import (
    Z_IMAGE_MODEL_ID,
    Z_IMAGE_OMNI_MODEL_ID,
    Z_IMAGE_PATTERNS,
    Z_IMAGE_TURBO_MODEL_ID,
)
from diffsynth.pipelines.z_image.pipeline import ModelConfig, ZImagePipeline, ZImageScheduler
from tests.pipelines.family_helpers import load_ours, load_theirs, noised_input_image

PROMPT, NEGATIVE = "a red cube on a blue table", "blurry, low quality"
SIZE = dict(height=48, width=80)


def configs(model_id, *names):
    return [ModelConfig(model_id=model_id, origin_file_pattern=Z_IMAGE_PATTERNS[n]) for n in names]


@pytest.fixture(scope="module")
def pipes(tiny_root):
    from diffusers import ZImagePipeline as DiffusersZImagePipeline

    return {model_id: (load_ours(tiny_root, "z_image", [entry(model_id, n) for n in ("dit", "text_encoder", "vae")]),
                       load_theirs(tiny_root, DiffusersZImagePipeline, model_id))
            for model_id in (Z_IMAGE_MODEL_ID, Z_IMAGE_TURBO_MODEL_ID)}


def entry(model_id, name):
    return f"{model_id}:{Z_IMAGE_PATTERNS[name]}"


def render_ours(pipe, seed=7, **kwargs):
    return pipe(PROMPT, negative_prompt=NEGATIVE, seed=seed, output_type="pt", progress_bar=False, **SIZE, **kwargs)


def render_theirs(pipe, seed=7, **kwargs):
    return pipe(PROMPT, negative_prompt=NEGATIVE, generator=torch.Generator().manual_seed(seed), output_type="pt",
                **SIZE, **kwargs).images


# (release, steps, diffusers' guidance_scale, cfg_normalization, cfg_truncation): Turbo's few steps without
# guidance, the base model's CFG, and CFG with each of diffusers' options (shift 6 keeps the progress
# (1000 - t) / 1000 of 4 steps below 0.15, so truncation at 0.05 drops CFG from the second step on).
# Turbo without guidance is the family kit's case (tests/pipelines/test_family_kit.py).
CASES = [
    (Z_IMAGE_MODEL_ID, 4, 0.0, False, 1.0),
    (Z_IMAGE_MODEL_ID, 4, 3.0, False, 1.0),
    (Z_IMAGE_MODEL_ID, 4, 3.0, True, 1.0),
    (Z_IMAGE_MODEL_ID, 4, 3.0, False, 0.05),
    (Z_IMAGE_TURBO_MODEL_ID, 3, 2.0, False, 1.0),
]


@pytest.mark.parametrize(("model_id", "steps", "guidance", "normalization", "truncation"), CASES)
def test_matches_diffusers_pipeline(pipes, model_id, steps, guidance, normalization, truncation):
    ours, theirs = pipes[model_id]
    image = render_ours(ours, cfg_scale=guidance + 1, cfg_normalization=float(normalization),
                        cfg_truncation=truncation, num_inference_steps=steps)
    reference = render_theirs(theirs, guidance_scale=guidance, cfg_normalization=normalization,
                              cfg_truncation=truncation, num_inference_steps=steps)
    assert image.shape == reference.shape == (1, 3, 48, 80)
    assert (image - reference).abs().max() < 1e-4
    # The check has teeth: another seed moves the image far beyond the tolerance.
    other = render_ours(ours, seed=8, cfg_scale=guidance + 1, cfg_normalization=float(normalization),
                        cfg_truncation=truncation, num_inference_steps=steps)
    assert (other - reference).abs().max() > 1e-2


def test_each_cfg_option_changes_the_output(pipes):
    ours, _ = pipes[Z_IMAGE_MODEL_ID]
    plain = render_ours(ours, num_inference_steps=3)
    guided = render_ours(ours, cfg_scale=4.0, num_inference_steps=3)
    normalised = render_ours(ours, cfg_scale=4.0, cfg_normalization=1.0, num_inference_steps=3)
    truncated = render_ours(ours, cfg_scale=4.0, cfg_truncation=0.05, num_inference_steps=3)
    for first, second in ((plain, guided), (guided, normalised), (guided, truncated)):
        assert (first - second).abs().max() > 1e-3


def test_the_schedule_takes_each_releases_shift(pipes):
    for model_id, shift in ((Z_IMAGE_MODEL_ID, 6.0), (Z_IMAGE_TURBO_MODEL_ID, 3.0)):
        ours, theirs = pipes[model_id]
        assert ours.scheduler.shift == shift == theirs.scheduler.config.shift
        ours.scheduler.set_timesteps(4)
        assert torch.allclose(ours.scheduler.sigmas[0], torch.tensor(1.0))
        expected = shift * 0.75 / (1 + (shift - 1) * 0.75)
        assert abs(float(ours.scheduler.sigmas[1]) - expected) < 1e-6
    # Training draws from the reference's grid (shift 3) whatever the release samples with.
    assert torch.equal(pipes[Z_IMAGE_MODEL_ID][0].scheduler.training_timesteps,
                       pipes[Z_IMAGE_TURBO_MODEL_ID][0].scheduler.training_timesteps)


def test_without_the_scheduler_config_the_reference_shift_is_used(tiny_root, tmp_path, monkeypatch):
    import shutil

    copy = tmp_path / Z_IMAGE_MODEL_ID
    shutil.copytree(tiny_root / Z_IMAGE_MODEL_ID / "transformer", copy / "transformer")
    (copy / ".diffsynth_tiny_model").write_text("")
    monkeypatch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tmp_path))
    pipe = ZImagePipeline.from_pretrained(torch.float32, "cpu", configs(Z_IMAGE_MODEL_ID, "dit"))
    assert pipe.scheduler.shift == 3.0 and pipe.text_encoder is None


def test_model_fn_cuts_each_padded_caption_to_its_real_tokens(pipes):
    ours, _ = pipes[Z_IMAGE_TURBO_MODEL_ID]
    torch.manual_seed(0)
    latents, short, long = torch.randn(2, 16, 4, 6), torch.randn(1, 5, 32), torch.randn(1, 9, 32)
    padded = torch.cat([torch.cat([short, short.new_zeros(1, 4, 32)], dim=1), long])
    mask = torch.tensor([[1] * 5 + [0] * 4, [1] * 9])
    batched = ours.model_fn(latents, torch.tensor([500.0, 500.0]), padded, mask)
    alone = [ours.model_fn(latents[i:i + 1], 500.0, emb) for i, emb in enumerate((short, long))]
    assert batched.shape == latents.shape
    assert torch.allclose(batched, torch.cat(alone), atol=1e-5)


def test_bad_input_is_named(pipes):
    ours, _ = pipes[Z_IMAGE_TURBO_MODEL_ID]
    with pytest.raises(TypeError, match="prompt must be one string"):
        ours(["a", "b"])
    with pytest.raises(ValueError, match="output_type='np' must be 'pil', 'pt' or 'latent'"):
        ours(PROMPT, output_type="np")
    with pytest.raises(ValueError, match=r"max_sequence_length=600 must lie in \[1, 512\]"):
        ours(PROMPT, max_sequence_length=600)
    with pytest.raises(ValueError, match="cfg_normalization=-1 must be 0"):
        ours(PROMPT, cfg_normalization=-1)
    with pytest.raises(ValueError, match="height=-16 must be a positive number"):
        ours(PROMPT, height=-16, num_inference_steps=1, progress_bar=False)
    with pytest.raises(ValueError, match="inference_shift=0 must be positive"):
        ZImageScheduler(inference_shift=0)


def test_a_prompt_needs_the_text_encoder(tiny_root, monkeypatch):
    monkeypatch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
    pipe = ZImagePipeline.from_pretrained(torch.float32, "cpu", configs(Z_IMAGE_TURBO_MODEL_ID, "dit", "vae"))
    with pytest.raises(ValueError, match="text_encoder/\\*.safetensors"):
        pipe(PROMPT, height=32, width=32, num_inference_steps=1, progress_bar=False)


def test_sample_inputs_other_than_the_prompt_are_refused(pipes):
    ours, _ = pipes[Z_IMAGE_TURBO_MODEL_ID]
    assert ours.sample_input_problems(set()) == []
    assert "Z-Image-Omni-Base" in ours.sample_input_problems({"edit_image"})[0]


def test_units_do_what_they_declare(pipes):
    from PIL import Image

    from tests.pipelines.declarations import check_declarations

    ours, _ = pipes[Z_IMAGE_TURBO_MODEL_ID]
    ours.scheduler.set_timesteps(2, 0.5)
    shared = {"cfg_scale": 2.0, "height": 32, "width": 32, "seed": 0, "rand_device": "cpu",
              "input_image": Image.new("RGB", (32, 32)), "denoising_strength": 0.5, "max_sequence_length": 64}
    assert check_declarations(ours, shared, {"prompt": PROMPT}, {"negative_prompt": NEGATIVE}) == {}


def test_image_to_image_noises_the_input_to_the_first_timestep(pipes):
    ours, _ = pipes[Z_IMAGE_TURBO_MODEL_ID]
    ours.scheduler.set_timesteps(4, 0.5)
    sigma, shared = noised_input_image(ours, PROMPT)
    assert 0.5 < sigma < 1
    assert shared["input_latents"].shape == (1, 16, 4, 4)


# Z-Image-Omni-Base: text-to-image and condition images through diffusers' ZImageOmniPipeline.
OMNI_CONFIGS = ("dit", "siglip", "text_encoder", "vae")


def load_omni(tiny_root, vae_dtype):
    """Our pipeline and diffusers' on the tiny Omni-Base repo, float32 except the VAEs (``vae_dtype``): diffusers
    casts condition images to bfloat16 for its VAE, so its image path needs a bfloat16 VAE."""
    from diffusers import ZImageOmniPipeline

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        ours = ZImagePipeline.from_pretrained(torch.float32, "cpu", configs(Z_IMAGE_OMNI_MODEL_ID, *OMNI_CONFIGS))
    theirs = ZImageOmniPipeline.from_pretrained(str(tiny_root / Z_IMAGE_OMNI_MODEL_ID), dtype=torch.float32)
    theirs.set_progress_bar_config(disable=True)
    ours.vae.to(vae_dtype)
    theirs.vae.to(vae_dtype)
    return ours, theirs


@pytest.fixture(scope="module")
def omni_pipes(tiny_root):
    return load_omni(tiny_root, torch.float32)


@pytest.fixture(scope="module")
def omni_edit_pipes(tiny_root):
    return load_omni(tiny_root, torch.bfloat16)


def condition(size, color):
    """A condition image with some structure (a gradient and a square), so that the encoders see more than a flat
    color."""
    from PIL import Image, ImageDraw

    image = Image.linear_gradient("L").resize(size).convert("RGB")
    ImageDraw.Draw(image).rectangle((8, 8, size[0] // 2, size[1] // 2), fill=color)
    return image


@pytest.mark.parametrize("guidance", [0.0, 3.0])
def test_omni_text_to_image_matches_diffusers(omni_pipes, guidance):
    ours, theirs = omni_pipes
    assert ours.siglip is not None and type(ours.siglip).__name__ == "Siglip2VisionModel"
    image = render_ours(ours, cfg_scale=guidance + 1, num_inference_steps=3)
    # ZImageOmniPipeline's first argument is the image list, so the prompt goes by name.
    reference = theirs(prompt=PROMPT, negative_prompt=NEGATIVE, generator=torch.Generator().manual_seed(7),
                       output_type="pt", guidance_scale=guidance, num_inference_steps=3, **SIZE).images
    assert image.shape == reference.shape == (1, 3, 48, 80)
    assert (image - reference).abs().max() < 1e-4
    other = render_ours(ours, seed=8, cfg_scale=guidance + 1, num_inference_steps=3)
    assert (other - reference).abs().max() > 1e-2
    assert ours.scheduler.shift == theirs.scheduler.config.shift == 6.0


# Condition images: one of a size that is no multiple of 16 (the VAE reads it cropped, SigLIP whole), and two.
EDIT_CASES = [([(72, 88)], 0.0), ([(72, 88)], 3.0), ([(64, 96), (80, 64)], 3.0)]


@pytest.mark.parametrize(("sizes", "guidance"), EDIT_CASES)
def test_omni_condition_images_match_diffusers(omni_edit_pipes, sizes, guidance):
    ours, theirs = omni_edit_pipes
    images = [condition(size, (200, 40 * index, 90)) for index, size in enumerate(sizes)]
    edit = images if len(images) > 1 else images[0]
    # Latents are compared: the bfloat16 VAE's decode would round away what the comparison measures.
    kwargs = dict(negative_prompt=NEGATIVE, output_type="latent", num_inference_steps=2)
    image = ours(PROMPT, edit_image=edit, cfg_scale=guidance + 1, seed=7, progress_bar=False, **kwargs)
    reference = theirs(image=edit, prompt=PROMPT, guidance_scale=guidance, generator=torch.Generator().manual_seed(7),
                       **kwargs).images
    # Without height and width both take the last condition image's size, cropped to multiples of 16.
    expected = (1, 16, sizes[-1][1] // 16 * 2, sizes[-1][0] // 16 * 2)
    assert image.shape == reference.shape == expected
    assert (image - reference).abs().max() < 1e-4
    # Teeth: another seed, and another condition image, move the output far beyond the tolerance.
    other_seed = ours(PROMPT, edit_image=edit, cfg_scale=guidance + 1, seed=8, progress_bar=False, **kwargs)
    changed = [condition(size, (20, 220, 40 * index)) for index, size in enumerate(sizes)]
    other_image = ours(PROMPT, edit_image=changed if len(changed) > 1 else changed[0], cfg_scale=guidance + 1,
                       seed=7, progress_bar=False, **kwargs)
    assert (other_seed - reference).abs().max() > 1e-2
    assert (other_image - reference).abs().max() > 1e-2


def test_omni_prompt_segments_frame_the_condition_images(omni_pipes):
    from diffsynth.pipelines.z_image.omni import prompt_segments

    assert prompt_segments("a cat", 0) == ["<|im_start|>user\na cat<|im_end|>\n<|im_start|>assistant\n"]
    two = prompt_segments("a cat", 2)
    assert len(two) == 4 and two[1] == "<|vision_end|><|vision_start|>" and "a cat" in two[2]
    ours, _ = omni_pipes
    shared, posi, _ = ours.run_units({"height": 32, "width": 32, "seed": 0, "max_sequence_length": 512,
                                      "edit_image": [condition((64, 64), (1, 2, 3))] * 2}, {"prompt": PROMPT}, {})
    assert posi["prompt_emb_lengths"].shape == (1, 4)
    assert int(posi["prompt_emb_lengths"].sum()) == posi["prompt_emb"].shape[1]
    assert len(shared["edit_latents"]) == len(shared["edit_siglip"]) == 2
    assert shared["edit_latents"][0].shape == (1, 16, 8, 8) and shared["edit_siglip"][0].shape[-1] == 24


def test_condition_images_need_the_omni_transformer(pipes):
    ours, _ = pipes[Z_IMAGE_TURBO_MODEL_ID]
    with pytest.raises(ValueError, match="Z-Image-Omni-Base"):
        ours(PROMPT, edit_image=condition((64, 64), (1, 2, 3)), height=32, width=32, num_inference_steps=1,
             progress_bar=False)


def test_omni_units_do_what_they_declare(omni_pipes):
    from tests.pipelines.declarations import check_declarations

    ours, _ = omni_pipes
    ours.scheduler.set_timesteps(2, 0.5)
    shared = {"cfg_scale": 2.0, "height": 32, "width": 32, "seed": 0, "rand_device": "cpu",
              "edit_image": condition((64, 64), (1, 2, 3)), "input_image": condition((32, 32), (9, 9, 9)),
              "denoising_strength": 0.5, "max_sequence_length": 64}
    assert check_declarations(ours, shared, {"prompt": PROMPT}, {"negative_prompt": NEGATIVE}) == {}
