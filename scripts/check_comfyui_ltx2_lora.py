"""Manual check, not part of the tests: ComfyUI's real LTX-2 code on this project's LTX-2 and LTX-2.3 LoRA files.

Exports the Python files of a ComfyUI snapshot that has LTX-2 (a bare git mirror) and imports its ``comfy`` package on
the CPU, as ``check_comfyui_flux_lora.py`` does. For a tiny LTX-2 and a tiny LTX-2.3 transformer it puts a random LoRA
(alpha / rank 0.5) on the layers the reference's LTX-2 scripts train (``to_q``, ``to_k``, ``to_v``, ``to_out.0`` of
every attention) and on every layer outside the blocks (among them those whose LTX-2 names differ from diffusers':
``patchify_proj``, the AdaLN embedders, the ``audio_*`` ones), and writes the universal and the kohya file as the
trainer does, and the diffusers twin, which ComfyUI is not meant to read (a row that shows the check can fail).
ComfyUI then builds its own ``LTXAVModel`` at the tiny sizes (every LTX-2 name of the base weights must be one of its
weights, of the same shape), maps LoRA keys with ``comfy.lora.model_lora_keys_unet`` (its ``LTXAV`` model class),
loads each file with ``comfy.lora.load_lora`` and patches the base weights with ``comfy.lora.calculate_weight``. It
prints per file the keys loaded and left unused, the weights changed against those this project's ``load_lora``
changes, the ratio of ComfyUI's change to ours (1.000000: exact), the largest difference, and what
``python -m diffsynth.lora inspect`` predicts for ComfyUI.

Usage::

    python scripts/check_comfyui_ltx2_lora.py [--mirror /work/.mirror/YellowRoseCx+ComfyUI/repo] [--rev HEAD]
"""

from __future__ import annotations

import copy
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent))  # the sibling script's ComfyUI export
from check_comfyui_flux_lora import comfyui_arguments, comfyui_changes, compare, export, import_comfy, random_lora
from check_comfyui_flux_lora import stand_in_model

from diffsynth.lora import inspect_lora, load_lora, naming_for
from diffsynth.lora.formats import write_lora
from diffsynth.pipelines.ltx2.original import DIT_PREFIX, transformer_key_to_original
from diffsynth.testing import tiny_ltx2, tiny_ltx23

MIRROR = Path("/work/.mirror/YellowRoseCx+ComfyUI/repo")
BLOCK_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")  # the reference's LTX-2 scripts: --lora_target_modules
# ComfyUI's LTXAVModel arguments for the tiny transformers (tiny_ltx2's widths; LTX-2.3's switches).
COMFY_LTX2 = {"in_channels": 8, "audio_in_channels": 8, "cross_attention_dim": 16, "audio_cross_attention_dim": 8,
              "attention_head_dim": 8, "audio_attention_head_dim": 4, "num_attention_heads": 2,
              "audio_num_attention_heads": 2, "caption_channels": tiny_ltx2.TEXT_HIDDEN_SIZE, "num_layers": 2}
COMFY_LTX23 = {**COMFY_LTX2, "apply_gated_attention": True, "cross_attention_adaln": True,
               "caption_proj_before_connector": True}


def targets(model: torch.nn.Module) -> list[str]:
    """The block attentions' q, k, v, out layers and every non-block Linear layer LoRA files name."""
    naming = naming_for(model)
    names = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or naming.to_native(name) is None:
            continue
        if not name.startswith("transformer_blocks.") or name.endswith(BLOCK_TARGETS):
            names.append(name)
    return names


def native_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The transformer's weights under the names ComfyUI's model holds (``diffusion_model.`` + LTX-2's names)."""
    return {transformer_key_to_original(key)[len(DIT_PREFIX) - len("diffusion_model."):]: value.detach().clone()
            for key, value in model.state_dict().items()}


def comfy_model_check(comfy, arguments: dict, base: dict[str, torch.Tensor]) -> str:
    """Builds ComfyUI's own LTXAVModel at the tiny sizes; reports our LTX-2 names missing from it or misshapen."""
    import comfy.ldm.lightricks.av_model
    import comfy.ops

    network = comfy.ldm.lightricks.av_model.LTXAVModel(**arguments, operations=comfy.ops.disable_weight_init)
    theirs = {f"diffusion_model.{key}": value.shape for key, value in network.state_dict().items()}
    missing = [key for key in base if key not in theirs]
    misshapen = [key for key in base if key in theirs and theirs[key] != base[key].shape]
    return (f"ComfyUI's LTXAVModel holds {len(base) - len(missing)}/{len(base)} of the base weights' names "
            f"({len(misshapen)} of another shape){'; missing: ' + ', '.join(missing[:4]) if missing else ''}")


def lora_files(folder: Path, family: str, model: torch.nn.Module) -> list[tuple[str, Path, dict, object]]:
    """The universal, kohya and diffusers file of a random LoRA on :func:`targets`, each with our merge's change of
    each weight and ``python -m diffsynth.lora inspect``'s emulation of ComfyUI."""
    naming, names = naming_for(model), targets(model)
    weights = random_lora(model, names=names)
    runs = []
    for layout in ("universal", "kohya", "diffusers"):
        path = write_lora(folder / f"{family}.{layout}.safetensors", weights, layout, naming)
        merged = copy.deepcopy(model)
        load_lora(merged, path)
        ours = {f"diffusion_model.{naming.to_native(name)}.weight": merged.get_submodule(name).weight.detach()
                - model.get_submodule(name).weight.detach() for name in names}
        runs.append((layout, path, ours, inspect_lora(path, model).result("ComfyUI")))
    return runs


def main(argv: list[str] | None = None) -> int:
    args = comfyui_arguments(__doc__, argv, MIRROR)
    families = {}
    with tempfile.TemporaryDirectory() as folder:
        for family, build, arguments in (("LTX-2", tiny_ltx2._transformer, COMFY_LTX2),
                                         ("LTX-2.3", tiny_ltx23._transformer_23, COMFY_LTX23)):
            torch.manual_seed(0)
            model = build().eval()
            # Before ComfyUI's stand-ins, which would confuse diffusers' imports.
            families[family] = (arguments, native_state_dict(model), len(targets(model)),
                                lora_files(Path(folder), family, model))
        commit = export(args.mirror, args.rev, Path(folder) / "comfyui")
        comfy = import_comfy(Path(folder) / "comfyui")
        print(f"ComfyUI {commit[:10]}; alpha / rank 0.5, layers: attention q/k/v/out in blocks + every non-block one")
        for family, (arguments, base, count, runs) in families.items():
            print(f"{family}: {count} LoRA layers; {comfy_model_check(comfy, arguments, base)}")
            for layout, path, ours, emulated in runs:
                model = stand_in_model(comfy.model_base.LTXAV, {}, base)
                theirs, loaded, unused = comfyui_changes(comfy, model, path, base)
                print(f"  {layout:<9} keys loaded {loaded}/{len(load_file(str(path)))}, unused {len(unused)}; "
                      f"{compare(ours, theirs)}; emulation: {emulated.mapped}/{emulated.total} layers"
                      + ("" if emulated.strength is None else f" at {emulated.strength:.6f}"))
                for message in unused[:3]:
                    print(f"    {message}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
