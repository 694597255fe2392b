"""Wan text-to-video (and video-to-video) as declared units over the diffusers / transformers models.

Models, by pipeline name: ``dit`` (``WanTransformer3DModel``), ``vae`` (``AutoencoderKLWan``), ``text_encoder``
(``UMT5EncoderModel``) and ``tokenizer``, loaded from a diffusers-layout repository such as
``Wan-AI/Wan2.1-T2V-1.3B-Diffusers``. The computation follows diffusers' ``WanPipeline`` (prompt cleaning, UMT5
embeddings zero-padded to ``max_sequence_length``, latents ``(1, 16, (frames - 1) / 4 + 1, height / 8, width / 8)``,
plain CFG, latent de-normalisation), so with the same scheduler both produce the same video.

The schedule differs by default: this pipeline samples and trains with the flow-matching Euler schedule at shift 5
(the reference trainer's choice for Wan), while the diffusers repositories ship ``UniPCMultistepScheduler`` with
``flow_shift=3``. To reproduce diffusers exactly, set ``pipe.scheduler = DiffusersScheduler(that scheduler)``.
"""

from __future__ import annotations

import html
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from ..core.loader import ModelConfig
from ..diffusion.base_pipeline import PipelineUnit
from .common import (LatentsUnit, ShapeCheckUnit, TextToLatentPipeline, draw_noise, image_to_tensor, round_size,
                     tensor_to_images)

__all__ = ["ModelConfig", "WanVideoPipeline", "lora_to_original_wan", "save_video"]

logger = logging.getLogger(__name__)

VAE_SCALE = 8
VAE_TEMPORAL_SCALE = 4

MODEL_ROLES = {
    "WanTransformer3DModel": "dit",
    "AutoencoderKLWan": "vae",
    "UMT5EncoderModel": "text_encoder",
}


def clean_prompt(text: str) -> str:
    """Unescapes HTML entities and collapses whitespace, as diffusers does before tokenising (ftfy aside)."""
    try:
        import ftfy

        text = ftfy.fix_text(text)
    except ImportError:
        pass
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


