"""Manual check, not part of the tests: ComfyUI's real LoRA code on this project's FLUX.1 LoRA files.

Exports the Python files of a ComfyUI snapshot (a bare git mirror) to a temporary folder, imports its ``comfy``
package on the CPU (packages it imports that are not installed, such as torchvision, replaced by empty stand-ins), and
runs its own ``comfy.lora.model_lora_keys_unet`` (the Flux key map) and ``comfy.lora.load_lora`` on the universal and
the BFL kohya file of a tiny random FLUX.1 LoRA (alpha / rank 0.5, every LoRA-able layer). The patches are applied to
a tiny BFL state dict, built from a tiny ``FluxTransformer2DModel`` with ComfyUI's ``comfy.utils.flux_to_diffusers``,
by ``comfy.lora.calculate_weight``, grouped as its ``ModelPatcher.add_patches`` groups them. For each file it prints
how many BFL weights ComfyUI changed against those this project's ``load_lora`` changes, the ratio of the two changes
(1.0: the trained strength), the largest difference, the file's keys ComfyUI left unused, and the emulation's verdict
(``python -m diffsynth.lora inspect``).

Usage::

    python scripts/check_comfyui_flux_lora.py [--mirror /work/.mirror/Comfy-Org+ComfyUI/repo] [--rev HEAD]
"""

from __future__ import annotations

import argparse
import copy
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import torch
from safetensors.torch import load_file

from diffsynth.lora import inspect_lora, load_lora, naming_for
from diffsynth.lora.formats import LoRALayer, LoRAWeights, write_lora
from diffsynth.lora.naming import lora_layer_names

DEPTH, SINGLE_DEPTH, HEADS, HEAD_DIM = 2, 2, 2, 32
HIDDEN = HEADS * HEAD_DIM


def export(mirror: Path, rev: str, folder: Path) -> str:
    """Writes the snapshot's Python files into ``folder`` (the mirror may lack large data files); returns the commit."""
    def git(*args: str) -> bytes:
        return subprocess.run(["git", "--git-dir", str(mirror), *args], check=True, capture_output=True).stdout

    commit = git("rev-parse", rev).decode().strip()
    for path in git("ls-tree", "-r", "--name-only", commit).decode().splitlines():
        if path.endswith(".py") and (path.startswith(("comfy/", "comfy_api/", "comfy_config/", "comfy_execution/"))
                                     or "/" not in path):
            target = folder / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(git("show", f"{commit}:{path}"))
    return commit


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Empty modules for the packages ComfyUI imports at start-up that are not installed (its video and audio
    models' dependencies); the LoRA code never calls them."""

    NAMES = ("torchvision", "torchaudio", "av", "torchsde", "spandrel", "kornia", "einops", "scipy",
             "comfy_aimdo")  # the last: newer snapshots' memory manager

    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top not in self.NAMES:
            return None
        if getattr(getattr(sys.modules.get(top), "__spec__", None), "loader", None) is self:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)  # a stand-in's submodule
        sys.meta_path.remove(self)
        try:
            installed = importlib.util.find_spec(top) is not None
        finally:
            sys.meta_path.insert(0, self)
        return None if installed else importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        from unittest import mock

        module = mock.MagicMock(name=spec.name)
        module.__path__, module.__spec__, module.__name__ = [], spec, spec.name
        return module

    def exec_module(self, module) -> None:
        """Nothing to run: the stand-in is empty."""


def import_comfy(folder: Path) -> types.SimpleNamespace:
    sys.path.insert(0, str(folder))
    sys.meta_path.insert(0, _StandIns())
    import comfy.cli_args

    comfy.cli_args.args.cpu = True  # read when comfy.model_management is first imported
    import comfy.lora
    import comfy.lora_convert
    import comfy.model_base
    import comfy.model_detection
    import comfy.utils

    return types.SimpleNamespace(lora=comfy.lora, lora_convert=comfy.lora_convert, model_base=comfy.model_base,
                                 model_detection=comfy.model_detection, utils=comfy.utils)


def tiny_flux() -> torch.nn.Module:
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    return FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=DEPTH, num_single_layers=SINGLE_DEPTH,
                                  attention_head_dim=HEAD_DIM, num_attention_heads=HEADS, joint_attention_dim=32,
                                  pooled_projection_dim=32, guidance_embeds=True, axes_dims_rope=(4, 14, 14)).eval()


def random_lora(model: torch.nn.Module, rank: int = 4, scale: float = 0.5,
                names: list[str] | None = None) -> LoRAWeights:
    """A random LoRA on ``names`` (default: every LoRA-able layer of ``model``), ``scale`` = alpha / rank; a
    convolution's down keeps its kernel, its up is 1x1."""
    generator = torch.Generator().manual_seed(1)
    layers = {}
    for name in lora_layer_names(model) if names is None else names:
        weight = model.get_submodule(name).weight
        up = torch.randn(weight.shape[0], rank, *[1] * (weight.dim() - 2), generator=generator)
        layers[name] = LoRALayer(torch.randn(rank, *weight.shape[1:], generator=generator) * 0.1, up * 0.1, scale)
    return LoRAWeights(layers)


