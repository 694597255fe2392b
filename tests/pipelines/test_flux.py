"""FLUX.1 [dev], Krea and Kontext: output parity with diffusers' own FluxPipeline / FluxKontextPipeline on the tiny
repos, our pipeline loading the released single files (``flux1-*.safetensors``, ``ae.safetensors``) and diffusers
the repos' diffusers folders; true CFG, the guidance input, the schedule, the reference's target names and bad input."""

import numpy as np
import pytest
import torch
from PIL import Image

from diffsynth.testing.tiny_flux import FLUX1_DEV_MODEL_ID, FLUX1_KONTEXT_MODEL_ID, FLUX1_KREA_MODEL_ID
from diffsynth.pipelines.flux.pipeline import REFERENCE_TARGETS, kontext_size
from diffsynth.testing.families import tiny_family
from diffsynth.training.objective.lora_targets import resolve_lora_targets
from tests.pipelines.family_helpers import load_ours, load_theirs

PROMPT = "a red cube on a blue table"
SINGLE_FILES = {FLUX1_DEV_MODEL_ID: "flux1-dev.safetensors", FLUX1_KONTEXT_MODEL_ID: "flux1-kontext-dev.safetensors",
                FLUX1_KREA_MODEL_ID: "flux1-krea-dev.safetensors"}


def reference_image(seed, width, height):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def pipes(tiny_root):
    from diffusers import FluxKontextPipeline as DiffusersKontext
    from diffusers import FluxPipeline as DiffusersFlux

    # diffusers loads the repo's diffusers folders; the Kontext and Krea repos ship their own copies of FLUX.1-dev's
    # encoders and VAE, as the released ones do.
    return {model_id: (load_ours(tiny_root, "flux", [f"{model_id}:{SINGLE_FILES[model_id]}",
                                                     *list(tiny_family("flux").models.values())[1:]]),
                       load_theirs(tiny_root, reference_class, model_id))
            for model_id, reference_class in ((FLUX1_DEV_MODEL_ID, DiffusersFlux), (FLUX1_KREA_MODEL_ID, DiffusersFlux),
                                              (FLUX1_KONTEXT_MODEL_ID, DiffusersKontext))}


def ours_image(pipe, seed=7, **options):
    return pipe(PROMPT, seed=seed, num_inference_steps=3, output_type="pt", progress_bar=False, **options)


@pytest.mark.parametrize("model_id", [FLUX1_DEV_MODEL_ID, FLUX1_KREA_MODEL_ID])
@pytest.mark.parametrize(("cfg_scale", "guidance"), [(1.0, 3.5), (1.0, 1.0), (2.5, 3.5)])
def test_matches_diffusers_flux_pipeline(pipes, model_id, cfg_scale, guidance):
    ours, theirs = pipes[model_id]
    image = ours_image(ours, cfg_scale=cfg_scale, embedded_guidance=guidance, negative_prompt="blurry", height=48,
                       width=80)
    reference = theirs(prompt=PROMPT, negative_prompt="blurry", true_cfg_scale=cfg_scale, guidance_scale=guidance,
                       height=48, width=80, num_inference_steps=3, generator=torch.Generator().manual_seed(7),
                       output_type="pt").images
    assert image.shape == reference.shape == (1, 3, 48, 80)
    assert (image - reference).abs().max() < 1e-4
    # Teeth: another seed moves the output far beyond the tolerance.
    other = ours_image(ours, seed=8, cfg_scale=cfg_scale, embedded_guidance=guidance, negative_prompt="blurry",
                       height=48, width=80)
    assert (other - reference).abs().max() > 1e-2


def test_the_guidance_input_reaches_the_transformer(pipes):
    ours, _ = pipes[FLUX1_DEV_MODEL_ID]
    low = ours_image(ours, embedded_guidance=1.0, height=32, width=32)
    high = ours_image(ours, embedded_guidance=6.0, height=32, width=32)
    assert (low - high).abs().max() > 1e-4