def round_frames(num_frames: int) -> int:
    """The largest count of the form 4k+1 not above ``num_frames`` (at least 1)."""
    return max(1, (int(num_frames) - 1) // VAE_TEMPORAL_SCALE * VAE_TEMPORAL_SCALE + 1)


def video_to_tensor(frames: Sequence[Image.Image]) -> torch.Tensor:
    """RGB frames as a ``(1, 3, frames, H, W)`` float32 tensor in ``[-1, 1]``."""
    return torch.stack([image_to_tensor(frame)[0] for frame in frames], dim=1).unsqueeze(0)


def save_video(frames: Sequence[Image.Image], path: str | Path, fps: int = 15, quality: int = 8) -> Path:
    """Writes frames as an ``.mp4`` (PyAV; H.264, or MPEG-4 Part 2 where FFmpeg lacks libx264) or an animated
    ``.gif`` (Pillow), chosen by the suffix.

    Args:
        frames: PIL images of one size.
        path: Output file; ``.mp4`` or ``.gif``.
        fps: Frames per second.
        quality: For H.264, 0 (smallest file) to 10 (best); mapped to the encoder's CRF.
    """
    from ..core.files import atomic_write

    path = Path(path)
    if path.suffix.lower() == ".gif":
        return atomic_write(path, lambda temporary: frames[0].save(
            temporary, format="GIF", save_all=True, append_images=list(frames[1:]), duration=int(1000 / fps), loop=0))
    if path.suffix.lower() != ".mp4":
        raise ValueError(f"save_video: {path} must end in .mp4 or .gif")

    def write(temporary: Path) -> None:
        import av

        with av.open(str(temporary), mode="w", format="mp4") as container:
            try:
                stream = container.add_stream("libx264", rate=fps)
            except (ValueError, av.error.FFmpegError):  # an FFmpeg build without libx264
                stream = container.add_stream("mpeg4", rate=fps)
            stream.width, stream.height = frames[0].size
            stream.pix_fmt = "yuv420p"
            if stream.codec_context.name == "libx264":
                stream.options = {"crf": str(round(51 - 4.6 * quality))}
            for frame in frames:
                container.mux(stream.encode(av.VideoFrame.from_image(frame.convert("RGB"))))
            container.mux(stream.encode())

    return atomic_write(path, write)


# diffusers module paths of WanTransformer3DModel -> the original Wan code's, for the layers a LoRA wraps.
_ORIGINAL_BLOCK_NAMES = {
    "attn1.to_q": "self_attn.q", "attn1.to_k": "self_attn.k", "attn1.to_v": "self_attn.v", "attn1.to_out.0": "self_attn.o",
    "attn2.to_q": "cross_attn.q", "attn2.to_k": "cross_attn.k", "attn2.to_v": "cross_attn.v",
    "attn2.to_out.0": "cross_attn.o", "attn2.add_k_proj": "cross_attn.k_img", "attn2.add_v_proj": "cross_attn.v_img",
    "ffn.net.0.proj": "ffn.0", "ffn.net.2": "ffn.2",
}  # fmt: skip
_ORIGINAL_TOP_NAMES = {
    "patch_embedding": "patch_embedding", "proj_out": "head.head",
    "condition_embedder.text_embedder.linear_1": "text_embedding.0",
    "condition_embedder.text_embedder.linear_2": "text_embedding.2",
    "condition_embedder.time_embedder.linear_1": "time_embedding.0",
    "condition_embedder.time_embedder.linear_2": "time_embedding.2",
    "condition_embedder.time_proj": "time_projection.1",
}  # fmt: skip
_LORA_KEY = re.compile(r"^(?:transformer\.)?(?P<module>.+)\.(?P<part>lora_[AB]\.(?:weight|bias))$")
_BLOCK = re.compile(r"^blocks\.(?P<index>\d+)\.(?P<layer>.+)$")


def lora_to_original_wan(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Renames a diffusers-format Wan LoRA (as the trainer saves it) to the original Wan code's key names.

    ``transformer.blocks.3.attn1.to_q.lora_A.weight`` becomes ``diffusion_model.blocks.3.self_attn.q.lora_A.weight``,
    the naming that tools built on the original Wan code (ComfyUI, DiffSynth-Studio) load.

    Raises:
        ValueError: A key is not a LoRA weight, or names a layer the original code has no counterpart for.
    """
    renamed = {}
    for key, tensor in state_dict.items():
        match = _LORA_KEY.match(key)
        if match is None:
            raise ValueError(f"{key!r} is not a LoRA weight (module.lora_A / lora_B); pass a Wan LoRA file")
        original = _original_module_name(match["module"])
        if original is None:
            raise ValueError(f"{key!r}: layer {match['module']!r} has no counterpart in the original Wan code's naming")
        renamed[f"diffusion_model.{original}.{match['part']}"] = tensor
    return renamed


def _original_module_name(module: str) -> str | None:
    block = _BLOCK.match(module)
    if block is None:
        return _ORIGINAL_TOP_NAMES.get(module)
    layer = _ORIGINAL_BLOCK_NAMES.get(block["layer"])
    return None if layer is None else f"blocks.{block['index']}.{layer}"


class FrameCountUnit(PipelineUnit):
    """Rounds ``num_frames`` down to the form 4k+1 that the VAE's 4x temporal compression needs, with a warning."""

    def __init__(self) -> None:
        super().__init__(input_params=("num_frames",), output_params=("num_frames",))

    def process(self, pipe: WanVideoPipeline, num_frames: int) -> dict:
        if not isinstance(num_frames, int) or num_frames < 1:
            raise ValueError(f"num_frames={num_frames!r} must be a positive frame count of the form 4k+1, e.g. 81")
        rounded = round_frames(num_frames)
        if rounded != num_frames:
            logger.warning("num_frames=%d is not of the form 4k+1; using %d", num_frames, rounded)
        return {"num_frames": rounded}


class NoiseUnit(PipelineUnit):
    """Draws the initial noise ``(1, 16, (num_frames - 1) / 4 + 1, height / 8, width / 8)``."""

    def __init__(self) -> None:
        super().__init__(input_params=("height", "width", "num_frames", "seed", "rand_device"),
                         output_params=("noise",))

    def process(self, pipe: WanVideoPipeline, height: int, width: int, num_frames: int, seed: int | None,
                rand_device: str | torch.device | None) -> dict:
        latent_frames = (num_frames - 1) // VAE_TEMPORAL_SCALE + 1
        shape = (1, pipe.latent_channels, latent_frames, height // VAE_SCALE, width // VAE_SCALE)
        return {"noise": draw_noise(pipe, shape, seed, rand_device)}


class InputVideoEmbedderUnit(PipelineUnit):
    """Encodes ``input_video`` (a list of frames) with the Wan VAE into normalised latents.

    Frames are resized to ``height x width`` if they differ, and the first ``num_frames`` are used. The VAE's
    distribution mode is used rather than a sample, so a cached latent equals the one a single-stage run computes.
    """

    def __init__(self) -> None:
        super().__init__(input_params=("input_video", "height", "width", "num_frames"),
                         output_params=("input_latents",), onload_model_names=("vae",))

    def process(self, pipe: WanVideoPipeline, input_video: Sequence[Image.Image] | None, height: int, width: int,
                num_frames: int) -> dict:
        if input_video is None:
            return {}
        if len(input_video) < num_frames:
            raise ValueError(f"input_video has {len(input_video)} frames, fewer than num_frames={num_frames}; pass "
                             f"num_frames={round_frames(len(input_video))} or a longer video")
        frames = [frame if frame.size == (width, height) else frame.resize((width, height), Image.Resampling.LANCZOS)
                  for frame in input_video[:num_frames]]
        pixels = video_to_tensor(frames).to(pipe.device, pipe.vae.dtype)
        latents = pipe.vae.encode(pixels).latent_dist.mode()
        mean, inverse_std = pipe.latent_statistics(latents)
        return {"input_latents": ((latents - mean) * inverse_std).to(pipe.torch_dtype)}


class PromptEmbedderUnit(PipelineUnit):
    """Encodes the prompt (and, with CFG, the negative prompt) with UMT5.

    The embeddings of the real tokens are kept and zero-padded to ``max_sequence_length``, as the model was trained.
    """

    def __init__(self) -> None:
        super().__init__(separate_cfg=True, input_params=("max_sequence_length",),
                         input_params_posi={"prompt": "prompt"}, input_params_nega={"prompt": "negative_prompt"},
                         output_params=("prompt_emb",), onload_model_names=("text_encoder",))

    def process(self, pipe: WanVideoPipeline, prompt: str | None, max_sequence_length: int | None) -> dict:
        if pipe.text_encoder is None or pipe.tokenizer is None:
            raise ValueError("encoding a prompt needs the text encoder and tokenizer; add "
                             "'<model_id>:text_encoder/model*.safetensors' to the model configs")
        length = max_sequence_length or 512
        tokens = pipe.tokenizer([clean_prompt(prompt or "")], padding="max_length", max_length=length,
                                truncation=True, add_special_tokens=True, return_attention_mask=True,
                                return_tensors="pt")
        ids, mask = tokens.input_ids.to(pipe.device), tokens.attention_mask.to(pipe.device)
        hidden = pipe.text_encoder(ids, mask).last_hidden_state
        kept = int(mask.gt(0).sum())
        embeddings = torch.zeros_like(hidden)
        embeddings[:, :kept] = hidden[:, :kept]
        return {"prompt_emb": embeddings.to(pipe.torch_dtype)}


class WanVideoPipeline(TextToLatentPipeline):
    """Wan video generation and the computation its training shares; see the module docstring."""

    denoising_model_names = ("dit",)
    model_roles = MODEL_ROLES
    model_fn_params = ("prompt_emb",)
    training_columns = ("video", "prompt")
    # The reference's Wan commands name layers as in the original Wan code; suffixes match self- and cross-attention.
    lora_target_aliases = {"q": "to_q", "k": "to_k", "v": "to_v", "o": "to_out.0", "ffn.0": "ffn.net.0.proj",
                           "ffn.2": "ffn.net.2"}
    scheduler_preset = "wan"

    def __init__(self, device: str | torch.device = "cpu", torch_dtype: torch.dtype = torch.bfloat16,
                 offload_device: str | torch.device = "cpu", manage_model_devices: bool = True) -> None:
        super().__init__(device=device, torch_dtype=torch_dtype, offload_device=offload_device,
                         manage_model_devices=manage_model_devices)
        self.units = [ShapeCheckUnit(), FrameCountUnit(), NoiseUnit(), InputVideoEmbedderUnit(), LatentsUnit(),
                      PromptEmbedderUnit()]

    def training_inputs(self, sample: dict[str, Any], extra_inputs: Sequence[str] = ()) -> tuple[dict, dict, dict]:
        """The unit state for one dataset sample (``video`` frames, ``prompt``, and the ``extra_inputs`` columns)."""
        frames = sample["video"]
        inputs_shared = {
            "input_video": frames, "height": frames[0].height, "width": frames[0].width, "num_frames": len(frames),
            "cfg_scale": 1, "seed": None, "rand_device": "cpu", "denoising_strength": 1.0, "max_sequence_length": 512,
            **{name: sample[name] for name in extra_inputs},
        }  # fmt: skip
        return inputs_shared, {"prompt": sample["prompt"]}, {}

    def model_fn(self, latents: torch.Tensor, timestep: torch.Tensor | float, prompt_emb: torch.Tensor,
                 **_: Any) -> torch.Tensor:
        """The transformer's velocity prediction for ``latents`` at ``timestep`` (scale 0 to 1000)."""
        timestep = torch.as_tensor(timestep, device=latents.device).reshape(-1).expand(latents.shape[0])
        return self.dit(hidden_states=latents.to(self.dit.dtype), timestep=timestep, encoder_hidden_states=prompt_emb,
                        return_dict=False)[0]

    def decode(self, inputs_shared: dict, inputs_posi: dict, inputs_nega: dict) -> torch.Tensor:
        """The final latents through the VAE, as ``(B, frames, 3, H, W)`` values in ``[0, 1]``."""
        self.load_models_to_device(["vae"])
        latents = inputs_shared["latents"].to(self.vae.dtype)
        mean, inverse_std = self.latent_statistics(latents)
        video = self.vae.decode(latents / inverse_std + mean, return_dict=False)[0]
        return (video / 2 + 0.5).clamp(0, 1).permute(0, 2, 1, 3, 4)

    @torch.no_grad()
    def __call__(self, prompt: str, negative_prompt: str = "", cfg_scale: float = 5.0,
                 input_video: Sequence[Image.Image] | None = None, denoising_strength: float = 1.0,
                 height: int = 480, width: int = 832, num_frames: int = 81, seed: int | None = None,
                 rand_device: str = "cpu", num_inference_steps: int = 50, max_sequence_length: int = 512,
                 output_type: str = "pil", progress_bar: bool = True) -> list[Image.Image] | torch.Tensor:
        """Generates one video.

        Args:
            prompt: What to show.
            negative_prompt: What to steer away from; used when ``cfg_scale`` is not 1.
            cfg_scale: Classifier-free guidance scale; 1 turns CFG off and halves the work per step.
            input_video: Start from these frames instead of pure noise (video-to-video).
            denoising_strength: With ``input_video``: how much of the schedule to run (1 ignores the video).
            height: Frame height in pixels, rounded to a multiple of 16.
            width: Frame width in pixels, rounded to a multiple of 16.
            num_frames: Frame count, rounded down to the form 4k+1.
            seed: Noise seed; ``None`` draws from torch's global generator.
            rand_device: Device the noise is drawn on.
            num_inference_steps: Denoising steps.
            max_sequence_length: Prompt tokens the text encoder sees (padded to this length).
            output_type: ``"pil"`` for a list of frames, ``"pt"`` for a ``(1, frames, 3, H, W)`` tensor in ``[0, 1]``.
            progress_bar: Show a progress bar over the steps.
        """
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be one string, got {type(prompt).__name__}; call once per prompt")
        if output_type not in ("pil", "pt"):
            raise ValueError(f"output_type={output_type!r} must be 'pil' or 'pt'")
        latent_shape = (1, self.latent_channels, (round_frames(num_frames) - 1) // VAE_TEMPORAL_SCALE + 1,
                        round_size(height) // VAE_SCALE, round_size(width) // VAE_SCALE)
        self.set_inference_timesteps(num_inference_steps, denoising_strength, latent_shape=latent_shape)
        inputs_shared = {
            "cfg_scale": cfg_scale, "input_video": input_video, "denoising_strength": denoising_strength,
            "height": height, "width": width, "num_frames": num_frames, "seed": seed, "rand_device": rand_device,
            "max_sequence_length": max_sequence_length,
        }  # fmt: skip
        video = self.denoise(inputs_shared, {"prompt": prompt}, {"negative_prompt": negative_prompt},
                             progress_bar=progress_bar)
        return video if output_type == "pt" else tensor_to_images(video[0])
