"""The original Wan release layouts, loaded into the diffusers / transformers classes.

The ``Wan-AI/Wan2.1-*`` and ``Wan-AI/Wan2.2-*`` repositories (without ``-Diffusers``) ship the files of the original
Wan code rather than diffusers folders:

- the DiT: ``config.json`` naming ``WanModel`` beside ``diffusion_pytorch_model*.safetensors`` shards (at the
  repository root, or in ``high_noise_model/`` and ``low_noise_model/`` for the Wan2.2 A14B experts);
- ``models_t5_umt5-xxl-enc-bf16.pth`` (UMT5 encoder) with its tokenizer in ``google/umt5-xxl/``;
- ``Wan2.1_VAE.pth`` or ``Wan2.2_VAE.pth``;
- ``models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth`` (Wan2.1 image-to-video and Wan2.2-Animate).

A DiT whose tensors hold the Animate modules (``original_animate.py``) is read into ``WanAnimateTransformer3DModel``;
the Animate-2 release's lone safetensors file (``original_animate2.py``) into ``WanAnimate2Transformer3DModel``.

``identify`` tells from the files themselves (the config's class, the tensor names of a ``.pth``) which of these a
set of files is, and returns the class to build, its config and where each of its tensors comes from. The class is
always diffusers' or transformers' (``WanTransformer3DModel``, ``AutoencoderKLWan``, ``UMT5EncoderModel``,
``CLIPVisionModel``): the original code is never imported. The DiT's renaming is diffusers' own
``convert_wan_transformer_to_diffusers``; ``dit_original_keys`` is its inverse, used to write original-layout files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...core.file_memo import read_json
from ...core.loader.errors import ModelLoadError
from ...core.loader.original_layout import OriginalModel, converted_entries, renamed_entries
from ...core.loader.pth import PTH_SUFFIX
from ...core.loader.state_dict import read_headers
from ...core.model_traits import register_model_module
from .original_animate import (
    ANIMATE_DIT_CLASS,
    ANIMATE_PREFIXES,
    animate_config,
    animate_sources,
    animate_to_original,
    is_animate,
)
from .original_animate2 import (
    ANIMATE2_DIT_CLASS,
    animate2_config,
    animate2_model_keys,
    animate2_original_key,
    is_animate2,
)
from .original_encoders import clip_config, clip_model_keys, is_clip, is_umt5, umt5_config, umt5_model_keys
from .original_vace import (
    ORIGINAL_VACE_CLASS,
    VACE_DIT_CLASS,
    is_vace_config,
    original_vace_config_json,
    vace_config,
    vace_original_key,
)
from .original_vae import is_wan22_vae, vae_config, wan21_vae_model_keys, wan22_vae_model_keys

ORIGINAL_DIT_CLASS = "WanModel"
# The Fun releases' DiT (reference-image convolution, camera adapter) is a subclass kept in this room.
FUN_DIT_CLASS = "WanFunTransformer3DModel"
register_model_module("diffsynth.pipelines.wan_video.fun_model", library="diffusers")
# Tensors of the Fun releases' extra modules, named alike in WanFunTransformer3DModel.
_FUN_PREFIXES = ("ref_conv.", "control_adapter.")
# The camera adapter's pixel unshuffle (the VAE's spatial compression): its convolution reads 64x the camera channels.
CAMERA_UNSHUFFLE = 8
# The tokenizer folder every original Wan repository ships beside the T5 file (t5_tokenizer in wan/configs/*.py).
UMT5_TOKENIZER_FOLDER = "google/umt5-xxl"
# Defaults of WanModel.__init__ in wan/modules/model.py, for fields a config.json leaves out.
_WAN_MODEL_DEFAULTS = {"dim": 2048, "ffn_dim": 8192, "freq_dim": 256, "num_heads": 16, "num_layers": 32,
                       "in_dim": 16, "out_dim": 16, "eps": 1e-6}  # fmt: skip
_KNOWN_PTH = ("the UMT5 text encoder (models_t5_umt5-xxl-enc-bf16.pth), the Wan2.1 or Wan2.2 VAE (Wan2.1_VAE.pth, "
              "Wan2.2_VAE.pth) or the CLIP image encoder (models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth)")

# diffusers module paths of WanTransformer3DModel -> the original WanModel's (whole modules, weights and biases).
_DIT_TOP = {
    "patch_embedding": "patch_embedding", "proj_out": "head.head", "scale_shift_table": "head.modulation",
    "condition_embedder.time_embedder.linear_1": "time_embedding.0",
    "condition_embedder.time_embedder.linear_2": "time_embedding.2",
    "condition_embedder.text_embedder.linear_1": "text_embedding.0",
    "condition_embedder.text_embedder.linear_2": "text_embedding.2",
    "condition_embedder.time_proj": "time_projection.1",
    "condition_embedder.image_embedder.norm1": "img_emb.proj.0",
    "condition_embedder.image_embedder.ff.net.0.proj": "img_emb.proj.1",
    "condition_embedder.image_embedder.ff.net.2": "img_emb.proj.3",
    "condition_embedder.image_embedder.norm2": "img_emb.proj.4",
    "condition_embedder.image_embedder.pos_embed": "img_emb.emb_pos",
}  # fmt: skip
# The one original DiT tensor diffusers' single-file converter leaves unrenamed (its conversion script maps it).
_FLF2V_POSITIONS = {"img_emb.emb_pos": "condition_embedder.image_embedder.pos_embed"}
_DIT_BLOCK = {
    "scale_shift_table": "modulation", "norm2": "norm3",
    "attn1.to_q": "self_attn.q", "attn1.to_k": "self_attn.k", "attn1.to_v": "self_attn.v",
    "attn1.to_out.0": "self_attn.o", "attn1.norm_q": "self_attn.norm_q", "attn1.norm_k": "self_attn.norm_k",
    "attn2.to_q": "cross_attn.q", "attn2.to_k": "cross_attn.k", "attn2.to_v": "cross_attn.v",
    "attn2.to_out.0": "cross_attn.o", "attn2.norm_q": "cross_attn.norm_q", "attn2.norm_k": "cross_attn.norm_k",
    "attn2.add_k_proj": "cross_attn.k_img", "attn2.add_v_proj": "cross_attn.v_img",
    "attn2.norm_added_k": "cross_attn.norm_k_img",
    "ffn.net.0.proj": "ffn.0", "ffn.net.2": "ffn.2",
}  # fmt: skip


def identify(files: list[Path]) -> OriginalModel | None:
    """The original Wan model ``files`` hold, or None when they are not an original layout (a diffusers or
    transformers folder, a tokenizer).

    Raises:
        ModelLoadError: A ``.pth`` file is not one of the Wan release files, several ``.pth`` files form one entry,
            or an original file lacks tensors its structure needs. The message names the file.
    """
    pth = [path for path in files if path.is_file() and path.suffix == PTH_SUFFIX]
    if pth:
        if len(files) != 1:
            raise ModelLoadError(f"{[str(f) for f in files]} hold a .pth file among other files; a .pth file is a "
                                 "whole model: give each one its own entry")
        return _identify_pth(pth[0])
    shards = [path for path in files if path.is_file() and path.name.endswith(".safetensors")]
    folders = {shard.parent for shard in shards}
    if len(folders) != 1:
        return None
    folder = folders.pop()
    if len(shards) == 1 and not (folder / "config.json").exists():
        return _identify_single_file(shards[0])
    config = _original_dit_config(folder)
    if config is None:
        return None
    entries = read_headers(shards)
    shapes = {key: entry.shape for key, entry in entries.items()}
    model_config = dit_config(config, shapes, folder / "config.json")
    if is_animate(shapes):
        model_config.update(animate_config(shapes, model_config["num_layers"]))
        return OriginalModel(kind="dit", library="diffusers", class_name=ANIMATE_DIT_CLASS, config=model_config,
                             entries=converted_entries(entries, _animate_model_sources(model_config)), source=folder)
    vace = is_vace_config(config)
    if vace:
        model_config.update(vace_config(config, shapes, model_config["num_layers"]))
    fun = "reference_conv" in model_config
    class_name = VACE_DIT_CLASS if vace else FUN_DIT_CLASS if fun else "WanTransformer3DModel"
    return OriginalModel(
        kind="dit", library="diffusers", class_name=class_name, config=model_config,
        entries=renamed_entries(entries, dit_model_keys(list(entries))), source=folder,
    )  # fmt: skip


def _identify_single_file(file: Path) -> OriginalModel | None:
    """A lone safetensors file without a config: the Animate-2 release's transformer, or None."""
    entries = read_headers([file])
    if not is_animate2(entries):
        return None
    shapes = {key: entry.shape for key, entry in entries.items()}
    return OriginalModel(kind="dit", library="diffusers", class_name=ANIMATE2_DIT_CLASS, config=animate2_config(shapes),
                         entries=renamed_entries(entries, animate2_model_keys(list(entries))), source=file)


def _animate_model_sources(config: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """Where each tensor of a ``WanAnimateTransformer3DModel`` of ``config`` comes from in the release (its keys are
    read off the model built on the meta device: the motion encoder's depth decides its names)."""
    import torch
    from diffusers import WanAnimateTransformer3DModel

    with torch.device("meta"):
        keys = list(WanAnimateTransformer3DModel(**config).state_dict())
    plain = dit_original_keys([key for key in keys if not key.startswith(ANIMATE_PREFIXES)])
    return {**{key: (name, None) for key, name in plain.items()}, **animate_sources(keys)}


def _original_dit_config(folder: Path) -> dict[str, Any] | None:
    path = folder / "config.json"
    try:
        config = read_json(path)
    except (OSError, ValueError):
        return None  # the diffusers loader reports a missing or broken config.json itself
    # The Animate release is told from its tensors; its config may name the original WanAnimateModel.
    known = (ORIGINAL_DIT_CLASS, ORIGINAL_VACE_CLASS, "WanAnimateModel")
    return config if isinstance(config, dict) and config.get("_class_name") in known else None


def _identify_pth(file: Path) -> OriginalModel:
    entries = read_headers([file])
    shapes = {key: entry.shape for key, entry in entries.items()}
    if is_umt5(shapes):
        sources = umt5_model_keys(list(entries))
        kind, library, name, config = "umt5", "transformers", "UMT5EncoderModel", umt5_config(shapes, str(file))
    elif is_clip(shapes):
        sources = clip_model_keys(list(entries))
        kind, library, name, config = "clip", "transformers", "CLIPVisionModel", clip_config(shapes, str(file))
    elif "decoder.middle.0.residual.0.gamma" in shapes:
        keys = wan22_vae_model_keys(list(entries)) if is_wan22_vae(shapes) else wan21_vae_model_keys(list(entries))
        sources = {model_key: (key, None) for model_key, key in keys.items()}
        kind, library, name, config = "vae", "diffusers", "AutoencoderKLWan", vae_config(shapes, str(file))
    else:
        shown = ", ".join(repr(key) for key in list(entries)[:5])
        raise ModelLoadError(f"{file} is not an original Wan release file this loader knows ({_KNOWN_PTH}); its "
                             f"first tensors are {shown}. Other checkpoints are read only as safetensors: point "
                             "the pattern at the right file, or convert this one to a diffusers folder")
    return OriginalModel(kind=kind, library=library, class_name=name, config=config,
                            entries=converted_entries(entries, sources), source=file)


def dit_model_keys(checkpoint_keys: list[str]) -> dict[str, str]:
    """``{WanTransformer3DModel key: original key}``, by diffusers' ``convert_wan_transformer_to_diffusers``, plus
    the FLF2V image positions, which that converter leaves under their original name."""
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    names = convert_wan_transformer_to_diffusers({key: key for key in checkpoint_keys})
    return {_FLF2V_POSITIONS.get(key, key): original for key, original in names.items()}


def dit_original_keys(model_keys: list[str]) -> dict[str, str]:
    """``{WanTransformer3DModel key: original key}``, the inverse of ``dit_model_keys`` (to write original files).

    Raises:
        ValueError: A key has no counterpart in the original ``WanModel``.
    """
    original = {}
    for key in model_keys:
        module, _, param = key.rpartition(".")
        if key in _DIT_TOP:  # a bare parameter (the head's modulation, the FLF2V image positions)
            original[key] = _DIT_TOP[key]
            continue
        if module in _DIT_TOP:
            original[key] = f"{_DIT_TOP[module]}.{param}"
            continue
        if key.startswith(_FUN_PREFIXES):
            original[key] = key
            continue
        if key.startswith(ANIMATE_PREFIXES):
            raise ValueError(f"{key!r} is a WanAnimateTransformer3DModel key: write it with dit_to_original, which "
                             "fuses and reshapes the Animate tensors")
        vace = vace_original_key(key, _DIT_BLOCK)
        if vace is not None:
            original[key] = vace
            continue
        parts = key.split(".")
        layer = ".".join(parts[2:-1]) if parts[-1] in ("weight", "bias") else ".".join(parts[2:])
        suffix = f".{parts[-1]}" if parts[-1] in ("weight", "bias") else ""
        if parts[0] != "blocks" or layer not in _DIT_BLOCK:
            raise ValueError(f"WanTransformer3DModel key {key!r} has no counterpart in the original WanModel")
        original[key] = f"blocks.{parts[1]}.{_DIT_BLOCK[layer]}{suffix}"
    return original


def dit_config(original: dict[str, Any], shapes: dict[str, tuple[int, ...]], config_path: Path) -> dict[str, Any]:
    """The ``WanTransformer3DModel`` config of an original DiT: sizes from its ``config.json``, and from the weights'
    shapes what ``WanModel`` leaves out of its config (patch size, text width, image projection).

    Raises:
        ModelLoadError: The config's sizes are not numbers, or the patch embedding is missing.
    """
    values = {**_WAN_MODEL_DEFAULTS, **{k: v for k, v in original.items() if k in _WAN_MODEL_DEFAULTS}}
    if not all(isinstance(values[k], (int, float)) and values[k] > 0 for k in values):
        raise ModelLoadError(f"{config_path} holds a size that is not a positive number ({values}); restore the "
                             "repository's config.json")
    if "patch_embedding.weight" not in shapes or "text_embedding.0.weight" not in shapes:
        raise ModelLoadError(f"the shards beside {config_path} lack the patch or text embedding of a WanModel; the "
                             "pattern leaves shards out, or the folder holds another model")
    dim, heads = int(values["dim"]), int(values["num_heads"])
    config = {
        "patch_size": list(shapes["patch_embedding.weight"][2:]), "num_attention_heads": heads,
        "attention_head_dim": dim // heads, "in_channels": int(values["in_dim"]),
        "out_channels": int(values["out_dim"]), "text_dim": shapes["text_embedding.0.weight"][1],
        "freq_dim": int(values["freq_dim"]), "ffn_dim": int(values["ffn_dim"]), "num_layers": int(values["num_layers"]),
        "cross_attn_norm": "blocks.0.norm3.weight" in shapes,
        "qk_norm": "rms_norm_across_heads" if "blocks.0.self_attn.norm_q.weight" in shapes else None,
        "eps": float(values["eps"]), "image_dim": None, "added_kv_proj_dim": None,
    }  # fmt: skip
    if "img_emb.proj.0.weight" in shapes:  # Wan2.1 image-to-video: CLIP features through img_emb, k_img / v_img
        config.update(image_dim=shapes["img_emb.proj.0.weight"][0], added_kv_proj_dim=dim)
    if "img_emb.emb_pos" in shapes:
        config["pos_embed_seq_len"] = shapes["img_emb.emb_pos"][1]
    if any(key.startswith(_FUN_PREFIXES) for key in shapes):  # a Fun release: WanFunTransformer3DModel
        camera = shapes.get("control_adapter.conv.weight")
        config.update(reference_conv="ref_conv.weight" in shapes,
                      camera_channels=None if camera is None else camera[1] // CAMERA_UNSHUFFLE**2)
    return config


def original_dit_config_json(config: dict[str, Any], model_type: str) -> dict[str, Any]:
    """The ``config.json`` an original release would hold for a ``WanTransformer3DModel`` config (the fields
    ``WanModel`` registers; the others are implied by its weights)."""
    return {
        "_class_name": ORIGINAL_DIT_CLASS, "_diffusers_version": "0.33.0", "model_type": model_type,
        "dim": config["num_attention_heads"] * config["attention_head_dim"], "eps": config["eps"],
        "ffn_dim": config["ffn_dim"], "freq_dim": config["freq_dim"], "in_dim": config["in_channels"],
        "num_heads": config["num_attention_heads"], "num_layers": config["num_layers"],
        "out_dim": config["out_channels"], "text_len": 512,
    }  # fmt: skip


def dit_to_original(state_dict: dict[str, Any]) -> dict[str, Any]:
    """A ``WanTransformer3DModel`` state dict under the original release's names (a full fine-tune's original layout);
    a ``WanAnimateTransformer3DModel``'s Animate tensors as ``original_animate.animate_to_original`` writes them; a
    ``WanAnimate2Transformer3DModel``'s (its self-attention is ``self_attn``, not ``attn1``) under the release's names."""
    if any(".self_attn.to_q." in key for key in state_dict):
        return {animate2_original_key(key): tensor for key, tensor in state_dict.items()}
    plain = {key: tensor for key, tensor in state_dict.items() if not key.startswith(ANIMATE_PREFIXES)}
    names = dit_original_keys(list(plain))
    animate = animate_to_original(state_dict) if len(plain) < len(state_dict) else {}
    return {**{names[key]: tensor for key, tensor in plain.items()}, **animate}


def dit_original_config(model: Any) -> dict[str, Any] | None:
    """The ``config.json`` of the original release folder of ``model`` (a ``WanTransformer3DModel``). Its
    ``model_type`` is informational: loaders read the weights' shapes. None for Wan2.2-Animate-2, released as one file
    without a config."""
    config = dict(model.config)
    if "refer_offset_t" in config:
        return None
    if "motion_encoder_size" in config:
        return original_dit_config_json(config, "animate")
    if "vace_layers" in config:
        return {**original_dit_config_json(config, "vace"), **original_vace_config_json(config)}
    fun = "reference_conv" in config  # the Fun releases name themselves i2v whatever their width
    model_type = "flf2v" if config.get("pos_embed_seq_len") else (
        "i2v" if fun or config.get("image_dim") or config.get("in_channels") == 36 else (
        "ti2v" if config.get("in_channels") == 48 else "t2v"))
    return original_dit_config_json(config, model_type)