def to_bfl(state_dict: dict[str, torch.Tensor], key_map: dict) -> dict[str, torch.Tensor]:
    """A FluxTransformer2DModel state dict in BFL's layout, by ComfyUI's own map (slices stacked, functions applied:
    its swap of the final modulation's halves is its own inverse)."""
    whole, slices = {}, {}
    for key, target in key_map.items():
        if key not in state_dict:
            continue
        if isinstance(target, str):
            whole[target] = state_dict[key]
        elif target[1] is None:
            whole[target[0]] = target[2](state_dict[key])
        else:
            slices.setdefault(target[0], []).append((target[1][1], state_dict[key]))
    whole.update({key: torch.cat([tensor for _, tensor in sorted(parts, key=lambda part: part[0])])
                  for key, parts in slices.items()})
    return whole


def comfyui_arguments(doc: str, argv: list[str] | None,
                      mirror: Path = Path("/work/.mirror/Comfy-Org+ComfyUI/repo")) -> argparse.Namespace:
    """The check scripts' flags: ``--mirror`` (a bare git mirror of ComfyUI; ``mirror`` by default) and ``--rev``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--mirror", type=Path, default=mirror,
                        help="A bare git mirror of Comfy-Org/ComfyUI.")
    parser.add_argument("--rev", default="HEAD", help="The ComfyUI commit to check against.")
    return parser.parse_args(argv)


def stand_in_model(model_class: type, unet_config: dict, state_dict: dict[str, torch.Tensor]) -> object:
    """A ``model_class`` (a ``comfy.model_base`` class) holding ``state_dict``, without building its network: only
    what ``model_lora_keys_unet`` reads (the class, ``model_config.unet_config`` and ``state_dict()``)."""

    class TinyModel(model_class):
        def state_dict(self, *args, **kwargs):
            return state_dict

    model = object.__new__(TinyModel)  # no BaseModel.__init__: that would build the real network
    object.__setattr__(model, "model_config", types.SimpleNamespace(unet_config=unet_config))
    return model


def as_loaded(config, state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """``state`` (keys under ``prefix``) as ComfyUI's model loads it: through its model config's
    ``process_unet_state_dict`` (FLUX's RMSNorm ``scale`` becomes ``weight``)."""
    processed = config.process_unet_state_dict({key.removeprefix(prefix): value for key, value in state.items()})
    return {prefix + key: value for key, value in processed.items()}


def comfy_model(comfy, released: dict[str, torch.Tensor], prefix: str, tiny_sizes: dict,
                release_sizes: dict | None = None) -> tuple[object, object, str]:
    """ComfyUI's own model and model config for the weights ``released`` (a release's names under ``prefix``), as its
    ``model_detection`` picks and builds them, and a line on what it picked and whether the model holds every weight
    under the same name and shape.

    Args:
        tiny_sizes: The model arguments its detection fixes at the release's values (or does not read), set to the
            tiny model's before the model is built.
        release_sizes: Detected arguments its model list matches on, given at the release's values for the match
            only (the widths of a tiny UNet).
    """
    detected = comfy.model_detection.detect_unet_config(released, prefix)
    if detected is None:
        return None, None, "ComfyUI's detection recognises no model in these weights"
    picked = comfy.model_detection.model_config_from_unet_config({**detected, **(release_sizes or {})}, released)
    if picked is None:
        return None, None, f"ComfyUI's model list has no match for {detected}"
    config = type(picked)(detected)
    config.unet_config.update(tiny_sizes)
    model = config.get_model(released, prefix)
    base = as_loaded(config, released, prefix)
    theirs = {key: value.shape for key, value in model.state_dict().items()}
    missing = [key for key in base if key not in theirs]
    misshapen = [key for key in base if key in theirs and theirs[key] != base[key].shape]
    extra = [key for key in theirs if key.startswith(prefix) and key not in base]
    model_type = config.unet_config.get("model_type")
    line = (f"detected {type(config).__name__} ({'' if model_type is None else f'model_type {model_type}, '}"
            f"{type(model).__name__}); it holds {len(base) - len(missing)}/{len(base)} base weights "
            f"({len(misshapen)} of another shape), and {len(extra)} more"
            f"{' (' + ', '.join(extra[:3]) + ')' if extra else ''}")
    if missing or misshapen:
        line += f"; missing or misshapen: {', '.join((missing + misshapen)[:4])}"
    return model, config, line


def comfyui_patches(comfy, model, tensors: dict[str, torch.Tensor]) -> tuple[dict, list[str]]:
    """ComfyUI's patches for a LoRA file's ``tensors`` on ``model`` (a ``comfy.model_base`` model, or a
    :func:`stand_in_model`), as its ``load_lora_for_models`` makes them (its key map, ``convert_lora``, ``load_lora``),
    and the messages it logged meanwhile."""
    key_map = comfy.lora.model_lora_keys_unet(model, {})
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logging.getLogger().addHandler(handler)
    try:
        patches = comfy.lora.load_lora(comfy.lora_convert.convert_lora(tensors), key_map)
    finally:
        logging.getLogger().removeHandler(handler)
    return patches, messages


def comfyui_patched(comfy, patches: dict, base: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights of ``base`` that ComfyUI's ``patches`` change, patched at strength 1.0 by
    ``comfy.lora.calculate_weight``, grouped as its ``ModelPatcher.add_patches`` groups them (a target is a key, or a
    key with the offset of a slice and a function)."""
    grouped = {}
    for target, adapter in patches.items():
        key, offset, function = (target, None, None) if isinstance(target, str) else (*target, None)[:3]
        if key in base:
            grouped.setdefault(key, []).append((1.0, adapter, 1.0, offset, function))
    return {key: comfy.lora.calculate_weight(items, base[key].clone(), key) for key, items in grouped.items()}


def comfyui_changes(comfy, model, path: Path,
                    base: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int, list[str]]:
    """ComfyUI's change of each base weight (its native names) after loading ``path`` at strength 1.0 on ``model`` (as
    :func:`comfyui_patches`), the number of keys it loaded, and its messages about keys it did not load or adapters
    that failed (it logs those rather than raising)."""
    patches, messages = comfyui_patches(comfy, model, load_file(str(path)))
    changed = {key: value - base[key] for key, value in comfyui_patched(comfy, patches, base).items()}
    loaded = {key for adapter in patches.values() for key in adapter.loaded_keys}
    return changed, len(loaded), [message for message in messages if "not loaded" in message or "ERROR" in message]


def compare(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> str:
    """How far ``theirs`` (weight changes by key) is from ``ours``: the count changed, the ratio range, the largest
    difference."""
    both = [key for key in ours if key in theirs]
    ratios = [float((theirs[key] * ours[key]).sum() / (ours[key] * ours[key]).sum()) for key in both]
    largest = max((float((theirs[key] - ours[key]).abs().max()) for key in both), default=float("nan"))
    return (f"weights changed {len(both)}/{len(ours)} (others: {len(set(theirs) - set(ours))}), ratio "
            f"{min(ratios, default=0):.6f}..{max(ratios, default=0):.6f}, largest difference {largest:.1e}")


def comfyui_weights(comfy, lora_file: Path, bfl: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list]:
    """The BFL weights after ComfyUI loads ``lora_file`` at strength 1.0, and the keys it reported unused."""
    unet_config = {"depth": DEPTH, "depth_single_blocks": SINGLE_DEPTH, "hidden_size": HIDDEN}
    patches, messages = comfyui_patches(comfy, stand_in_model(comfy.model_base.Flux, unet_config, bfl),
                                        load_file(str(lora_file)))
    patched = comfyui_patched(comfy, patches, bfl)
    return patched, [message for message in messages if "not loaded" in message]


def main(argv: list[str] | None = None) -> int:
    args = comfyui_arguments(__doc__, argv)
    with tempfile.TemporaryDirectory() as folder:
        model = tiny_flux()
        weights = random_lora(model)
        files = {}
        for layout in ("universal", "kohya"):  # before ComfyUI's stand-ins, which would confuse diffusers' imports
            path = write_lora(Path(folder) / f"{layout}.safetensors", weights, layout, naming_for(model))
            merged = copy.deepcopy(model)
            load_lora(merged, path)
            files[layout] = (path, merged.state_dict(), inspect_lora(path, model).result("ComfyUI"))
        commit = export(args.mirror, args.rev, Path(folder) / "comfyui")
        comfy = import_comfy(Path(folder) / "comfyui")
        map_to_bfl = comfy.utils.flux_to_diffusers({"depth": DEPTH, "depth_single_blocks": SINGLE_DEPTH,
                                                    "hidden_size": HIDDEN}, output_prefix="diffusion_model.")
        base = to_bfl(model.state_dict(), map_to_bfl)
        print(f"ComfyUI {commit[:10]}; tiny FLUX.1, {len(weights.layers)} LoRA layers, alpha / rank 0.5")
        for layout, (path, merged, emulated) in files.items():
            ours = {key: value - base[key] for key, value in to_bfl(merged, map_to_bfl).items()
                    if not torch.equal(value, base[key])}
            patched, unused = comfyui_weights(comfy, path, base)
            theirs = {key: value - base[key] for key, value in patched.items()}
            both = [key for key in ours if key in theirs]
            ratios = [float((theirs[key] * ours[key]).sum() / (ours[key] * ours[key]).sum()) for key in both]
            largest = max((float((theirs[key] - ours[key]).abs().max()) for key in both), default=0.0)
            print(f"{layout:<10} BFL weights changed {len(both)}/{len(ours)} (others: {len(set(theirs) - set(ours))}), "
                  f"change ratio {min(ratios, default=0):.6f}..{max(ratios, default=0):.6f}, largest difference "
                  f"{largest:.1e}, keys unused {len(unused)}; emulation: {emulated.mapped}/{emulated.total} layers "
                  f"at {emulated.strength:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
