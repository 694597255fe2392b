"""The original layout of ``Wan-AI/Wan2.2-Animate-14B``, read into diffusers' ``WanAnimateTransformer3DModel``.

The release ships a ``WanModel``-style folder (``config.json`` beside ``diffusion_pytorch_model*.safetensors``
shards) whose tensors are an image-to-video Wan (``in_dim`` 36, CLIP cross-attention) plus the Animate modules of the
original ``WanAnimateModel``:

- ``pose_patch_embedding.*``: the pose latents' patch embedding (same name in diffusers);
- ``motion_encoder.enc.net_app.convs.<i>.*`` (a StyleGAN-like face encoder: a 1x1 conv, residual blocks with blurred
  down-sampling, a 4x4 conv), ``motion_encoder.enc.fc.<j>.*`` (its linear layers) and ``motion_encoder.dec.direction
  .weight`` (the motion basis);
- ``face_encoder.conv{1_local,2,3}.conv.*``, ``face_encoder.out_proj.*``, ``face_encoder.padding_tokens``;
- ``face_adapter.fuser_blocks.<k>.*``: cross-attention to the face motion, one per ``inject_face_latents_blocks``
  main blocks, with a fused ``linear1_kv`` (key rows, then value rows).

The map follows diffusers' ``convert_wan_transformer_to_diffusers`` (its face-adapter and motion-encoder renames, the
``linear1_kv`` split, the ``(1, C, 1, 1)`` leaky-ReLU biases flattened), worked out from the model's own module tree
rather than that converter's fixed indices, which hold only for the released 512-pixel motion encoder. The blur
kernels the release stores (``...conv2.0.kernel``, ``...skip.0.kernel``) are constants diffusers rebuilds: they are
not read, and the writer stores them as the release does. The sizes of diffusers' config come from the shapes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

ANIMATE_DIT_CLASS = "WanAnimateTransformer3DModel"
# A tensor only the Animate release has (diffusers' single-file detection reads the same one).
ANIMATE_MARKER = "motion_encoder.dec.direction.weight"
ANIMATE_PREFIXES = ("pose_patch_embedding.", "motion_encoder.", "face_encoder.", "face_adapter.")
_APP = "motion_encoder.enc.net_app.convs"
# The blur of the motion encoder's down-sampling convolutions (StyleGAN's [1, 3, 3, 1]).
_BLUR = (1.0, 3.0, 3.0, 1.0)
_FACE_ENCODER = {"conv1_local": "conv1_local.conv", "conv2": "conv2.conv", "conv3": "conv3.conv",
                 "out_proj": "out_proj"}
_FACE_ADAPTER = {"to_q": "linear1_q", "to_out": "linear2", "norm_q": "q_norm", "norm_k": "k_norm"}
# diffusers' fused-K/V halves: (half index, layer name).
_FACE_KV = {"to_k": 0, "to_v": 1}


def is_animate(shapes: dict[str, Any]) -> bool:
    """Whether an original DiT's tensors are Wan2.2-Animate's."""
    return ANIMATE_MARKER in shapes


def _count(shapes: dict[str, Any], pattern: str) -> int:
    return sum(1 for key in shapes if re.fullmatch(pattern, key))


def animate_config(shapes: dict[str, tuple[int, ...]], num_layers: int) -> dict[str, Any]:
    """The Animate fields of ``WanAnimateTransformer3DModel``'s config, from the release's tensor shapes."""
    blocks = _count(shapes, re.escape(_APP) + r"\.\d+\.conv1\.0\.weight")
    size = 2 ** (blocks + 2)  # each residual block halves the face image, down to the 4x4 the last conv reads
    channels = {str(size): shapes[f"{_APP}.0.0.weight"][0]}
    for index in range(blocks):
        channels[str(size >> (index + 1))] = shapes[f"{_APP}.{index + 1}.conv2.1.weight"][0]
    linears = _count(shapes, r"motion_encoder\.enc\.fc\.\d+\.weight")
    hidden = shapes["face_encoder.conv2.conv.weight"][0]
    fusers = _count(shapes, r"face_adapter\.fuser_blocks\.\d+\.linear1_q\.weight")
    return {
        "latent_channels": shapes["pose_patch_embedding.weight"][1], "motion_encoder_channel_sizes": channels,
        "motion_encoder_size": size, "motion_style_dim": shapes[f"{_APP}.{blocks + 1}.weight"][0],
        "motion_dim": shapes[f"motion_encoder.enc.fc.{linears - 1}.weight"][0],
        "motion_encoder_dim": shapes[ANIMATE_MARKER][0], "face_encoder_hidden_dim": hidden,
        "face_encoder_num_heads": shapes["face_encoder.conv1_local.conv.weight"][0] // hidden,
        "inject_face_latents_blocks": num_layers // fusers,
    }  # fmt: skip


def _flat_bias(tensor: Any) -> Any:
    return tensor.reshape(-1)


def _half(index: int) -> Callable[[Any], Any]:
    def take(tensor: Any) -> Any:
        rows = tensor.shape[0] // 2
        return tensor[index * rows:(index + 1) * rows]

    return take


def animate_sources(model_keys: list[str]) -> dict[str, tuple[str, Callable[[Any], Any] | None]]:
    """``{diffusers key: (original key, conversion or None)}`` for the Animate modules among ``model_keys`` (the keys
    of a ``WanAnimateTransformer3DModel``); the other keys are left out.

    Raises:
        ValueError: An Animate key has no counterpart in the original ``WanAnimateModel``.
    """
    blocks = len({key.split(".")[2] for key in model_keys if key.startswith("motion_encoder.res_blocks.")})
    sources = {}
    for key in model_keys:
        if not key.startswith(ANIMATE_PREFIXES):
            continue
        module, _, param = key.rpartition(".")
        parts = module.split(".")
        source: tuple[str, Callable[[Any], Any] | None] | None = None
        if parts[0] == "pose_patch_embedding" or key == "face_encoder.padding_tokens":
            source = (key, None)
        elif parts[0] == "face_encoder" and parts[1] in _FACE_ENCODER:
            source = (f"face_encoder.{_FACE_ENCODER[parts[1]]}.{param}", None)
        elif parts[0] == "face_adapter" and parts[2] in _FACE_KV:
            source = (f"face_adapter.fuser_blocks.{parts[1]}.linear1_kv.{param}", _half(_FACE_KV[parts[2]]))
        elif parts[0] == "face_adapter" and parts[2] in _FACE_ADAPTER:
            source = (f"face_adapter.fuser_blocks.{parts[1]}.{_FACE_ADAPTER[parts[2]]}.{param}", None)
        elif parts[0] == "motion_encoder":
            source = _motion_source(key, blocks)
        if source is None:
            raise ValueError(f"{ANIMATE_DIT_CLASS} key {key!r} has no counterpart in the original WanAnimateModel")
        sources[key] = source
    return sources


def _motion_source(key: str, blocks: int) -> tuple[str, Callable[[Any], Any] | None] | None:
    """The original name of a motion-encoder key (``blocks`` residual blocks), or None."""
    name = key.removeprefix("motion_encoder.")
    if name == "motion_synthesis_weight":
        return ANIMATE_MARKER, None
    if name == "conv_in.weight":
        return f"{_APP}.0.0.weight", None
    if name == "conv_in.act_fn.bias":
        return f"{_APP}.0.1.bias", _flat_bias
    if name == "conv_out.weight":
        return f"{_APP}.{blocks + 1}.weight", None
    match = re.fullmatch(r"motion_network\.(\d+)\.(weight|bias)", name)
    if match:
        return f"motion_encoder.enc.fc.{match[1]}.{match[2]}", None
    match = re.fullmatch(r"res_blocks\.(\d+)\.(conv1|conv2|conv_skip)\.(weight|act_fn\.bias)", name)
    if match is None:
        return None
    layer, param = match[2], match[3]
    original = {("conv1", "weight"): "conv1.0.weight", ("conv1", "act_fn.bias"): "conv1.1.bias",
                ("conv2", "weight"): "conv2.1.weight", ("conv2", "act_fn.bias"): "conv2.2.bias",
                ("conv_skip", "weight"): "skip.1.weight"}.get((layer, param))  # fmt: skip
    if original is None:
        return None
    return f"{_APP}.{int(match[1]) + 1}.{original}", _flat_bias if param.endswith("bias") else None


def animate_to_original(state_dict: dict[str, Any]) -> dict[str, Any]:
    """The Animate modules of a ``WanAnimateTransformer3DModel`` state dict under the release's names and shapes: the
    face adapter's K and V fused into ``linear1_kv``, the leaky-ReLU biases as ``(1, C, 1, 1)``, and the blur kernels
    of the down-sampling convolutions added."""
    import torch

    original: dict[str, Any] = {}
    fused: dict[str, list[Any]] = {}
    for key, (name, convert) in animate_sources(list(state_dict)).items():
        tensor = state_dict[key]
        if convert is _flat_bias:
            original[name] = tensor.reshape(1, -1, 1, 1)
        elif convert is not None:  # a K or V half of linear1_kv
            fused.setdefault(name, [None, None])[_FACE_KV[key.split(".")[2]]] = tensor
        else:
            original[name] = tensor
    original.update({name: torch.cat(halves) for name, halves in fused.items()})
    blur = torch.tensor(_BLUR)
    kernel = blur[None, :] * blur[:, None]
    for name in [name for name in original if name.endswith((".conv2.1.weight", ".skip.1.weight"))]:
        original[name.replace(".1.weight", ".0.kernel")] = kernel / kernel.sum()
    return original
