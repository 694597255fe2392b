"""The reference's Wan2.2-Animate scripts (DiffSynth-Studio fed7b18, ``lora/`` and ``full/``) run as written on the
tiny original-layout repo through the trainer's ``main``, with a drawn Animate dataset at the path each names and only
the sizes, epochs and repeats made small. The LoRA trains the main blocks, renders samples from the Animate inputs,
loads fully into diffusers' ``WanAnimatePipeline`` and is what a split (cache, then train) run gives; the full
fine-tune of ``animate_adapter`` changes the Animate modules and nothing else.
"""

from __future__ import annotations

import functools
import json
import types
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from diffsynth.pipelines.wan_video.example_animate import build_animate_example_dataset
from diffsynth.lora import load_lora, read_lora
from diffsynth.pipelines.wan_video.pipeline import ModelConfig, WanVideoPipeline
from diffsynth.testing.tiny_wan_animate import (
    WAN_ANIMATE_DIFFUSERS_MODEL_ID,
    WAN_ANIMATE_MODEL_ID,
    tiny_wan_animate_transformer,
)
from diffsynth.training import entry as trainer
from tests.conftest import load_lora_into_diffusers, reset_accelerate_state

from .test_scripts import launch_commands, trainer_argv
from .test_wan_scripts import VIDEO, WAN, small
from .test_wan_vace_scripts import run_vace_script, trained_names

SIZES = {**VIDEO, "--num_frames": "9"}  # a 5-frame video after the character's latent slot
LORA = "lora/Wan2.2-Animate-14B.sh"
DATA = "data/diffsynth_example_dataset/wanvideo/Wan2.2-Animate-14B"
build = functools.partial(build_animate_example_dataset, num_videos=1, num_frames=9, size=(48, 32))
run = functools.partial(run_vace_script, sizes=SIZES, build=build)
ANIMATE_MODULES = ("pose_patch_embedding.", "motion_encoder.", "face_encoder.", "face_adapter.")


@pytest.fixture(scope="module")
def lora_run(tiny_root, tmp_path_factory):
    """The LoRA script, with samples from a prompt file naming the Animate inputs; its folder and result."""
    folder = tmp_path_factory.mktemp("animate_lora")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        build(DATA)
        entry = {"prompt": "a dancer", "input_image": "character.png", "animate_pose_video": "pose_000.mp4",
                 "animate_face_video": "face_000.mp4"}
        (folder / DATA / "prompts.json").write_text(json.dumps([entry]))
        Image.new("RGB", (48, 32), (200, 40, 40)).save(folder / DATA / "character.png")
        (result,) = run(LORA, {"--validation_prompts": f"{DATA}/prompts.json", "--validation_epochs": "1",
                               "--validation_num_inference_steps": "1"})
    return folder, result


def test_the_lora_script_trains_the_main_blocks_and_samples_from_the_animate_inputs(lora_run):
    folder, result = lora_run
    assert result["global_step"] == 1 and all(torch.isfinite(torch.tensor(result["losses"])))
    names = trained_names(result)
    assert names and all(name.startswith("pipe.dit.blocks.") and ".lora_" in name for name in names)
    lora = load_file(str(folder / "models/train/Wan2.2-Animate-14B_lora/epoch-0.safetensors"))
    assert any(".self_attn.q." in key for key in lora) and not any("face_adapter" in key for key in lora)
    samples = sorted((folder / "models/train/Wan2.2-Animate-14B_lora/samples").glob("*/*.mp4"))
    assert [path.name for path in samples] == ["00.mp4"]


