"""FLUX.1 [dev], Kontext and Krea in their released single-file layouts, loaded into diffusers' classes.

The ``black-forest-labs/FLUX.1-*`` repositories ship, beside their diffusers folders, the files of BFL's own code
(``src/flux/model.py`` and ``src/flux/modules/autoencoder.py`` of black-forest-labs/flux), which are what the
reference's commands load and what ComfyUI reads:

- ``flux1-dev.safetensors`` (``flux1-kontext-dev``, ``flux1-krea-dev``): the transformer;
- ``ae.safetensors``: the VAE, in the LDM layout of latent-diffusion autoencoders.

``identify`` tells from a file's tensor names whether it is one of these, and returns the diffusers class to build
(``FluxTransformer2DModel`` or ``AutoencoderKL``), its config read from the tensor shapes, and where each of the
model's tensors comes from. BFL's code is never imported. The transformer's names, one block of each kind shown:

==========================================================  ========================================================
BFL (``flux1-*.safetensors``)                                diffusers ``FluxTransformer2DModel``
==========================================================  ========================================================
``img_in`` / ``txt_in``                                      ``x_embedder`` / ``context_embedder``
``{time,vector,guidance}_in.in_layer`` / ``.out_layer``     ``time_text_embed.{timestep,text,guidance}_embedder``
                                                             ``.linear_1`` / ``.linear_2``
``double_blocks.N.{img,txt}_mod.lin``                        ``transformer_blocks.N.norm1{,_context}.linear``
``double_blocks.N.img_attn.qkv`` (3 x hidden rows)           ``transformer_blocks.N.attn.to_{q,k,v}``
``double_blocks.N.txt_attn.qkv`` (3 x hidden rows)           ``transformer_blocks.N.attn.add_{q,k,v}_proj``
``double_blocks.N.{img,txt}_attn.norm.{query,key}_norm``     ``transformer_blocks.N.attn.norm{,_added}_{q,k}``
``.scale``                                                   ``.weight``
``double_blocks.N.img_attn.proj`` / ``txt_attn.proj``        ``transformer_blocks.N.attn.to_out.0`` / ``to_add_out``
``double_blocks.N.{img,txt}_mlp.0`` / ``.2``                 ``transformer_blocks.N.ff{,_context}.net.0.proj`` /
                                                             ``.net.2``
``single_blocks.N.modulation.lin``                           ``single_transformer_blocks.N.norm.linear``
``single_blocks.N.linear1`` (3 x hidden + MLP rows)          ``single_transformer_blocks.N.attn.to_{q,k,v}``,
                                                             ``proj_mlp``
``single_blocks.N.norm.{query,key}_norm.scale``              ``single_transformer_blocks.N.attn.norm_{q,k}.weight``
``single_blocks.N.linear2``                                  ``single_transformer_blocks.N.proj_out``
``final_layer.linear``                                       ``proj_out``
``final_layer.adaLN_modulation.1`` (shift, scale)            ``norm_out.linear`` (scale, shift: the halves swapped)
==========================================================  ========================================================

The VAE's names are the LDM autoencoder's (``encoder.down.I.block.J``, ``encoder.mid.attn_1``, ``decoder.up.I``
numbered from the lowest resolution, ...), with the mid-block attention's projections stored as 1x1 convolutions;
``_VAE_MODULES`` lists them. Both maps agree with diffusers' single-file converters
(``convert_flux_transformer_checkpoint_to_diffusers``, ``convert_ldm_vae_checkpoint``), which are not used here:
the first hard-codes the released widths when it splits the fused projections, and both convert whole state dicts,
while the loader plans from the headers and converts one tensor at a time.

What the files do not record is FLUX.1's: patch size 1, rotary axes of 1/8, 7/16 and 7/16 of the head dim (16, 56
and 56 for the released 128), and the VAE's 32 norm groups, scaling and shift factors (``FLUX1_VAE_CONFIG``).
``transformer_to_original`` and ``vae_to_original`` write a diffusers state dict back in these layouts (the tiny
repos, and full fine-tunes saved as the single file ComfyUI loads).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from ...core.file_memo import read_json
from ...core.loader.errors import ModelLoadError
from ...core.loader.original_layout import OriginalModel, converted_entries, single_file_entries
from ...diffusion.module_naming import swap_halves

# vae/config.json of black-forest-labs/FLUX.1-dev, less what the weights' shapes give.
FLUX1_VAE_CONFIG = {
    "act_fn": "silu", "force_upcast": True, "latents_mean": None, "latents_std": None,
    "mid_block_add_attention": True, "norm_num_groups": 32, "sample_size": 1024, "scaling_factor": 0.3611,
    "shift_factor": 0.1159, "use_post_quant_conv": False, "use_quant_conv": False,
}  # fmt: skip
FLUX1_LATENT_CHANNELS = 16
# Rotary axes (text / image index, height, width) in sixteenths of the head dim; each axis needs an even size.
_ROPE_SIXTEENTHS = (2, 7, 7)
_HEAD_DIM_MULTIPLE = 32

# How one BFL tensor holds the model's: as it is, the model's tensors stacked along rows (all but the last with
# ``hidden`` rows, the last with the rest), or with its two halves in the other order.
_SAME, _FUSED, _SWAPPED = "same", "fused", "swapped"
# The rows of each part of a fused layer, in multiples of the hidden size: its MLP is four times as wide.
_FUSED_WIDTHS = {"img_attn.qkv": (1, 1, 1), "txt_attn.qkv": (1, 1, 1), "linear1": (1, 1, 1, 4)}
_LINEAR = (("weight", "weight"), ("bias", "bias"))  # (diffusers parameter, BFL parameter)
_RMS_NORM = (("weight", "scale"),)
# (diffusers modules, BFL module, parameters, how the BFL tensor holds them).
_TOP = (
    (("x_embedder",), "img_in", _LINEAR, _SAME),
    (("context_embedder",), "txt_in", _LINEAR, _SAME),
    (("time_text_embed.timestep_embedder.linear_1",), "time_in.in_layer", _LINEAR, _SAME),
    (("time_text_embed.timestep_embedder.linear_2",), "time_in.out_layer", _LINEAR, _SAME),
    (("time_text_embed.text_embedder.linear_1",), "vector_in.in_layer", _LINEAR, _SAME),
    (("time_text_embed.text_embedder.linear_2",), "vector_in.out_layer", _LINEAR, _SAME),
    (("proj_out",), "final_layer.linear", _LINEAR, _SAME),
    # BFL's final modulation yields (shift, scale), diffusers' AdaLayerNormContinuous (scale, shift)
    (("norm_out.linear",), "final_layer.adaLN_modulation.1", _LINEAR, _SWAPPED),
)
_GUIDANCE = (
    (("time_text_embed.guidance_embedder.linear_1",), "guidance_in.in_layer", _LINEAR, _SAME),
    (("time_text_embed.guidance_embedder.linear_2",), "guidance_in.out_layer", _LINEAR, _SAME),
)
_DOUBLE_BLOCK = (
    (("norm1.linear",), "img_mod.lin", _LINEAR, _SAME),
    (("norm1_context.linear",), "txt_mod.lin", _LINEAR, _SAME),
    (("attn.to_q", "attn.to_k", "attn.to_v"), "img_attn.qkv", _LINEAR, _FUSED),
    (("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"), "txt_attn.qkv", _LINEAR, _FUSED),
    (("attn.norm_q",), "img_attn.norm.query_norm", _RMS_NORM, _SAME),
    (("attn.norm_k",), "img_attn.norm.key_norm", _RMS_NORM, _SAME),
    (("attn.norm_added_q",), "txt_attn.norm.query_norm", _RMS_NORM, _SAME),
    (("attn.norm_added_k",), "txt_attn.norm.key_norm", _RMS_NORM, _SAME),
    (("attn.to_out.0",), "img_attn.proj", _LINEAR, _SAME),
    (("attn.to_add_out",), "txt_attn.proj", _LINEAR, _SAME),
    (("ff.net.0.proj",), "img_mlp.0", _LINEAR, _SAME),
    (("ff.net.2",), "img_mlp.2", _LINEAR, _SAME),
    (("ff_context.net.0.proj",), "txt_mlp.0", _LINEAR, _SAME),
    (("ff_context.net.2",), "txt_mlp.2", _LINEAR, _SAME),
)
_SINGLE_BLOCK = (
    (("norm.linear",), "modulation.lin", _LINEAR, _SAME),
    (("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"), "linear1", _LINEAR, _FUSED),
    (("attn.norm_q",), "norm.query_norm", _RMS_NORM, _SAME),
    (("attn.norm_k",), "norm.key_norm", _RMS_NORM, _SAME),
    (("proj_out",), "linear2", _LINEAR, _SAME),
)
# FLUX.1's per-block image modulation: FLUX.2 and Chroma, which also have double_blocks, share one across blocks.
_FLUX1_MARKER = re.compile(r"^double_blocks\.\d+\.img_mod\.lin\.weight$")

# LDM module <-> AutoencoderKL module. {i}: a stage counted from the full resolution, {u}: the same decoder stage
# as LDM numbers it (from the lowest resolution), {j}: a block in it, {res}: a layer of a residual block, {att}: a
# layer of the mid-block attention.
_VAE_MODULES = (
    ("encoder.conv_in", "encoder.conv_in"),
    ("encoder.down.{i}.block.{j}.{res}", "encoder.down_blocks.{i}.resnets.{j}.{res}"),
    ("encoder.down.{i}.downsample.conv", "encoder.down_blocks.{i}.downsamplers.0.conv"),
    ("encoder.mid.block_1.{res}", "encoder.mid_block.resnets.0.{res}"),
    ("encoder.mid.attn_1.{att}", "encoder.mid_block.attentions.0.{att}"),
    ("encoder.mid.block_2.{res}", "encoder.mid_block.resnets.1.{res}"),
    ("encoder.norm_out", "encoder.conv_norm_out"),
    ("encoder.conv_out", "encoder.conv_out"),
    ("decoder.conv_in", "decoder.conv_in"),
    ("decoder.mid.block_1.{res}", "decoder.mid_block.resnets.0.{res}"),
    ("decoder.mid.attn_1.{att}", "decoder.mid_block.attentions.0.{att}"),
    ("decoder.mid.block_2.{res}", "decoder.mid_block.resnets.1.{res}"),
    ("decoder.up.{u}.block.{j}.{res}", "decoder.up_blocks.{i}.resnets.{j}.{res}"),
    ("decoder.up.{u}.upsample.conv", "decoder.up_blocks.{i}.upsamplers.0.conv"),
    ("decoder.norm_out", "decoder.conv_norm_out"),
    ("decoder.conv_out", "decoder.conv_out"),
)
_VAE_RESNET_LAYERS = {"norm1": "norm1", "conv1": "conv1", "norm2": "norm2", "conv2": "conv2",
                      "nin_shortcut": "conv_shortcut"}  # fmt: skip
_VAE_ATTENTION_LAYERS = {"norm": "group_norm", "q": "to_q", "k": "to_k", "v": "to_v", "proj_out": "to_out.0"}
_VAE_PROJECTIONS = ("q", "k", "v", "proj_out")  # 1x1 convolutions in LDM, Linear layers in diffusers
_LDM_VAE_MARKER = re.compile(r"^(?:encoder\.down|decoder\.up)\.\d+\.block\.\d+\.")


def identify(files: list[Path]) -> OriginalModel | None:
    """The FLUX.1 single file ``files`` hold (the transformer or ``ae.safetensors``), or None for anything else.

    Only one safetensors file is looked at, and only its header is read; a config.json is not needed.

    Raises:
        ModelLoadError: The file is not valid safetensors, looks like a FLUX.1 file but lacks tensors its structure
            needs, or is an LDM-layout VAE other than FLUX.1's. The message names the file.
    """
    found = single_file_entries(list(files))
    if found is None:
        return None
    file, entries = found
    shapes = {key: entry.shape for key, entry in entries.items()}
    if any(_FLUX1_MARKER.match(key) for key in shapes):
        config = transformer_config(shapes, file)
        kind, name, sources = "dit", "FluxTransformer2DModel", transformer_sources(shapes, config, file)
    elif any(_LDM_VAE_MARKER.match(key) for key in shapes):
        if _declares_diffusers_class(file.parent):  # a diffusers folder (LTX-2's audio VAE keeps LDM-like names)
            return None
        config = vae_config(shapes, file)
        kind, name, sources = "vae", "AutoencoderKL", vae_sources(shapes, config, file)
    else:
        return None
    return OriginalModel(kind=kind, library="diffusers", class_name=name, config=config,
                            entries=converted_entries(entries, sources), source=file)


def _declares_diffusers_class(folder: Path) -> bool:
    """Whether ``folder`` holds a ``config.json`` naming a diffusers class, as a diffusers model folder does (BFL's
    single files come without one)."""
    path = folder / "config.json"
    if not path.is_file():
        return False
    try:
        return "_class_name" in read_json(path)
    except (OSError, ValueError):
        return False


# ---- the transformer -------------------------------------------------------------------------------------------------


def _block_count(keys: Iterable[str], prefix: str) -> int:
    """1 + the highest block index under ``prefix`` (``double_blocks``), 0 when there is none."""
    pattern = re.compile(rf"^{re.escape(prefix)}\.(\d+)\.")
    return 1 + max((int(match[1]) for key in keys if (match := pattern.match(key))), default=-1)


def transformer_config(shapes: dict[str, tuple[int, ...]], file: Path | str) -> dict[str, Any]:
    """The ``FluxTransformer2DModel`` config of a BFL transformer file, from its tensor shapes.

    Raises:
        ModelLoadError: A tensor the sizes are read from is missing, or the head dim is not a multiple of 32 (FLUX.1's
            rotary axes would not split it).
    """
    try:
        hidden, in_channels = shapes["img_in.weight"]
        joint_attention_dim = shapes["txt_in.weight"][1]
        pooled_projection_dim = shapes["vector_in.in_layer.weight"][1]
        (head_dim,) = shapes["double_blocks.0.img_attn.norm.query_norm.scale"]
        out_channels = shapes["final_layer.linear.weight"][0]
    except KeyError as missing:
        raise ModelLoadError(f"{file} lacks {missing.args[0]!r}, which every FLUX.1 transformer has; the file is "
                             "incomplete (an interrupted download?): download it again") from None
    if head_dim % _HEAD_DIM_MULTIPLE or hidden % head_dim:
        raise ModelLoadError(f"{file}: attention head dim {head_dim} (the query norm's size) with width {hidden} is "
                             f"not a FLUX.1 transformer's: its rotary axes need a head dim that is a multiple of "
                             f"{_HEAD_DIM_MULTIPLE} and divides the width (the releases have 128 and 3072)")
    return {
        "patch_size": 1, "in_channels": in_channels,
        # the released config.json leaves out_channels unset (diffusers then takes in_channels); Fill sets it
        "out_channels": None if out_channels == in_channels else out_channels,
        "num_layers": _block_count(shapes, "double_blocks"),
        "num_single_layers": _block_count(shapes, "single_blocks"),
        "attention_head_dim": head_dim, "num_attention_heads": hidden // head_dim,
        "joint_attention_dim": joint_attention_dim, "pooled_projection_dim": pooled_projection_dim,
        "guidance_embeds": "guidance_in.in_layer.weight" in shapes,
        "axes_dims_rope": [head_dim * sixteenths // 16 for sixteenths in _ROPE_SIXTEENTHS],
    }  # fmt: skip


def _transformer_pairs(num_layers: int, num_single_layers: int, guidance: bool) -> list[tuple[str, tuple, str]]:
    """``(BFL key, diffusers keys, how)`` for every tensor of a FLUX.1 transformer with these blocks."""

    def expand(rules, bfl_prefix: str, model_prefix: str):
        for modules, bfl, params, how in rules:
            for model_param, bfl_param in params:
                yield (f"{bfl_prefix}{bfl}.{bfl_param}",
                       tuple(f"{model_prefix}{module}.{model_param}" for module in modules), how)

    pairs = list(expand(_TOP + (_GUIDANCE if guidance else ()), "", ""))
    for index in range(num_layers):
        pairs += expand(_DOUBLE_BLOCK, f"double_blocks.{index}.", f"transformer_blocks.{index}.")
    for index in range(num_single_layers):
        pairs += expand(_SINGLE_BLOCK, f"single_blocks.{index}.", f"single_transformer_blocks.{index}.")
    return pairs


def _rows(start: int, stop: int | None, tensor: torch.Tensor) -> torch.Tensor:
    # A copy, not a view: a view would keep the whole fused tensor alive behind each of its parts.
    return tensor[start:stop].clone()


def bfl_linear_layers() -> dict[str, tuple[tuple[str, ...], tuple[int, ...], bool]]:
    """BFL's Linear layers -> ``(diffusers layers, widths, swapped)``: the diffusers Linear layers each holds in row
    order, their rows in multiples of the hidden size (empty for a layer of one part), and whether the two halves of
    its rows come in the other order. Block layers have ``{}`` for the block index on both sides
    (``double_blocks.{}.img_attn.qkv`` -> ``transformer_blocks.{}.attn.to_q``, ...). The LoRA naming of FLUX.1's
    kohya files (``lora.naming``) is built from this table."""
    layers = {}
    for prefix, model_prefix, table in (("", "", _TOP + _GUIDANCE), ("double_blocks.{}.", "transformer_blocks.{}.",
                                                                      _DOUBLE_BLOCK),
                                        ("single_blocks.{}.", "single_transformer_blocks.{}.", _SINGLE_BLOCK)):
        for modules, bfl, params, how in table:
            if params is _LINEAR:
                layers[prefix + bfl] = (tuple(model_prefix + module for module in modules),
                                        _FUSED_WIDTHS.get(bfl, ()), how == _SWAPPED)
    return layers


def transformer_sources(shapes: dict[str, tuple[int, ...]], config: dict[str, Any],
                        file: Path | str) -> dict[str, tuple[str, Any]]:
    """``{FluxTransformer2DModel key: (BFL key, convert or None)}`` for a BFL transformer file.

    The fused projections are split by ``config``'s width (not the released 3072). Keys of the file that are no
    FLUX.1 tensor keep their name, so that the loader reports them as unexpected.

    Raises:
        ModelLoadError: The file lacks tensors of the structure its blocks imply; the message names them.
    """
    hidden = config["num_attention_heads"] * config["attention_head_dim"]
    pairs = _transformer_pairs(config["num_layers"], config["num_single_layers"], config["guidance_embeds"])
    _refuse_missing(file, [bfl for bfl, _, _ in pairs if bfl not in shapes],
                    f"FLUX.1 transformer with {config['num_layers']} double and {config['num_single_layers']} "
                    "single blocks")
    sources: dict[str, tuple[str, Any]] = {}
    for bfl, model_keys, how in pairs:
        if how == _FUSED:
            for index, model_key in enumerate(model_keys):
                stop = None if index == len(model_keys) - 1 else (index + 1) * hidden
                sources[model_key] = (bfl, functools.partial(_rows, index * hidden, stop))
        else:
            sources[model_keys[0]] = (bfl, swap_halves if how == _SWAPPED else None)
    used = {bfl for bfl, _, _ in pairs}
    sources.update({key: (key, None) for key in shapes if key not in used})
    return sources


def transformer_to_original(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A ``FluxTransformer2DModel`` state dict in BFL's layout (``flux1-dev.safetensors``), fused projections
    concatenated and the final modulation's halves swapped back.

    Raises:
        ValueError: A key has no counterpart in BFL's transformer, or a fused projection lacks one of its parts.
    """
    pairs = _transformer_pairs(_block_count(state_dict, "transformer_blocks"),
                               _block_count(state_dict, "single_transformer_blocks"),
                               any(key.startswith("time_text_embed.guidance_embedder.") for key in state_dict))
    original, used = {}, set()
    for bfl, model_keys, how in pairs:
        absent = [key for key in model_keys if key not in state_dict]
        if absent:
            raise ValueError(f"the FluxTransformer2DModel state dict lacks {absent}, needed for BFL's {bfl!r}")
        tensors = [state_dict[key] for key in model_keys]
        original[bfl] = torch.cat(tensors) if how == _FUSED else swap_halves(tensors[0]) if how == _SWAPPED \
            else tensors[0]
        used.update(model_keys)
    extra = sorted(set(state_dict) - used)
    if extra:
        raise ValueError(f"FluxTransformer2DModel key(s) {extra[:10]} have no counterpart in BFL's FLUX.1 layout")
    return original


