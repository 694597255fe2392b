"""What the LTX-2 ``validate_lora`` and ``validate_full`` scripts share: each script names its release
(``RELEASES``); this module gives it the flags (the shared ones of ``diffsynth.training.config.validate_script`` and
the clip's), checks them before any model loads, loads the files the reference's script renders with (the transformer
its training script trains, the text encoder and connectors, the decoders and the vocoder), merges the trained LoRA
into the transformer, or loads a full fine-tune's ``epoch-<e>.safetensors`` (the transformer's weights under its own
names) over it (``full=True``), and writes one ``.mp4`` with its sound track, atomically.

The no-audio release loads no audio decoder or vocoder: its clip is written without sound. The image-to-audio+video
release takes the first frame (``--input_image``); the IC-LoRA releases take the reference clip(s) the LoRA learned to
follow (``--in_context_videos``, given to the transformer ``--in_context_downsample_factor`` times smaller).

JoyAI-Echo's reference scripts sample with the reference's distilled sampler (``use_distilled_pipeline``), which
this package does not have; its scripts here render with the one-stage flow-matching sampler, at the few steps
and without the guidance a distilled model is sampled with (``--steps`` and ``--cfg_scale`` change that).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from diffsynth.training.config.validate_script import Defaults, InputFlag, Weights, add_flags, read_flags

GEMMA = "google/gemma-3-12b-it-qat-q4_0-unquantized:model-*.safetensors"
# The Repackage files the reference's scripts render with, beside the transformer (``transformer.safetensors``).
TEXT = ("text_encoder_post_modules.safetensors",)
DECODERS = ("video_vae_decoder.safetensors",)
AUDIO = ("audio_vae_decoder.safetensors", "audio_vocoder.safetensors")
ENCODER = ("video_vae_encoder.safetensors",)  # the first frame's and the reference clips' encoder
NEGATIVE = ("blurry, out of focus, overexposed, underexposed, low contrast, washed out colors, excessive noise, grainy "
            "texture, poor lighting, flickering, motion blur, distorted proportions, unnatural skin tones, deformed "
            "facial features, asymmetrical face, missing facial features, extra limbs, disfigured hands, wrong hand "
            "count, artifacts around text, inconsistent perspective, camera shake, incorrect depth of field, "
            "background too sharp, background clutter, distracting reflections, harsh shadows, inconsistent lighting "
            "direction, color banding, cartoonish rendering, 3D CGI look, unrealistic materials, uncanny valley "
            "effect, incorrect ethnicity, wrong gender, exaggerated expressions, wrong gaze direction, mismatched lip "
            "sync, silent or muted audio, distorted voice, robotic voice, echo, background noise, off-sync audio, "
            "incorrect dialogue, added dialogue, repetitive speech, jittery movement, awkward pauses, incorrect "
            "timing, unnatural transitions, inconsistent framing, tilted camera, flat lighting, inconsistent tone, "
            "cinematic oversaturation, stylized filters, or AI artifacts.")
SUNSET = "A beautiful sunset over the ocean."
CATS = ("[VISUAL]:Two cute orange cats, wearing boxing gloves, stand on a boxing ring and fight each other. "
        "[SOUNDS]:the sound of two cats boxing")
INPUTS = {
    "input_image": InputFlag("image", "the first frame (an image file)", required=True),
    "in_context_videos": InputFlag("images", "the reference clip(s) the IC-LoRA learned to follow: depth, edges, "
                                             "pose... (video files, at least --num_frames long)", required=True),
    "in_context_downsample_factor": InputFlag("integer", "how much smaller than the clip the references are given "
                                                         "(the IC-LoRA's training factor, the reference's 2)",
                                              default=2),
}


class Release(NamedTuple):
    """A release's files (``model_id:pattern`` entries), the folder its training scripts write to (``lora``, ``full``,
    without ``/epoch-<e>.safetensors``), the inputs it renders with and the reference script's sampling defaults."""

    models: tuple[str, ...]
    lora: str
    full: str | None = None
    inputs: tuple[str, ...] = ()
    prompt: str = SUNSET
    output: str = "ltx2_onestage.mp4"
    num_frames: int = 121
    sampling: Mapping[str, Any] = {}
    full_epoch: int = 4


def _repackage(repo: str, *extra: str) -> tuple[str, ...]:
    """The Repackage release's transformer and the files ``extra`` names, with Gemma-3's release."""
    return (GEMMA, *(f"DiffSynth-Studio/{repo}:{pattern}" for pattern in ("transformer.safetensors", *extra)))


_T2AV = dict(sampling={"cfg_scale": 4.0})
_IC = dict(inputs=("in_context_videos", "in_context_downsample_factor"), prompt=CATS, num_frames=81)
_JOYAI = (GEMMA, "jd-opensource/JoyAI-Echo:JoyAI-Echo-release.safetensors")
RELEASES = {
    "JoyAI-Echo-T2AV": Release(_JOYAI, "JoyAI-Echo-T2AV_lora", "JoyAI-Echo-T2AV-full", output="joyai_echo.mp4",
                               sampling={"cfg_scale": 1.0, "num_inference_steps": 8}),
    "LTX-2-T2AV": Release(_repackage("LTX-2-Repackage", *TEXT, *DECODERS, *AUDIO), "LTX2-T2AV_lora", "LTX2-T2AV_full",
                          full_epoch=1, **_T2AV),
    "LTX-2-T2AV_noaudio": Release(_repackage("LTX-2-Repackage", *TEXT, *DECODERS), "LTX2-T2AV-noaudio_lora", **_T2AV),
    "LTX-2-T2AV-IC-LoRA": Release(_repackage("LTX-2-Repackage", *TEXT, *DECODERS, *AUDIO, *ENCODER),
                                  "LTX2-T2AV-IC-LoRA", output="ltx2_onestage_ic.mp4", **_IC),
    "LTX-2.3-T2AV": Release(_repackage("LTX-2.3-Repackage", *TEXT, *DECODERS, *AUDIO), "LTX2.3-T2AV_lora",
                            "LTX2.3-T2AV-full", **_T2AV),
    "LTX-2.3-I2AV": Release(_repackage("LTX-2.3-Repackage", *TEXT, *DECODERS, *AUDIO, *ENCODER), "LTX2.3-I2AV_lora",
                            "LTX2.3-I2AV-full", inputs=("input_image",), output="ltx2.3_onestage_i2av_first.mp4",
                            sampling={"num_inference_steps": 40}),
    "LTX-2.3-T2AV-IC-LoRA": Release(_repackage("LTX-2.3-Repackage", *TEXT, *DECODERS, *AUDIO, *ENCODER),
                                    "LTX2.3-T2AV-IC-LoRA", output="ltx2.3_onestage_ic.mp4", **_IC),
}