def test_the_lora_loads_fully_into_diffusers_animate_pipeline_at_the_trained_strength(lora_run, tiny_root):
    from diffusers import WanAnimatePipeline
    from diffusers.pipelines.wan import pipeline_wan_animate
    from peft.utils import get_peft_model_state_dict

    from tests.pipelines.test_wan_animate import FRAMES, PATTERNS, inputs, render
    from tests.pipelines.test_wan_i2v import reference_schedule

    if not hasattr(pipeline_wan_animate, "ftfy"):  # its prompt cleaning calls ftfy unguarded; not installed here
        pipeline_wan_animate.ftfy = types.SimpleNamespace(fix_text=lambda text: text)
    lora = lora_run[0] / "models/train/Wan2.2-Animate-14B_lora/epoch-0.safetensors"
    layers = set(read_lora(lora).layers)
    theirs = WanAnimatePipeline.from_pretrained(str(tiny_root / WAN_ANIMATE_DIFFUSERS_MODEL_ID), dtype=torch.float32)
    theirs.set_progress_bar_config(disable=True)
    given = inputs()
    kwargs = dict(image=given["input_image"], pose_video=given["animate_pose_video"],
                  face_video=given["animate_face_video"], prompt="a dancer", negative_prompt="blurry", height=32,
                  width=48, segment_frame_length=FRAMES, num_inference_steps=1, output_type="pt",
                  max_sequence_length=16)
    before = theirs(**kwargs, generator=torch.Generator().manual_seed(7)).frames
    assert load_lora_into_diffusers(theirs, lora, "animate") == []  # no key left over, none missing
    loaded = get_peft_model_state_dict(theirs.transformer, adapter_name="animate")
    padded = {key for key in loaded if key.rsplit(".lora_", 1)[0] not in layers}
    assert {key.rsplit(".lora_", 1)[0] for key in loaded} >= layers and len(layers) == 2 * 10
    # diffusers gives a LoRA without the image projections zero ones for them (an image-to-video transformer)
    assert {key.split(".")[3] for key in padded} == {"add_k_proj", "add_v_proj"}
    assert not any(loaded[key].any() for key in padded if ".lora_B." in key)
    after = theirs(**kwargs, generator=torch.Generator().manual_seed(7)).frames
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        merged = WanVideoPipeline.from_pretrained(torch.float32, "cpu", [
            ModelConfig(model_id=WAN_ANIMATE_MODEL_ID, origin_file_pattern=pattern) for pattern in PATTERNS])
    assert load_lora(merged.dit, lora) == len(layers)
    with reference_schedule(merged, theirs):
        ours = render(merged, steps=1, **given)
    assert (ours - after).abs().max() < 1e-4  # diffusers at the default strength renders the merged LoRA
    assert (after - before).abs().max() > 1e-5  # and the LoRA changed something


class SeededRuns:
    """The LoRA script with a fixed ``--seed`` (the same draws in every run) in one folder, run with extra flags."""

    def __init__(self, folder: Path, tiny_root: Path) -> None:
        self.folder, self.tiny_root = folder, tiny_root
        (words,) = launch_commands((WAN / LORA).read_text())
        self.argv = [*small(trainer_argv(words)[1], SIZES), "--seed", "3"]
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(folder)
            build(DATA)

    def lora(self, name: str, *extra: str, argv: list[str] | None = None) -> dict[str, torch.Tensor]:
        """Runs with ``extra`` flags into ``<folder>/<name>``; returns the LoRA (None for a stage-1 run)."""
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(self.folder)
            patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(self.tiny_root))
            try:
                trainer.main(WanVideoPipeline, [*(argv or self.argv), *extra, "--output_path", name], video=True)
            finally:
                reset_accelerate_state()
        path = self.folder / name / "epoch-0.safetensors"
        return load_file(str(path)) if path.is_file() else None


@pytest.fixture(scope="module")
def seeded(tiny_root, tmp_path_factory):
    runs = SeededRuns(tmp_path_factory.mktemp("animate_seeded"), tiny_root)
    return runs, runs.lora("plain")


def assert_same_lora(lora: dict[str, torch.Tensor], plain: dict[str, torch.Tensor]) -> None:
    assert set(lora) == set(plain)
    assert max((lora[key] - plain[key]).abs().max().item() for key in lora) < 1e-5


def test_split_training_gives_the_one_stage_lora(seeded):
    runs, plain = seeded
    runs.lora("cache", "--task", "sft:data_process")
    argv = list(runs.argv)
    index = argv.index("--dataset_metadata_path")
    argv[index:index + 2] = []
    argv[argv.index("--dataset_base_path") + 1] = str(runs.folder / "cache")
    assert_same_lora(runs.lora("split", "--task", "sft:train", argv=argv), plain)


def test_block_swap_gives_the_plain_lora(seeded):
    """The face adapter runs between the swapped blocks. Model offload moves whole models, whatever their layers: the
    family kit's Wan runs and the Wan control variants' (``tests/pipelines/test_wan_control_training.py``) cover it."""
    runs, plain = seeded
    assert_same_lora(runs.lora("block_swap", "--blocks_to_swap", "1"), plain)


def test_the_full_script_trains_the_animate_modules_alone(workdir):
    (result,) = run("full/Wan2.2-Animate-14B.sh")
    assert result["global_step"] == 1 and all(torch.isfinite(torch.tensor(result["losses"])))
    names = trained_names(result)
    assert names and all(name.removeprefix("pipe.dit.").startswith(ANIMATE_MODULES) for name in names)
    weights = load_file(str(workdir / "models/train/Wan2.2-Animate-14B_full/epoch-0.safetensors"))
    assert weights and all(key.startswith(ANIMATE_MODULES) for key in weights)
    initial = tiny_wan_animate_transformer(0).state_dict()  # the tiny release's weights
    assert set(weights) == {key for key in initial if key.startswith(ANIMATE_MODULES)}
    assert max((weights[key] - initial[key]).abs().max().item() for key in weights) > 1e-6
