"""Writes the memory planner's tables for the released Qwen-Image, Wan2.1, Z-Image, FLUX.1, FLUX.2 [klein] and
LTX-2 denoisers into the docs: per model every placement in Low_VRAM, and the placement chosen for each GPU size in
Multi_GPU, from the same predictions, so that the pages cannot disagree with the planner or with each other; the
full fine-tunes of Qwen-Image and Wan2.1-14B per optimizer setup, GPU size and host RAM size in Full_Fine_Tuning; and
a family page's own runs with every placement on the 24 and 32 GB GPUs (LTX2).

    python scripts/planner_tables.py            # rewrites the tables in docs/{en,zh}/Low_VRAM.md, Multi_GPU.md,
                                                # Full_Fine_Tuning.md and LTX2.md
    python scripts/planner_tables.py --print    # prints them instead

The runs planned are LoRA rank 32 on the example scripts' layers, bf16 weights (and Qwen-Image and LTX-2 once more
with fp8 storage), one sample per step: Qwen-Image and Z-Image at 1024x1024 with 256 prompt tokens, FLUX.1 and FLUX.2
[klein] at 1024x1024 with 512, Wan2.1-T2V at 832x480 with 81 frames, LTX-2 at 768x512 with 121 frames and its sound
(1,024 prompt tokens); device budgets are each profile's memory less 0.5 GiB, the host budget 128 GiB. Everything is
predicted on the meta device (no weights, no GPU); it takes minutes. The full fine-tunes train every transformer
weight in bf16, from a stage-1 cache, at the same shapes.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

from diffsynth.core.planning.plans import (
    HOST_OPTIMIZER_VALUES_PER_SECOND,
    NoPlanFits,
    Prediction,
    Workload,
    candidate_plans,
    choose,
    format_table,
    predict,
)
from diffsynth.core.planning.profiles import GIB, PROFILES
from diffsynth.core.planning.training_state import TrainingSetup
from diffsynth.pipelines.flux.pipeline import FluxPipeline
from diffsynth.pipelines.flux2_klein.pipeline import Flux2KleinPipeline
from diffsynth.pipelines.ltx2.pipeline import LTX2AudioVideoPipeline
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
from diffsynth.pipelines.z_image.pipeline import ZImagePipeline
from diffsynth.training.config import RunConfig
from diffsynth.training.config.parsers import build_parser
from diffsynth.training.config.placement import PlacementConfig
from diffsynth.training.placement.planner import (
    DEVICE_MARGIN_BYTES,
    PlanReport,
    build_architecture,
    build_workload,
    plan_workload,
)

ROOT = Path(__file__).resolve().parents[1]
LOW_VRAM_PROFILES = ("rtx4070-12gb", "rtx4080-16gb", "rtx4090-24gb", "rtx5090-32gb", "h100-80gb")
GPU_SIZE_PROFILES = ("rtx4070-12gb", "rtx4080-16gb", "rtx4090-24gb", "rtx5090-32gb", "l40s-48gb", "h100-80gb")
DETAIL_PROFILE = "rtx4090-24gb"
# A family page shows every placement on both consumer cards its users ask about.
FAMILY_DETAIL_PROFILES = ("rtx4090-24gb", "rtx5090-32gb")
HOST_BUDGET = 128 * GIB
QWEN_IMAGE_FLAGS = ["--lora_target_modules", "to_q,to_k,to_v,add_q_proj,add_k_proj,add_v_proj,to_out.0,to_add_out,"
                    "img_mlp.net.2,img_mod.1,txt_mlp.net.2,txt_mod.1", "--height", "1024", "--width", "1024"]
SQUARE = ["--height", "1024", "--width", "1024"]
WAN_FLAGS = ["--lora_target_modules", "q,k,v,o,ffn.0,ffn.2", "--height", "480", "--width", "832", "--num_frames", "81"]
LTX2_FLAGS = ["--lora_target_modules", "to_k,to_q,to_v,to_out.0", "--height", "512", "--width", "768", "--num_frames",
              "121"]
# The reference's FLUX.2 [klein] targets: its scripts name single_transformer_blocks.0-19.attn.to_out one by one.
FLUX2_FLAGS = ["--lora_target_modules", ",".join([
    "to_q,to_k,to_v,to_out.0,add_q_proj,add_k_proj,add_v_proj,to_add_out,linear_in,linear_out,to_qkv_mlp_proj",
    *(f"single_transformer_blocks.{index}.attn.to_out" for index in range(20))]), *SQUARE]
# The reference's FLUX.1 targets, in its own module names (mapped to diffusers' by FluxPipeline.lora_target_aliases).
FLUX_FLAGS = ["--lora_target_modules", "a_to_qkv,b_to_qkv,ff_a.0,ff_a.2,ff_b.0,ff_b.2,a_to_out,b_to_out,proj_out,"
              "norm.linear,norm1_a.linear,norm1_b.linear,to_qkv_mlp", *SQUARE]


@dataclasses.dataclass(frozen=True)
class Run:
    """One planned training run: its titles (English, Chinese), the released denoiser and the trainer flags."""

    title: str
    title_zh: str
    architecture: str
    pipeline: type
    flags: tuple[str, ...]
    video: bool = False
    fp8: bool = False


RUNS = (
    Run("Qwen-Image (20B) LoRA, 1024x1024", "Qwen-Image（20B）LoRA，1024x1024", "qwen-image", QwenImagePipeline,
        tuple(QWEN_IMAGE_FLAGS)),
    Run("Qwen-Image (20B) LoRA, 1024x1024, frozen weights in fp8 (--fp8_models)",
        "Qwen-Image（20B）LoRA，1024x1024，冻结权重 fp8（--fp8_models）", "qwen-image", QwenImagePipeline,
        tuple(QWEN_IMAGE_FLAGS), fp8=True),
    Run("Wan2.1-T2V-14B LoRA, 832x480, 81 frames", "Wan2.1-T2V-14B LoRA，832x480，81 帧", "wan2.1-t2v-14b",
        WanVideoPipeline, tuple(WAN_FLAGS), video=True),
    Run("Wan2.1-T2V-1.3B LoRA, 832x480, 81 frames", "Wan2.1-T2V-1.3B LoRA，832x480，81 帧", "wan2.1-t2v-1.3b",
        WanVideoPipeline, tuple(WAN_FLAGS), video=True),
    Run("Z-Image (6B) LoRA, 1024x1024", "Z-Image（6B）LoRA，1024x1024", "z-image", ZImagePipeline,
        ("--lora_target_modules", "to_q,to_k,to_v,to_out.0,w1,w2,w3", *SQUARE)),
    Run("FLUX.1 [dev] (12B) LoRA, 1024x1024", "FLUX.1 [dev]（12B）LoRA，1024x1024", "flux.1-dev", FluxPipeline,
        tuple(FLUX_FLAGS)),
    Run("FLUX.2 [klein] 4B LoRA, 1024x1024", "FLUX.2 [klein] 4B LoRA，1024x1024", "flux.2-klein-4b",
        Flux2KleinPipeline, tuple(FLUX2_FLAGS)),
    Run("FLUX.2 [klein] 9B LoRA, 1024x1024", "FLUX.2 [klein] 9B LoRA，1024x1024", "flux.2-klein-9b",
        Flux2KleinPipeline, tuple(FLUX2_FLAGS)),
    Run("LTX-2 (19B) LoRA, 768x512, 121 frames with sound", "LTX-2（19B）LoRA，768x512，121 帧（含声音）", "ltx2-19b",
        LTX2AudioVideoPipeline, tuple(LTX2_FLAGS), video=True),
    Run("LTX-2 (19B) LoRA, 768x512, 121 frames with sound, frozen weights in fp8 (--fp8_models)",
        "LTX-2（19B）LoRA，768x512，121 帧（含声音），冻结权重 fp8（--fp8_models）", "ltx2-19b",
        LTX2AudioVideoPipeline, tuple(LTX2_FLAGS), video=True, fp8=True),
)
FAMILY_PAGES = {"LTX2.md": "ltx2-19b"}
"""The family pages that show their own runs (those of this architecture), every placement on
``FAMILY_DETAIL_PROFILES``."""
Outcome = PlanReport | NoPlanFits
"""What the planner answers for one run on one profile: the report, or why nothing fits."""
Planned = list[tuple[Run, Workload, dict[str, Outcome]]]
"""Each run with its workload and its outcome per profile name."""

LOW_VRAM_MARKERS = ("<!-- planner-tables:start -->", "<!-- planner-tables:end -->")
FAMILY_MARKERS = ("<!-- planner-family:start -->", "<!-- planner-family:end -->")
GPU_SIZE_MARKERS = ("<!-- planner-gpu-sizes:start -->", "<!-- planner-gpu-sizes:end -->")
WORDS = {
    "en": {"model": "model", "gpu": "{size} GB ({profile})",
           "cell": "{plan}, checkpointing {mode}: {device} / {host} GiB",
           "none": "none fits (the least any plan needs: {least})",
           "intro": "The placement the memory planner chooses for one GPU of each size, with its predicted peak GPU / "
                    "host memory in GiB (generated by `python scripts/planner_tables.py` from the runs of the tables "
                    "in [Low_VRAM](Low_VRAM.md): LoRA rank 32, AdamW in float32, one sample per step, training from a "
                    "stage-1 cache so that only the transformer is on the GPU, host budget {host} GiB):"},
    "zh": {"model": "模型", "gpu": "{size} GB（{profile}）", "cell": "{plan}，梯度检查点 {mode}：{device} / {host} GiB",
           "none": "都放不下（任何方案最少需要 {least}）",
           "intro": "显存规划器为每种显存大小的单张 GPU 选择的放置方式，以及预测的 GPU / 内存峰值（GiB；由 "
                    "`python scripts/planner_tables.py` 生成，与 [Low_VRAM](Low_VRAM.md) 中的表格是同一组训练：LoRA "
                    "秩 32，AdamW 为 float32，每步一个样本，从第一阶段缓存训练，GPU 上只有 transformer，内存预算 "
                    "{host} GiB）："},
}


def plan_runs(runs: tuple[Run, ...] = RUNS) -> Planned:
    """Each run's workload and the planner's outcome on every profile of the tables (the slow part: dry runs)."""
    planned = []
    for run in runs:
        namespace = build_parser(video=run.video).parse_args(["--lora_base_model", "dit", "--lora_rank", "32",
                                                              *run.flags])
        config = RunConfig.from_namespace(namespace, runnable=False)  # planned, not run: no model files or dataset
        model = build_architecture(run.architecture, "bfloat16")
        workload = build_workload(model, config, (), run.pipeline.lora_target_aliases, fp8=run.fp8)
        outcomes = {name: _outcome(workload, name) for name in dict.fromkeys(LOW_VRAM_PROFILES + GPU_SIZE_PROFILES)}
        planned.append((run, workload, outcomes))
    return planned


def _outcome(workload: Workload, profile_name: str) -> Outcome:
    profile = PROFILES[profile_name]
    try:
        return plan_workload(workload, PlacementConfig(), profile, profile.memory_bytes - DEVICE_MARGIN_BYTES,
                             HOST_BUDGET)
    except NoPlanFits as error:
        return error


def least_device_memory(error: NoPlanFits) -> str:
    """The least device memory any plan needs, as the planner's message words it (``52.3 GiB``)."""
    return str(error).split("The least device memory within the host budget: ")[-1].split(" with")[0]


