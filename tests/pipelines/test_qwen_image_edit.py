"""Qwen-Image-Edit, Edit-2509 and Edit-2511: parity with diffusers' edit pipelines on the tiny repos, the processor's
origin, zero_cond_t, unit declarations and bad input.

The reference sizes the edit images to about 1024 x 1024 pixels for the VAE, which takes the tiny VAE seconds per
image on a CPU. The parity tests lower that area, and 2509's 384 x 384 encoder area, to the same small values on
both sides: diffusers reads them from its module constants, this pipeline from two attributes. Every other step
(templates, processor, packing, ``img_shapes``, CFG, the schedule) runs as it does at full size.
"""

import shutil

import pytest
import torch
from PIL import Image

from diffsynth.core.loader import ModelConfig, ModelLoadError
from diffsynth.testing.tiny_models import (QWEN_IMAGE_EDIT_2509_MODEL_ID, QWEN_IMAGE_EDIT_2511_MODEL_ID,
                                               QWEN_IMAGE_EDIT_MODEL_ID, QWEN_IMAGE_EDIT_PATTERNS,
                                               QWEN_IMAGE_MODEL_ID)
from diffsynth.pipelines.qwen_image import edit as qwen_image_edit
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline

from .edit_reference import diffusers_edit_pipeline, shrink_reference_sizes

PROMPT, NEGATIVE = "paint the square blue", "blurry, low quality"
# Small stand-ins for the reference's 1024 x 1024 (VAE) and 384 x 384 (2509's encoder) pixel areas.
EDIT_PIXELS, CONDITION_PIXELS = 96 * 96, 64 * 64
RED = Image.new("RGB", (96, 64), (200, 30, 90))
TEAL = Image.new("RGB", (40, 80), (20, 130, 190))


def configs(model_id, *names):
    return [ModelConfig(model_id=model_id, origin_file_pattern=QWEN_IMAGE_EDIT_PATTERNS[n]) for n in names]


def ours(model_id, **kwargs):
    pipe = QwenImagePipeline.from_pretrained(torch.float32, "cpu", configs(model_id, "dit", "text_encoder", "vae"),
                                             **kwargs)
    pipe.edit_image_pixels, pipe.edit_condition_pixels = EDIT_PIXELS, CONDITION_PIXELS
    return pipe


@pytest.fixture
def small_reference_sizes(monkeypatch):
    """diffusers' edit image areas lowered to the ones ``ours`` sets."""
    shrink_reference_sizes(monkeypatch, EDIT_PIXELS, CONDITION_PIXELS)


def render(pipe, edit_image, cfg_scale, seed=7, **kwargs):
    return pipe(PROMPT, negative_prompt=NEGATIVE, cfg_scale=cfg_scale, edit_image=edit_image, height=32, width=48,
                num_inference_steps=2, seed=seed, output_type="pt", progress_bar=False, **kwargs)


def reference_render(pipe, edit_image, cfg_scale):
    return pipe(image=edit_image, prompt=PROMPT, negative_prompt=NEGATIVE if cfg_scale > 1 else None,
                true_cfg_scale=cfg_scale, height=32, width=48, num_inference_steps=2,
                generator=torch.Generator().manual_seed(7), output_type="pt").images


@pytest.mark.parametrize(("model_id", "edit_image"), [(QWEN_IMAGE_EDIT_MODEL_ID, RED),
                                                      (QWEN_IMAGE_EDIT_2509_MODEL_ID, [RED, TEAL]),
                                                      (QWEN_IMAGE_EDIT_2511_MODEL_ID, [RED, TEAL])],
                         ids=["edit", "edit_2509", "edit_2511"])
