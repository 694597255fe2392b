"""Wan text-to-video, video-to-video and image-to-video as declared units over the diffusers / transformers models.

Models, by pipeline name: ``dit`` (``WanTransformer3DModel``), ``vae`` (``AutoencoderKLWan``), ``text_encoder``
(``UMT5EncoderModel``) and ``tokenizer``, loaded from a diffusers-layout repository such as
``Wan-AI/Wan2.1-T2V-1.3B-Diffusers`` or from an original release such as ``Wan-AI/Wan2.1-T2V-1.3B`` (a ``WanModel``
config and ``.pth`` encoders, read by ``original.py`` into the same classes; the tokenizer is then the
repository's ``google/umt5-xxl/``). The computation follows diffusers' ``WanPipeline`` (prompt cleaning, UMT5
embeddings zero-padded to ``max_sequence_length``, latents ``(1, C, (frames - 1) / 4 + 1, height / s, width / s)``
with the VAE's channels ``C`` and spatial compression ``s``, plain CFG, latent de-normalisation), so with the same
scheduler both produce the same video.

The units of the other inputs (frame count, noise, input video, prompt) are in ``units.py``. Image
conditioning (``wan_image.py``) follows diffusers' ``WanImageToVideoPipeline``: ``y`` for Wan2.1 / Wan2.2
image-to-video (with CLIP features, ``image_encoder`` and ``image_processor``, for Wan2.1), and for Wan2.2 TI2V-5B
(48 latent channels, the 16x Wan2.2 VAE) the image's latents as the first latent frame with per-token timesteps (zero
on that frame), as diffusers does with ``expand_timesteps``.

Wan2.2 A14B has two experts: the first transformer loaded is ``dit`` (high noise), a second one ``dit2`` (low noise).
With both, each step runs ``dit`` while the timestep is at or above ``boundary_ratio * 1000`` and ``dit2`` below, as
diffusers' pipelines do with ``transformer_2``; the default ratio is the release's (0.875 for text-to-video, 0.9 for
image-to-video, ``boundary`` in Wan-Video/Wan2.2's ``wan/configs``). Training follows the reference: one expert per
run, with ``--min_timestep_boundary`` / ``--max_timestep_boundary`` selecting its timesteps.

The schedule differs by default: this pipeline samples and trains with the flow-matching Euler schedule at shift 5
(the reference trainer's choice for Wan), while the diffusers repositories ship ``UniPCMultistepScheduler`` with
``flow_shift=3``. To reproduce diffusers exactly, set ``pipe.scheduler = DiffusersScheduler(that scheduler)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from ...core.data.cells import positive_integer, real, text
from ...core.loader import ModelConfig
from ..common import (
    LatentsUnit,
    ShapeCheckUnit,
    TextToLatentPipeline,
    check_call_inputs,
    round_size,
    sibling_folder,
    tensor_to_images,
)
from .animate import AnimateUnit, animate_inputs, animate_sample_problems
from .animate2 import (
    Animate2ClipUnit,
    Animate2PromptUnit,
    Animate2Unit,
    animate2_prediction,
    animate2_sample_problems,
    new_kv_cache,
)
from .camera import CAMERA_SPEED
from .fun_control import FunCameraUnit, FunControlUnit, FunReferenceUnit, fun_kind, fun_sample_problems
from .image import ImageConditionUnit, ImageEmbedderUnit, clip_image_processor, is_original_layout, load_image_processor
from .media import save_video
from .original import UMT5_TOKENIZER_FOLDER
from .units import (
    VAE_TEMPORAL_SCALE,
    FrameCountUnit,
    InputVideoEmbedderUnit,
    NoiseUnit,
    PromptEmbedderUnit,
    first_frame_inputs,
    round_frames,
)
from .vace import VaceUnit, vace_inputs

__all__ = ["ModelConfig", "WanVideoPipeline", "save_video"]

# Latent channels of the Wan2.2 VAE: its models (TI2V-5B) take the first frame as the first latent frame.
WAN22_LATENT_CHANNELS = 48
PATCH_SIZE = 2
# The boundary of the Wan2.2 A14B experts (``boundary`` in wan/configs/wan_{t2v,i2v}_A14B.py of Wan-Video/Wan2.2).
T2V_BOUNDARY_RATIO = 0.875
I2V_BOUNDARY_RATIO = 0.9
# The arguments of WanVideoPipeline.__call__ that are not the units' shared state.
_NOT_SHARED = ("self", "prompt", "negative_prompt", "num_inference_steps", "output_type", "progress_bar")

MODEL_ROLES = {
    "WanTransformer3DModel": "dit",
    "WanFunTransformer3DModel": "dit",
    "WanVACETransformer3DModel": "dit",
    "WanAnimateTransformer3DModel": "dit",
    "WanAnimate2Transformer3DModel": "dit",
    "AutoencoderKLWan": "vae",
    "UMT5EncoderModel": "text_encoder",
    "CLIPVisionModel": "image_encoder",
}


class WanVideoPipeline(TextToLatentPipeline):
    """Wan video generation and the computation its training shares; see the module docstring."""

    model_roles = MODEL_ROLES
    model_fn_params = ("prompt_emb", "y", "clip_feature", "first_frame_latents", "boundary_ratio", "reference_latents",
                       "camera_latents", "vace_context", "vace_scale", "pose_latents", "face_pixel_values",
                       "blank_face", "animate2_y", "animate2_condition", "animate2_clip", "animate2_clip_ref",
                       "animate2_prompt_emb", "animate2_unconditional")
    training_columns = ("video", "prompt")
    # Extra inputs a sample may leave out: the reference takes the first (last) frame of the video for them.
    derived_inputs = ("input_image", "end_image")
    # The reference's Wan commands name layers as in the original Wan code; suffixes match self- and cross-attention.
    lora_target_aliases = {"q": "to_q", "k": "to_k", "v": "to_v", "o": "to_out.0", "ffn.0": "ffn.net.0.proj",
                           "ffn.2": "ffn.net.2", "k_img": "add_k_proj", "v_img": "add_v_proj",
                           # Wan2.2-Animate-2's commands name its self-attention (diffusers keeps self_attn)
                           **{f"self_attn.{name}": f"self_attn.to_{name}" for name in "qkv"}}
    default_lora_target_modules = "q,k,v,o,ffn.0,ffn.2"
    # The reference loads VACE's blocks as a model of their own, pipe.vace; diffusers keeps them in the transformer.
    # Likewise Animate's pose embedding, motion and face encoders and face adapter, pipe.animate_adapter there.
    model_parts = {"vace": ("dit", ("vace_blocks", "vace_patch_embedding")), "animate_adapter": (
        "dit", ("pose_patch_embedding", "motion_encoder", "face_encoder", "face_adapter"))}
    scheduler_preset = "wan"
    input_types = {**TextToLatentPipeline.input_types, "num_frames": positive_integer,
                   "camera_control_direction": text, "camera_control_speed": real}
    image_inputs = ("control_video", "reference_image")
    #: The low-noise expert of Wan2.2 A14B (a second transformer) and the CLIP image processor.
    extra_attributes = {"dit2": None, "image_processor": None}
    # The image-condition unit runs next to the video encoder, so the VAE is onloaded once for both.
    unit_classes = (ShapeCheckUnit, FrameCountUnit, NoiseUnit, InputVideoEmbedderUnit, ImageConditionUnit, AnimateUnit,
                    Animate2Unit, VaceUnit, LatentsUnit, PromptEmbedderUnit, ImageEmbedderUnit, Animate2ClipUnit,
                    Animate2PromptUnit, FunControlUnit, FunCameraUnit, FunReferenceUnit)

    def _after_load(self, image_processor_config: ModelConfig | None = None) -> None:
        """Loads the CLIP image processor after the models.

        Args:
            image_processor_config: The ``CLIPImageProcessor`` folder. When an image encoder is loaded and this is
                ``None``, the ``image_processor/`` folder of the image encoder's repository is used (for local
                paths, the ``image_processor`` folder beside the image encoder's folder, if there is one); an
                original-layout CLIP file gets the released preprocessing at its image size.

        Raises:
            ModelLoadError: The image processor folder holds no readable ``preprocessor_config.json``.
        """
        config = image_processor_config or self._image_processor_config(self.model_configs)
        if config is not None:
            self.image_processor = load_image_processor(config)
        elif self.image_encoder is not None:
            self.image_processor = clip_image_processor(self.image_encoder)

    @classmethod
    def _companions(cls, roles: dict[str, ModelConfig], tokenizer_config: ModelConfig | None) -> dict[str, ModelConfig]:
        """The tokenizer (``google/umt5-xxl/`` beside an original T5 file, else as in ``BasePipeline``), plus the image
        processor beside a diffusers-layout image encoder (an original CLIP file ships none)."""
        text_encoder = roles.get("text_encoder")
        if text_encoder is not None and "tokenizer" not in roles and tokenizer_config is None \
                and is_original_layout(text_encoder):
            # Wan2.2-Animate-2 keeps its T5 in videomodel/Wan-AI/ with the tokenizer beside it, in umt5-xxl/.
            folder = str(Path(text_encoder.origin_file_pattern or "").parent)
            folder = UMT5_TOKENIZER_FOLDER if folder == "." else f"{folder}/{Path(UMT5_TOKENIZER_FOLDER).name}"
            companions = {"tokenizer": sibling_folder(text_encoder, folder, beside_suffix=".pth")}
            companions = {name: config for name, config in companions.items() if config is not None}
        else:
            companions = super()._companions(roles, tokenizer_config)
        processor = cls._image_processor_config(roles)
        if processor is not None:
            companions["image_processor"] = processor
        return companions

    @staticmethod
    def _image_processor_config(roles: dict[str, ModelConfig]) -> ModelConfig | None:
        """The ``image_processor`` folder beside a diffusers-layout image encoder (an original CLIP file ships none)."""
        encoder = roles.get("image_encoder")
        if encoder is None or is_original_layout(encoder):
            return None
        return sibling_folder(encoder, "image_processor", beside_suffix=".pth")

    @classmethod
    def slots_of(cls, class_names: Sequence[str | None]) -> list[str | None]:
        """As ``BasePipeline.slots_of``; the second transformer is ``dit2``, as ``_assign`` puts it."""
        slots = super().slots_of(class_names)
        transformers = [index for index, slot in enumerate(slots) if slot == "dit"]
        if len(transformers) > 1:
            slots[transformers[1]] = "dit2"
        return slots

    def _assign(self, component: Any, config: ModelConfig) -> str:
        """As ``BasePipeline._assign``; a second transformer is the low-noise expert ``dit2`` (Wan2.2 A14B)."""
        if self.model_roles.get(type(component).__name__) == "dit" and self.dit is not None and self.dit2 is None:
            self.dit2 = component
            self.model_configs["dit2"] = config
            return "dit2"
        return super()._assign(component, config)

    # ---- what the loaded models take ------------------------------------------------------------------------------

    @property
    def latent_channels(self) -> int:
        """Latent channels: the VAE's ``z_dim``, else the transformer's output channels."""
        if self.vae is not None:
            return self.vae.config.z_dim
        return self.dit.config.get("out_channels", self.dit.config.get("out_dim")) if self.dit is not None else 16

    def spatial_compression(self) -> int:
        """Pixels per latent pixel: 8 for the Wan2.1 VAE, 16 for the Wan2.2 VAE."""
        if self.vae is not None:
            return self.vae.config.scale_factor_spatial or 8
        return 16 if self.latent_channels == WAN22_LATENT_CHANNELS else 8

    def size_multiple(self) -> int:
        """Pixels per token side: the VAE's compression times the transformer's 2x2 patch (16, or 32 for Wan2.2)."""
        return self.spatial_compression() * PATCH_SIZE

    def latent_shape(self, height: int, width: int, num_frames: int) -> tuple[int, ...]:
        """The latents of a ``num_frames``-frame video of ``height x width`` pixels (sizes already rounded)."""
        scale = self.spatial_compression()
        return (1, self.latent_channels, (num_frames - 1) // VAE_TEMPORAL_SCALE + 1, height // scale, width // scale)

    def image_conditioning(self) -> str | None:
        """How the transformer takes a first frame: ``"channels"`` (``y``, image-to-video), ``"first_frame"``
        (the first latent frame, Wan2.2 TI2V), ``"animate"`` (the character of Wan2.2-Animate, ``animate.py``) or
        None (text-to-video).

        Without a transformer (a stage that does not load it) the image encoder's presence decides.
        """
        if self.dit is None:
            return "channels" if self.image_encoder is not None else None
        if self.takes_animate():
            return "animate"
        if self.takes_animate2():  # its character is animate2_reference_image
            return None
        if self.dit.config.in_channels != self.dit.config.out_channels:
            return "channels"
        return "first_frame" if self.dit.config.out_channels == WAN22_LATENT_CHANNELS else None

    def needs_input_image(self) -> bool:
        """Whether the transformer cannot run without ``input_image``: an image-to-video one, save a Fun Control
        model (whose image condition is zeros without one)."""
        mode = self.image_conditioning()
        return mode == "animate" or (mode == "channels" and fun_kind(self.dit) != "control")

    def takes_image_embedding(self) -> bool:
        """Whether the transformer reads ``clip_feature`` (its ``image_dim`` is set)."""
        if self.dit is None:
            return self.image_encoder is not None
        return self.dit.config.get("image_dim") is not None

    def takes_two_images(self) -> bool:
        """Whether the transformer's image cross-attention reads two images' CLIP tokens (Wan2.1-FLF2V: learned
        positions for both, ``pos_embed_seq_len``)."""
        return self.dit is not None and self.dit.config.get("pos_embed_seq_len") is not None

    def takes_vace(self) -> bool | None:
        """Whether the transformer has VACE blocks (reads ``vace_context``); None without a loaded transformer."""
        if self.dit is None:
            return None
        return "vace_layers" in self.dit.config

    def takes_animate(self) -> bool | None:
        """Whether the transformer is Wan2.2-Animate's (reads pose latents and face frames); None without one."""
        if self.dit is None:
            return None
        return "motion_encoder_size" in self.dit.config

    def takes_animate2(self) -> bool | None:
        """Whether the transformer is Wan2.2-Animate-2's (``animate2.py``); None without one."""
        return None if self.dit is None else "refer_offset_t" in self.dit.config

    def describe_transformer(self) -> str:
        """The transformer's image-related config, for error messages."""
        if self.dit is None:
            return "the pipeline (no transformer loaded, no image encoder)"
        if self.takes_animate2():
            return "the transformer (Wan2.2-Animate-2)"
        return (f"the transformer (in_channels={self.dit.config.in_channels}, out_channels="
                f"{self.dit.config.out_channels}, image_dim={self.dit.config.image_dim})")

    # ---- training -------------------------------------------------------------------------------------------------

    def training_media(self, sample: dict[str, Any]) -> dict[str, Any]:
        """The sample's ``video`` frames as ``input_video``, at their own size and count."""
        frames = sample["video"]
        return {"input_video": frames, "height": frames[0].height, "width": frames[0].width, "num_frames": len(frames)}

    def derived_training_inputs(self, sample: dict[str, Any], extra_inputs: Sequence[str]) -> dict[str, Any]:
        """The condition images: the sample's ``input_image`` column when it has one, else the video's first frame
        (what the model is trained to continue) when ``--extra_inputs`` names ``input_image`` or the transformer
        needs an image (image-to-video), as the reference trainer takes it; likewise ``end_image`` (the last frame)
        when ``--extra_inputs`` names it or the transformer needs it (FLF2V).

        Raises:
            ValueError: ``input_image`` or ``end_image`` is a path that was not loaded.
        """
        derived = {}
        for name, index, needed in (("input_image", 0, self.needs_input_image()),
                                    ("end_image", -1, self.takes_two_images())):
            image = sample.get(name)
            if isinstance(image, str):
                raise ValueError(f"the {name} column holds the path {image!r}, not an image; add {name} to "
                                 f"--data_file_keys (e.g. --data_file_keys video,{name}) so it is loaded")
            if image is None and (name in extra_inputs or needed):
                image = sample["video"][index]
            derived[name] = image
        return derived

    def loss_regions(self, inputs_shared: dict) -> tuple[tuple[slice, ...] | None, ...]:
        """With a first-frame condition (TI2V) the first latent frame is given, not predicted: the loss skips it."""
        if inputs_shared.get("first_frame_latents") is None:
            return (None,)
        return ((slice(None), slice(None), slice(1, None)),)

    # ---- denoising ------------------------------------------------------------------------------------------------

    def expert(self, timestep: torch.Tensor | float, boundary_ratio: float | None = None) -> torch.nn.Module:
        """The transformer for ``timestep``: ``dit``, or with two experts ``dit2`` below ``boundary_ratio * 1000``
        (default: the release's boundary for the model kind). Onloads it when the pipeline manages devices."""
        if self.dit2 is None:
            return self.dit
        if boundary_ratio is None:
            boundary_ratio = I2V_BOUNDARY_RATIO if self.image_conditioning() == "channels" else T2V_BOUNDARY_RATIO
        name = "dit" if float(torch.as_tensor(timestep).reshape(-1)[0]) >= boundary_ratio * 1000 else "dit2"
        self.load_models_to_device([name])
        return getattr(self, name)

    def model_fn(self, latents: torch.Tensor, timestep: torch.Tensor | float, prompt_emb: torch.Tensor,
                 y: torch.Tensor | None = None, clip_feature: torch.Tensor | None = None,
                 first_frame_latents: torch.Tensor | None = None, boundary_ratio: float | None = None,
                 reference_latents: torch.Tensor | None = None, camera_latents: torch.Tensor | None = None,
                 vace_context: torch.Tensor | None = None, vace_scale: float | None = None,
                 pose_latents: torch.Tensor | None = None, face_pixel_values: torch.Tensor | None = None,
                 blank_face: bool = False, **_: Any) -> torch.Tensor:
        """The transformer's velocity prediction for ``latents`` at ``timestep`` (scale 0 to 1000).

        With an image-to-video transformer, ``y`` is concatenated to the latents along channels and ``clip_feature``
        goes to the image cross-attention. A Wan2.2-latent (TI2V) transformer gets one timestep per token, as
        diffusers gives it with ``expand_timesteps``; with ``first_frame_latents`` the first latent frame is that
        condition, at timestep 0. A Fun transformer also takes ``reference_latents`` and ``camera_latents``; a VACE
        transformer reads ``vace_context``, its hints scaled by ``vace_scale``; an Animate transformer reads
        ``pose_latents`` and ``face_pixel_values`` (all -1 with ``blank_face``, the negative branch).

        Raises:
            ValueError: The channels given (latents plus ``y``) are not the transformer's ``in_channels``.
        """
        dit = self.expert(timestep, boundary_ratio)
        if self.takes_animate2():
            return animate2_prediction(dit, latents, timestep, prompt_emb, **_)
        timestep = torch.as_tensor(timestep, device=latents.device).reshape(-1).expand(latents.shape[0])
        hidden = latents if y is None else torch.cat([latents, y.to(latents.dtype)], dim=1)
        if clip_feature is not None and dit.config.get("pos_embed_seq_len") is not None:
            if clip_feature.shape[1] != dit.config.pos_embed_seq_len:
                # A split run's first stage without the transformer cannot tell FLF2V from Fun InP.
                raise ValueError(f"the first-last-frame transformer reads {dit.config.pos_embed_seq_len} CLIP tokens "
                                 f"(both images'), got {clip_feature.shape[1]}: the cache of a --task "
                                 "sft:data_process run without the transformer holds input_image's alone; load the "
                                 "transformer in that stage too")
            # diffusers' FLF2V image embedder takes each image as its own sample and joins them back in pairs.
            clip_feature = clip_feature.reshape(-1, clip_feature.shape[1] // 2, clip_feature.shape[2])
        if hidden.shape[1] != dit.config.in_channels:
            raise ValueError(f"the transformer takes in_channels={dit.config.in_channels}, but got "
                             f"{hidden.shape[1]} (latents {latents.shape[1]} + y "
                             f"{0 if y is None else y.shape[1]}); an image-to-video transformer needs input_image, "
                             "a text-to-video one must not get it")
        if dit.config.out_channels == WAN22_LATENT_CHANNELS and y is None:
            hidden, timestep = first_frame_inputs(hidden, timestep, first_frame_latents)
        control = {name: value for name, value in (("reference_latents", reference_latents),
                                                   ("camera_latents", camera_latents)) if value is not None}
        if vace_context is not None:
            control.update(vace_inputs(dit, vace_context, vace_scale))
        if pose_latents is not None:
            control.update(animate_inputs(dit, pose_latents, face_pixel_values, blank_face))
        return dit(hidden_states=hidden.to(dit.dtype), timestep=timestep, encoder_hidden_states=prompt_emb,
                   encoder_hidden_states_image=clip_feature, return_dict=False, **control)[0]

    def decode(self, inputs_shared: dict, inputs_posi: dict, inputs_nega: dict) -> torch.Tensor:
        """The final latents through the VAE, as ``(B, frames, 3, H, W)`` values in ``[0, 1]``; a first-frame
        condition takes the place of the first latent frame."""
        self.load_models_to_device(["vae"])
        latents = inputs_shared["latents"].to(self.vae.dtype)
        first = inputs_shared.get("first_frame_latents")
        if first is not None:
            latents = torch.cat([first.to(latents), latents[:, :, 1:]], dim=2)
        # The frames of VACE's reference images, or Animate's character frame.
        skipped = (inputs_shared.get("vace_reference_frames") or 0) + (inputs_shared.get("pose_latents") is not None) \
            + (inputs_shared.get("animate2_condition") is not None)
        latents = latents[:, :, skipped:]
        mean, inverse_std = self.latent_statistics(latents)
        video = self.vae.decode(latents / inverse_std + mean, return_dict=False)[0]
        return (video / 2 + 0.5).clamp(0, 1).permute(0, 2, 1, 3, 4)

    def sample_input_problems(self, inputs: set[str]) -> list[str]:
        """An image-to-video transformer needs ``input_image``; a text-to-video one refuses it; no Wan takes
        ``edit_image``; the Fun inputs go to the Fun models that read them (``fun_sample_problems``); only a VACE
        transformer takes the VACE inputs, and a mask only with its video; likewise Animate's and Animate-2's
        (``animate_sample_problems``, ``animate2_sample_problems``)."""
        problems = []
        mode = self.image_conditioning()
        if self.needs_input_image() and "input_image" not in inputs:
            problems.append(f'{self.describe_transformer()} is an image-to-video model: give an "input_image"')
        if mode is None and "input_image" in inputs:
            problems.append(f'"input_image" was given, but {self.describe_transformer()} takes no image')
        if self.takes_two_images() and "end_image" not in inputs:
            problems.append(f'{self.describe_transformer()} is a first-last-frame model: give an "end_image"')
        if mode != "channels" and "end_image" in inputs:
            problems.append(f'"end_image" was given, but {self.describe_transformer()} takes no last frame')
        if "edit_image" in inputs:
            problems.append('"edit_image" is for Qwen-Image-Edit; Wan takes "input_image"')
        given = sorted(inputs & {"vace_video", "vace_video_mask", "vace_reference_image"})
        if given and self.takes_vace() is False:
            problems.append(f"{', '.join(given)} given, but {self.describe_transformer()} has no VACE blocks")
        if "vace_video_mask" in inputs and "vace_video" not in inputs:
            problems.append('"vace_video_mask" marks which parts of "vace_video" to keep: give "vace_video" too')
        return [*problems, *fun_sample_problems(self, inputs), *animate_sample_problems(self, inputs),
                *animate2_sample_problems(self, inputs)]

    def save_output(self, output: Sequence[Image.Image], stem: Path, fps: int = 16) -> Path:
        """Writes a video's frames as ``<stem>.mp4`` at ``fps`` frames per second (``save_video``)."""
        return save_video(output, stem.with_suffix(".mp4"), fps=fps)

    @torch.no_grad()
    def __call__(self, prompt: str, negative_prompt: str = "", cfg_scale: float = 5.0,
                 input_video: Sequence[Image.Image] | None = None, input_image: Image.Image | None = None,
                 end_image: Image.Image | None = None, denoising_strength: float = 1.0,
                 height: int = 480, width: int = 832, num_frames: int = 81, seed: int | None = None,
                 rand_device: str = "cpu", num_inference_steps: int = 50, max_sequence_length: int = 512,
                 boundary_ratio: float | None = None, output_type: str = "pil", progress_bar: bool = True,
                 control_video: Sequence[Image.Image] | None = None, reference_image: Image.Image | None = None,
                 camera_control_direction: str | None = None, camera_control_speed: float = CAMERA_SPEED,
                 camera_control_origin: Sequence[float] | None = None, vace_video: Sequence[Image.Image] | None = None,
                 vace_video_mask: Sequence[Image.Image] | None = None,
                 vace_reference_image: Image.Image | Sequence[Image.Image] | None = None,
                 vace_scale: float = 1.0, animate_pose_video: Sequence[Image.Image] | None = None,
                 animate_face_video: Sequence[Image.Image] | None = None,
                 animate_inpaint_video: Sequence[Image.Image] | None = None,
                 animate_mask_video: Sequence[Image.Image] | None = None,
                 animate2_reference_image: Image.Image | None = None,
                 animate2_reference_video: Sequence[Image.Image] | None = None, animate2_prompt_ref: str = " ",
                 animate2_refert_images: Sequence[Image.Image] | None = None) -> list[Image.Image] | torch.Tensor:
        """Generates one video.

        Args:
            prompt: What to show.
            negative_prompt: What to steer away from; used when ``cfg_scale`` is not 1.
            cfg_scale: Classifier-free guidance scale; 1 turns CFG off and halves the work per step.
            input_video: Start from these frames instead of pure noise (video-to-video).
            input_image: The first frame, for an image-to-video model (which needs it) or a TI2V model (which may
                take it); resized to ``height x width``. A text-to-video model rejects it.
            end_image: The last frame, with ``input_image``, for a first-last-frame model (Wan2.1-FLF2V, which needs
                it; diffusers' ``last_image``) or a Fun InP model (which may take it); resized likewise.
            denoising_strength: With ``input_video``: how much of the schedule to run (1 ignores the video).
            height: Frame height in pixels, rounded to a multiple of ``size_multiple()`` (16; 32 for Wan2.2 TI2V).
            width: Frame width in pixels, rounded likewise.
            num_frames: Frame count, rounded down to the form 4k+1.
            seed: Noise seed; ``None`` draws from torch's global generator.
            rand_device: Device the noise is drawn on.
            num_inference_steps: Denoising steps.
            max_sequence_length: Prompt tokens the text encoder sees (padded to this length).
            boundary_ratio: With two experts (``dit2`` loaded), the fraction of the 1000 training timesteps at which
                the low-noise expert takes over; default the release's (0.875 text-to-video, 0.9 image-to-video).
            output_type: ``"pil"`` for a list of frames, ``"pt"`` for a ``(1, frames, 3, H, W)`` tensor in ``[0, 1]``.
            progress_bar: Show a progress bar over the steps.
            control_video: Wan Fun Control: the control frames (depth, edges, pose...), at least ``num_frames``.
            reference_image: Fun-V1.1 / Wan2.2-Fun Control: an image whose look the video takes.
            camera_control_direction: Control-Camera: the camera motion, e.g. ``"Left"`` or ``"RightUp"``
                (``camera.DIRECTIONS``); needs ``input_image``.
            camera_control_speed: Control-Camera: the motion per frame (the reference's default 1/54).
            camera_control_origin: Control-Camera: the first pose, 19 numbers (default ``camera.CAMERA_ORIGIN``).
            vace_video: For a VACE model: frames to condition on (``vace.py``); default black frames.
            vace_video_mask: For a VACE model: frames, white where to generate, black where to keep ``vace_video``;
                default all white.
            vace_reference_image: For a VACE model: one image or a list, fitted into the frame on a white canvas;
                their frames are generated first and dropped from the output.
            vace_scale: For a VACE model: the scale of its hints (diffusers' ``conditioning_scale``).
            animate_pose_video: Wan2.2-Animate (``animate.py``): the pose frames, at least ``num_frames - 4``; the
                video has ``num_frames - 4`` frames and ``input_image`` is the character.
            animate_face_video: Wan2.2-Animate: the face crops, as many.
            animate_inpaint_video: Wan2.2-Animate replacement mode: the background frames, as many.
            animate_mask_video: Wan2.2-Animate replacement mode: white where the character goes, as many.
            animate2_reference_image: Wan2.2-Animate-2 (``animate2.py``): the character.
            animate2_reference_video: Wan2.2-Animate-2: the driving video, at least ``num_frames`` frames.
            animate2_prompt_ref: Wan2.2-Animate-2: the prompt of the reference video's pass.
            animate2_refert_images: Wan2.2-Animate-2: frames continuing a previous clip (known first frames).
        """
        # Every argument but the prompts and the output options is the units' shared state.
        inputs_shared = {name: value for name, value in locals().items() if name not in _NOT_SHARED}
        check_call_inputs(prompt, output_type)
        if boundary_ratio is not None and not 0 < boundary_ratio < 1:
            raise ValueError(f"boundary_ratio={boundary_ratio!r} must lie between 0 and 1, e.g. 0.875")
        multiple = self.size_multiple()
        latent_shape = self.latent_shape(round_size(height, multiple), round_size(width, multiple),
                                         round_frames(num_frames))
        self.set_inference_timesteps(num_inference_steps, denoising_strength, latent_shape=latent_shape)
        # Animate-2's reference pass fills it once; every step and both CFG branches read it.
        inputs_shared["animate2_kv_cache"] = new_kv_cache(self.dit) if self.takes_animate2() else None
        # diffusers' Animate pipeline blanks the face in the negative branch.
        negative = {"negative_prompt": negative_prompt, **({"blank_face": True} if animate_face_video else {}),
                    **({"animate2_unconditional": True} if animate2_reference_video else {})}
        video = self.denoise(inputs_shared, {"prompt": prompt}, negative, progress_bar=progress_bar)
        return video if output_type == "pt" else tensor_to_images(video[0])