def low_vram_tables(planned: Planned, details: tuple[str, ...] = (DETAIL_PROFILE,)) -> str:
    """The Markdown of Low_VRAM: per run, the chosen plan on each profile, and every placement on the ``details``
    ones (the 24 GB one)."""
    sections = []
    for run, workload, outcomes in planned:
        lines = [f"#### {run.title}", "", f"{workload.model_bytes / GIB:.1f} GiB of weights, "
                 f"{workload.trainable_bytes / GIB:.2f} GiB of LoRA (float32).", "",
                 "| device | chosen placement | checkpointing | GPU GiB | host GiB | step s |",
                 "| --- | --- | --- | ---: | ---: | ---: |"]
        for name in LOW_VRAM_PROFILES:
            outcome = outcomes[name]
            if isinstance(outcome, NoPlanFits):
                lines.append(f"| {name} | none fits (the least any plan needs: {least_device_memory(outcome)}) "
                             "| | | | |")
                continue
            chosen = outcome.chosen
            lines.append(f"| {name} | {chosen.plan.describe()} | {chosen.plan.checkpointing} | "
                         f"{chosen.device_bytes / GIB:.1f} | {chosen.host_bytes / GIB:.1f} | "
                         f"{chosen.step_seconds:.1f} |")
        for name in details:
            detail = outcomes[name]
            if isinstance(detail, PlanReport):
                lines += ["", f"Every placement on {name} (the best of each kind; device budget "
                              f"{detail.vram_bytes / GIB:.1f} GiB, host {HOST_BUDGET / GIB:.0f} GiB):", "",
                          format_table(detail.rows, detail.vram_bytes, detail.ram_bytes, detail.chosen)]
        sections.append("\n".join(lines))
    return "\n\n".join(sections) + "\n"


