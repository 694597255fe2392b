"""Manual check, not part of the tests: ComfyUI's real Wan code on this project's Wan control LoRA files.

Exports the Python files of a ComfyUI snapshot (a bare git mirror) and imports its ``comfy`` package on the CPU, as
``check_comfyui_flux_lora.py`` does. For each variant of :data:`VARIANTS` (plain Wan2.1 text-to-video as the
baseline, VACE, the Fun InP / Control / Control-Camera models, FLF2V, Animate) it builds the tiny transformer of
``diffsynth.testing``, puts a random LoRA (alpha / rank 0.5) on every layer a LoRA can wrap (VACE's blocks and patch
embedding, the Fun ``ref_conv`` and camera ``control_adapter``, the image embedder), and writes the universal and the
kohya file as the trainer does; for VACE also the diffusers twin, which ComfyUI is not meant to read (the row that
shows the check can fail).

ComfyUI then meets the transformer's weights under their original release names (``dit_original_keys``, as the
trainer's original-layout checkpoints and the releases name them): its own ``model_detection`` picks the model
(``WAN21_Vace``, ``WAN21_Camera``, ...), which is built at the tiny sizes (the sizes its detection fixes at the
releases' values, heads, frequency and text width, are set to the tiny ones) and must hold every base weight under
the same name and shape. Its ``comfy.lora.model_lora_keys_unet`` on that model, ``convert_lora`` and ``load_lora``
read each file, and ``comfy.lora.calculate_weight`` patches the base weights. Per file it prints the keys loaded and
left unused, the weights changed against those this project's ``load_lora`` changes, the ratio of ComfyUI's change to
ours (1.000000: exact), the largest difference, and what ``python -m diffsynth.lora inspect`` predicts for ComfyUI.

A variant is a row of :data:`VARIANTS`: its name, the tiny transformer's builder, the ComfyUI model its detection
must pick, and whether the diffusers twin is checked too.

Usage::

    python scripts/check_comfyui_wan_lora.py [--mirror /work/.mirror/YellowRoseCx+ComfyUI/repo] [--rev HEAD]
"""

from __future__ import annotations

import copy
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent))
import check_comfyui_flux_lora as harness  # noqa: E402 - the sibling script's ComfyUI export and comparison

from diffsynth.lora import inspect_lora, load_lora, naming_for  # noqa: E402
from diffsynth.lora.formats import write_lora  # noqa: E402
from diffsynth.lora.naming import lora_layer_names  # noqa: E402
from diffsynth.pipelines.wan_video.original import dit_original_keys, dit_to_original  # noqa: E402
from diffsynth.testing.tiny_wan import TEXT_DIM, tiny_wan_transformer  # noqa: E402
from diffsynth.testing.tiny_wan_flf2v import tiny_flf2v_transformer  # noqa: E402
from diffsynth.testing.tiny_wan_fun import FUN_RELEASES, tiny_fun_transformer  # noqa: E402
from diffsynth.testing.tiny_wan_vace import tiny_wan_vace_transformer  # noqa: E402

MIRROR = Path("/work/.mirror/YellowRoseCx+ComfyUI/repo")
# ComfyUI's image embedder (MLPProj) reads 1280-wide CLIP features whatever the checkpoint holds: the tiny models that
# read CLIP features get that width, so its model holds their weights at their shapes.
CLIP_DIM = 1280
# What ComfyUI's Wan detection fixes at the releases' values (num_heads = dim // 128; WanModel's text_dim default),
# set to the tiny transformers' sizes.
TINY_SIZES = {"num_heads": 2, "freq_dim": 32, "text_dim": TEXT_DIM}
PREFIX = "diffusion_model."


@dataclass(frozen=True)
class Variant:
    """One Wan model to check.

    Attributes:
        name: What the rows are labelled.
        build: The tiny diffusers transformer (seeded).
        comfy_config: The ``comfy.supported_models`` class ComfyUI's detection must pick for its weights.
        diffusers_twin: Also check the diffusers-layout file (VACE's twin: ComfyUI is not meant to read it).
    """

    name: str
    build: Callable[[], torch.nn.Module]
    comfy_config: str
    diffusers_twin: bool = False


def _fun(model_id: str) -> Callable[[], torch.nn.Module]:
    return lambda: tiny_fun_transformer(FUN_RELEASES[model_id], 0, clip_dim=CLIP_DIM)