def test_matches_diffusers_edit_pipelines(base, tiny_root, small_reference_sizes, model_id, edit_image):
    from diffusers import QwenImageEditPipeline, QwenImageEditPlusPipeline

    pipe = ours(model_id)
    reference = diffusers_edit_pipeline(QwenImageEditPlusPipeline if isinstance(edit_image, list)
                                        else QwenImageEditPipeline, tiny_root / model_id, pipe.processor)
    for cfg_scale in (1.0, 3.5):
        image = render(pipe, edit_image, cfg_scale)
        expected = reference_render(reference, edit_image, cfg_scale)
        assert image.shape == expected.shape == (1, 3, 32, 48)
        assert (image - expected).abs().max() < 1e-4, f"cfg_scale={cfg_scale}"
    # The check has teeth: another seed changes the image well beyond the tolerance.
    assert (render(pipe, edit_image, 3.5, seed=8) - expected).abs().max() > 1e-2


def test_the_edit_images_and_their_form_change_the_output(base):
    pipe = ours(QWEN_IMAGE_EDIT_2509_MODEL_ID)
    red, teal = render(pipe, [RED], 1.0), render(pipe, [TEAL], 1.0)
    assert (red - teal).abs().max() > 1e-3
    # One image alone is Qwen-Image-Edit's template; in a list, 2509's ("Picture 1: ...").
    assert (render(pipe, RED, 1.0) - red).abs().max() > 1e-4
    assert (render(pipe, [RED, TEAL], 1.0) - red).abs().max() > 1e-3


def test_the_reference_areas_are_diffusers_own():
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus

    assert QwenImagePipeline.edit_image_pixels == pipeline_qwenimage_edit_plus.VAE_IMAGE_SIZE == 1024 * 1024
    assert QwenImagePipeline.edit_condition_pixels == pipeline_qwenimage_edit_plus.CONDITION_IMAGE_SIZE == 384 * 384
    assert qwen_image_edit.edit_image_size(Image.new("RGB", (300, 200)), 1024 * 1024) == (1248, 832)


def test_output_size_defaults_to_the_last_edit_image_scaled(base):
    pipe = ours(QWEN_IMAGE_EDIT_MODEL_ID)
    image = pipe(PROMPT, cfg_scale=1.0, edit_image=[TEAL, RED], num_inference_steps=1, seed=0, progress_bar=False)
    assert image.size == qwen_image_edit.edit_image_size(RED, EDIT_PIXELS) == (128, 64)


def test_zero_cond_t_comes_from_the_config_or_the_option(base):
    assert ours(QWEN_IMAGE_EDIT_2511_MODEL_ID).dit.zero_cond_t is True
    plain = ours(QWEN_IMAGE_EDIT_2509_MODEL_ID)
    switched = ours(QWEN_IMAGE_EDIT_2509_MODEL_ID, zero_cond_t=True)
    assert plain.dit.zero_cond_t is False and plain.dit.config.zero_cond_t is False
    assert switched.dit.config.zero_cond_t is True
    assert all(block.zero_cond_t for block in switched.dit.transformer_blocks)
    # The reference tokens are now modulated as at timestep 0, which changes what the same weights draw.
    assert (render(plain, [RED], 1.0) - render(switched, [RED], 1.0)).abs().max() > 1e-4


def test_the_processor_comes_from_the_transformers_repository(base, tiny_root):
    pipe = QwenImagePipeline.from_pretrained(torch.float32, "cpu", [
        *configs(QWEN_IMAGE_EDIT_2509_MODEL_ID, "dit"), *configs(QWEN_IMAGE_MODEL_ID, "text_encoder", "vae")])
    assert pipe.processor is not None
    assert pipe.processor_config == ModelConfig(model_id=QWEN_IMAGE_EDIT_2509_MODEL_ID,
                                                origin_file_pattern="processor/")
    assert pipe.processor.image_processor.merge_size == 2 and pipe.processor.tokenizer is not None
    # Text-to-image repositories have no processor; it is only looked for when an edit needs it.
    text_to_image = QwenImagePipeline.from_pretrained(torch.float32, "cpu", configs(QWEN_IMAGE_MODEL_ID, "dit"))
    assert text_to_image.processor is None
    explicit = ModelConfig(path=str(tiny_root / QWEN_IMAGE_EDIT_MODEL_ID / "processor"))
    given = QwenImagePipeline.from_pretrained(torch.float32, "cpu", configs(QWEN_IMAGE_MODEL_ID, "dit"),
                                              processor_config=explicit)
    assert given.processor is not None and given.processor_config == explicit


