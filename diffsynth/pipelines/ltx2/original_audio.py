"""LTX-2's audio VAE and vocoders under its own key names (``DiffSynth-Studio/LTX-2-Repackage``'s and
``LTX-2.3-Repackage``'s ``audio_vae_encoder``, ``audio_vae_decoder`` and ``audio_vocoder``), loaded into diffusers'
``AutoencoderKLLTX2Audio``, ``LTX2Vocoder`` (LTX-2) and ``LTX2VocoderWithBWE`` (LTX-2.3).

The audio VAE keeps LTX-2's layer names in diffusers (``encoder.down.<l>.block.<i>``, ``decoder.up.<l>.upsample``,
``mid.block_1``); only the prefix ``audio_vae.`` and the latent statistics (``per_channel_statistics.{mean,std}-of-
means`` -> ``latents_{mean,std}``) differ. As the video VAE's (``original_vae``), the reference's two files each load as
the whole class with the other half left out, and join when both are given. The vocoder renames its layers
(``conv_pre`` / ``conv_post`` -> ``conv_in`` / ``conv_out``, ``ups`` -> ``upsamplers``, ``resblocks`` -> ``resnets``,
``act_post`` -> ``act_out``, an activation's ``downsample.lowpass.filter`` -> ``downsample.filter``). LTX-2.3's
vocoder with bandwidth extension holds two such generators, ``vocoder.vocoder.*`` (mel to 16 kHz) and
``vocoder.bwe_generator.*`` (the extender's residual at 48 kHz), and the extender's STFT buffers
``vocoder.mel_stft.*``, named alike in diffusers but for the leading ``vocoder.``.

Widths, depths, the latent channels and kernel sizes come from the tensors (the audio statistics are those of the
latents patched with their mel bins, 128 in the release, not of the latent channels). The rest is read from the
file's ``config`` metadata under LTX-2's names when present, else the release's values: for the audio VAE the mel bins
(``audio_vae.model.params.ddconfig.mel_bins`` or ``preprocessing.mel.n_mel_channels``; 64), the sample rate
(``model.params.sampling_rate``; 16 kHz), whether the encoder makes a log-variance per channel (``ddconfig.double_z``;
yes), the mel hop (``preprocessing.stft.hop_length``; 160) and causality
(``preprocessing.stft.causal``); for the vocoder its upsampling strides (``vocoder.upsample_rates``: the release's
``[6, 5, 2, 2, 2]`` for its kernels ``[16, 15, 8, 4, 4]``, no default for other kernels), the residual blocks'
dilations (``resblock_dilation_sizes``; ``[1, 3, 5]`` each) and the output rate (``output_sample_rate``; 24 kHz).
LTX-2.3's vocoder reads the same per generator from ``vocoder.vocoder`` and ``vocoder.bwe`` (the release's strides
``[5, 2, 2, 2, 2, 2]`` and ``[6, 5, 2, 2, 2]``), plus ``resblock`` (``AMP1``: anti-aliased activations),
``activation`` (``snakebeta``), the first generator's final activation (``apply_final_activation``,
``use_tanh_at_final``: tanh, a clamp, or none as diffusers' release config has it) and the extender's
``hop_length`` (80), ``input_sampling_rate`` (16 kHz) and ``output_sampling_rate`` (48 kHz); the STFT and mel sizes
are the buffers'.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...core.loader.errors import ModelLoadError
from ...core.loader.original_layout import OriginalModel
from ...core.loader.state_dict import CheckpointEntry
from .original import _block_count as count
from .original import _shape as shape
from .original_vae import STATISTICS, missing_half, part_model

AUDIO_PREFIX = "audio_vae."
VOCODER_PREFIX = "vocoder."
_STATISTICS = {"latents_mean": "mean-of-means", "latents_std": "std-of-means"}
# Settings of both halves that only the encoder / the decoder file records (the other half's are taken on joining).
_ENCODER_KEYS = ("in_channels",)
_DECODER_KEYS = ("output_channels",)
# The releases' vocoder strides for their upsampling kernels (the strides are in no tensor): LTX-2's vocoder, LTX-2.3's
# first vocoder and its bandwidth extender.
_RELEASE_VOCODER = {(16, 15, 8, 4, 4): [6, 5, 2, 2, 2]}
_RELEASE_BWE_VOCODER = {(11, 4, 4, 4, 4, 4): [5, 2, 2, 2, 2, 2]}
_RELEASE_EXTENDER = {(12, 11, 4, 4, 4): [6, 5, 2, 2, 2]}


def _get(section: dict[str, Any], *path: str) -> Any:
    for name in path:
        section = section.get(name) if isinstance(section, dict) else None
    return section


# ---- the audio VAE ---------------------------------------------------------------------------------------------


def _widths(shapes: dict[str, tuple[int, ...]], file: Path, half: str) -> dict[str, Any]:
    """The structure the ``half`` of the audio VAE in ``shapes`` has: base width, multipliers, residual blocks."""
    prefix = f"{AUDIO_PREFIX}{half}."
    stage = "down" if half == "encoder" else "up"
    if any(key.startswith(f"{prefix}{stage}.") and ".attn" in key for key in shapes):
        raise ModelLoadError(f"{file}: the audio VAE {half} has attention layers in its resolution levels, which "
                             "LTX-2's release has not; this layout is not supported")
    levels = count(shapes, f"{prefix}{stage}")
    if not levels:
        raise ModelLoadError(f"{file} lacks {prefix}{stage}.0.*, which every LTX-2 audio VAE {half} has; the file is "
                             "incomplete: download it again")
    layer = "conv1" if half == "encoder" else "conv2"
    widths = [shape(shapes, f"{prefix}{stage}.{level}.block.0.{layer}.conv.weight", file, f"audio VAE {half}")[0]
              for level in range(levels)]
    base = widths[0]
    if any(width % base for width in widths):
        raise ModelLoadError(f"{file}: the audio VAE {half}'s level widths {widths} are not multiples of the first; "
                             "the file is not LTX-2's audio VAE")
    blocks = count(shapes, f"{prefix}{stage}.0.block") - (half == "decoder")  # the decoder has one block more
    return {"base_channels": base, "ch_mult": tuple(width // base for width in widths), "num_res_blocks": blocks,
            "mid_block_add_attention": f"{prefix}mid.attn_1.q.weight" in shapes}


def audio_vae_config(shapes: dict[str, tuple[int, ...]], metadata: dict[str, Any], file: Path) -> dict[str, Any]:
    """The ``AutoencoderKLLTX2Audio`` config of an audio VAE file (either half or both): structure from the tensors,
    the rest from ``metadata`` (the ``audio_vae`` section of its ``config``) or the release's.

    Raises:
        ModelLoadError: A tensor the structure is read from is missing, or the halves disagree.
    """
    shape(shapes, f"{AUDIO_PREFIX}{STATISTICS}mean-of-means", file, "audio VAE")  # (of the patched latents)
    ddconfig = _get(metadata, "model", "params", "ddconfig") or {}
    double_z = ddconfig.get("double_z", True)
    config: dict[str, Any] = {
        "double_z": double_z, "attn_resolutions": None,
        "resolution": ddconfig.get("resolution", 256), "norm_type": ddconfig.get("norm_type", "pixel"),
        "causality_axis": ddconfig.get("causality_axis", "height"), "dropout": ddconfig.get("dropout", 0.0),
        "sample_rate": _get(metadata, "model", "params", "sampling_rate") or 16000,
        "mel_hop_length": _get(metadata, "preprocessing", "stft", "hop_length") or 160,
        "is_causal": _get(metadata, "preprocessing", "stft", "causal") is not False,
        "mel_bins": ddconfig.get("mel_bins") or _get(metadata, "preprocessing", "mel", "n_mel_channels") or 64,
    }  # fmt: skip
    for half in ("encoder", "decoder"):
        if not any(key.startswith(f"{AUDIO_PREFIX}{half}.") for key in shapes):
            continue
        found = _widths(shapes, file, half)
        clash = sorted(key for key in found if key in config and config[key] != found[key])
        if clash:
            raise ModelLoadError(f"{file}: the audio VAE's encoder and decoder disagree on {clash[0]}; the file "
                                 "mixes two models")
        config.update(found)
        if half == "encoder":
            conv_in = shape(shapes, f"{AUDIO_PREFIX}encoder.conv_in.conv.weight", file, "audio VAE encoder")
            made = shape(shapes, f"{AUDIO_PREFIX}encoder.conv_out.conv.weight", file, "audio VAE encoder")[0]
            found = {"in_channels": conv_in[1], "latent_channels": made // 2 if double_z else made}
        else:
            conv_out = shape(shapes, f"{AUDIO_PREFIX}decoder.conv_out.conv.weight", file, "audio VAE decoder")
            conv_in = shape(shapes, f"{AUDIO_PREFIX}decoder.conv_in.conv.weight", file, "audio VAE decoder")
            found = {"output_channels": conv_out[0], "latent_channels": conv_in[1]}
        if config.setdefault("latent_channels", found["latent_channels"]) != found["latent_channels"]:
            raise ModelLoadError(f"{file}: the audio VAE's encoder and decoder disagree on the latent channels; the "
                                 "file mixes two models")
        config.update(found)
    return config


def audio_vae_key_to_original(key: str) -> str:
    """The official name of an ``AutoencoderKLLTX2Audio`` key (``latents_mean`` ->
    ``audio_vae.per_channel_statistics.mean-of-means``)."""
    if key in _STATISTICS:
        return f"{AUDIO_PREFIX}{STATISTICS}{_STATISTICS[key]}"
    return AUDIO_PREFIX + key


def audio_vae_model(file: Path, entries: dict[str, CheckpointEntry], metadata: dict[str, Any]) -> OriginalModel:
    """The ``AutoencoderKLLTX2Audio`` an ``audio_vae_encoder`` / ``audio_vae_decoder`` file loads as.

    Raises:
        ModelLoadError: As ``audio_vae_config``, or a key of the class the file lacks.
    """
    shapes = {key: entry.shape for key, entry in entries.items()}
    config = audio_vae_config(shapes, metadata, file)
    absent = {half: (missing_half(file, half, "LTX-2's audio VAE", f"audio_vae_{half}.safetensors"),
                     _ENCODER_KEYS if half == "encoder" else _DECODER_KEYS)
              for half in ("encoder", "decoder") if not any(key.startswith(f"{AUDIO_PREFIX}{half}.") for key in shapes)}
    return part_model(file, entries, "AutoencoderKLLTX2Audio", config, audio_vae_key_to_original, "audio_vae",
                      absent, skipped=(f"{AUDIO_PREFIX}{STATISTICS}",))


# ---- the vocoder -----------------------------------------------------------------------------------------------

# diffusers -> official: the first dotted part of a generator's key.
_VOCODER_RENAMES = {"conv_in": "conv_pre", "conv_out": "conv_post", "upsamplers": "ups", "resnets": "resblocks",
                    "act_out": "act_post"}
# The two generators of LTX-2.3's vocoder, under the same names in both layouts.
_GENERATORS = ("vocoder", "bwe_generator")


def _generator_key(key: str) -> str:
    """The official name of a key of one generator (an ``LTX2Vocoder``), without the file's prefix."""
    head, dot, rest = key.partition(".")
    # the anti-aliased activations keep their low-pass filter one module deeper in LTX-2's code
    rest = rest.replace("downsample.filter", "downsample.lowpass.filter")
    return f"{_VOCODER_RENAMES.get(head, head)}{dot}{rest}"