def gpu_size_cell(outcome: Outcome, language: str) -> str:
    """One cell of the GPU-size table: the chosen plan with its GPU and host memory, or the least any plan needs."""
    words = WORDS[language]
    if isinstance(outcome, NoPlanFits):
        return words["none"].format(least=least_device_memory(outcome))
    chosen = outcome.chosen
    return words["cell"].format(plan=chosen.plan.describe(), mode=chosen.plan.checkpointing,
                                device=f"{chosen.device_bytes / GIB:.1f}", host=f"{chosen.host_bytes / GIB:.1f}")


def gpu_size_row(run: Run, outcomes: dict[str, Outcome], language: str) -> str:
    """The GPU-size table's row of one run."""
    title = run.title_zh if language == "zh" else run.title
    return "| " + " | ".join([title, *(gpu_size_cell(outcomes[name], language) for name in GPU_SIZE_PROFILES)]) + " |"


def gpu_size_table(planned: Planned, language: str) -> str:
    """The Markdown of Multi_GPU in ``language`` (``en``, ``zh``): per run, the plan chosen on each GPU size."""
    words = WORDS[language]
    sizes = [words["gpu"].format(size=PROFILES[name].memory_bytes // GIB, profile=name) for name in GPU_SIZE_PROFILES]
    lines = [words["intro"].format(host=f"{HOST_BUDGET / GIB:.0f}"), "",
             "| " + " | ".join([words["model"], *sizes]) + " |",
             "| " + " | ".join(["---"] * (len(sizes) + 1)) + " |"]
    lines += [gpu_size_row(run, outcomes, language) for run, _, outcomes in planned]
    return "\n".join(lines) + "\n"


@dataclasses.dataclass(frozen=True)
class FullRun:
    """One planned full fine-tune: its titles, the released denoiser and the trainer flags, with each optimizer
    setup of ``FULL_SETUPS``."""

    title: str
    title_zh: str
    architecture: str
    flags: tuple[str, ...]
    video: bool = False


FULL_RUNS = (
    FullRun("Qwen-Image (20B), 1024x1024", "Qwen-Image（20B），1024x1024", "qwen-image", tuple(SQUARE)),
    FullRun("Wan2.1-T2V-14B, 832x480, 81 frames", "Wan2.1-T2V-14B，832x480，81 帧", "wan2.1-t2v-14b",
            ("--height", "480", "--width", "832", "--num_frames", "81"), video=True),
)
FULL_SETUPS = (
    ("AdamW", "AdamW", TrainingSetup()),
    ("AdamW8bit, fused step", "AdamW8bit，融合步进", TrainingSetup("bitsandbytes.optim.AdamW8bit", fused_step=True)),
    ("AdamW8bit, fused step, EMA", "AdamW8bit，融合步进，EMA",
     TrainingSetup("bitsandbytes.optim.AdamW8bit", ema=True, fused_step=True)),
)
"""The optimizer setups of the full fine-tunes: torch's AdamW (two bf16 moments), bitsandbytes' AdamW8bit with
``--fused_optimizer_step``, and that with ``--ema_decay``."""
FULL_PROFILES = ("rtx4090-24gb", "rtx5090-32gb", "l40s-48gb", "h100-80gb")
FULL_HOST_GIB = (64, 128, 256, 512)
FULL_MARKERS = ("<!-- planner-full-training:start -->", "<!-- planner-full-training:end -->")
FULL_WORDS = {
    "en": {"head": ["model", "optimizer", "GPU", *(f"{size} GB RAM" for size in FULL_HOST_GIB)],
           "cell": "{plan}, checkpointing {mode}: {device} / {host} GiB, {step} s",
           "ram": "needs {host} GiB of RAM ({plan})", "gpu": "does not fit the GPU (the least any plan needs: "
           "{device} GiB)",
           "intro": "The fastest plan the memory planner predicts to fit each GPU and host RAM size, with its peak GPU "
                    "/ host memory in GiB and its step time, or the least host memory any plan that fits the GPU needs "
                    "(generated by `python scripts/planner_tables.py`: every weight of the transformer trained in bf16, "
                    "one sample per step, training from a stage-1 cache; AdamW keeps two bf16 moments, AdamW8bit two "
                    "8-bit ones; the fused step is `--fused_optimizer_step`, EMA `--ema_decay`, float32 in host "
                    "memory; the optimizer step on the host is assumed at {rate} values/s):"},
    "zh": {"head": ["模型", "优化器", "GPU", *(f"{size} GB 内存" for size in FULL_HOST_GIB)],
           "cell": "{plan}，梯度检查点 {mode}：{device} / {host} GiB，{step} s",
           "ram": "需要 {host} GiB 内存（{plan}）", "gpu": "GPU 放不下（任何方案最少需要 {device} GiB）",
           "intro": "显存规划器预测能放进每种 GPU 与主机内存大小的最快方案，以及它的 GPU / 内存峰值（GiB）和每步时间；"
                    "若放不下，则给出能放进该 GPU 的方案最少需要的内存（由 `python scripts/planner_tables.py` 生成："
                    "transformer 的全部权重以 bf16 训练，每步一个样本，从第一阶段缓存训练；AdamW 保存两个 bf16 动量，"
                    "AdamW8bit 保存两个 8 位动量；融合步进即 `--fused_optimizer_step`，EMA 即 `--ema_decay`，以 "
                    "float32 保存在主机内存中；主机上的优化器步进按每秒 {rate} 个数值估计）："},
}
FullPlanned = list[tuple[FullRun, str, str, str, list[Prediction]]]
"""Each full run with its setup's titles (English, Chinese), a profile name and every candidate's prediction."""


def plan_full_runs(runs: tuple[FullRun, ...] = FULL_RUNS) -> FullPlanned:
    """Every candidate plan of each full fine-tune, setup and profile of the full-training table (dry runs shared
    across setups, which do not change them)."""
    planned = []
    for run in runs:
        namespace = build_parser(video=run.video).parse_args(["--trainable_models", "dit", *run.flags])
        config = RunConfig.from_namespace(namespace, runnable=False)
        base = build_workload(build_architecture(run.architecture, "bfloat16"), config)
        for title, title_zh, setup in FULL_SETUPS:
            workload = base.with_training(setup)
            plans = candidate_plans(workload)
            for name in FULL_PROFILES:
                planned.append((run, title, title_zh, name,
                                [predict(plan, workload, PROFILES[name]) for plan in plans]))
    return planned


def full_cell(predictions: list[Prediction], profile_name: str, host_gib: int, language: str) -> str:
    """The fastest plan within the GPU and ``host_gib``, or the host memory the least demanding one that fits the GPU
    needs, or the GPU memory the least demanding plan needs."""
    words = FULL_WORDS[language]
    vram = PROFILES[profile_name].memory_bytes - DEVICE_MARGIN_BYTES
    try:
        chosen = choose(predictions, vram, host_gib * GIB, full_training=True)
    except NoPlanFits:
        on_gpu = [p for p in predictions if p.device_bytes <= vram]
        if not on_gpu:
            return words["gpu"].format(device=f"{min(p.device_bytes for p in predictions) / GIB:.1f}")
        least = min(on_gpu, key=lambda p: p.host_bytes)
        return words["ram"].format(host=f"{least.host_bytes / GIB:.1f}", plan=least.plan.describe())
    return words["cell"].format(plan=chosen.plan.describe(), mode=chosen.plan.checkpointing,
                                device=f"{chosen.device_bytes / GIB:.1f}", host=f"{chosen.host_bytes / GIB:.1f}",
                                step=f"{chosen.step_seconds:.1f}")


def full_training_table(planned: FullPlanned, language: str) -> str:
    """The Markdown of Full_Fine_Tuning in ``language``: per run, setup and GPU, the plan for each host RAM size."""
    words = FULL_WORDS[language]
    lines = [words["intro"].format(rate=f"{HOST_OPTIMIZER_VALUES_PER_SECOND:,.0f}"), "",
             "| " + " | ".join(words["head"]) + " |", "| " + " | ".join(["---"] * len(words["head"])) + " |"]
    for run, title, title_zh, name, predictions in planned:
        gpu = f"{PROFILES[name].memory_bytes // GIB} GB ({name})"
        cells = [full_cell(predictions, name, size, language) for size in FULL_HOST_GIB]
        row = [run.title_zh if language == "zh" else run.title, title_zh if language == "zh" else title, gpu, *cells]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def replace_between(page: str, markers: tuple[str, str], text: str, where: str) -> str:
    """``page`` with what lies between ``markers`` replaced by ``text``.

    Raises:
        SystemExit: ``page`` (``where``) lacks the start marker.
    """
    start, end = markers
    if start not in page:
        raise SystemExit(f"{where} has no {start} marker to write the tables after; add {start} and {end} where "
                         "they belong")
    return re.sub(f"{re.escape(start)}.*{re.escape(end)}", lambda _: f"{start}\n{text}{end}", page, flags=re.DOTALL)


def pages(planned: Planned, full: FullPlanned) -> dict[Path, tuple[tuple[str, str], str]]:
    """Each page to write, with its markers and the text that goes between them."""
    low_vram = low_vram_tables(planned)
    written = {}
    for language in ("en", "zh"):
        folder = ROOT / "docs" / language
        written[folder / "Low_VRAM.md"] = (LOW_VRAM_MARKERS, low_vram)
        written[folder / "Multi_GPU.md"] = (GPU_SIZE_MARKERS, gpu_size_table(planned, language))
        written[folder / "Full_Fine_Tuning.md"] = (FULL_MARKERS, full_training_table(full, language))
        for page, architecture in FAMILY_PAGES.items():
            own = [entry for entry in planned if entry[0].architecture == architecture]
            written[folder / page] = (FAMILY_MARKERS, low_vram_tables(own, FAMILY_DETAIL_PROFILES))
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--print", action="store_true", help="print the tables instead of writing the docs")
    args = parser.parse_args()
    for path, (markers, text) in pages(plan_runs(), plan_full_runs()).items():
        where = path.relative_to(ROOT)
        if args.print:
            print(f"{where}:\n{text}")
            continue
        path.write_text(replace_between(path.read_text(encoding="utf-8"), markers, text, str(where)),
                        encoding="utf-8")
        print(f"{where}: updated")


if __name__ == "__main__":
    main()
