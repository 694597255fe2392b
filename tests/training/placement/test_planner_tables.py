"""The planner's tables in the docs (``scripts/planner_tables.py``): Multi_GPU's GPU sizes and Low_VRAM's placements
from the same predictions, in English and Chinese, current, and agreeing with each other.

Regenerating every table takes minutes (a dry run of each released denoiser), so the currency check plans one run,
the smallest, and the other rows are checked against Low_VRAM's tables, which the same predictions wrote.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from diffsynth.core.planning.plans import NoPlanFits, Plan, Prediction
from diffsynth.core.planning.profiles import GIB, PROFILES
from diffsynth.training.placement.planner import PlanReport
from tests.conftest import load_script

REPO = Path(__file__).resolve().parents[3]


TABLES = load_script("scripts/planner_tables.py", "planner_tables", register=True)  # its dataclass looks it up


def between(path: Path, markers: tuple[str, str]) -> str:
    page = path.read_text(encoding="utf-8")
    start, end = markers
    assert start in page and end in page, f"{path} lacks {start} / {end}"
    return page[page.index(start) + len(start) + 1:page.index(end)]


def report(plan: Plan, device_gib: float, host_gib: float, profile: str) -> PlanReport:
    chosen = Prediction(plan, int(device_gib * GIB), int(device_gib * GIB), int(host_gib * GIB), 1.0, 1.0, 0.0, {})
    return PlanReport(chosen, [chosen], PROFILES[profile].memory_bytes, math.inf, PROFILES[profile], False)


def test_a_row_of_the_gpu_size_table_names_each_chosen_plan_and_its_memory():
    run = TABLES.RUNS[0]
    none = NoPlanFits("no placement fits 11.5 GiB of device memory and 128.0 GiB of host memory. The least device "
                      "memory within the host budget: 13.2 GiB with H2D ring 60/2 (pinned), checkpointing offload")
    outcomes = {"rtx4070-12gb": none,
                "rtx4080-16gb": report(Plan("offload", "h2d", 51, ring_size=2), 15.2, 74.3, "rtx4080-16gb"),
                "rtx4090-24gb": report(Plan("on", "h2d", 39, ring_size=2), 23.4, 59.1, "rtx4090-24gb"),
                "rtx5090-32gb": report(Plan("on", "h2d", 24, ring_size=2), 30.9, 54.1, "rtx5090-32gb"),
                "l40s-48gb": report(Plan("on", "classic", 2), 47.0, 41.0, "l40s-48gb"),
                "h100-80gb": report(Plan("on", "device"), 48.7, 3.0, "h100-80gb")}
    assert TABLES.gpu_size_row(run, outcomes, "en") == (
        "| Qwen-Image (20B) LoRA, 1024x1024 | none fits (the least any plan needs: 13.2 GiB) | H2D ring 51/2 (pinned), "
        "checkpointing offload: 15.2 / 74.3 GiB | H2D ring 39/2 (pinned), checkpointing on: 23.4 / 59.1 GiB | H2D "
        "ring 24/2 (pinned), checkpointing on: 30.9 / 54.1 GiB | block swap 2 (pinned), checkpointing on: 47.0 / 41.0 "
        "GiB | all on the GPU, checkpointing on: 48.7 / 3.0 GiB |")
    assert TABLES.gpu_size_row(run, outcomes, "zh") == (
        "| Qwen-Image（20B）LoRA，1024x1024 | 都放不下（任何方案最少需要 13.2 GiB） | H2D ring 51/2 (pinned)，梯度检查点 "
        "offload：15.2 / 74.3 GiB | H2D ring 39/2 (pinned)，梯度检查点 on：23.4 / 59.1 GiB | H2D ring 24/2 (pinned)，"
        "梯度检查点 on：30.9 / 54.1 GiB | block swap 2 (pinned)，梯度检查点 on：47.0 / 41.0 GiB | all on the GPU，梯度检查点 "
        "on：48.7 / 3.0 GiB |")


def test_the_tables_are_written_between_their_markers_only():
    page = f"# Title\n\nbefore\n\n{TABLES.GPU_SIZE_MARKERS[0]}\n| stale |\n{TABLES.GPU_SIZE_MARKERS[1]}\n\nafter\n"
    assert TABLES.replace_between(page, TABLES.GPU_SIZE_MARKERS, "| new |\n", "page.md") == (
        f"# Title\n\nbefore\n\n{TABLES.GPU_SIZE_MARKERS[0]}\n| new |\n{TABLES.GPU_SIZE_MARKERS[1]}\n\nafter\n")
    with pytest.raises(SystemExit, match="page.md has no <!-- planner-gpu-sizes:start --> marker"):
        TABLES.replace_between("# no markers\n", TABLES.GPU_SIZE_MARKERS, "| new |\n", "page.md")


def chosen_in_low_vram(language: str) -> dict[tuple[str, str], str]:
    """(run title, profile) -> "plan, checkpointing mode", from Low_VRAM's generated tables."""
    text, chosen = between(REPO / "docs" / language / "Low_VRAM.md", TABLES.LOW_VRAM_MARKERS), {}
    for section in text.split("#### ")[1:]:
        title = section.splitlines()[0]
        for row in re.findall(r"^\| (\S+) \| (.+?) \|\s?(off|on|offload|)\s?\|", section,
                              flags=re.MULTILINE):
            chosen[title, row[0]] = f"{row[1]}, {row[2]}"
    return chosen