def _refuse_missing(file: Path | str, missing: list[str], what: str) -> None:
    if missing:
        shown = ", ".join(repr(key) for key in missing[:10])
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        raise ModelLoadError(f"{file} lacks {len(missing)} tensor(s) of a {what}: {shown}{more}; the file is "
                             "incomplete (an interrupted download or a partial export): download it again")


# ---- the VAE ---------------------------------------------------------------------------------------------------------


def vae_config(shapes: dict[str, tuple[int, ...]], file: Path | str) -> dict[str, Any]:
    """The ``AutoencoderKL`` config of an LDM-layout ``ae.safetensors``: widths and depth from its shapes, the rest
    FLUX.1's (``FLUX1_VAE_CONFIG``).

    Raises:
        ModelLoadError: A tensor the sizes are read from is missing, or the VAE is not FLUX.1's (other latent
            channels, or the quant convolutions of Stable Diffusion's VAEs), whose scaling this loader cannot know.
    """
    stages = _block_count(shapes, "encoder.down")
    try:
        in_channels = shapes["encoder.conv_in.weight"][1]
        out_channels = shapes["decoder.conv_out.weight"][0]
        latent_channels = shapes["decoder.conv_in.weight"][1]
        widths = [shapes[f"encoder.down.{stage}.block.0.conv1.weight"][0] for stage in range(stages)]
    except KeyError as missing:
        raise ModelLoadError(f"{file} lacks {missing.args[0]!r}, which every LDM-layout VAE has; the file is "
                             "incomplete (an interrupted download?): download it again") from None
    quant = [key for key in ("quant_conv.weight", "post_quant_conv.weight") if key in shapes]
    if latent_channels != FLUX1_LATENT_CHANNELS or quant:
        found = f"{latent_channels} latent channels" + (" and quant convolutions" if quant else "")
        raise ModelLoadError(f"{file} is an LDM-layout VAE with {found}; the only one this loader reads in that "
                             f"layout is FLUX.1's ae.safetensors ({FLUX1_LATENT_CHANNELS} latent channels, no quant "
                             "convolutions), whose scaling it knows: load this VAE from its diffusers folder")
    return {
        **FLUX1_VAE_CONFIG, "in_channels": in_channels, "out_channels": out_channels,
        "latent_channels": latent_channels, "block_out_channels": widths,
        "layers_per_block": _block_count(shapes, "encoder.down.0.block"),
        "down_block_types": ["DownEncoderBlock2D"] * stages, "up_block_types": ["UpDecoderBlock2D"] * stages,
    }  # fmt: skip