def test_a_folder_without_a_processor_is_refused(base, tiny_root):
    folder = ModelConfig(path=str(tiny_root / QWEN_IMAGE_MODEL_ID / "tokenizer"))
    with pytest.raises(ModelLoadError, match="preprocessor_config.json"):
        QwenImagePipeline.from_pretrained(torch.float32, "cpu", configs(QWEN_IMAGE_MODEL_ID, "dit"),
                                          processor_config=folder)


def test_companions_include_the_processor_only_for_edits(base, tiny_root):
    models = [*configs(QWEN_IMAGE_EDIT_MODEL_ID, "dit"), *configs(QWEN_IMAGE_MODEL_ID, "text_encoder")]
    tokenizer = ModelConfig(model_id=QWEN_IMAGE_MODEL_ID, origin_file_pattern="tokenizer/")
    processor = ModelConfig(model_id=QWEN_IMAGE_EDIT_MODEL_ID, origin_file_pattern="processor/")
    assert QwenImagePipeline.companion_configs(models) == [tokenizer]
    assert QwenImagePipeline.companion_configs(models, inputs=["edit_image"]) == [tokenizer, processor]
    own = ModelConfig(path=str(tiny_root / QWEN_IMAGE_EDIT_MODEL_ID / "processor"))
    assert QwenImagePipeline.companion_configs(models, inputs=["edit_image"], processor_config=own) == [tokenizer]


def test_units_do_what_they_declare_with_edit_images(base):
    from tests.pipelines.declarations import check_declarations

    pipe = ours(QWEN_IMAGE_EDIT_2509_MODEL_ID)
    pipe.scheduler.set_timesteps(2, 1.0, image_seq_len=4)
    shared = {"cfg_scale": 2.0, "height": 32, "width": 32, "seed": 0, "rand_device": "cpu", "denoising_strength": 1.0,
              "input_image": Image.new("RGB", (32, 32)), "edit_image": [RED, TEAL], "max_sequence_length": 64}
    assert check_declarations(pipe, shared, {"prompt": PROMPT}, {"negative_prompt": NEGATIVE}) == {}


def test_edit_latents_follow_each_images_aspect_ratio(base):
    pipe = ours(QWEN_IMAGE_EDIT_2509_MODEL_ID)
    shared, _, _ = pipe.run_units({"height": 32, "width": 32, "seed": 0, "edit_image": [RED, TEAL]},
                                  {"prompt": PROMPT}, {})
    # 96 x 96 pixels at each image's aspect ratio, sides multiples of 32, then the VAE's factor 8.
    assert [tuple(latents.shape) for latents in shared["edit_latents"]] == [(1, 16, 8, 16), (1, 16, 16, 8)]


@pytest.mark.parametrize(("edit_image", "message"), [("photos/1.jpg", "add edit_image to --data_file_keys"),
                                                     ([], "empty list"), ([RED, 3], "holds a int")])
def test_bad_edit_images_are_named(base, edit_image, message):
    pipe = ours(QWEN_IMAGE_EDIT_MODEL_ID)
    with pytest.raises(ValueError, match=message):
        render(pipe, edit_image, 1.0)


def test_a_processor_not_on_disk_yet_is_loaded_at_the_first_edit(tiny_root, tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tmp_path))
    repo = tmp_path / QWEN_IMAGE_EDIT_MODEL_ID
    shutil.copytree(tiny_root / QWEN_IMAGE_EDIT_MODEL_ID, repo, ignore=shutil.ignore_patterns("processor"))
    pipe = ours(QWEN_IMAGE_EDIT_MODEL_ID)
    assert pipe.processor is None  # nothing downloaded for a pipeline that may never edit
    shutil.copytree(tiny_root / QWEN_IMAGE_EDIT_MODEL_ID / "processor", repo / "processor")  # as a download would
    render(pipe, RED, 1.0)
    assert pipe.processor is not None
