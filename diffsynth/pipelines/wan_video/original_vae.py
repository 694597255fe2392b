"""The original Wan VAE files (``Wan2.1_VAE.pth``, ``Wan2.2_VAE.pth``) as diffusers' ``AutoencoderKLWan``.

Module names in the original code (``wan/modules/vae2_1.py`` and ``vae2_2.py`` of Wan-Video/Wan2.2) and in diffusers
differ only by renaming; no tensor changes shape. For the Wan2.1 VAE the renaming is diffusers' own
``convert_wan_vae_to_diffusers`` (``diffusers/loaders/single_file_utils.py``), which assumes the released structure
(two residual blocks per stage). diffusers' single-file code has no converter for the Wan2.2 VAE, so its map is
written here, following the module trees of ``vae2_2.py`` and diffusers' ``autoencoder_kl_wan.py``:

=====================================================  ============================================================
original (``vae2_2.py``)                               diffusers ``AutoencoderKLWan(is_residual=True)``
=====================================================  ============================================================
``encoder.conv1``                                      ``encoder.conv_in``
``encoder.downsamples.S.downsamples.J`` (residual)     ``encoder.down_blocks.S.resnets.J``
``encoder.downsamples.S.downsamples.J`` (resample)     ``encoder.down_blocks.S.downsampler``
``decoder.upsamples.S.upsamples.J`` (residual)         ``decoder.up_blocks.S.resnets.J``
``decoder.upsamples.S.upsamples.J`` (resample)         ``decoder.up_blocks.S.upsampler``
``{en,de}coder.middle.0`` / ``.1`` / ``.2``            ``{en,de}coder.mid_block.resnets.0`` / ``.attentions.0`` /
                                                       ``.resnets.1``
``{en,de}coder.head.0`` / ``.head.2``                  ``{en,de}coder.norm_out`` / ``.conv_out``
``conv1`` / ``conv2``                                  ``quant_conv`` / ``post_quant_conv``
residual ``residual.0 / .2 / .3 / .6``, ``shortcut``   ``norm1 / conv1 / norm2 / conv2``, ``conv_shortcut``
=====================================================  ============================================================

The files record no configuration, so it is read from the tensor shapes (widths, stages, residual blocks per stage,
which stages downsample time). The latent statistics are constants of each release, chosen by the latent width: 16
channels are the Wan2.1 VAE's (``AutoencoderKLWan``'s defaults), 48 the Wan2.2 VAE's (``Wan2_2_VAE`` in
``vae2_2.py``, also ``vae22_diffusers_config`` in diffusers' ``scripts/convert_wan_to_diffusers.py``).

Each direction is a function of key names only: the loader reads headers, never tensors, to plan a load, and the
tiny-model builder writes original-layout files with the inverse.
"""

from __future__ import annotations

import re
from typing import Any

from ...core.loader.errors import ModelLoadError

# Wan2_2_VAE in wan/modules/vae2_2.py of Wan-Video/Wan2.2 (the same values as diffusers' conversion script).
WAN22_LATENTS_MEAN = [
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813, 0.0891, 0.1570,
    -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502, -0.2055, -0.0322,
    0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230, -0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520,
    0.3748, 0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
]  # fmt: skip
WAN22_LATENTS_STD = [
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901, 0.6885, 0.6165,
    0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659, 0.7069, 0.5338, 0.4889, 0.4917,
    0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600,
    0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
]  # fmt: skip
WAN21_LATENT_CHANNELS = 16
WAN22_LATENT_CHANNELS = len(WAN22_LATENTS_MEAN)
# The Wan2.2 VAE folds each 2x2 pixel patch into channels before the first convolution (3 colours x 4).
WAN22_PATCH_SIZE = 2
_PATCHED_CHANNELS = 3 * WAN22_PATCH_SIZE**2

# Sequential indices of the original residual block and their diffusers names.
_RESIDUAL_PARTS = {"residual.0": "norm1", "residual.2": "conv1", "residual.3": "norm2", "residual.6": "conv2",
                   "shortcut": "conv_shortcut"}  # fmt: skip
_RESIDUAL_PARTS_BACK = {new: old for old, new in _RESIDUAL_PARTS.items()}
_TOP_NAMES = {
    "encoder.conv1": "encoder.conv_in", "decoder.conv1": "decoder.conv_in",
    "encoder.head.0": "encoder.norm_out", "encoder.head.2": "encoder.conv_out",
    "decoder.head.0": "decoder.norm_out", "decoder.head.2": "decoder.conv_out",
    "conv1": "quant_conv", "conv2": "post_quant_conv",
    "encoder.middle.0": "encoder.mid_block.resnets.0", "encoder.middle.1": "encoder.mid_block.attentions.0",
    "encoder.middle.2": "encoder.mid_block.resnets.1",
    "decoder.middle.0": "decoder.mid_block.resnets.0", "decoder.middle.1": "decoder.mid_block.attentions.0",
    "decoder.middle.2": "decoder.mid_block.resnets.1",
}  # fmt: skip
_TOP_NAMES_BACK = {new: old for old, new in _TOP_NAMES.items()}
_WAN22_STAGE = re.compile(r"^(?P<side>encoder|decoder)\.(?:downsamples|upsamples)\.(?P<stage>\d+)\."
                          r"(?:downsamples|upsamples)\.(?P<index>\d+)\.(?P<rest>.+)$")
