"""Every ``train.py`` answers a flag error before torch, diffusers or the pipeline are imported."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRAIN_SCRIPTS = sorted(REPO.glob("examples/*/model_training/train.py"))

# Runs a train.py as `python train.py ...` does, and says on exit which heavy libraries had been imported.
PROBE = """
import atexit, runpy, sys
atexit.register(lambda: print(sorted(m for m in ("torch", "diffusers", "transformers") if m in sys.modules)))
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_every_family_has_a_train_script():
    assert {path.parts[-3] for path in TRAIN_SCRIPTS} >= {"qwen_image", "wanvideo", "z_image", "flux", "flux2"}


@pytest.mark.parametrize("script", TRAIN_SCRIPTS, ids=lambda path: path.parts[-3])
def test_a_misspelled_flag_is_answered_without_importing_torch(script):
    result = subprocess.run([sys.executable, "-c", PROBE, str(script), "--lora_rnak", "4"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "--lora_rnak 4: unknown flag; did you mean --lora_rank?" in result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout


def test_a_bad_value_is_answered_without_importing_torch():
    script = REPO / "examples/qwen_image/model_training/train.py"
    result = subprocess.run([sys.executable, "-c", PROBE, str(script), "--learning_rate", "fast"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "--learning_rate" in result.stderr and "fast" in result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout
