"""Every ``train.py`` answers a flag error before torch, diffusers or the pipeline are imported."""

import os
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


# As PROBE, saying on exit whether bitsandbytes was kept out of the process.
BITSANDBYTES_PROBE = """
import atexit, runpy, sys
atexit.register(lambda: print("kept out:", sys.modules.get("bitsandbytes", 0) is None))
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
# Flags that fail in main(), once the pipeline's module is imported: no metadata file.
FAILING_IN_MAIN = ["--dataset_base_path", "unused", "--lora_base_model", "dit"]
NF4 = "Qwen/Qwen-Image:transformer/diffusion_pytorch_model*.safetensors:bitsandbytes_nf4"


def probe_bitsandbytes(script, flags, cwd=REPO):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", BITSANDBYTES_PROBE, str(script), *FAILING_IN_MAIN, *flags],
                            cwd=cwd, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2 and "--dataset_metadata_path is unset" in result.stderr, result.stderr
    return result.stdout.strip().splitlines()[-1] == "kept out: True"


@pytest.mark.parametrize(("flags", "kept_out"), [
    ([], True),
    (["--customized_optimizer", "bitsandbytes.optim.AdamW8bit"], False),
    (["--quant_options", NF4], False),
], ids=["no-8-or-4-bit-feature", "8-bit-optimizer", "nf4-weights"])
def test_bitsandbytes_is_kept_out_of_a_run_whose_flags_use_none_of_it(flags, kept_out):
    assert probe_bitsandbytes(REPO / "examples/qwen_image/model_training/train.py", flags) is kept_out


@pytest.mark.skipif(__import__("importlib").util.find_spec("bitsandbytes") is None,
                    reason="bitsandbytes is not installed")
def test_a_users_own_pipeline_module_may_import_bitsandbytes(tmp_path):
    (tmp_path / "user_pipeline.py").write_text(
        "import bitsandbytes\nfrom diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline as UserPipeline\n")
    (tmp_path / "train.py").write_text("from diffsynth.training import cli\ncli('user_pipeline:UserPipeline')\n")
    assert not probe_bitsandbytes(tmp_path / "train.py", [], cwd=tmp_path)  # imported, and past it to main()


def test_the_flags_are_parsed_once(monkeypatch, capsys):
    # The command line parses them before torch is imported; the entry builds its config from that parse.
    from diffsynth.training import command_line
    from diffsynth.training.config import parsers

    parsed, parse_namespace = [], parsers.parse_namespace
    monkeypatch.setattr(parsers, "parse_namespace",
                        lambda parser, argv=None: (parsed.append(list(argv)), parse_namespace(parser, argv))[1])
    with pytest.raises(SystemExit) as exited:
        command_line.cli("diffsynth.pipelines.qwen_image.pipeline:QwenImagePipeline", FAILING_IN_MAIN)
    assert exited.value.code == 2 and "--dataset_metadata_path is unset" in capsys.readouterr().err
    assert parsed == [FAILING_IN_MAIN]