VARIANTS = (
    Variant("Wan2.1 T2V (baseline)", lambda: tiny_wan_transformer(0), "WAN21_T2V"),
    Variant("Wan2.1-VACE", lambda: tiny_wan_vace_transformer(0), "WAN21_Vace", diffusers_twin=True),
    # The Fun InP releases are laid out and shaped as Wan2.1-I2V (36 input channels, CLIP cross-attention).
    Variant("Wan2.1-Fun InP", lambda: tiny_wan_transformer(0, in_channels=36, image_dim=CLIP_DIM), "WAN21_I2V"),
    Variant("Wan2.1-Fun Control", _fun("PAI/Wan2.1-Fun-1.3B-Control"), "WAN21_FunControl2V"),
    Variant("Wan2.1-Fun-V1.1 Control", _fun("PAI/Wan2.1-Fun-V1.1-1.3B-Control"), "WAN21_FunControl2V"),
    Variant("Wan2.1-Fun-V1.1 Control-Camera", _fun("PAI/Wan2.1-Fun-V1.1-1.3B-Control-Camera"), "WAN21_Camera"),
    Variant("Wan2.2-Fun-A14B Control", _fun("PAI/Wan2.2-Fun-A14B-Control"), "WAN21_T2V"),
    Variant("Wan2.2-Fun-A14B Control-Camera", _fun("PAI/Wan2.2-Fun-A14B-Control-Camera"), "WAN22_Camera"),
    Variant("Wan2.1-FLF2V", lambda: tiny_flf2v_transformer(0, clip_dim=CLIP_DIM), "WAN21_I2V"),
    Variant("Wan2.2-Animate", lambda: _animate(), "WAN22_Animate"),
)


def _animate() -> torch.nn.Module:
    """A Wan2.2-Animate transformer of the tiny width, with five blocks (ComfyUI puts a face adapter after every
    fifth) and the release's motion and face encoders (ComfyUI builds those at fixed sizes)."""
    from diffusers import WanAnimateTransformer3DModel

    return WanAnimateTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=36, latent_channels=16,
        out_channels=16, text_dim=TEXT_DIM, freq_dim=32, ffn_dim=64, num_layers=5, image_dim=CLIP_DIM,
        added_kv_proj_dim=32)


@dataclass
class Prepared:
    """A variant's files and base weights, made before ComfyUI is imported (its stand-ins confuse diffusers')."""

    variant: Variant
    layers: int
    base: dict[str, torch.Tensor]  # the transformer's weights under PREFIX + the original release's names
    runs: list[tuple[str, Path, dict[str, torch.Tensor], object]]  # layout, file, our change by weight, emulation


def prepare(variant: Variant, folder: Path) -> Prepared:
    """Writes the variant's LoRA files; records our merge's change of each weight and inspect's ComfyUI verdict."""
    torch.manual_seed(0)
    model = variant.build().eval()
    naming = naming_for(model)
    # Animate's own modules are not the denoiser's LoRA layers (the trainer's LoRA on dit leaves them out).
    names = [name for name in lora_layer_names(model) if naming.to_native(name) is not None]
    weights = harness.random_lora(model, names=names)
    state = model.state_dict()
    originals = dit_original_keys([f"{name}.weight" for name in names])
    base = {PREFIX + key: value.detach().clone() for key, value in dit_to_original(state).items()}
    layouts = ("universal", "kohya", "diffusers") if variant.diffusers_twin else ("universal", "kohya")
    runs = []
    for layout in layouts:
        stem = variant.name.replace(" ", "_").replace("(", "").replace(")", "")
        path = write_lora(folder / f"{stem}.{layout}.safetensors", weights, layout, naming)
        merged = copy.deepcopy(model)
        load_lora(merged, path)
        ours = {PREFIX + originals[f"{name}.weight"]: merged.get_submodule(name).weight.detach()
                - model.get_submodule(name).weight.detach() for name in names}
        runs.append((layout, path, ours, inspect_lora(path, model).result("ComfyUI")))
    return Prepared(variant, len(names), base, runs)


def main(argv: list[str] | None = None) -> int:
    args = harness.comfyui_arguments(__doc__, argv, MIRROR)
    with tempfile.TemporaryDirectory() as folder:
        prepared = [prepare(variant, Path(folder)) for variant in VARIANTS]
        commit = harness.export(args.mirror, args.rev, Path(folder) / "comfyui")
        comfy = harness.import_comfy(Path(folder) / "comfyui")
        print(f"ComfyUI {commit[:10]}; alpha / rank 0.5 on every LoRA-able layer")
        failures = 0
        for item in prepared:
            model, _, line = harness.comfy_model(comfy, item.base, PREFIX, TINY_SIZES)
            expected = line.startswith(f"detected {item.variant.comfy_config} ")
            failures += not expected
            print(f"{item.variant.name}: {item.layers} LoRA layers; {line}"
                  + ("" if expected else f" (expected {item.variant.comfy_config})"))
            if model is None:
                continue
            for layout, path, ours, emulated in item.runs:
                theirs, loaded, unused = harness.comfyui_changes(comfy, model, path, item.base)
                print(f"  {layout:<9} keys loaded {loaded}/{len(load_file(str(path)))}, unused {len(unused)}; "
                      f"{harness.compare(ours, theirs)}; emulation: {emulated.mapped}/{emulated.total} layers"
                      + ("" if emulated.strength is None else f" at {emulated.strength:.6f}"))
                for message in unused[:2]:
                    print(f"    {message}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