@pytest.mark.parametrize("language", ["en", "zh"])
def test_multi_gpu_names_the_plans_low_vram_names(language):
    text = between(REPO / "docs" / language / "Multi_GPU.md", TABLES.GPU_SIZE_MARKERS)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [row.split(" | ")[0][2:] for row in rows] == [
        run.title_zh if language == "zh" else run.title for run in TABLES.RUNS]
    in_low_vram = chosen_in_low_vram("en")
    checkpointing = "梯度检查点 " if language == "zh" else "checkpointing "
    for run, row in zip(TABLES.RUNS, rows):
        cells = dict(zip(TABLES.GPU_SIZE_PROFILES, row.strip("| ").split(" | ")[1:]))
        for profile in TABLES.LOW_VRAM_PROFILES:
            plan, mode = in_low_vram[run.title, profile].rsplit(", ", 1)
            if plan.startswith("none fits"):
                assert cells[profile].startswith("都放不下" if language == "zh" else "none fits")
            else:
                assert re.split("[:：]", cells[profile])[0].replace("，", ", ") == f"{plan}, {checkpointing}{mode}"


@pytest.mark.slow  # a dry run of the smallest released denoiser (Wan2.1-T2V-1.3B at 832x480x81)
def test_the_smallest_run_is_current_on_every_page():
    run = next(run for run in TABLES.RUNS if run.architecture == "wan2.1-t2v-1.3b")
    planned = TABLES.plan_runs((run,))
    for language in ("en", "zh"):
        assert TABLES.gpu_size_row(run, planned[0][2], language) in between(
            REPO / "docs" / language / "Multi_GPU.md", TABLES.GPU_SIZE_MARKERS).splitlines(), (
            f"docs/{language}/Multi_GPU.md is out of date; run: .venv/bin/python scripts/planner_tables.py")
        assert TABLES.low_vram_tables(planned).strip() in between(
            REPO / "docs" / language / "Low_VRAM.md", TABLES.LOW_VRAM_MARKERS), (
            f"docs/{language}/Low_VRAM.md is out of date; run: .venv/bin/python scripts/planner_tables.py")


# ---- Full_Fine_Tuning: full fine-tunes per optimizer setup, GPU and host RAM size ------------------------------------

def test_a_full_training_cell_names_the_fastest_plan_that_fits_or_the_memory_that_would():
    offload = Prediction(Plan("on", "offload", optimizer_offload=True), 5 * GIB, 5 * GIB, 100 * GIB, 20.0, 4.0, 1.0, {})
    on_gpu = Prediction(Plan("on", "device"), 90 * GIB, 90 * GIB, 2 * GIB, 4.0, 4.0, 0.0, {})
    assert TABLES.full_cell([offload, on_gpu], "rtx4090-24gb", 128, "en") == (
        "model offload K=1 + optimizer offload, checkpointing on: 5.0 / 100.0 GiB, 20.0 s")
    assert TABLES.full_cell([offload, on_gpu], "h200-141gb", 128, "en").startswith("all on the GPU")  # faster
    assert TABLES.full_cell([offload, on_gpu], "rtx4090-24gb", 64, "en") == (
        "needs 100.0 GiB of RAM (model offload K=1 + optimizer offload)")
    assert TABLES.full_cell([on_gpu], "rtx4090-24gb", 512, "zh") == "GPU 放不下（任何方案最少需要 90.0 GiB）"


@pytest.mark.parametrize("language", ["en", "zh"])
def test_full_fine_tuning_has_a_row_per_run_setup_and_gpu(language):
    text = between(REPO / "docs" / language / "Full_Fine_Tuning.md", TABLES.FULL_MARKERS)
    rows = [line.strip("| ").split(" | ") for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0] == TABLES.FULL_WORDS[language]["head"]
    chinese = language == "zh"
    expected = [(run.title_zh if chinese else run.title, zh if chinese else en,
                 f"{PROFILES[name].memory_bytes // GIB} GB ({name})")
                for run in TABLES.FULL_RUNS for en, zh, _ in TABLES.FULL_SETUPS for name in TABLES.FULL_PROFILES]
    assert [tuple(row[:3]) for row in rows[1:]] == expected
    assert all(len(row) == 3 + len(TABLES.FULL_HOST_GIB) for row in rows[1:])