def vocoder_key_to_original(key: str) -> str:
    """The official name of an ``LTX2Vocoder`` key (``conv_in.weight`` -> ``vocoder.conv_pre.weight``)."""
    return VOCODER_PREFIX + _generator_key(key)


def bwe_vocoder_key_to_original(key: str) -> str:
    """The official name of an ``LTX2VocoderWithBWE`` key (``bwe_generator.conv_in.weight`` ->
    ``vocoder.bwe_generator.conv_pre.weight``; ``mel_stft.mel_basis`` -> ``vocoder.mel_stft.mel_basis``)."""
    head, dot, rest = key.partition(".")
    return f"{VOCODER_PREFIX}{head}{dot}{_generator_key(rest)}" if head in _GENERATORS else VOCODER_PREFIX + key


def is_bandwidth_extended(keys) -> bool:
    """Whether official vocoder ``keys`` are LTX-2.3's vocoder with bandwidth extension (two generators)."""
    return any(key.startswith(tuple(f"{VOCODER_PREFIX}{name}." for name in _GENERATORS)) for key in keys)


def _generator(shapes: dict[str, tuple[int, ...]], prefix: str, section: dict[str, Any], file: Path,
               release: dict[tuple[int, ...], list[int]], what: str) -> dict[str, Any]:
    """The ``LTX2Vocoder`` structure of the generator under ``prefix``: widths and kernels from its tensors, strides
    and dilations from its metadata ``section`` or, for the ``release``'s kernels, the release's strides."""
    conv_in = shape(shapes, f"{prefix}conv_pre.weight", file, what)
    conv_out = shape(shapes, f"{prefix}conv_post.weight", file, what)
    kernels = [shape(shapes, f"{prefix}ups.{i}.weight", file, what)[2] for i in range(count(shapes, f"{prefix}ups"))]
    per_step = count(shapes, f"{prefix}resblocks") // max(len(kernels), 1)
    resnet_kernels = [shape(shapes, f"{prefix}resblocks.{i}.convs1.0.weight", file, what)[2] for i in range(per_step)]
    strides = section.get("upsample_rates") or release.get(tuple(kernels))
    if strides is None:
        raise ModelLoadError(f"{file}: the {what}'s upsampling kernels {kernels} are not the release's and the file's "
                             "metadata gives no 'upsample_rates' (the strides are in no tensor); use the release's "
                             "file or the diffusers vocoder/ folder")
    dilations = section.get("resblock_dilation_sizes") or [
        [1, 3, 5][: count(shapes, f"{prefix}resblocks.{i}.convs1")] for i in range(per_step)]
    return {
        "in_channels": conv_in[1], "hidden_channels": conv_in[0], "out_channels": conv_out[0],
        "upsample_kernel_sizes": kernels, "upsample_factors": list(strides), "resnet_kernel_sizes": resnet_kernels,
        "resnet_dilations": [list(d) for d in dilations], "final_bias": f"{prefix}conv_post.bias" in shapes,
    }  # fmt: skip


