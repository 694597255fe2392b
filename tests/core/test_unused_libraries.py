"""Keeping bitsandbytes out of a process: the real libraries take it as not installed and still work, a process
that has imported them is left alone, and the LoRA command inspects a file without it."""

import subprocess
import sys

import pytest
from peft import LoraConfig, inject_adapter_in_model

from diffsynth.core.unused_libraries import keep_out
from diffsynth.lora.base_layers import BaseLayers
from diffsynth.training.outputs.logger import ModelLogger
from tests.core.offload_training.test_diffusers_models import tiny_qwen_image
from tests.lora.test_tools import RANK

pytestmark = pytest.mark.skipif(__import__("importlib").util.find_spec("bitsandbytes") is None,
                                reason="bitsandbytes is not installed: there is nothing to keep out")

KEPT_OUT = "sys.modules.get('bitsandbytes', 0) is None"


def run_python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})


def test_kept_out_the_libraries_find_it_not_installed_and_still_build_and_adapt_models():
    done = run_python(
        "import sys\n"
        "from diffsynth.core.unused_libraries import keep_out\n"
        "assert keep_out('bitsandbytes')\n"
        "import diffusers, peft.import_utils\n"
        "from peft import LoraConfig, inject_adapter_in_model\n"
        "from diffusers import QwenImageTransformer2DModel\n"
        "model = QwenImageTransformer2DModel(num_layers=1, attention_head_dim=8, num_attention_heads=2,\n"
        "    joint_attention_dim=16, in_channels=16, out_channels=4, axes_dims_rope=(2, 2, 4))\n"
        "inject_adapter_in_model(LoraConfig(r=2, target_modules=['to_q']), model)\n"
        "print('adapted', sum('lora_A' in name for name, _ in model.named_parameters()))\n"
        "print('seen', diffusers.utils.is_bitsandbytes_available(), peft.import_utils.is_bnb_available())\n"
        f"print('kept out', {KEPT_OUT})\n")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:3] == ["adapted 1", "seen False False", "kept out True"]


def test_a_process_that_has_imported_the_libraries_is_left_alone():
    import diffusers  # noqa: F401  (the libraries have looked already)

    assert not keep_out("a_library_no_one_installed")
    assert "a_library_no_one_installed" not in sys.modules


def test_the_lora_command_inspects_a_trained_file_without_bitsandbytes(tmp_path):
    base, targets, _ = tiny_qwen_image()
    model = inject_adapter_in_model(LoraConfig(r=RANK, lora_alpha=RANK, target_modules=targets), base)
    state = {"pipe.dit." + key: value for key, value in model.named_parameters() if ".lora_" in key}
    ModelLogger(tmp_path, "pipe.dit.", {"lora_rank": RANK, "base_model_class": type(base).__name__,
                                        "base_model_layers": BaseLayers.of(model)}).save_lora(state, "file")
    # As `python -m diffsynth.lora inspect FILE` runs: the module as __main__, reading the process's arguments.
    done = run_python(
        "import runpy, sys\n"
        "sys.argv = ['diffsynth.lora', 'inspect', sys.argv[1]]\n"
        "try:\n"
        "    runpy.run_module('diffsynth.lora', run_name='__main__', alter_sys=True)\n"
        "except SystemExit as end:\n"
        f"    print('exit', end.code, 'kept out', {KEPT_OUT})\n", str(tmp_path / "file.safetensors"))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {line.split()[0]: line.split()[1] for line in done.stdout.splitlines() if line[:1].isalpha()}
    layers = len(state) // 2  # an A and a B weight each
    assert rows["diffusers"] == rows["ComfyUI"] == f"{layers}/{layers}"  # diffusers' own key conversion ran
    assert done.stdout.rstrip().endswith("exit 0 kept out True")
