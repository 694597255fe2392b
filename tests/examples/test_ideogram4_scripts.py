"""The reference's Ideogram 4 training commands (DiffSynth-Studio fed7b18, ``examples/ideogram4/model_training``: LoRA
on the bf16 repackage, fp8 and NF4 releases, full on the bf16 repackage) parse as written and stop with one line
naming the release before anything loads: no reader takes Ideogram's own layout yet. The trainer itself runs on a
diffusers-layout folder (the family kit)."""

from __future__ import annotations

import pytest

from diffsynth.pipelines.ideogram4.pipeline import Ideogram4Pipeline
from tests.examples.helpers import script_commands
from tests.pipelines.family_helpers import refused_before_loading

from .test_scripts import REPO

IDEOGRAM4 = REPO / "examples" / "ideogram4" / "model_training"


@pytest.mark.parametrize("script, release", [
    ("lora/Ideogram-4-bf16-repackage.sh", "bf16 repackage"), ("lora/Ideogram-4-fp8.sh", "fp8"),
    ("lora/Ideogram-4-nf4.sh", "NF4"), ("full/Ideogram-4-bf16-repackage.sh", "bf16 repackage"),
])
def test_the_reference_commands_are_refused_by_name(script, release, workdir, capsys):
    [(config, argv)] = script_commands(IDEOGRAM4, script)
    assert (config is not None) == script.startswith("full/")
    line = refused_before_loading(Ideogram4Pipeline, argv, workdir, capsys)
    assert f"Ideogram 4's {release} release" in line and "no reader here takes yet" in line, line
