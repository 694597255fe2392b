"""Manual check, not part of the tests: ComfyUI's real LoRA code on this project's LoHa, LoKr and DoRA files.

Exports the Python files of a ComfyUI snapshot (a bare git mirror) and imports its ``comfy`` package on the CPU, as
``check_comfyui_flux_lora.py`` does. For each adapter type (LoHa; LoKr with whole factors, where ComfyUI ignores
``alpha``; LoKr with a decomposed factor; a LoRA with DoRA) it injects peft's adapter into a tiny Wan transformer on
the layers Wan's LoRA scripts train, moves every adapter weight at random (alpha / rank != 1), and writes the
universal and the kohya file as the trainer does. ComfyUI's own ``comfy.lora.model_lora_keys_unet`` (its Wan model
class) and ``comfy.lora.load_lora`` then read each file, and ``comfy.lora.calculate_weight`` patches the base weights
under Wan's original names. It prints, per file, the keys ComfyUI loaded and left unused, the weights it changed, the
ratio of its change to peft's own merge of the adapter (1.000000: exact) and the largest difference, and the same
for this project's ``load_lora``.

Usage::

    python scripts/check_comfyui_lycoris.py [--mirror /work/.mirror/Comfy-Org+ComfyUI/repo] [--rev HEAD]
"""

from __future__ import annotations

import copy
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent))
from check_comfyui_flux_lora import comfyui_arguments, comfyui_changes, compare, export, import_comfy  # noqa: E402 - the sibling script's ComfyUI export
from check_comfyui_flux_lora import stand_in_model  # noqa: E402

from diffsynth.lora import load_lora, naming_for  # noqa: E402
from diffsynth.lora.formats import write_lora  # noqa: E402
from diffsynth.lora.peft_adapters import weights_from_peft  # noqa: E402
from diffsynth.training.objective.adapter import AdapterSettings, DoraBaseWeights, inject_adapter  # noqa: E402

TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2"]  # Wan's q,k,v,o,ffn.0,ffn.2
CASES = {
    "loha": AdapterSettings("loha", rank=4, alpha=2.0),
    "lokr (whole factors)": AdapterSettings("lokr", rank=16, alpha=2.0),
    "lokr (decomposed)": AdapterSettings("lokr", rank=1, alpha=2.0),
    "lora + dora": AdapterSettings("lora", rank=4, alpha=2.0, use_dora=True),
}


def tiny_wan() -> torch.nn.Module:
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=16,
                                 out_channels=16, text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2,
                                 cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32).eval()


def trained(model: torch.nn.Module, settings: AdapterSettings) -> torch.nn.Module:
    adapted = copy.deepcopy(model)
    inject_adapter(adapted, settings, TARGETS)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in adapted.parameters():
            if param.requires_grad:
                param.add_(torch.randn(param.shape, generator=generator) * 0.2)
    return adapted


def peft_changes(adapted: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Each adapted layer's change by peft's own merge, by diffusers layer name."""
    merged, changes = copy.deepcopy(adapted), {}
    for name, module in merged.named_modules():
        if hasattr(module, "merge") and hasattr(module, "get_base_layer"):
            before = module.get_base_layer().weight.detach().clone()
            module.merge()
            changes[name] = module.get_base_layer().weight.detach() - before
    return changes


def main(argv: list[str] | None = None) -> int:
    args = comfyui_arguments(__doc__, argv)
    model = tiny_wan()
    naming = naming_for(model)
    with tempfile.TemporaryDirectory() as folder:
        runs = []
        for case, settings in CASES.items():  # before ComfyUI's stand-ins, which would confuse diffusers' imports
            adapted = trained(model, settings)
            want = {f"diffusion_model.{naming.to_native(name)}.weight": change
                    for name, change in peft_changes(adapted).items()}
            state = {name: param.detach() for name, param in adapted.named_parameters() if param.requires_grad}
            weights = weights_from_peft(state, settings.alpha, settings.rank, base_weights=DoraBaseWeights(adapted))
            for layout in ("universal", "kohya"):
                path = write_lora(Path(folder) / f"{case}.{layout}.safetensors".replace(" ", "_"), weights, layout,
                                  naming)
                merged = copy.deepcopy(model)
                load_lora(merged, path)
                ours = {f"diffusion_model.{naming.to_native(name)}.weight": merged.get_submodule(name).weight.detach()
                        - model.get_submodule(name).weight.detach() for name in peft_changes(adapted)}
                runs.append((case, layout, path, want, ours))
        commit = export(args.mirror, args.rev, Path(folder) / "comfyui")
        comfy = import_comfy(Path(folder) / "comfyui")
        base = {f"diffusion_model.{naming.to_native(name)}.weight": module.weight.detach().clone()
                for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)
                and naming.to_native(name) is not None}
        print(f"ComfyUI {commit[:10]}; tiny Wan, {len(TARGETS)} targets x 2 blocks, alpha / rank != 1")
        for case, layout, path, want, ours in runs:
            keys = len(load_file(str(path)))
            model = stand_in_model(comfy.model_base.WAN21, {}, base)
            theirs, loaded, unused = comfyui_changes(comfy, model, path, base)
            print(f"{case:<21} {layout:<9} keys loaded {loaded}/{keys}, unused {len(unused)}; ComfyUI vs peft: "
                  f"{compare(want, theirs)}; load_lora vs peft: {compare(want, ours)}")
            for message in unused[:3]:
                print(f"    {message}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
