"""Wan2.2-Animate-2: the inputs of ``WanAnimate2Transformer3DModel`` and its two passes per denoising step, as the
reference pipeline (DiffSynth-Studio's ``WanVideoUnit_Animate2*`` units) builds them.

The call takes the reference's names:

- ``animate2_reference_image``: the character. Its latent (under a 4-channel mask of ones) is the first latent frame
  of the generated video, which the output drops; its CLIP features go to the generation pass's image cross-attention.
- ``animate2_reference_video``: the driving video, at least ``num_frames`` frames. Its latents, with a mask of ones,
  run through the transformer in the reference pass (``kv_cache_mode="extract"``, diffusers' fixed timestep 1), with
  the CLIP features of its first frame and the prompt ``animate2_prompt_ref`` (default " ", the reference's), and fill
  one K/V cache per block.
- ``animate2_refert_images``: frames that continue a previous clip (the first pixel frames of the condition, masked
  as known); default none.

Each step then runs the generation pass (``"cached"``) over the noisy latents, which attends to that cache. In
training both passes run inside the step with gradients, as the reference's ``forward_origin`` does, so a LoRA on
``self_attn.q,k,v`` trains the reference pass too; in inference the cache is computed once per call. Frames are
resized with PIL's default filter, as the reference does. Off CUDA the generation pass's block mask is applied densely
(``animate2_attention.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from PIL import Image

from ...diffusion.base_pipeline import PipelineUnit
from ..common import image_to_tensor, video_to_tensor
from .animate import fold_frame_mask
from .animate2_attention import use_attention_for
from .image import MASK_CHANNELS, check_image
from .units import PromptEmbedderUnit, normalised_latents

if TYPE_CHECKING:
    from .pipeline import WanVideoPipeline

ANIMATE2_INPUTS = ("animate2_reference_image", "animate2_reference_video", "animate2_refert_images")
# The reference's default prompt of the reference pass.
REFERENCE_PROMPT = " "
# Pixels per token side (8x VAE, 2x2 patch): diffusers' origin_area is in these pixels (256 per token).
_PIXELS_PER_TOKEN = 16


def _resized(frames: Sequence[Image.Image], width: int, height: int) -> list[Image.Image]:
    return [frame.convert("RGB").resize((width, height)) for frame in frames]


class Animate2Unit(PipelineUnit):
    """Encodes the Animate-2 inputs with the VAE: ``animate2_y`` (the character frame, then the condition of the
    video's frames), ``animate2_condition`` (the reference video's latents, a mask of ones and its latents again: the
    reference pass's 36 channels), and in training ``input_latents`` with the character's latent as first frame."""

    def __init__(self) -> None:
        super().__init__(input_params=(*ANIMATE2_INPUTS, "height", "width", "num_frames", "input_latents"),
                         output_params=("animate2_y", "animate2_condition", "input_latents"),
                         onload_model_names=("vae",))

    def process(self, pipe: WanVideoPipeline, animate2_reference_image: Image.Image | None,
                animate2_reference_video: Sequence[Image.Image] | None,
                animate2_refert_images: Sequence[Image.Image] | None, height: int, width: int, num_frames: int,
                input_latents: torch.Tensor | None) -> dict:
        if not check_animate2_inputs(pipe, animate2_reference_image, animate2_reference_video, num_frames):
            return {"animate2_y": None, "animate2_condition": None, "input_latents": input_latents}
        character = normalised_latents(pipe, image_to_tensor(_resized([animate2_reference_image], width, height)[0])
                                       .unsqueeze(2))
        known = len(animate2_refert_images or ())
        frames = torch.zeros(1, 3, num_frames, height, width)
        if known:
            frames[:, :, :known] = video_to_tensor(_resized(animate2_refert_images[:num_frames], width, height))
        latents = normalised_latents(pipe, frames)
        size = latents.shape[3:]
        mask = torch.zeros(1, 1, num_frames, *size)
        mask[:, :, :known] = 1
        y = torch.cat([torch.cat([torch.ones_like(character[:, :MASK_CHANNELS]), character], dim=1),
                       torch.cat([fold_frame_mask(mask), latents], dim=1)], dim=2)
        video = normalised_latents(pipe, video_to_tensor(_resized(animate2_reference_video[:num_frames], width,
                                                                  height)))
        condition = torch.cat([video, torch.ones_like(video[:, :MASK_CHANNELS]), video], dim=1)
        if input_latents is not None:
            input_latents = torch.cat([character.to(input_latents), input_latents], dim=2)
        return {"animate2_y": y.to(pipe.torch_dtype), "animate2_condition": condition.to(pipe.torch_dtype),
                "input_latents": input_latents}


def check_animate2_inputs(pipe: WanVideoPipeline, image: Image.Image | None, video: Sequence[Image.Image] | None,
                          num_frames: int) -> bool:
    """Whether the Animate-2 inputs are given (both, for an Animate-2 transformer or a stage without one).

    Raises:
        ValueError: One is given without the other, they are given to another transformer, an Animate-2 transformer
            lacks them, or the video is shorter than ``num_frames``.
    """
    takes = pipe.takes_animate2()
    if image is None and video is None and not takes:
        return False
    if takes is False:
        raise ValueError(f"animate2_reference_image / animate2_reference_video given, but {pipe.describe_transformer()} "
                         "is not Wan2.2-Animate-2's; load Wan-AI/Wan2.2-Animate-2-14B or drop them")
    if image is None or video is None:
        raise ValueError("Wan2.2-Animate-2 renders from animate2_reference_image (the character) and "
                         "animate2_reference_video (the driving video): pass both")
    check_image(image, "animate2_reference_image", "the character")
    if len(video) < num_frames:
        raise ValueError(f"animate2_reference_video has {len(video)} frames, fewer than num_frames={num_frames}; "
                         "pass a longer video or a smaller num_frames (4k+1)")
    return True


def animate2_sample_problems(pipe: WanVideoPipeline, inputs: set[str]) -> list[str]:
    """What is wrong with a sample's ``inputs`` for the loaded transformer: Animate-2 inputs for another model, or an
    Animate-2 model without its character image and driving video."""
    given = sorted(inputs & set(ANIMATE2_INPUTS))
    if given and pipe.takes_animate2() is False:
        return [f"{', '.join(given)} given, but {pipe.describe_transformer()} is not Wan2.2-Animate-2"]
    if pipe.takes_animate2() and not set(ANIMATE2_INPUTS[:2]) <= inputs:
        return ['Wan2.2-Animate-2 renders from "animate2_reference_image" and "animate2_reference_video": give both']
    return []


class Animate2ClipUnit(PipelineUnit):
    """The CLIP features of the character (``animate2_clip``) and of the reference video's first frame
    (``animate2_clip_ref``), each resized to the video's size first, as the reference does."""

    def __init__(self) -> None:
        super().__init__(input_params=("animate2_reference_image", "animate2_reference_video", "height", "width"),
                         output_params=("animate2_clip", "animate2_clip_ref"), onload_model_names=("image_encoder",))

    def process(self, pipe: WanVideoPipeline, animate2_reference_image: Image.Image | None,
                animate2_reference_video: Sequence[Image.Image] | None, height: int, width: int) -> dict:
        if animate2_reference_image is None or animate2_reference_video is None:
            return {"animate2_clip": None, "animate2_clip_ref": None}
        if pipe.image_encoder is None or pipe.image_processor is None:
            raise ValueError("Wan2.2-Animate-2 reads CLIP features of animate2_reference_image; add "
                             "'Wan-AI/Wan2.2-Animate-2-14B:videomodel/Wan-AI/models_clip_open-clip-xlm-roberta-large-"
                             "vit-huge-14.pth' to the model configs")
        images = _resized([animate2_reference_image, animate2_reference_video[0]], width, height)
        pixels = pipe.image_processor(images=images, return_tensors="pt").pixel_values
        hidden = pipe.image_encoder(pixel_values=pixels.to(pipe.device, pipe.image_encoder.dtype),
                                    output_hidden_states=True).hidden_states[-2].to(pipe.torch_dtype)
        return {"animate2_clip": hidden[:1], "animate2_clip_ref": hidden[1:]}


class Animate2PromptUnit(PipelineUnit):
    """The UMT5 embeddings of ``animate2_prompt_ref`` (the reference pass's prompt; default " ")."""

    def __init__(self) -> None:
        super().__init__(input_params=("animate2_prompt_ref", "animate2_reference_video", "max_sequence_length"),
                         output_params=("animate2_prompt_emb",), onload_model_names=("text_encoder",))

    def process(self, pipe: WanVideoPipeline, animate2_prompt_ref: str | None,
                animate2_reference_video: Sequence[Image.Image] | None, max_sequence_length: int | None) -> dict:
        if animate2_reference_video is None:
            return {"animate2_prompt_emb": None}
        prompt = REFERENCE_PROMPT if animate2_prompt_ref is None else animate2_prompt_ref
        encoded = PromptEmbedderUnit().process(pipe, prompt=prompt, max_sequence_length=max_sequence_length)
        return {"animate2_prompt_emb": encoded["prompt_emb"]}


def new_kv_cache(dit: torch.nn.Module) -> Any:
    """An empty ``WanAnimate2KVCache`` for ``dit``: one call's reference pass fills it, every step reads it."""
    from diffusers.models.transformers.transformer_wan_animate_2 import WanAnimate2KVCache

    return WanAnimate2KVCache(len(dit.blocks))


def _grid(dit: torch.nn.Module, latents: torch.Tensor) -> torch.Tensor:
    patch = dit.config.patch_size
    return torch.tensor([[size // step for size, step in zip(latents.shape[2:], patch)]])


def animate2_prediction(dit: torch.nn.Module, latents: torch.Tensor, timestep: torch.Tensor, prompt_emb: torch.Tensor,
                        animate2_y: torch.Tensor | None = None, animate2_condition: torch.Tensor | None = None,
                        animate2_clip: torch.Tensor | None = None, animate2_clip_ref: torch.Tensor | None = None,
                        animate2_prompt_emb: torch.Tensor | None = None, animate2_kv_cache: Any = None,
                        animate2_unconditional: bool = False, **_: Any) -> torch.Tensor:
    """The generation pass's velocity for ``latents`` ``(1, C, F, h, w)``, after the reference pass fills
    ``animate2_kv_cache`` (a ``WanAnimate2KVCache``) when it is empty or None (a fresh one: training, where the
    reference pass runs with gradients every step). ``animate2_unconditional`` is the negative CFG branch (diffusers'
    ``is_uncondtion``).

    Raises:
        ValueError: The Animate-2 inputs are missing (a call or a cache without them).
    """
    if animate2_y is None or animate2_condition is None:
        raise ValueError("the Wan2.2-Animate-2 transformer renders from animate2_reference_image and "
                         "animate2_reference_video, and this state has neither: pass both (training: add them to "
                         "--extra_inputs and the dataset, and rebuild a --task sft:data_process cache made without "
                         "them)")
    device, dtype = latents.device, dit.dtype
    cache = new_kv_cache(dit) if animate2_kv_cache is None else animate2_kv_cache
    condition = animate2_condition.to(device, dtype)
    reference_grid = _grid(dit, condition)
    frames, height, width = reference_grid[0].tolist()
    use_attention_for(dit, device, (frames, height * width))
    timestep = torch.as_tensor(timestep, device=device, dtype=torch.float32).reshape(-1)[:1]
    channels = latents.shape[1]
    if cache.get(0).key is None:
        dit([condition[0, :channels]], timestep, [animate2_prompt_emb[0].to(dtype)], [condition[0, channels:]], cache,
            "extract", frames * height * width, _to(animate2_clip_ref, dtype), offset_grid_sizes=reference_grid)
    grid = _grid(dit, latents)
    output = dit([latents[0].to(dtype)], timestep, [prompt_emb[0].to(dtype)], [animate2_y[0].to(device, dtype)], cache,
                 "cached", int(grid.prod()), _to(animate2_clip, dtype), reference_grid_sizes=reference_grid,
                 origin_len=(frames - 1) * 4 + 1, origin_area=[height * _PIXELS_PER_TOKEN, width * _PIXELS_PER_TOKEN],
                 is_uncondtion=animate2_unconditional, return_dict=False)[0]
    return output[0].unsqueeze(0)


def _to(tensor: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(dtype)
