"""LTX-2's video VAE under its own key names (``DiffSynth-Studio/LTX-2-Repackage``'s ``video_vae_encoder`` and
``video_vae_decoder``), loaded into diffusers' ``AutoencoderKLLTX2Video``; shared helpers of the part readers.

The reference cuts the official VAE (``vae.*`` of ``ltx-2-19b-dev.safetensors``) in two files: the encoder with the
latent statistics, and the decoder with the same statistics. diffusers has one class for both, so a file loads as the
whole class with the other half left out (``OriginalModel.absent``): an encoder-only VAE encodes (stage 1, training),
a decoder-only one decodes (inference), and calling the missing half names the file to add. Given both files, the
pipeline joins the halves into one model (``core.loader.original_layout.join_parts``).

LTX-2's code lists each half as one flat sequence of blocks (``down_blocks.<i>``: groups of residual blocks and the
convolutions that compress between them; ``up_blocks.<i>`` in the decoding order). diffusers groups them: each
``down_blocks.<j>`` holds a group's ``resnets`` and the ``downsamplers.0`` after them, the last group is the
``mid_block``; the decoder starts with its ``mid_block``, then each ``up_blocks.<j>`` holds ``upsamplers.0`` and the
``resnets`` after it. The residual blocks are ``res_blocks`` there, ``resnets`` here; the statistics
``per_channel_statistics.{mean,std}-of-means`` are ``latents_{mean,std}``; the decoder's timestep conditioning is
``last_time_embedder`` / ``last_scale_shift_table`` there. The release's other statistics (``channel``,
``mean-of-stds``, ...) are not used by the class and are skipped.

Widths, depths, the compression of each step (spatial, temporal or both, from how many channels its convolution
makes), the patch size and the latent channels come from the tensors; the encoder is causal in time, the decoder not
(LTX-2's and LTX-2.3's, which diffusers' defaults do not say). Whether the decoder's upsamplers add a residual
is not in them: the ``decoder_blocks`` of the ``vae`` section of the file's ``config`` metadata says it when present,
else LTX-2's decoder has it (every upsampler spatiotemporal and halving the channels) and LTX-2.3's does not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...core.loader.errors import ModelLoadError
from ...core.loader.original_layout import OriginalModel, renamed_entries
from ...core.loader.state_dict import CheckpointEntry
from .original import _block_count as count
from .original import _model_keys, _refuse_missing
from .original import _shape as shape

VAE_PREFIX = "vae."
STATISTICS = "per_channel_statistics."
# The class's latent statistics -> the official buffers.
_STATISTICS = {"latents_mean": "mean-of-means", "latents_std": "std-of-means"}
# Compression of one step by how many times its convolution multiplies the channels (the pixels it moves).
_STRIDES = {8: "spatiotemporal", 4: "spatial", 2: "temporal"}
_SPATIAL = {"spatiotemporal": 2, "spatial": 2, "temporal": 1}
_TEMPORAL = {"spatiotemporal": 2, "spatial": 1, "temporal": 2}
_ENCODER_KEYS = ("block_out_channels", "down_block_types", "layers_per_block", "spatio_temporal_scaling",
                 "downsample_type", "encoder_causal", "encoder_spatial_padding_mode")
_DECODER_KEYS = ("decoder_block_out_channels", "decoder_layers_per_block", "decoder_spatio_temporal_scaling",
                 "decoder_inject_noise", "upsample_type", "upsample_residual", "upsample_factor",
                 "timestep_conditioning", "decoder_causal", "decoder_spatial_padding_mode")
# What LTX-2's video VAE uses that no tensor records.
_RGB = 3


@dataclass(frozen=True)
class Block:
    """One entry of an official block list: a group of ``layers`` residual blocks ``width`` wide, or (``layers``
    None) a compression / expansion convolution from ``width`` channels to ``made``."""

    index: int
    width: int
    layers: int | None = None
    made: int = 0


# ---- shared by the part readers ---------------------------------------------------------------------------------


def part_model(file: Path, entries: dict[str, CheckpointEntry], class_name: str, config: dict[str, Any],
               to_original, kind: str, absent: dict[str, tuple[str, tuple[str, ...]]] | None = None,
               skipped: tuple[str, ...] = ()) -> OriginalModel:
    """The ``OriginalModel`` of one part file: every key of ``class_name`` built from ``config`` (but those of the
    ``absent`` submodules) named by ``to_original``; a key the file lacks is refused here, a key it has beyond them
    (but the ``skipped`` prefixes) is left for loading to report as unexpected."""
    absent = absent or {}
    keys = {key: to_original(key) for key in _model_keys(class_name, config)
            if key.partition(".")[0] not in absent}
    _refuse_missing(file, sorted(official for official in keys.values() if official not in entries), class_name)
    used = set(keys.values())
    keys.update({key: key for key in entries if key not in used and not key.startswith(skipped)})
    return OriginalModel(kind=kind, library="diffusers", class_name=class_name, config=config,
                         entries=renamed_entries(entries, keys), source=file, absent=absent)


def missing_half(file: Path, half: str, what: str, half_file: str) -> str:
    """The message a call of the ``half`` a part file lacks raises; ``half_file`` is the file holding it."""
    return (f"{file} holds {what} without its {half}, which was not loaded: add {half_file} of the same repository "
            "to the model configs (--model_id_with_origin_paths) to use it")


# ---- the video VAE ---------------------------------------------------------------------------------------------


def _blocks(shapes: dict[str, tuple[int, ...]], prefix: str, file: Path) -> list[Block]:
    """The official block list under ``prefix`` (``vae.encoder.down_blocks``), each block read from its tensors."""
    blocks = []
    for index in range(count(shapes, prefix)):
        block = f"{prefix}.{index}."
        if f"{block}res_blocks.0.conv1.conv.weight" in shapes:
            blocks.append(Block(index, shapes[f"{block}res_blocks.0.conv1.conv.weight"][0],
                                layers=count(shapes, f"{block}res_blocks")))
        elif f"{block}conv.conv.weight" in shapes:
            made, width = shapes[f"{block}conv.conv.weight"][:2]
            blocks.append(Block(index, width, made=made))
        else:
            raise ModelLoadError(f"{file}: {block[:-1]!r} is neither a group of residual blocks nor a resampling "
                                 "convolution (none of its tensors is known); the file is not LTX-2's video VAE")
    return blocks


def _step(file: Path, block: Block, factor: int, what: str) -> str:
    if factor not in _STRIDES:
        raise ModelLoadError(f"{file}: block {block.index} of the {what} multiplies the channels by {factor}, which "
                             "no spatial / temporal step of diffusers' AutoencoderKLLTX2Video makes")
    return _STRIDES[factor]


def encoder_layout(shapes: dict[str, tuple[int, ...]], file: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """``(config entries, diffusers block -> official block)`` of the encoder in ``shapes``.

    Raises:
        ModelLoadError: A tensor the layout is read from is missing, or the blocks do not make diffusers' encoder
            (two groups of residual blocks without a compression between them, an unknown compression).
    """
    prefix = f"{VAE_PREFIX}encoder."
    conv_in = shape(shapes, f"{prefix}conv_in.conv.weight", file, "video VAE encoder")
    blocks = _blocks(shapes, f"{prefix}down_blocks", file)
    if not blocks or blocks[-1].layers is None:
        raise ModelLoadError(f"{file}: the video VAE encoder does not end with a group of residual blocks, which "
                             "diffusers' encoder (its mid block) needs; the file is not LTX-2's video VAE")
    names, layers, widths, types = {}, [], [], []
    group = None
    for position, block in enumerate(blocks[:-1]):
        if block.layers is not None:
            if group is not None:
                raise ModelLoadError(f"{file}: blocks {group.index} and {block.index} of the video VAE encoder are "
                                     "both residual groups, which diffusers' encoder cannot hold in a row")
            group = block
            continue
        following = blocks[position + 1]
        out = following.width
        names[f"encoder.down_blocks.{len(layers)}.downsamplers.0."] = f"{prefix}down_blocks.{block.index}."
        if group is not None:
            names[f"encoder.down_blocks.{len(layers)}.resnets."] = f"{prefix}down_blocks.{group.index}.res_blocks."
        layers.append(group.layers if group is not None else 0)
        widths.append(out)
        types.append(_step(file, block, out // block.made if block.made and out % block.made == 0 else 0,
                           "video VAE encoder"))
        group = None
    names["encoder.mid_block.resnets."] = f"{prefix}down_blocks.{blocks[-1].index}.res_blocks."
    patch = math.isqrt(conv_in[1] // _RGB)
    config = {
        "block_out_channels": tuple(widths), "down_block_types": ("LTX2VideoDownBlock3D",) * len(widths),
        "layers_per_block": (*layers, blocks[-1].layers), "spatio_temporal_scaling": (True,) * len(widths),
        "downsample_type": tuple(types), "patch_size": patch,
        "spatial_compression_ratio": patch * math.prod(_SPATIAL[kind] for kind in types),
        "temporal_compression_ratio": math.prod(_TEMPORAL[kind] for kind in types),
    }  # fmt: skip
    return config, names


def decoder_layout(shapes: dict[str, tuple[int, ...]], metadata: dict[str, Any],
                   file: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """``(config entries, diffusers block -> official block)`` of the decoder in ``shapes``; ``metadata`` is the
    ``vae`` section of the file's ``config`` metadata (for the upsamplers' residual).

    Raises:
        ModelLoadError: As ``encoder_layout``, for the decoder.
    """
    prefix = f"{VAE_PREFIX}decoder."
    conv_out = shape(shapes, f"{prefix}conv_out.conv.weight", file, "video VAE decoder")
    blocks = _blocks(shapes, f"{prefix}up_blocks", file)
    if not blocks or blocks[0].layers is None:
        raise ModelLoadError(f"{file}: the video VAE decoder does not start with a group of residual blocks, which "
                             "diffusers' decoder (its mid block) needs; the file is not LTX-2's video VAE")
    names = {"decoder.mid_block.": f"{prefix}up_blocks.{blocks[0].index}."}
    groups, upsampler = [], None
    for block in blocks[1:]:
        if block.layers is None:
            if upsampler is not None:
                raise ModelLoadError(f"{file}: blocks {upsampler.index} and {block.index} of the video VAE decoder "
                                     "are both upsamplers, which diffusers' decoder cannot hold in a row")
            upsampler = block
            continue
        j = len(groups)
        names[f"decoder.up_blocks.{j}."] = f"{prefix}up_blocks.{block.index}."
        if upsampler is not None:
            names[f"decoder.up_blocks.{j}.upsamplers.0."] = f"{prefix}up_blocks.{upsampler.index}."
        groups.append((upsampler, block))
        upsampler = None
    residuals = _residuals(metadata, [up for up, _ in groups if up is not None])
    out_channels, kinds, factors, scaling, noise = [], [], [], [], [_noise(shapes, prefix, blocks[0])]
    width = blocks[0].width
    for up, group in groups:
        factor = up.width // group.width if up is not None else 1
        if up is None and group.width != width or up is not None and up.width != width:
            raise ModelLoadError(f"{file}: block {group.index} of the video VAE decoder changes the width without "
                                 "an upsampler, which diffusers' decoder cannot express")
        kinds.append(_step(file, up, up.made // group.width if up.made % group.width == 0 else 0,
                           "video VAE decoder") if up is not None else "spatiotemporal")
        out_channels.append(width)
        factors.append(factor)
        scaling.append(up is not None)
        noise.append(_noise(shapes, prefix, group))
        width = group.width
    if residuals is None:  # LTX-2's decoder (each step spatiotemporal, halving the channels) adds the residual
        residuals = [all(kind == "spatiotemporal" for kind in kinds) and factors == [2] * len(factors)] * len(groups)
    patch = math.isqrt(conv_out[0] // _RGB)
    steps = [kind for kind, scaled in zip(kinds, scaling) if scaled]
    config = {
        "decoder_block_out_channels": tuple(reversed(out_channels)),
        "decoder_layers_per_block": tuple(reversed([blocks[0].layers, *(group.layers for _, group in groups)])),
        "decoder_spatio_temporal_scaling": tuple(reversed(scaling)), "decoder_inject_noise": tuple(reversed(noise)),
        "upsample_type": tuple(kinds), "upsample_residual": tuple(reversed(residuals)),
        "upsample_factor": tuple(reversed(factors)),
        "timestep_conditioning": f"{prefix}last_scale_shift_table" in shapes, "patch_size": patch,
        "spatial_compression_ratio": patch * math.prod(_SPATIAL[kind] for kind in steps),
        "temporal_compression_ratio": math.prod(_TEMPORAL[kind] for kind in steps),
    }  # fmt: skip
    return config, names


def _noise(shapes: dict[str, tuple[int, ...]], prefix: str, block: Block) -> bool:
    return f"{prefix}up_blocks.{block.index}.res_blocks.0.per_channel_scale1" in shapes


def _residuals(metadata: dict[str, Any], upsamplers: list[Block]) -> list[bool] | None:
    """The upsamplers' residual flags in the decoding order, from the metadata's ``decoder_blocks`` (listed in the
    encoding order, as LTX-2's code lists them); None when the metadata does not give them."""
    listed = metadata.get("decoder_blocks")
    if not isinstance(listed, list):
        return None
    flags = [bool((params if isinstance(params, dict) else {}).get("residual", False))
             for name, params in reversed(listed) if str(name).startswith("compress")]
    return flags if len(flags) == len(upsamplers) else None


# The decoder's timestep conditioning, outside its blocks: diffusers' names -> the official ones.
_DECODER_TOP = {"time_embedder": "last_time_embedder", "scale_shift_table": "last_scale_shift_table"}


def _video_key_to_original(key: str, names: dict[str, str]) -> str:
    """The official name of an ``AutoencoderKLLTX2Video`` key, given the block map ``names``."""
    if key in _STATISTICS:
        return f"{VAE_PREFIX}{STATISTICS}{_STATISTICS[key]}"
    for new, old in sorted(names.items(), key=lambda item: -len(item[0])):  # a block's upsampler before the block
        if key.startswith(new):
            return old + key.removeprefix(new).replace("resnets.", "res_blocks.")
    half, _, rest = key.partition(".")
    layer, dot, tail = rest.partition(".")
    return f"{VAE_PREFIX}{half}.{_DECODER_TOP.get(layer, layer) if half == 'decoder' else layer}{dot}{tail}"


def video_vae_model(file: Path, entries: dict[str, CheckpointEntry], metadata: dict[str, Any]) -> OriginalModel:
    """The ``AutoencoderKLLTX2Video`` a ``video_vae_encoder`` / ``video_vae_decoder`` file (or both halves in one
    file) loads as; ``metadata`` is the ``vae`` section of its ``config`` metadata.

    Raises:
        ModelLoadError: A tensor the structure is read from is missing, or the blocks do not fit the class.
    """
    shapes = {key: entry.shape for key, entry in entries.items()}
    latent = shape(shapes, f"{VAE_PREFIX}{STATISTICS}mean-of-means", file, "video VAE")[0]
    has = {half: any(key.startswith(f"{VAE_PREFIX}{half}.") for key in shapes) for half in ("encoder", "decoder")}
    # LTX-2's encoder is causal in time and its decoder is not; no tensor records it (diffusers' default differs)
    config: dict[str, Any] = {"in_channels": _RGB, "out_channels": _RGB, "latent_channels": latent, "patch_size_t": 1,
                              "encoder_causal": True, "decoder_causal": False}
    names: dict[str, str] = {}
    absent = {}
    for half, layout in (("encoder", encoder_layout), ("decoder", decoder_layout)):
        if not has[half]:
            absent[half] = (missing_half(file, half, "LTX-2's video VAE", f"video_vae_{half}.safetensors"),
                            _ENCODER_KEYS if half == "encoder" else _DECODER_KEYS)
            continue
        found, block_names = layout(shapes, file) if half == "encoder" else layout(shapes, metadata, file)
        for key in ("patch_size", "spatial_compression_ratio", "temporal_compression_ratio"):
            if key in config and config[key] != found[key]:
                raise ModelLoadError(f"{file}: the video VAE's encoder and decoder disagree on {key} ({config[key]} "
                                     f"vs {found[key]}); the file mixes two models")
        config.update(found)
        names.update(block_names)
    conv_out = f"{VAE_PREFIX}encoder.conv_out.conv.weight"
    if has["encoder"] and shape(shapes, conv_out, file, "video VAE encoder")[0] != latent + 1:
        raise ModelLoadError(f"{file}: the encoder makes {shapes[conv_out][0]} channels for {latent} latent ones; "
                             "diffusers' AutoencoderKLLTX2Video makes the means and one shared log-variance "
                             f"({latent + 1}): this VAE's variance layout is not supported")
    return part_model(file, entries, "AutoencoderKLLTX2Video", config,
                      lambda key: _video_key_to_original(key, names), "vae", absent,
                      skipped=(f"{VAE_PREFIX}{STATISTICS}",))


def video_vae_key_namer(config: dict[str, Any]):
    """``key -> official name`` for an ``AutoencoderKLLTX2Video`` of this ``config`` (the inverse of the reader's
    map, to write a model in LTX-2's layout): the official block lists numbered from the class's structure."""
    names, index = {}, 0
    prefix = f"{VAE_PREFIX}encoder.down_blocks"
    for j, (layers, scaled) in enumerate(zip(config["layers_per_block"], config["spatio_temporal_scaling"])):
        if layers:
            names[f"encoder.down_blocks.{j}.resnets."], index = f"{prefix}.{index}.res_blocks.", index + 1
        if scaled:
            names[f"encoder.down_blocks.{j}.downsamplers.0."], index = f"{prefix}.{index}.", index + 1
    names["encoder.mid_block.resnets."] = f"{prefix}.{index}.res_blocks."
    prefix = f"{VAE_PREFIX}decoder.up_blocks"
    names["decoder.mid_block."], index = f"{prefix}.0.", 1
    for j, scaled in enumerate(reversed(config["decoder_spatio_temporal_scaling"])):
        if scaled:
            names[f"decoder.up_blocks.{j}.upsamplers.0."], index = f"{prefix}.{index}.", index + 1
        names[f"decoder.up_blocks.{j}."], index = f"{prefix}.{index}.", index + 1
    return lambda key: _video_key_to_original(key, names)