_PARAM = re.compile(r"^(?P<module>.+)\.(?P<param>weight|bias|gamma)$")


def is_wan22_vae(shapes: dict[str, tuple[int, ...]]) -> bool:
    """Whether original VAE keys are the Wan2.2 VAE's (patchified input, residual stages) rather than Wan2.1's."""
    return any(_WAN22_STAGE.match(key) for key in shapes)


def _rename_residual(rest: str) -> str | None:
    """``residual.2.weight`` -> ``conv1.weight`` inside one residual block; None when ``rest`` is not one."""
    match = _PARAM.match(rest)
    if match is None or match["module"] not in _RESIDUAL_PARTS:
        return None
    return f"{_RESIDUAL_PARTS[match['module']]}.{match['param']}"


def _rename_top(key: str) -> str | None:
    match = _PARAM.match(key)
    if match is None:
        return None
    module = match["module"]
    for original, diffusers in _TOP_NAMES.items():
        if module == original:
            return f"{diffusers}.{match['param']}"
        if module.startswith(original + "."):  # a middle residual block's parts, or the attention's layers
            inner = module[len(original) + 1:] + "." + match["param"]
            return f"{diffusers}.{_rename_residual(inner) or inner}"
    return None


def wan21_vae_model_keys(checkpoint_keys: list[str]) -> dict[str, str]:
    """``{diffusers key: original key}`` for a ``Wan2.1_VAE.pth``, by diffusers' own single-file converter."""
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    return convert_wan_vae_to_diffusers({key: key for key in checkpoint_keys})


def wan22_vae_model_keys(checkpoint_keys: list[str]) -> dict[str, str]:
    """``{diffusers key: original key}`` for a ``Wan2.2_VAE.pth``; keys it cannot place keep their name (the loader
    then reports them as unexpected)."""
    renamed = {}
    for key in checkpoint_keys:
        stage = _WAN22_STAGE.match(key)
        if stage is None:
            new = _rename_top(key) or key
        else:
            blocks, sampler = ("down_blocks", "downsampler") if stage["side"] == "encoder" else ("up_blocks",
                                                                                                  "upsampler")
            prefix = f"{stage['side']}.{blocks}.{stage['stage']}"
            residual = _rename_residual(stage["rest"])
            if residual is not None:
                new = f"{prefix}.resnets.{stage['index']}.{residual}"
            else:  # the stage's resample: its index follows the residual blocks and diffusers drops it
                new = f"{prefix}.{sampler}.{stage['rest']}"
        renamed[new] = key
    return renamed


def vae_original_keys(model_keys: list[str], config: dict[str, Any]) -> dict[str, str]:
    """``{diffusers key: original key}``, the inverse of the two maps above, for an ``AutoencoderKLWan`` config.

    Used to write original-layout files (the tiny-model builder); the loader reads them back with the forward maps.

    Raises:
        ValueError: A key has no original name (a structure neither release has).
    """
    residual = config.get("is_residual", False)
    blocks = config.get("num_res_blocks", 2)
    original = {}
    for key in model_keys:
        match = _PARAM.match(key)
        module, param = (match["module"], match["param"]) if match else (key, "")
        name = _original_module(module, residual, blocks)
        if name is None:
            raise ValueError(f"AutoencoderKLWan key {key!r} has no counterpart in the original Wan VAE")
        original[key] = f"{name}.{param}"
    return original


def _original_module(module: str, residual: bool, blocks: int) -> str | None:
    for diffusers, original in _TOP_NAMES_BACK.items():
        if module == diffusers:
            return original
        if module.startswith(diffusers + "."):
            inner = module[len(diffusers) + 1:]
            return f"{original}.{_RESIDUAL_PARTS_BACK.get(inner, inner)}"
    parts = module.split(".")
    side, kind, stage = parts[0], parts[1], parts[2]
    if kind not in ("down_blocks", "up_blocks"):
        return None
    flat = "downsamples" if side == "encoder" else "upsamples"
    residual_blocks = blocks if side == "encoder" else blocks + 1
    if not residual:
        if side == "encoder":  # the Wan2.1 encoder's stages are already one flat list in diffusers
            inner = ".".join(parts[3:])
            return f"encoder.downsamples.{stage}.{_RESIDUAL_PARTS_BACK.get(inner, inner)}"
        index, rest = _stage_member(parts, residual_blocks, "upsamplers")
        return None if index is None else f"decoder.upsamples.{int(stage) * (residual_blocks + 1) + index}.{rest}"
    index, rest = _stage_member(parts, residual_blocks, "downsampler" if side == "encoder" else "upsampler")
    return None if index is None else f"{side}.{flat}.{stage}.{flat}.{index}.{rest}"