def vocoder_config(shapes: dict[str, tuple[int, ...]], metadata: dict[str, Any], file: Path) -> dict[str, Any]:
    """The ``LTX2Vocoder`` config of an LTX-2 ``audio_vocoder`` file: widths and kernels from its tensors, strides,
    dilations and output rate from ``metadata`` (the ``vocoder`` section of its ``config``) or the release's.

    Raises:
        ModelLoadError: A missing tensor, or upsampling kernels whose strides neither the metadata nor the release
            gives.
    """
    return {**_generator(shapes, VOCODER_PREFIX, metadata, file, _RELEASE_VOCODER, "vocoder"),
            "output_sampling_rate": metadata.get("output_sample_rate", 24000)}


def _activations(section: dict[str, Any], shapes: dict[str, tuple[int, ...]], prefix: str) -> dict[str, Any]:
    """The activation settings of one LTX-2.3 generator from its metadata ``section`` (LTX-2's names), else the
    release's: anti-aliased snake activations (``resblock: AMP1``) and no final activation."""
    amp = section.get("resblock", "AMP1") == "AMP1"
    final = None
    # LTX-2's generator ends in tanh (or a clamp) unless told not to; diffusers' release config has none
    if section.get("apply_final_activation", "use_tanh_at_final" in section):
        final = "tanh" if section.get("use_tanh_at_final", True) else "clamp"
    filter_key = f"{prefix}act_post.upsample.filter"
    return {"act_fn": section.get("activation", "snakebeta") if amp else "leaky_relu", "antialias": amp,
            "antialias_kernel_size": shapes[filter_key][-1] if filter_key in shapes else 12, "final_act_fn": final}