@pytest.mark.parametrize("auto_resize", [True, False])
def test_kontext_matches_diffusers(pipes, auto_resize):
    ours, theirs = pipes[FLUX1_KONTEXT_MODEL_ID]
    image_in = reference_image(0, 88, 72)
    image = ours_image(ours, kontext_images=image_in, kontext_auto_resize=auto_resize, height=48, width=64)
    # diffusers rescales the output size to max_area; an area of exactly height x width keeps it.
    reference = theirs(prompt=PROMPT, image=image_in, height=48, width=64, max_area=48 * 64,
                       _auto_resize=auto_resize, num_inference_steps=3, generator=torch.Generator().manual_seed(7),
                       output_type="pt").images
    assert image.shape == reference.shape == (1, 3, 48, 64)
    assert (image - reference).abs().max() < 1e-4
    moved = ours_image(ours, kontext_images=Image.new("RGB", (88, 72), "white"), kontext_auto_resize=auto_resize,
                       height=48, width=64)
    assert (moved - reference).abs().max() > max(1e-3, 50 * (image - reference).abs().max())


def test_kontext_sizes():
    # Auto resize picks the trained resolution of the nearest aspect ratio; otherwise the sides are cut to 16s.
    assert kontext_size(Image.new("RGB", (1000, 1000)), auto_resize=True) == (1024, 1024)
    assert kontext_size(Image.new("RGB", (1600, 900)), auto_resize=True) == (1392, 752)
    assert kontext_size(Image.new("RGB", (88, 72)), auto_resize=False) == (80, 64)


def test_schedule_matches_diffusers_and_training_uses_shift_three(pipes):
    ours, theirs = pipes[FLUX1_DEV_MODEL_ID]
    ours.set_inference_timesteps(5, latent_shape=(1, 16, 64, 96))
    theirs.scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / 5, 5),
                                   mu=_diffusers_mu(theirs.scheduler.config, 32 * 48))
    assert torch.allclose(ours.scheduler.timesteps, theirs.scheduler.timesteps.float(), atol=1e-3)
    grid = torch.linspace(1, 0, 1001, dtype=torch.float64)[:-1]
    assert torch.allclose(ours.scheduler.training_timesteps, (3 * grid / (1 + 2 * grid) * 1000).float())


def _diffusers_mu(config, image_seq_len):
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    return calculate_shift(image_seq_len, config["base_image_seq_len"], config["max_image_seq_len"],
                           config["base_shift"], config["max_shift"])


def test_training_inputs_follow_the_reference(pipes):
    ours, _ = pipes[FLUX1_KONTEXT_MODEL_ID]
    sample = {"image": reference_image(0, 32, 48), "prompt": "p", "kontext_images": reference_image(1, 40, 24)}
    shared, posi, _ = ours.training_inputs(sample, ["kontext_images"])
    assert shared["embedded_guidance"] == 1.0 and shared["cfg_scale"] == 1
    assert shared["kontext_auto_resize"] is False and shared["kontext_images"] is sample["kontext_images"]
    assert (shared["height"], shared["width"]) == (48, 32) and posi == {"prompt": "p"}


def test_reference_target_names_map_to_the_diffusers_modules(pipes):
    dit = pipes[FLUX1_DEV_MODEL_ID][0].dit
    targets = resolve_lora_targets(dit, list(REFERENCE_TARGETS), REFERENCE_TARGETS, "dit")
    double, single = len(dit.transformer_blocks), len(dit.single_transformer_blocks)
    # 14 layers per double block, 6 per single block (to_qkv_mlp is four), and the two top-level layers.
    assert len(targets) == 14 * double + 6 * single + 2
    assert "transformer_blocks.0.attn.to_q" in targets and "single_transformer_blocks.0.proj_mlp" in targets
    assert "proj_out" in targets and "norm_out.linear" in targets
    only_qkv = resolve_lora_targets(dit, ["a_to_qkv"], REFERENCE_TARGETS, "dit")
    assert sorted(only_qkv) == sorted(f"transformer_blocks.{i}.attn.to_{p}" for i in range(double) for p in "qkv")
    # The reference's block-local proj_out is the single blocks' only, not the final layer.
    assert "proj_out" not in resolve_lora_targets(dit, ["proj_out"], REFERENCE_TARGETS, "dit")
    # diffusers' own names still work as suffixes.
    assert resolve_lora_targets(dit, ["to_q"], REFERENCE_TARGETS, "dit") == ["to_q"]


def test_bad_input(pipes):
    ours, _ = pipes[FLUX1_KONTEXT_MODEL_ID]
    with pytest.raises(ValueError, match="kontext_images holds the path"):
        ours_image(ours, kontext_images="photo.png", height=32, width=32)
    with pytest.raises(ValueError, match="max_sequence_length"):
        ours_image(ours, max_sequence_length=513)
    with pytest.raises(TypeError, match="one string"):
        ours([PROMPT])
    assert ours.sample_input_problems({"edit_image"})