def _stage_member(parts: list[str], residual_blocks: int, sampler: str) -> tuple[int | None, str]:
    """The index of a stage member in the original flat list and the rest of its name."""
    if parts[3] == "resnets":
        inner = ".".join(parts[5:])
        return int(parts[4]), _RESIDUAL_PARTS_BACK.get(inner, inner)
    if parts[3] == sampler:
        skip = 5 if sampler == "upsamplers" else 4  # Wan2.1's decoder keeps a list of one upsampler
        return residual_blocks, ".".join(parts[skip:])
    return None, ""


def vae_config(shapes: dict[str, tuple[int, ...]], file: str) -> dict[str, Any]:
    """The ``AutoencoderKLWan`` config of an original VAE file, read from its tensor shapes.

    Raises:
        ModelLoadError: A tensor the structure needs is missing, or the latent width is neither release's.
    """
    try:
        base_dim, in_channels = shapes["encoder.conv1.weight"][:2]
        z_dim = shapes["conv2.weight"][0]
        decoder_width = shapes["decoder.head.2.weight"][1]
    except KeyError as missing:
        raise ModelLoadError(f"{file} lacks {missing.args[0]!r}, which every original Wan VAE has; the file is "
                             "incomplete or not a Wan VAE: download it again") from None
    residual = is_wan22_vae(shapes)
    stages = _encoder_stages(shapes, residual)
    dim_mult = [widths[-1] // base_dim for widths, _ in stages]
    config: dict[str, Any] = {
        "base_dim": base_dim,
        "z_dim": z_dim,
        "dim_mult": dim_mult,
        "num_res_blocks": len(stages[0][0]),
        "temperal_downsample": [time for _, time in stages[:-1]],
        "attn_scales": [],
    }
    if z_dim == WAN22_LATENT_CHANNELS:
        config.update(latents_mean=list(WAN22_LATENTS_MEAN), latents_std=list(WAN22_LATENTS_STD))
    elif z_dim != WAN21_LATENT_CHANNELS:
        raise ModelLoadError(f"{file} is a VAE with {z_dim} latent channels; the Wan releases have "
                             f"{WAN21_LATENT_CHANNELS} (Wan2.1 VAE) or {WAN22_LATENT_CHANNELS} (Wan2.2 VAE), whose "
                             "latent statistics this loader knows: use one of those files")
    if residual:
        if in_channels != _PATCHED_CHANNELS:
            raise ModelLoadError(f"{file}: a Wan2.2-style VAE whose first convolution takes {in_channels} channels, "
                                 f"not {_PATCHED_CHANNELS} (3 colours x 2x2 patch); the file is not a Wan release")
        config.update(
            is_residual=True, in_channels=in_channels, out_channels=in_channels, patch_size=WAN22_PATCH_SIZE,
            decoder_base_dim=decoder_width // dim_mult[0],
            scale_factor_spatial=WAN22_PATCH_SIZE * 2 ** (len(dim_mult) - 1),
        )  # fmt: skip
    return config


def _encoder_stages(shapes: dict[str, tuple[int, ...]], residual: bool) -> list[tuple[list[int], bool]]:
    """Per encoder stage: the output widths of its residual blocks, and whether its resample also halves time."""
    if residual:
        stages: dict[int, tuple[list[int], bool]] = {}
        for key, shape in shapes.items():
            match = _WAN22_STAGE.match(key)
            if match is None or match["side"] != "encoder":
                continue
            widths, time = stages.setdefault(int(match["stage"]), ([], False))
            if match["rest"] == "residual.2.weight":
                widths.append(shape[0])
            elif match["rest"].startswith("time_conv."):
                stages[int(match["stage"])] = (widths, True)
        return [stages[index] for index in sorted(stages)]
    flat: list[tuple[int, str, tuple[int, ...]]] = []
    for key, shape in shapes.items():
        match = re.match(r"^encoder\.downsamples\.(\d+)\.(.+)$", key)
        if match:
            flat.append((int(match[1]), match[2], shape))
    ordered: list[tuple[list[int], bool]] = [([], False)]
    for index in sorted({index for index, _, _ in flat}):
        members = {rest: shape for i, rest, shape in flat if i == index}
        if "residual.2.weight" in members:
            ordered[-1][0].append(members["residual.2.weight"][0])
        else:  # a resample closes the stage
            ordered[-1] = (ordered[-1][0], any(rest.startswith("time_conv.") for rest in members))
            ordered.append(([], False))
    return ordered