def bwe_vocoder_config(shapes: dict[str, tuple[int, ...]], metadata: dict[str, Any], file: Path) -> dict[str, Any]:
    """The ``LTX2VocoderWithBWE`` config of LTX-2.3's vocoder: both generators' widths and kernels and the
    extender's STFT sizes from the tensors; strides, dilations, activations, hop length and rates from ``metadata``
    (``{"vocoder": {...}, "bwe": {...}}``, LTX-2.3's ``vocoder`` section) or the release's.

    Raises:
        ModelLoadError: A missing tensor, upsampling kernels whose strides neither the metadata nor the release
            gives, or an extender that does not read the first vocoder's mel bins.
    """
    main, bwe = dict(metadata.get("vocoder") or {}), dict(metadata.get("bwe") or {})
    first, second = (f"{VOCODER_PREFIX}{name}." for name in _GENERATORS)
    config = {**_generator(shapes, first, main, file, _RELEASE_BWE_VOCODER, "vocoder"),
              **_activations(main, shapes, first)}
    extender = {**_generator(shapes, second, bwe, file, _RELEASE_EXTENDER, "bandwidth extender"),
                **_activations({**bwe, "apply_final_activation": False}, shapes, second)}  # LTX-2 forces it off
    config.update({f"bwe_{key}": value for key, value in extender.items()})
    basis = shape(shapes, f"{VOCODER_PREFIX}mel_stft.stft_fn.forward_basis", file, "LTX-2.3 vocoder")
    mel = shape(shapes, f"{VOCODER_PREFIX}mel_stft.mel_basis", file, "LTX-2.3 vocoder")
    if config["bwe_in_channels"] != config["out_channels"] * mel[0]:
        raise ModelLoadError(f"{file}: the bandwidth extender reads {config['bwe_in_channels']} channels, not the "
                             f"{config['out_channels']} x {mel[0]} mel bins of the first vocoder's sound; the file "
                             "mixes two models")
    config.update(filter_length=basis[-1], window_length=basis[-1], num_mel_channels=mel[0],
                  hop_length=bwe.get("hop_length", 80), input_sampling_rate=bwe.get("input_sampling_rate", 16000),
                  output_sampling_rate=bwe.get("output_sampling_rate", 48000))
    return config


def vocoder_model(file: Path, entries: dict[str, CheckpointEntry], metadata: dict[str, Any]) -> OriginalModel:
    """The ``LTX2Vocoder`` (LTX-2) or ``LTX2VocoderWithBWE`` (LTX-2.3) an ``audio_vocoder`` file loads as.

    Raises:
        ModelLoadError: As ``vocoder_config`` / ``bwe_vocoder_config``, or a key of the class the file lacks.
    """
    shapes = {key: entry.shape for key, entry in entries.items()}
    if is_bandwidth_extended(shapes):
        return part_model(file, entries, "LTX2VocoderWithBWE", bwe_vocoder_config(shapes, metadata, file),
                          bwe_vocoder_key_to_original, "vocoder")
    return part_model(file, entries, "LTX2Vocoder", vocoder_config(shapes, metadata, file), vocoder_key_to_original,
                      "vocoder")
