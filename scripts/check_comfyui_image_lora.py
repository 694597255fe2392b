"""Manual check, not part of the tests: ComfyUI's real code on this project's LoRA files of the image families that
``check_comfyui_flux_lora.py``, ``check_comfyui_wan_lora.py`` and ``check_comfyui_ltx2_lora.py`` leave out.

Exports the Python files of a ComfyUI snapshot (a bare git mirror) and imports its ``comfy`` package on the CPU, as
those scripts do (their helpers are shared). For each row of :data:`VARIANTS` (Stable Diffusion 1.5, SDXL,
ERNIE-Image, FLUX.2 [dev] with every layer and with the reference's targets, Qwen-Image, whose layout
Qwen-Image-Distill-Full, Qwen-Image-Edit and FireRed-Image-Edit share, Qwen-Image-Edit-2511 and Qwen-Image-Layered)
it builds the tiny denoiser of ``diffsynth.testing``, puts a random LoRA (alpha / rank 0.5) on every layer a LoRA can
wrap (or on the row's targets), and writes the files as the trainer does: its main file (kohya's layout for Stable
Diffusion, the universal one otherwise), the kohya form (``--align_to_opensource_format``) and, where the trainer
writes one, the ``.diffusers.safetensors`` twin for diffusers, which ComfyUI is not meant to read. The text encoders
of SD and SDXL get no LoRA: the trainer writes no text-encoder LoRA.

ComfyUI then meets the denoiser's weights under the names of the release checkpoint ComfyUI loads (the LDM names of
SD's and SDXL's single-file checkpoints, BFL's for FLUX.2, diffusers' for the others, under ``diffusion_model.``): its
own ``model_detection`` reads the model's structure from them and picks the model (for SD and SDXL the widths its
model list matches on are given at the release's values, since the tiny UNets are narrower), which is built at the
tiny sizes (those its detection fixes at the release's values set to the tiny ones) and must hold every base weight
under the same name and shape. ``comfy.lora.model_lora_keys_unet`` on that model, ``convert_lora`` and ``load_lora``
read each file, and ``comfy.lora.calculate_weight`` patches the base weights. Per file it prints the keys loaded and
left unused, the weights changed against those this project's ``load_lora`` changes, the ratio of ComfyUI's change to
ours (1.000000: exact), the largest difference, and ``python -m diffsynth.lora inspect``'s prediction for ComfyUI.
For the families the snapshot has no model for (:data:`NOT_IN_COMFYUI`: Krea 2, Ideogram 4, JoyAI-Image-Edit) it
shows that its detection makes nothing of their release-named weights, and skips them.

Usage::

    python scripts/check_comfyui_image_lora.py [--mirror /work/.mirror/YellowRoseCx+ComfyUI/repo] [--rev HEAD]
"""

from __future__ import annotations

import copy
import re
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent))
import check_comfyui_flux_lora as harness  # noqa: E402 - the sibling script's ComfyUI export and comparison

from diffsynth.lora import inspect_lora, load_lora, naming_for  # noqa: E402
from diffsynth.lora.formats import write_lora  # noqa: E402
from diffsynth.lora.naming import lora_layer_names  # noqa: E402
from diffsynth.testing import (  # noqa: E402
    tiny_ernie_image, tiny_ideogram4, tiny_joyai_image, tiny_krea2, tiny_stable_diffusion)
from diffsynth.testing.tiny_flux2 import tiny_flux2_transformer  # noqa: E402
from diffsynth.testing.tiny_flux2_dev import DOUBLE_BLOCKS, SINGLE_BLOCKS, TEXT_HIDDEN  # noqa: E402

MIRROR = Path("/work/.mirror/YellowRoseCx+ComfyUI/repo")
PREFIX = "diffusion_model."


@dataclass(frozen=True)
class Variant:
    """One image model to check.

    Attributes:
        name: What the rows are labelled.
        build: The tiny diffusers denoiser (seeded).
        comfy_config: The ``comfy.supported_models`` class ComfyUI's detection must pick for its weights.
        release_names: ComfyUI's module and a diffusers state dict -> that state dict under the release's names
            (without ``PREFIX``).
        tiny_sizes: The model arguments ComfyUI's detection fixes at the release's values (or does not read), as the
            tiny model has them.
        release_sizes: The detected arguments ComfyUI's model list matches on, at the release's values.
        targets: ``--lora_target_modules`` (module name suffixes, as peft matches them); None for every layer a LoRA
            can wrap.
    """

    name: str
    build: Callable[[], torch.nn.Module]
    comfy_config: str
    release_names: Callable[[object, dict[str, torch.Tensor]], dict[str, torch.Tensor]]
    tiny_sizes: dict = field(default_factory=dict)
    release_sizes: dict = field(default_factory=dict)
    targets: tuple[str, ...] | None = None


