"""The README read as a newcomer reads it: two commands on a fresh machine, and a training section that works when
followed from the top (the dataset command first, then training commands the trainer accepts; what they do without
the models and without a network is checked in ``tests/training/test_trainer_downloads.py``)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from diffsynth.training.config import RunConfig
from diffsynth.training.config.parsers import build_parser
from tests.examples.test_scripts import launch_commands, trainer_argv

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"


def section(title: str) -> str:
    """The text of the README's ``## title`` section."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def code_blocks(text: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)]


def training_commands() -> tuple[list[str], list[list[str]]]:
    """The training section's dataset command, and the trainer arguments of each training command, in order."""
    blocks = code_blocks(section("Training"))
    return shlex.split(blocks[0]), [trainer_argv(words)[1] for block in blocks[1:] for words in launch_commands(block)]


def test_a_fresh_machine_needs_two_commands():
    assert code_blocks(section("On a fresh machine")) == ["make demo", "make test"]


def test_the_training_section_makes_the_dataset_first_and_its_commands_are_valid(tmp_path):
    dataset, trainings = training_commands()
    assert dataset[:3] == ["python", "-m", "diffsynth.core.data.example_dataset"]
    subprocess.run([sys.executable, *dataset[1:]], cwd=tmp_path, check=True, capture_output=True, timeout=120)
    first = trainings[0]
    metadata = tmp_path / first[first.index("--dataset_metadata_path") + 1]
    assert metadata.is_file() and metadata.read_text().startswith("image,prompt")
    # The plain command, then the same one with model CPU offload, then with a memory budget for the planner.
    assert trainings[1:] == [[*first, "--enable_model_cpu_offload"], [*first, "--vram_budget", "auto"]]
    for argv in trainings:
        RunConfig.from_namespace(build_parser().parse_args(argv))
