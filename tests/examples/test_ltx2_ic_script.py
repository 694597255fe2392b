"""The reference's LTX-2 IC-LoRA script runs as written on the tiny ``Lightricks/LTX-2`` repo (sizes, frames, epochs
and repeats made small), through the trainer's ``main``: stage 1 caches the reference videos' latents, stage 2 trains
an LTX-2-named LoRA that loads fully into diffusers' ``LTX2InContextPipeline``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from diffsynth.core.data.cache import list_cache_files, load_cache_sample
from diffsynth.core.data.example_dataset import build_example_video_dataset
from diffsynth.pipelines.ltx2 import LTX2AudioVideoPipeline
from diffsynth.training.config.parsers import build_parser
from tests.examples.helpers import lora_update, run_command, script_commands
from tests.examples.test_ltx2_scripts import CHANGES, LTX2
from tests.training.test_trainer_ltx2_in_context import write_rows

pytestmark = pytest.mark.slow  # trainer runs on the tiny repo


def draw_references(argv: list[str]) -> None:
    """Two clips with sound at the folder the raw-data command names, each the other's reference, and the JSON
    metadata at the path it names."""
    args = build_parser(video=True).parse_args(argv)
    if args.task.endswith(":train"):
        return
    folder = Path(args.dataset_base_path)
    build_example_video_dataset(folder, num_videos=2, num_frames=6, audio=True)
    write_rows(folder, Path(args.dataset_metadata_path))


def test_the_ic_lora_script_caches_the_references_and_its_lora_loads_in_diffusers(workdir, model_root):
    stage_one, stage_two = (run_command(LTX2AudioVideoPipeline, argv, draw_references, video=True)
                            for config, argv in script_commands(LTX2, "lora/LTX-2-T2AV-IC-LoRA-splited.sh", CHANGES))
    assert stage_one["cached"] == 2 and stage_two["global_step"] == 2
    for path in list_cache_files(workdir / "models/train/LTX2-T2AV-IC-LoRA-splited-cache"):
        assert load_cache_sample(path)["shared"]["in_context_latents"].shape == (1, 3 * 8 * 8, 8)
    path = workdir / "models/train/LTX2-T2AV-IC-LoRA/epoch-0.safetensors"
    assert lora_update(path) > 0 and all(key.startswith("diffusion_model.") for key in load_file(str(path)))
    from diffusers import LTX2InContextPipeline

    from tests.conftest import load_lora_into_diffusers

    pipe = LTX2InContextPipeline.from_pretrained(str(model_root / "Lightricks/LTX-2"), dtype=torch.float32)
    assert load_lora_into_diffusers(pipe, path, "ic") == []
