"""The reference's Ideogram 4 training commands (DiffSynth-Studio fed7b18, ``examples/ideogram4/model_training``) on
tiny repos in Ideogram's own layout: LoRA on the bf16 repackage, the fp8 release and the NF4 release (over its frozen
4-bit layers) and full on the bf16 repackage run as written (sizes aside), their LoRA files under Ideogram's own fused
names."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from safetensors.torch import load_file

from diffsynth.core.data.example_dataset import build_example_dataset
from diffsynth.lora import read_lora
from diffsynth.pipelines.ideogram4.naming import NAMING

from diffsynth.pipelines.ideogram4.pipeline import Ideogram4Pipeline
from tests.examples.helpers import lora_update, run_command, script_commands

from .test_scripts import REPO

IDEOGRAM4 = REPO / "examples" / "ideogram4" / "model_training"


def draw_json_dataset(argv: list[str]) -> None:
    """Two drawn images with the ``metadata.json`` (a list of rows) the scripts name."""
    folder = Path(argv[argv.index("--dataset_base_path") + 1])
    with build_example_dataset(folder, num_images=2).open() as table:
        rows = list(csv.DictReader(table))
    Path(argv[argv.index("--dataset_metadata_path") + 1]).write_text(json.dumps(rows))


@pytest.mark.parametrize("script, model_id", [
    ("lora/Ideogram-4-bf16-repackage.sh", "DiffSynth-Studio/ideogram-4-bf16-repackage"),
    ("lora/Ideogram-4-fp8.sh", "ideogram-ai/ideogram-4-fp8"),
    pytest.param("lora/Ideogram-4-nf4.sh", "ideogram-ai/ideogram-4-nf4", marks=pytest.mark.skipif(
        importlib.util.find_spec("bitsandbytes") is None, reason="the NF4 release needs bitsandbytes")),
])
def test_lora_scripts_train_every_named_module(script, model_id, workdir):
    [(config, argv)] = script_commands(IDEOGRAM4, script)
    assert config is None
    result = run_command(Ideogram4Pipeline, argv, draw_json_dataset)
    pipe = result["module"].pipe
    assert pipe.model_configs["dit"].model_id == model_id and type(pipe.dit).__name__ == "Ideogram4Transformer2DModel"
    if model_id.endswith("nf4"):  # the LoRA wraps the release's frozen 4-bit layers, text encoder's kept 4-bit too
        import bitsandbytes as bnb

        assert isinstance(pipe.dit.layers[0].attention.to_k.base_layer, bnb.nn.Linear4bit)
        assert isinstance(pipe.text_encoder.language_model.layers[0].mlp.up_proj, bnb.nn.Linear4bit)
    assert result["global_step"] == 2 and all(torch.isfinite(torch.tensor(result["losses"])))
    [path] = (workdir / "models/train").glob("*_lora/epoch-0.safetensors")
    assert lora_update(path) > 0
    # The file names Ideogram's fused layers, as DiffSynth-Studio's Ideogram4DiT has them; they read back as the
    # diffusers layers of the twin, with the same updates.
    keys = set(load_file(str(path)))
    assert "diffusion_model.layers.0.attention.qkv.lora_A.weight" in keys and not any("to_q" in key for key in keys)
    assert "diffusion_model.layers.0.attention.o.lora_B.weight" in keys
    fused, twin = (read_lora(file, naming=NAMING).layers for file in (path, path.with_suffix(".diffusers.safetensors")))
    assert fused.keys() == twin.keys() and "layers.0.attention.to_k" in fused
    assert max((fused[name].delta() - layer.delta()).abs().max().item() for name, layer in twin.items()) < 1e-6


def test_full_script_trains_the_transformer(workdir):
    [(config, argv)] = script_commands(IDEOGRAM4, "full/Ideogram-4-bf16-repackage.sh")
    assert config is not None
    result = run_command(Ideogram4Pipeline, argv, draw_json_dataset)
    assert all(torch.isfinite(torch.tensor(result["losses"])))
    assert (workdir / "models/train/Ideogram-4-bf16-repackage_full/epoch-0.safetensors").is_file()