def model_id_with_origin_paths(name: str) -> str:
    """The ``--model_id_with_origin_paths`` of release ``name``: the files its reference script renders with."""
    return ",".join(RELEASES[name].models)


def trained_file(name: str, full: bool = False) -> str:
    """The last file release ``name``'s ``lora/`` (with ``full``: ``full/``) training script writes."""
    release = RELEASES[name]
    if full:
        return f"./models/train/{release.full}/epoch-{release.full_epoch}.safetensors"
    return f"./models/train/{release.lora}/epoch-4.safetensors"


def _weights(name: str, full: bool) -> list[Weights]:
    if full:
        return [Weights("--checkpoint_path", ("dit",), trained_file(name, True), "the transformer weights a full "
                        "fine-tune wrote (its epoch-<e>.safetensors or step-<s>.safetensors)")]
    return [Weights("--lora_path", ("dit",), trained_file(name), "LoRA .safetensors written by the trainer (or "
                    f"another {name} LoRA)")]


def _input_flags(release: Release) -> dict[str, InputFlag]:
    return {key: INPUTS[key] for key in release.inputs}


def build_parser(name: str, full: bool = False) -> argparse.ArgumentParser:
    """The flags of release ``name``'s script (``diffsynth.training.config.validate_script``'s, and the clip's)."""
    release = RELEASES[name]
    what = "full fine-tune loaded over the released weights" if full else "LoRA merged into the model"
    parser = argparse.ArgumentParser(description=f"Render a clip with its sound with a {name} {what}.")
    sampling = release.sampling
    defaults = Defaults(prompt=release.prompt, models=model_id_with_origin_paths(name), output=release.output,
                        negative_prompt=NEGATIVE, cfg_scale=sampling.get("cfg_scale"), height=512, width=768,
                        steps=sampling.get("num_inference_steps"), seed=43)
    add_flags(parser, _weights(name, full), full, defaults, _input_flags(release),
              "file to write: .mp4 (H.264, with the sound as AAC)", compare=False)
    parser.add_argument("--num_frames", type=int, default=release.num_frames,
                        help="frames in the clip, 8k+1 (others are rounded down)")
    parser.add_argument("--fps", type=int, default=24, help="frame rate: the sound's length and the file's rate")
    return parser


def _inputs(values: Mapping[str, Any], num_frames: int) -> dict[str, Any]:
    """The call's inputs, read from the files the flags name (the pipeline sizes them)."""
    from PIL import Image

    from diffsynth.core.data import LoadVideo
    from diffsynth.core.data.operators import ResizeConfig

    inputs: dict[str, Any] = {}
    if values.get("input_image") is not None:
        inputs["input_images"] = [Image.open(values["input_image"]).convert("RGB")]
    if values.get("in_context_videos") is not None:
        inputs["in_context_videos"] = [LoadVideo(num_frames).load(path, ResizeConfig())
                                       for path in values["in_context_videos"]]
        inputs["in_context_downsample_factor"] = values["in_context_downsample_factor"]
    return inputs


def main(name: str, argv: Sequence[str] | None = None, full: bool = False) -> Path:
    """Loads release ``name``, merges the LoRA (with ``full``: loads the full fine-tune's weights over the released
    ones), renders the prompt and writes the clip with its sound.

    Returns:
        The video file written.
    """
    from diffsynth.pipelines.ltx2 import LTX2AudioVideoPipeline
    from diffsynth.pipelines.ltx2.media import save_video_with_audio
    from diffsynth.training.validate import apply_weights, load_pipeline

    release = RELEASES[name]
    parser = build_parser(name, full)
    args = parser.parse_args(argv)
    run = read_flags(parser, args, _weights(name, full), full, _input_flags(release), (".mp4",), name)
    if args.num_frames < 1 or args.fps < 1:
        parser.error(f"--num_frames {args.num_frames} and --fps {args.fps} must be positive; e.g. --num_frames 121 "
                     "--fps 24")
    factor = run.inputs.get("in_context_downsample_factor")
    if factor is not None and factor < 1:
        parser.error(f"--in_context_downsample_factor {factor} must be positive; the released IC-LoRAs use 2")
    pipe = load_pipeline(LTX2AudioVideoPipeline, run)
    apply_weights(pipe, run, parser.error, name)
    frames, waveform = pipe(**run.call, num_frames=args.num_frames, frame_rate=float(args.fps),
                            **_inputs(run.inputs, args.num_frames))
    output = save_video_with_audio(frames, waveform, run.output, fps=args.fps,
                                   sample_rate=pipe.audio_sample_rate or 0)
    sound = "with its sound" if waveform is not None else "without sound"
    print(f"{len(frames)} frames {sound} written to {output.resolve()}")
    return output