@functools.cache
def _vae_template(template: str) -> re.Pattern:
    pattern = re.escape(template)
    for field in ("i", "u", "j"):
        pattern = pattern.replace(re.escape(f"{{{field}}}"), rf"(?P<{field}>\d+)")
    for field in ("res", "att"):
        pattern = pattern.replace(re.escape(f"{{{field}}}"), rf"(?P<{field}>[\w.]+)")
    return re.compile(rf"^{pattern}$")


def _vae_key(key: str, stages: int, to_diffusers: bool) -> str | None:
    """The other layout's name of a VAE key (``stages``: the number of resolutions), or None when it has none."""
    module, _, param = key.rpartition(".")
    layers = {"res": _VAE_RESNET_LAYERS, "att": _VAE_ATTENTION_LAYERS}
    if not to_diffusers:
        layers = {field: {new: old for old, new in names.items()} for field, names in layers.items()}
    for ldm, diffusers in _VAE_MODULES:
        source, target = (ldm, diffusers) if to_diffusers else (diffusers, ldm)
        match = _vae_template(source).match(module)
        if match is None:
            continue
        values = match.groupdict()
        if "u" in values:
            values["i"] = str(stages - 1 - int(values["u"]))
        elif "{u}" in target:
            values["u"] = str(stages - 1 - int(values["i"]))
        for field, names in layers.items():
            if field in values:
                if values[field] not in names:
                    return None
                values[field] = names[values[field]]
        return f"{target.format(**values)}.{param}"
    return None


