"""What the Wan ``validate_lora`` and ``validate_full`` scripts share: each script names its release (``RELEASES``);
this module gives it the flags (the shared ones of ``diffsynth.training.config.validate_script`` and the clip's),
checks them before any model loads, loads the release's original files, merges the
trained LoRA into the transformer (for the Wan2.2 A14B experts, one LoRA each) or loads a full fine-tune's weights
over it (``full=True``), and renders one clip with the release's control inputs.

A full fine-tune's ``epoch-<e>.safetensors`` (the flat file, ``docs/en/Full_Fine_Tuning.md``) holds the trained
weights under the transformer's own names: the whole transformer (``--trainable_models dit``), or only its VACE
blocks (``vace``) or its Animate modules (``animate_adapter``), which diffusers keeps inside the transformer. Either
way they load over the released weights, as the reference loads them into ``pipe.dit`` / ``pipe.vace`` /
``pipe.animate_adapter``.

The LoRA's weights are added into the transformer's (``diffsynth.lora.load_lora``), so sampling costs what it costs
without a LoRA. ``--lora_alpha_scale 0`` renders the base model from the same seed, for a side-by-side comparison. A
LoRA of the VACE blocks (``--lora_base_model vace``) merges into the same transformer, whose VACE blocks it names.

Sampling uses this package's flow-matching Euler schedule (shift 5), the one the trainer trains with; diffusers' Wan
pipelines use UniPC with shift 3 instead (see ``diffsynth.pipelines.wan_video.pipeline``). At the defaults (81 frames,
832 x 480, 50 steps, guidance doubling the work) a clip takes minutes on one consumer GPU; lower --num_frames and
--steps for a quick look.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from diffsynth.training.config.validate_script import Defaults, InputFlag, Weights, add_flags, read_flags

VIDEO_SUFFIXES = (".mp4", ".gif")
DIT = "diffusion_pytorch_model*.safetensors"
EXPERTS = ("high_noise_model/" + DIT, "low_noise_model/" + DIT)
T5 = "models_t5_umt5-xxl-enc-bf16.pth"
CLIP = "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth"

# The control inputs, as the pipeline's call names them: (kind, help). The animate kinds are videos read at the
# animate length (num_frames - 4), the face clip at its own size.
INPUTS = {
    "input_image": ("image", "the first frame (an image file)"),
    "end_image": ("image", "the last frame (an image file)"),
    "control_video": ("video", "the control clip: depth, edges, pose... (a video file, at least --num_frames long)"),
    "reference_image": ("image", "an image whose look the clip takes"),
    "camera_control_direction": ("text", "the camera motion, e.g. Left, Right, Up, Down, LeftUp, In, Out"),
    "camera_control_speed": ("number", "the camera motion per frame (default the reference's 1/54)"),
    "vace_video": ("video", "the clip to follow (a video file, at least --num_frames long)"),
    "vace_video_mask": ("video", "white where to paint, black where to keep --vace_video (a video file)"),
    "vace_reference_image": ("images", "one or more images of a subject or style"),
    "animate_pose_video": ("animate_video", "the driving pose clip (a video file, at least --num_frames - 4 long)"),
    "animate_face_video": ("face_video", "the driving face crops, one a frame (a video file, at least --num_frames - 4 "
                                         "long)"),
    "animate_inpaint_video": ("animate_video", "replacement mode: the background clip the character is put into (a "
                                               "video file, as long as the pose clip)"),
    "animate_mask_video": ("animate_video", "replacement mode: white where the character goes (a video file, as long "
                                            "as the pose clip)"),
    "animate2_reference_image": ("image", "the character (an image file)"),
    "animate2_reference_video": ("video", "the driving clip (a video file, at least --num_frames long)"),
    "animate2_prompt_ref": ("text", "the prompt of the driving clip's pass (default: a space, the reference's)"),
}


class Release(NamedTuple):
    """A release's files, what its scripts pass (the inputs offered and those it cannot render without) and the
    model its ``full/`` script trains (``dit``, or the transformer's ``vace`` / ``animate_adapter`` part)."""

    model_id: str
    inputs: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    clip: bool = False
    experts: bool = False
    vae: str = "Wan2.1_VAE.pth"
    part: str = "dit"
    entries: tuple[str, ...] = ()  # model_id:pattern entries of a release that loads files of two repositories

    def files(self) -> tuple[str, ...]:
        return (*(EXPERTS if self.experts else (DIT,)), T5, self.vae, *((CLIP,) if self.clip else ()))


_INP = dict(inputs=("input_image", "end_image"), required=("input_image",))
_CONTROL = dict(inputs=("control_video",), required=("control_video",))
_CONTROL_REF = dict(inputs=("control_video", "reference_image"), required=("control_video",))
_CAMERA = dict(inputs=("input_image", "camera_control_direction", "camera_control_speed"),
               required=("input_image", "camera_control_direction"))
_VACE = dict(inputs=("vace_video", "vace_video_mask", "vace_reference_image"), part="vace")
_I2V = dict(inputs=("input_image",), required=("input_image",))
_ANIMATE = ("input_image", "animate_pose_video", "animate_face_video")
_REPLACEMENT = ("animate_inpaint_video", "animate_mask_video")  # both or neither (the pipeline checks)
_ANIMATE2 = ("animate2_reference_image", "animate2_reference_video", "animate2_prompt_ref")


def _animate2(transformer: str) -> Release:
    """Wan2.2-Animate-2: its transformer file and encoders, and Wan2.1-T2V-14B's VAE, as its scripts load them."""
    repo = "Wan-AI/Wan2.2-Animate-2-14B"
    entries = (f"{repo}:videomodel/Wan-AI/{T5}", f"{repo}:videomodel/Wan-AI/{CLIP}",
               "Wan-AI/Wan2.1-T2V-14B:Wan2.1_VAE.pth", f"{repo}:wan_animate_2/{transformer}")
    return Release(repo, _ANIMATE2, _ANIMATE2[:2], clip=True, entries=entries)


RELEASES = {
    "Wan2.1-T2V-1.3B": Release("Wan-AI/Wan2.1-T2V-1.3B"),
    "Wan2.1-T2V-14B": Release("Wan-AI/Wan2.1-T2V-14B"),
    **{name: Release(f"Wan-AI/{name}", clip=True, **_I2V) for name in ("Wan2.1-I2V-14B-480P", "Wan2.1-I2V-14B-720P")},
    "Wan2.2-T2V-A14B": Release("Wan-AI/Wan2.2-T2V-A14B", experts=True),
    "Wan2.2-I2V-A14B": Release("Wan-AI/Wan2.2-I2V-A14B", experts=True, **_I2V),
    # One transformer for text and image to video: the image is optional.
    "Wan2.2-TI2V-5B": Release("Wan-AI/Wan2.2-TI2V-5B", ("input_image",), vae="Wan2.2_VAE.pth"),
    "Wan2.2-Animate-14B": Release("Wan-AI/Wan2.2-Animate-14B", (*_ANIMATE, *_REPLACEMENT), _ANIMATE, clip=True,
                                  part="animate_adapter"),
    "Wan2.2-Animate-2-14B": _animate2("wan_animate_2_bf16.safetensors"),
    "Wan2.2-Animate-2-14B-Distilled": _animate2("wan_animate_2_bf16_distillation.safetensors"),
    "Wan2.1-FLF2V-14B-720P": Release("Wan-AI/Wan2.1-FLF2V-14B-720P", ("input_image", "end_image"),
                                     ("input_image", "end_image"), clip=True),
    **{name: Release(f"PAI/{name}", clip=True, **_INP) for name in (
        "Wan2.1-Fun-1.3B-InP", "Wan2.1-Fun-14B-InP", "Wan2.1-Fun-V1.1-1.3B-InP", "Wan2.1-Fun-V1.1-14B-InP")},
    "Wan2.2-Fun-A14B-InP": Release("PAI/Wan2.2-Fun-A14B-InP", experts=True, **_INP),
    **{name: Release(f"PAI/{name}", clip=True, **_CONTROL) for name in ("Wan2.1-Fun-1.3B-Control",
                                                                        "Wan2.1-Fun-14B-Control")},
    **{name: Release(f"PAI/{name}", clip=True, **_CONTROL_REF) for name in ("Wan2.1-Fun-V1.1-1.3B-Control",
                                                                            "Wan2.1-Fun-V1.1-14B-Control")},
    "Wan2.2-Fun-A14B-Control": Release("PAI/Wan2.2-Fun-A14B-Control", experts=True, **_CONTROL_REF),
    **{name: Release(f"PAI/{name}", clip=True, **_CAMERA) for name in ("Wan2.1-Fun-V1.1-1.3B-Control-Camera",
                                                                       "Wan2.1-Fun-V1.1-14B-Control-Camera")},
    "Wan2.2-Fun-A14B-Control-Camera": Release("PAI/Wan2.2-Fun-A14B-Control-Camera", experts=True, **_CAMERA),
    "Wan2.1-VACE-1.3B": Release("Wan-AI/Wan2.1-VACE-1.3B", **_VACE),
    "Wan2.1-VACE-1.3B-Preview": Release("iic/VACE-Wan2.1-1.3B-Preview", **_VACE),
    "Wan2.1-VACE-14B": Release("Wan-AI/Wan2.1-VACE-14B", **_VACE),
    "Wan2.2-VACE-Fun-A14B": Release("PAI/Wan2.2-VACE-Fun-A14B", experts=True, **_VACE),
}


def model_id_with_origin_paths(name: str) -> str:
    """The ``--model_id_with_origin_paths`` of release ``name``'s files, as its training script loads them."""
    release = RELEASES[name]
    return ",".join(release.entries or (f"{release.model_id}:{pattern}" for pattern in release.files()))


def weight_flags(name: str, full: bool = False) -> tuple[str, ...]:
    """The flags naming the trained files to apply: one per transformer (the Wan2.2 A14B experts have two)."""
    flags = ("--checkpoint_path", "--low_noise_checkpoint_path") if full else ("--lora_path", "--low_noise_lora_path")
    return flags if RELEASES[name].experts else flags[:1]


def _weights(name: str, full: bool) -> list[Weights]:
    """The trained files' flags; the defaults read the last file its ``lora/<name>.sh`` writes (with ``full``: the
    last ``epoch-<e>.safetensors`` of its ``full/<name>.sh``)."""
    release, flags = RELEASES[name], weight_flags(name, full)
    if full:
        default = f"./models/train/{name}_{{}}full/epoch-1.safetensors"
        what = f"the {release.part} weights a full fine-tune wrote (its epoch-<e>.safetensors or step-<s>.safetensors)"
    else:
        default = f"./models/train/{name}_{{}}lora/epoch-4.safetensors"
        what = "LoRA .safetensors written by the trainer (or another Wan LoRA)"
    if not release.experts:
        return [Weights(flags[0], ("dit",), default.format(""), what)]
    return [Weights(flags[0], ("dit",), default.format("high_noise_"), f"the high-noise expert's: {what}"),
            Weights(flags[1], ("dit2",), default.format("low_noise_"),
                    "the low-noise expert's; 'none' renders that expert as released")]


def _input_flags(release: Release) -> dict[str, InputFlag]:
    kinds = {"animate_video": "video", "face_video": "video"}
    return {key: InputFlag(kinds.get(INPUTS[key][0], INPUTS[key][0]), INPUTS[key][1], key in release.required)
            for key in release.inputs}


def build_parser(name: str, full: bool = False) -> argparse.ArgumentParser:
    """The flags of release ``name``'s script (``diffsynth.training.config.validate_script``'s, and the clip's)."""
    what = "full fine-tune loaded over the released weights" if full else "LoRA merged into the model"
    parser = argparse.ArgumentParser(description=f"Render a clip with a {name} {what}.")
    defaults = Defaults(prompt="a corgi running along a sunny beach, the camera following it", output="video.mp4",
                        negative_prompt="blurry, distorted, static, low quality, watermark, subtitles", cfg_scale=5.0,
                        height=480, width=832, steps=50, models=model_id_with_origin_paths(name))
    add_flags(parser, _weights(name, full), full, defaults, _input_flags(RELEASES[name]),
              "file to write: .mp4 (H.264) or .gif", compare=False)
    parser.add_argument("--num_frames", type=int, default=81, help="frames in the clip, 4k+1 (others are rounded down)")
    parser.add_argument("--fps", type=int, default=15, help="frame rate written into the file")
    return parser


def _inputs(release: Release, values: Mapping[str, Any], num_frames: int, height: int, width: int) -> dict[str, Any]:
    """The call's control inputs, read from the files the flags name."""
    from PIL import Image

    from diffsynth.core.data import LoadVideo
    from diffsynth.core.data.operators import ResizeConfig

    # Animate's control clips cover the frames after the reference frame's latent slot (4 pixel frames).
    animate_frames = max(1, (num_frames - 1) // 4 * 4 - 3)
    inputs = {}
    for key in release.inputs:
        value, kind = values[key], INPUTS[key][0]
        if value is None:
            continue
        if kind == "image":
            value = Image.open(value).convert("RGB")
        elif kind == "images":
            value = [Image.open(path).convert("RGB") for path in value]
        elif kind == "video":
            value = LoadVideo(num_frames).load(value, ResizeConfig(height=height, width=width))
        elif kind == "animate_video":
            value = LoadVideo(animate_frames).load(value, ResizeConfig(height=height, width=width))
        elif kind == "face_video":  # at its own size: the pipeline fits the crops to the motion encoder's
            value = LoadVideo(animate_frames).load(value, ResizeConfig())
        inputs[key] = value
    return inputs


def main(name: str, argv: Sequence[str] | None = None, full: bool = False,
         defaults: Mapping[str, Any] | None = None) -> Path:
    """Loads release ``name``, merges the LoRA (with ``full``: loads the full fine-tune's weights over the released
    ones), renders the prompt with the control inputs and writes the clip. ``defaults`` replaces flags' defaults (a
    ``special/`` run's output file, a distilled model's steps).

    Returns:
        The video file written.
    """
    from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline, save_video
    from diffsynth.training.validate import apply_weights, load_pipeline

    release = RELEASES[name]
    parser = build_parser(name, full)
    parser.set_defaults(**(defaults or {}))
    args = parser.parse_args(argv)
    run = read_flags(parser, args, _weights(name, full), full, _input_flags(release), VIDEO_SUFFIXES,
                     release.model_id)
    if args.num_frames < 1 or args.fps < 1:
        parser.error(f"--num_frames {args.num_frames} and --fps {args.fps} must be positive; e.g. --num_frames 81 "
                     "--fps 15")
    if set(_REPLACEMENT) <= set(release.inputs) and len({run.inputs[key] is None for key in _REPLACEMENT}) == 2:
        parser.error("replacement mode takes --animate_inpaint_video (the background) and --animate_mask_video "
                     "together; give both, or neither to animate the character")
    pipe = load_pipeline(WanVideoPipeline, run)
    apply_weights(pipe, run, parser.error, name)
    frames = pipe(**run.call, num_frames=args.num_frames,
                  **_inputs(release, run.inputs, args.num_frames, args.height, args.width))
    output = save_video(frames, run.output, fps=args.fps)
    print(f"{len(frames)} frames written to {output.resolve()}")
    return output
