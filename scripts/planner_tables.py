"""Writes the memory planner's tables for the released Qwen-Image, Wan2.1-14B, Z-Image and FLUX.2 [klein] denoisers
into docs Low_VRAM.

    python scripts/planner_tables.py            # rewrites the tables in docs/en/Low_VRAM.md and docs/zh/Low_VRAM.md
    python scripts/planner_tables.py --print    # prints them instead

The runs planned are LoRA rank 32 on the example scripts' layers, bf16 weights (and Qwen-Image once more with fp8
storage), one sample per step: Qwen-Image and Z-Image at 1024x1024 with 256 prompt tokens, FLUX.2 [klein] at 1024x1024
with 512, Wan2.1-T2V-14B at 832x480 with 81 frames; device budgets are each profile's memory less 0.5 GiB, the host
budget 128 GiB. Everything is predicted on the meta device (no weights, no GPU).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from diffsynth.core.planning.plans import NoPlanFits, format_table
from diffsynth.core.planning.profiles import GIB, PROFILES
from diffsynth.pipelines.flux import FluxPipeline
from diffsynth.pipelines.flux2_klein import Flux2KleinPipeline
from diffsynth.pipelines.qwen_image import QwenImagePipeline
from diffsynth.pipelines.wan_video import WanVideoPipeline
from diffsynth.pipelines.z_image import ZImagePipeline
from diffsynth.training.config import RunConfig
from diffsynth.training.config.parsers import build_parser
from diffsynth.training.placement.config import PlacementConfig
from diffsynth.training.placement.planner import DEVICE_MARGIN_BYTES, build_architecture, build_workload, plan_workload

ROOT = Path(__file__).resolve().parents[1]
PROFILE_NAMES = ("rtx4070-12gb", "rtx4080-16gb", "rtx4090-24gb", "h100-80gb")
HOST_BUDGET = 128 * GIB
QWEN_IMAGE_FLAGS = ["--lora_target_modules", "to_q,to_k,to_v,add_q_proj,add_k_proj,add_v_proj,to_out.0,to_add_out,"
                    "img_mlp.net.2,img_mod.1,txt_mlp.net.2,txt_mod.1", "--height", "1024", "--width", "1024"]
SQUARE = ["--height", "1024", "--width", "1024"]
# The reference's FLUX.2 [klein] targets: its scripts name single_transformer_blocks.0-19.attn.to_out one by one.
FLUX2_FLAGS = ["--lora_target_modules", ",".join([
    "to_q,to_k,to_v,to_out.0,add_q_proj,add_k_proj,add_v_proj,to_add_out,linear_in,linear_out,to_qkv_mlp_proj",
    *(f"single_transformer_blocks.{index}.attn.to_out" for index in range(20))]), *SQUARE]
# The reference's FLUX.1 targets, in its own module names (mapped to diffusers' by FluxPipeline.lora_target_aliases).
FLUX_FLAGS = ["--lora_target_modules", "a_to_qkv,b_to_qkv,ff_a.0,ff_a.2,ff_b.0,ff_b.2,a_to_out,b_to_out,proj_out,"
              "norm.linear,norm1_a.linear,norm1_b.linear,to_qkv_mlp", *SQUARE]
RUNS = {
    "Qwen-Image (20B) LoRA, 1024x1024": ("qwen-image", QwenImagePipeline, False, False, QWEN_IMAGE_FLAGS),
    "Qwen-Image (20B) LoRA, 1024x1024, frozen weights in fp8 (--fp8_models)": (
        "qwen-image", QwenImagePipeline, False, True, QWEN_IMAGE_FLAGS),
    "Wan2.1-T2V-14B LoRA, 832x480, 81 frames": ("wan2.1-t2v-14b", WanVideoPipeline, True, False, [
        "--lora_target_modules", "q,k,v,o,ffn.0,ffn.2", "--height", "480", "--width", "832", "--num_frames", "81"]),
    "Z-Image (6B) LoRA, 1024x1024": ("z-image", ZImagePipeline, False, False, [
        "--lora_target_modules", "to_q,to_k,to_v,to_out.0,w1,w2,w3", *SQUARE]),
    "FLUX.1 [dev] (12B) LoRA, 1024x1024": ("flux.1-dev", FluxPipeline, False, False, FLUX_FLAGS),
    "FLUX.2 [klein] 4B LoRA, 1024x1024": ("flux.2-klein-4b", Flux2KleinPipeline, False, False, FLUX2_FLAGS),
    "FLUX.2 [klein] 9B LoRA, 1024x1024": ("flux.2-klein-9b", Flux2KleinPipeline, False, False, FLUX2_FLAGS),
}
START, END = "<!-- planner-tables:start -->", "<!-- planner-tables:end -->"


def tables() -> str:
    """The Markdown: per run, the chosen plan on each profile, and every placement on the 24 GB profile."""
    sections = []
    for title, (architecture, pipeline, video, fp8, flags) in RUNS.items():
        namespace = build_parser(video=video).parse_args(["--lora_base_model", "dit", "--lora_rank", "32", *flags])
        config = RunConfig.from_namespace(namespace, runnable=False)  # planned, not run: no model files or dataset
        model = build_architecture(architecture, "bfloat16")
        workload = build_workload(model, config, (), pipeline.lora_target_aliases, fp8=fp8)
        lines = [f"#### {title}", "", f"{workload.model_bytes / GIB:.1f} GiB of weights, "
                 f"{workload.trainable_bytes / GIB:.2f} GiB of LoRA (float32).", "",
                 "| device | chosen placement | checkpointing | GPU GiB | host GiB | step s |",
                 "| --- | --- | --- | ---: | ---: | ---: |"]
        detail = None
        for name in PROFILE_NAMES:
            profile = PROFILES[name]
            vram = profile.memory_bytes - DEVICE_MARGIN_BYTES
            try:
                report = plan_workload(workload, PlacementConfig(), profile, vram, HOST_BUDGET)
            except NoPlanFits as error:
                least = str(error).split("The least device memory within the host budget: ")[-1].split(" with")[0]
                lines.append(f"| {name} | none fits (the least any plan needs: {least}) | | | | |")
                continue
            chosen = report.chosen
            lines.append(f"| {name} | {chosen.plan.describe()} | {chosen.plan.checkpointing} | "
                         f"{chosen.device_bytes / GIB:.1f} | {chosen.host_bytes / GIB:.1f} | "
                         f"{chosen.step_seconds:.1f} |")
            if name == "rtx4090-24gb":
                detail = report
        if detail is not None:
            lines += ["", f"Every placement on rtx4090-24gb (the best of each kind; device budget "
                          f"{detail.vram_bytes / GIB:.1f} GiB, host {HOST_BUDGET / GIB:.0f} GiB):", "",
                      format_table(detail.rows, detail.vram_bytes, detail.ram_bytes, detail.chosen)]
        sections.append("\n".join(lines))
    return "\n\n".join(sections) + "\n"


def write(text: str) -> None:
    for language in ("en", "zh"):
        path = ROOT / "docs" / language / "Low_VRAM.md"
        page = path.read_text(encoding="utf-8")
        if START not in page:
            raise SystemExit(f"{path} has no {START} marker to write the tables after")
        page = re.sub(f"{re.escape(START)}.*{re.escape(END)}", lambda _: f"{START}\n{text}{END}", page, flags=re.S)
        path.write_text(page, encoding="utf-8")
        print(f"{path.relative_to(ROOT)}: updated")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--print", action="store_true", help="print the tables instead of writing the docs")
    args = parser.parse_args()
    text = tables()
    if args.print:
        print(text)
    else:
        write(text)


if __name__ == "__main__":
    main()
