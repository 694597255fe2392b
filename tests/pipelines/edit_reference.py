"""diffusers' Qwen-Image edit pipelines built from a tiny Edit repo, for the parity and LoRA-loading tests.

Without torchvision, transformers cannot build ``Qwen2VLProcessor``'s video part, so diffusers' own
``from_pretrained`` cannot load an Edit repository's ``processor/`` folder; the pipelines are assembled from their
parts instead, with the processor this package loads from that folder.
"""

from pathlib import Path

from diffsynth.core.loader import ModelConfig
from diffsynth.pipelines.qwen_image.edit import load_processor

# diffusers' area for the edit images (hard-coded in QwenImageEditPipeline, VAE_IMAGE_SIZE in the Plus pipeline).
REFERENCE_EDIT_PIXELS = 1024 * 1024


def diffusers_edit_pipeline(pipeline_class: type, repo: Path, processor=None):
    """``pipeline_class`` (``QwenImageEditPipeline`` or ``QwenImageEditPlusPipeline``) from the repo's components."""
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    pipe = pipeline_class(
        transformer=QwenImageTransformer2DModel.from_pretrained(repo / "transformer"),
        vae=AutoencoderKLQwenImage.from_pretrained(repo / "vae"),
        text_encoder=Qwen2_5_VLForConditionalGeneration.from_pretrained(repo / "text_encoder"),
        tokenizer=AutoTokenizer.from_pretrained(repo / "tokenizer"),
        processor=processor or load_processor(ModelConfig(path=str(repo / "processor"))),
        scheduler=FlowMatchEulerDiscreteScheduler.from_pretrained(repo / "scheduler"),
    )  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    return pipe


def shrink_reference_sizes(monkeypatch, edit_pixels: int, condition_pixels: int) -> None:
    """Lowers diffusers' edit image areas (1024 x 1024 for the VAE, 384 x 384 for 2509's encoder) for one test."""
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit, pipeline_qwenimage_edit_plus

    full_size = pipeline_qwenimage_edit.calculate_dimensions

    def edit_dimensions(target_area, ratio):
        return full_size(edit_pixels if target_area == REFERENCE_EDIT_PIXELS else target_area, ratio)

    monkeypatch.setattr(pipeline_qwenimage_edit, "calculate_dimensions", edit_dimensions)
    monkeypatch.setattr(pipeline_qwenimage_edit_plus, "VAE_IMAGE_SIZE", edit_pixels)
    monkeypatch.setattr(pipeline_qwenimage_edit_plus, "CONDITION_IMAGE_SIZE", condition_pixels)