def _is_projection_weight(ldm_key: str) -> bool:
    module, _, param = ldm_key.rpartition(".")
    return param == "weight" and ".mid.attn_1." in ldm_key and module.rpartition(".")[2] in _VAE_PROJECTIONS


def _linear_from_1x1(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.flatten(1)


def vae_sources(shapes: dict[str, tuple[int, ...]], config: dict[str, Any],
                file: Path | str) -> dict[str, tuple[str, Any]]:
    """``{AutoencoderKL key: (LDM key, convert or None)}`` for an ``ae.safetensors``; keys that are no VAE tensor keep
    their name (the loader reports them as unexpected).

    Raises:
        ModelLoadError: The file lacks tensors of the VAE ``config`` describes; the message names them.
    """
    from accelerate import init_empty_weights
    from diffusers import AutoencoderKL

    with init_empty_weights():
        expected = vae_to_original(AutoencoderKL.from_config(config).state_dict())
    _refuse_missing(file, sorted(key for key in expected if key not in shapes),
                    f"FLUX.1 VAE with {len(config['block_out_channels'])} stages")
    stages = len(config["block_out_channels"])
    sources: dict[str, tuple[str, Any]] = {}
    for key in shapes:
        model_key = _vae_key(key, stages, to_diffusers=True)
        if model_key is None:
            sources[key] = (key, None)
        else:
            sources[model_key] = (key, _linear_from_1x1 if _is_projection_weight(key) else None)
    return sources


def vae_to_original(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An ``AutoencoderKL`` state dict in the LDM layout of ``ae.safetensors`` (attention projections as 1x1
    convolutions).

    Raises:
        ValueError: A key has no counterpart in the LDM layout (quant convolutions included: FLUX.1 has none).
    """
    stages = _block_count(state_dict, "decoder.up_blocks")
    original = {}
    for key, tensor in state_dict.items():
        ldm_key = _vae_key(key, stages, to_diffusers=False)
        if ldm_key is None:
            raise ValueError(f"AutoencoderKL key {key!r} has no counterpart in FLUX.1's LDM-layout ae.safetensors")
        original[ldm_key] = tensor[:, :, None, None] if _is_projection_weight(ldm_key) else tensor
    return original
