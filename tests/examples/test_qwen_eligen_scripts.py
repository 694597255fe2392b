"""The reference's Qwen-Image EliGen LoRA scripts (``lora/Qwen-Image-EliGen.sh``, ``lora/Qwen-Image-EliGen-Poster.sh``)
run as written on the tiny repos through the trainer's ``main``, on an entity-mask dataset drawn where they expect
it, sizes made small; their LoRA files load fully in diffusers' ``QwenImagePipeline``; and the two-stage split caches
the entity prompts' embeddings and masks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from diffsynth.core.data.example_eligen_dataset import build_example_eligen_dataset
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID
from diffsynth.training.config.errors import FlagError
from diffsynth.training.config.parsers import build_parser
from tests.conftest import load_lora_into_diffusers
from tests.examples.helpers import lora_update, run_command, script_commands, small
from tests.pipelines.family_helpers import load_theirs

from .test_scripts import REPO

QWEN = REPO / "examples" / "qwen_image" / "model_training"


def draw_dataset(argv: list[str]) -> None:
    """The entity-mask dataset where a raw-data command expects one."""
    args = build_parser().parse_args(argv)
    if not args.task.endswith(":train") and not Path(args.dataset_metadata_path).is_file():
        build_example_eligen_dataset(args.dataset_base_path)


def run(argv: list[str]) -> dict:
    return run_command(QwenImagePipeline, argv, draw_dataset)


def test_eligen_scripts_train_loras_that_load_fully_in_diffusers(workdir, tiny_root):
    from diffusers import QwenImagePipeline as DiffusersQwenImagePipeline

    [(_, eligen)] = script_commands(QWEN, "lora/Qwen-Image-EliGen.sh")
    result = run(eligen)
    assert result["global_step"] == 2 and all(torch.isfinite(torch.tensor(result["losses"])))
    first = workdir / "models/train/Qwen-Image-EliGen_lora/epoch-0.safetensors"
    assert lora_update(first) > 0
    # The poster script goes on from the released EliGen-V2 LoRA; the first script's file stands in for it.
    released = workdir / "models/DiffSynth-Studio/Qwen-Image-EliGen-V2/model.safetensors"
    released.parent.mkdir(parents=True)
    shutil.copy(first, released)
    [(_, poster)] = script_commands(QWEN, "lora/Qwen-Image-EliGen-Poster.sh")
    assert run(poster)["global_step"] == 2
    theirs = load_theirs(tiny_root, DiffusersQwenImagePipeline, QWEN_IMAGE_MODEL_ID)
    for path in (first, workdir / "models/train/Qwen-Image-EliGen-Poster_lora/epoch-0.safetensors"):
        try:
            assert load_lora_into_diffusers(theirs, path, "eligen") == []
            loaded = [name for name, _ in theirs.transformer.named_parameters() if "lora_A" in name]
            assert len(loaded) == 24  # 12 targets in each of 2 blocks
        finally:
            theirs.unload_lora_weights()


def test_split_training_caches_the_entity_inputs_and_samples_render_entities(workdir):
    [(_, eligen)] = script_commands(QWEN, "lora/Qwen-Image-EliGen.sh")
    cache = "./models/train/Qwen-Image-EliGen_cache"
    assert run([*small(eligen, {"--output_path": cache}), "--task", "sft:data_process"])["cached"] == 2
    dataset = json.loads((workdir / "data/diffsynth_example_dataset/qwen_image/Qwen-Image-EliGen/metadata.json")
                         .read_text())
    prompts = workdir / "data/diffsynth_example_dataset/qwen_image/Qwen-Image-EliGen/prompts.json"
    prompts.write_text(json.dumps([{key: dataset[0][key] for key in ("prompt", "eligen_entity_prompts",
                                                                      "eligen_entity_masks")}]))
    with safe_open(next(Path(cache).rglob("*.safetensors")), "pt") as cached:
        names = set(cached.keys())
    assert {"posi/entity_prompt_emb/0", "posi/entity_prompt_emb/1", "posi/entity_masks"} <= names
    stage_two = small(eligen, {"--dataset_base_path": cache, "--output_path": "./models/train/split"})
    stage_two = [word for index, word in enumerate(stage_two) if word != "--dataset_metadata_path"
                 and stage_two[index - 1] != "--dataset_metadata_path"]
    sampling = ["--validation_prompts", str(prompts), "--validation_epochs", "1", "--validation_num_inference_steps",
                "1"]
    assert run([*stage_two, "--task", "sft:train", *sampling])["global_step"] == 2
    assert len(list((workdir / "models/train/split/samples").rglob("*.png"))) == 1


def test_a_batch_of_several_samples_is_refused_before_loading(workdir):
    [(_, eligen)] = script_commands(QWEN, "lora/Qwen-Image-EliGen.sh")
    with pytest.raises(FlagError, match="--batch_size 2 with --extra_inputs eligen_entity_masks, eligen_entity_pro"):
        run([*eligen, "--batch_size", "2"])
    assert not (workdir / "models").exists()