def _reference_targets(script: str) -> tuple[str, ...]:
    """The ``--lora_target_modules`` of a reference training script under ``examples/``."""
    text = (Path(__file__).parents[1] / "examples" / script).read_text()
    return tuple(re.search(r'--lora_target_modules "([^"]*)"', text)[1].split(","))


def _unet(config: dict) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        from diffusers import UNet2DConditionModel

        torch.manual_seed(0)
        return UNet2DConditionModel(**config)

    return build


def _ldm_unet_config(config: dict) -> dict:
    """ComfyUI's ``unet_config`` of the diffusers UNet ``config`` (the keys ``comfy.utils.unet_to_diffusers`` reads):
    per level and resnet, how many transformer layers follow; the output blocks' in the reverse order ComfyUI keeps."""
    levels, per_level = len(config["block_out_channels"]), config["layers_per_block"]
    depth = config.get("transformer_layers_per_block", 1)
    depth = [depth] * levels if isinstance(depth, int) else list(depth)
    down = [depth[i] if "CrossAttn" in kind else 0 for i, kind in enumerate(config["down_block_types"])]
    up = [depth[levels - 1 - i] if "CrossAttn" in kind else 0 for i, kind in enumerate(config["up_block_types"])]
    return {"num_res_blocks": [per_level] * levels,
            "channel_mult": [width // config["block_out_channels"][0] for width in config["block_out_channels"]],
            "transformer_depth": [count for count in down for _ in range(per_level)],
            "transformer_depth_output": [count for count in reversed(up) for _ in range(per_level + 1)],
            "transformer_depth_middle": depth[-1]}


def _ldm_names(config: dict) -> Callable[[object, dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """The UNet's weights under the names of the single-file checkpoints (LDM's), by ComfyUI's own map."""
    def rename(comfy, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        names = comfy.utils.unet_to_diffusers(_ldm_unet_config(config))
        return {names[key]: value for key, value in state.items()}

    return rename


def _flux2_bfl_names(comfy, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """FLUX.2's weights under BFL's names (the release's ``flux2-dev.safetensors``): ComfyUI's own diffusers map for
    the blocks and the layers FLUX.1 shares, and FLUX.2's other names (those of diffusers' single-file converter)."""
    blocks = sum(1 for key in state if key.endswith("attn.to_q.weight") and key.startswith("transformer_blocks."))
    singles = sum(1 for key in state if key.endswith("attn.to_qkv_mlp_proj.weight"))
    hidden = state["x_embedder.weight"].shape[0]
    key_map = comfy.utils.flux_to_diffusers({"depth": blocks, "depth_single_blocks": singles, "hidden_size": hidden})
    for diffusers, bfl in (("time_guidance_embed.timestep_embedder.linear_1", "time_in.in_layer"),
                           ("time_guidance_embed.timestep_embedder.linear_2", "time_in.out_layer"),
                           ("time_guidance_embed.guidance_embedder.linear_1", "guidance_in.in_layer"),
                           ("time_guidance_embed.guidance_embedder.linear_2", "guidance_in.out_layer"),
                           ("double_stream_modulation_img.linear", "double_stream_modulation_img.lin"),
                           ("double_stream_modulation_txt.linear", "double_stream_modulation_txt.lin"),
                           ("single_stream_modulation.linear", "single_stream_modulation.lin")):
        for end in ("weight", "bias"):
            key_map[f"{diffusers}.{end}"] = f"{bfl}.{end}"
    key_map["norm_out.linear.weight"] = ("final_layer.adaLN_modulation.1.weight", None, comfy.utils.swap_scale_shift)
    renamed = harness.to_bfl(state, key_map)
    # BFL's RMSNorms hold "scale" where diffusers says "weight".
    return {key.replace("norm.weight", "norm.scale"): value for key, value in renamed.items()}


def _same_names(comfy, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return dict(state)


def _ernie() -> torch.nn.Module:
    from diffusers import ErnieImageTransformer2DModel

    torch.manual_seed(0)
    return ErnieImageTransformer2DModel(**tiny_ernie_image.TRANSFORMER_CONFIG)


def _qwen(**extra) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        from diffusers import QwenImageTransformer2DModel

        torch.manual_seed(0)
        return QwenImageTransformer2DModel(
            patch_size=2, in_channels=64, out_channels=16, num_layers=2, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=32, guidance_embeds=False, axes_dims_rope=(8, 4, 4), **extra)

    return build


def _flux2_dev() -> torch.nn.Module:
    # The releases' 256 timestep channels, which ComfyUI's Flux model fixes.
    return tiny_flux2_transformer(0, DOUBLE_BLOCKS, SINGLE_BLOCKS, TEXT_HIDDEN, True, timestep_channels=256)


SD15_UNET, SDXL_UNET = tiny_stable_diffusion.UNET_CONFIG, tiny_stable_diffusion.SDXL_UNET_CONFIG
FLUX2_TINY = {"num_heads": 2, "axes_dim": [4, 4, 4, 4], "out_channels": 128}
QWEN_TINY = {"attention_head_dim": 16, "num_attention_heads": 2, "joint_attention_dim": 32, "axes_dims_rope": (8, 4, 4)}

VARIANTS = (
    Variant("Stable Diffusion 1.5", _unet(SD15_UNET), "SD15", _ldm_names(SD15_UNET),
            release_sizes={"model_channels": 320, "context_dim": 768}),
    # diffusers' SDXL attention_head_dim counts heads (2 of 16 channels here); ComfyUI's SDXL gives their width.
    Variant("SDXL", _unet(SDXL_UNET), "SDXL", _ldm_names(SDXL_UNET), tiny_sizes={"num_head_channels": 16},
            release_sizes={"model_channels": 320, "context_dim": 2048, "adm_in_channels": 2816}),
    Variant("ERNIE-Image", _ernie, "ErnieImage", _same_names,
            tiny_sizes={key: value for key, value in tiny_ernie_image.TRANSFORMER_CONFIG.items()}),
    Variant("FLUX.2 [dev]", _flux2_dev, "Flux2", _flux2_bfl_names, tiny_sizes=FLUX2_TINY),
    Variant("FLUX.2 [dev], the reference's targets", _flux2_dev, "Flux2", _flux2_bfl_names, tiny_sizes=FLUX2_TINY,
            targets=_reference_targets("flux2/model_training/lora/FLUX.2-dev.sh")),
    # Qwen-Image-Distill-Full, Qwen-Image-Edit(-2509) and FireRed-Image-Edit 1.0 / 1.1 hold the same weights.
    Variant("Qwen-Image", _qwen(), "QwenImage", _same_names, tiny_sizes=QWEN_TINY),
    Variant("Qwen-Image-Edit-2511", _qwen(zero_cond_t=True), "QwenImage", _same_names, tiny_sizes=QWEN_TINY),
    Variant("Qwen-Image-Layered", _qwen(use_additional_t_cond=True, use_layer3d_rope=True), "QwenImage", _same_names,
            tiny_sizes=QWEN_TINY),
)


def _krea2() -> dict[str, torch.Tensor]:
    from diffusers import Krea2Transformer2DModel

    from diffsynth.pipelines.krea2.original import transformer_to_original

    torch.manual_seed(0)
    return transformer_to_original(Krea2Transformer2DModel(**tiny_krea2.TRANSFORMER_CONFIG).state_dict())


def _ideogram4() -> dict[str, torch.Tensor]:
    from diffusers import Ideogram4Transformer2DModel

    from diffsynth.pipelines.ideogram4.original import transformer_to_original

    torch.manual_seed(0)
    return transformer_to_original(Ideogram4Transformer2DModel(**tiny_ideogram4.TRANSFORMER_CONFIG).state_dict())


def _joyai() -> dict[str, torch.Tensor]:
    from diffusers import JoyImageEditTransformer3DModel

    from diffsynth.pipelines.joyai_image.original import original_key

    torch.manual_seed(0)
    model = JoyImageEditTransformer3DModel(**tiny_joyai_image.TRANSFORMER_CONFIG)
    return {original_key(key): value for key, value in model.state_dict().items()}


# The families this ComfyUI has no model for, with their tiny denoisers' weights under their releases' names: only
# what its detection makes of them is shown.
NOT_IN_COMFYUI = (("Krea 2", _krea2), ("Ideogram 4", _ideogram4), ("JoyAI-Image-Edit", _joyai))


@dataclass
class Prepared:
    """A variant's files, made before ComfyUI is imported (its stand-ins confuse diffusers')."""

    variant: Variant
    layers: int
    state: dict[str, torch.Tensor]  # the denoiser's weights under diffusers' names
    runs: list[tuple[str, Path, dict[str, torch.Tensor], object]]  # layout, file, merged weights, emulation


def trainer_layouts(path: Path, model: torch.nn.Module) -> tuple[str, ...]:
    """The layouts the trainer writes for ``model`` (its main file's first, then the kohya form offered to
    musubi-tuner and ComfyUI), with the diffusers twin where diffusers cannot read the main file."""
    if naming_for(model).kohya_only:
        return ("kohya",)
    twin = any(result.tool == "diffusers" for result in inspect_lora(path, model).failing())
    return ("universal", "kohya", "diffusers") if twin else ("universal", "kohya")


def prepare(variant: Variant, folder: Path) -> Prepared:
    """Writes the variant's LoRA files; records our merge of each and inspect's ComfyUI verdict."""
    model = variant.build().eval()
    names = [name for name in lora_layer_names(model) if naming_for(model).to_native(name) is not None and (
        variant.targets is None or any(name == target or name.endswith("." + target) for target in variant.targets))]
    weights = harness.random_lora(model, names=names)
    stem = folder / re.sub(r"\W+", "_", variant.name)
    main_layout = "kohya" if naming_for(model).kohya_only else "universal"
    main = write_lora(stem.with_suffix(f".{main_layout}.safetensors"), weights, main_layout, naming_for(model))
    runs = []
    for layout in trainer_layouts(main, model):
        path = write_lora(stem.with_suffix(f".{layout}.safetensors"), weights, layout, naming_for(model))
        merged = copy.deepcopy(model)
        load_lora(merged, path)
        runs.append((layout, path, {key: value.detach() for key, value in merged.state_dict().items()},
                     inspect_lora(path, model).result("ComfyUI")))
    return Prepared(variant, len(names), {key: value.detach().clone() for key, value in model.state_dict().items()},
                    runs)


def report(comfy, item: Prepared) -> bool:
    """Prints a variant's rows; True when ComfyUI picked the expected model."""
    variant = item.variant

    def released(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {PREFIX + key: value for key, value in variant.release_names(comfy, state).items()}

    model, config, line = harness.comfy_model(comfy, released(item.state), PREFIX, variant.tiny_sizes,
                                              variant.release_sizes)
    expected = line.startswith(f"detected {variant.comfy_config} ")
    print(f"{variant.name}: {item.layers} LoRA layers; {line}" + ("" if expected else
                                                                   f" (expected {variant.comfy_config})"))
    if model is None:
        return expected
    base = harness.as_loaded(config, released(item.state), PREFIX)
    for layout, path, merged, emulated in item.runs:
        ours = {key: value - base[key] for key, value in harness.as_loaded(config, released(merged), PREFIX).items()
                if not torch.equal(value, base[key])}
        theirs, loaded, unused = harness.comfyui_changes(comfy, model, path, base)
        print(f"  {layout:<9} keys loaded {loaded}/{len(load_file(str(path)))}, unused {len(unused)}; "
              f"{harness.compare(ours, theirs)}; emulation: {emulated.mapped}/{emulated.total} layers"
              + ("" if emulated.strength is None else f" at {emulated.strength:.6f}"))
        for message in unused[:2]:
            print(f"    {message}")
    return expected


def report_absent(comfy, name: str, weights: dict[str, torch.Tensor]) -> bool:
    """Prints what ComfyUI's detection makes of the release-named ``weights`` of a family it has no model for; True
    when it makes nothing of them (a model it did pick would read the family's LoRA files by that model's names)."""
    detected = comfy.model_detection.detect_unet_config(weights, PREFIX)
    picked = None if detected is None else comfy.model_detection.model_config_from_unet_config(detected, weights)
    print(f"{name}: no model of it in this ComfyUI; its detection makes "
          f"{'nothing' if picked is None else type(picked).__name__} of the release's weights; skipped")
    return picked is None


def main(argv: list[str] | None = None) -> int:
    args = harness.comfyui_arguments(__doc__, argv, MIRROR)
    with tempfile.TemporaryDirectory() as folder:
        prepared = [prepare(variant, Path(folder)) for variant in VARIANTS]
        absent = {name: {PREFIX + key: value for key, value in build().items()} for name, build in NOT_IN_COMFYUI}
        commit = harness.export(args.mirror, args.rev, Path(folder) / "comfyui")
        comfy = harness.import_comfy(Path(folder) / "comfyui")
        print(f"ComfyUI {commit[:10]}; alpha / rank 0.5 on every LoRA-able layer")
        failures = sum(not report(comfy, item) for item in prepared)
        failures += sum(not report_absent(comfy, name, weights) for name, weights in absent.items())
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
