"""The reference's Wan VACE scripts (DiffSynth-Studio fed7b18, ``lora/`` and ``full/``) run as written on the tiny
original-layout repos through the trainer's ``main``, with a drawn VACE dataset at the path each script names and only
the sizes, epochs and repeats made small. A LoRA on ``vace`` trains the VACE blocks alone and loads fully into
diffusers' ``WanVACEPipeline`` through its diffusers-named twin; a LoRA on ``dit`` trains the main blocks alone; a full
fine-tune of ``vace`` changes the VACE blocks and nothing else.
"""

from __future__ import annotations

import functools
import json
import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from diffsynth.pipelines.wan_video.example_vace import build_vace_example_dataset
from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
from diffsynth.testing.tiny_wan_vace import WAN_VACE_MODEL_ID
from diffsynth.training import entry as trainer
from diffsynth.training.config.parsers import build_parser
from tests.conftest import reset_accelerate_state

from .test_scripts import launch_commands, trainer_argv
from .test_wan_scripts import VIDEO, WAN, small

SIZES = {**VIDEO, "--num_frames": "5"}


def run_vace_script(relative: str, changes: dict[str, str] | None = None, sizes: dict[str, str] = SIZES,
                    build: Callable[[str], Path] = functools.partial(build_vace_example_dataset, num_videos=1,
                                                                     num_frames=6, size=(48, 32))) -> list[dict]:
    """Runs every launch command of a Wan control script in this process at ``sizes``, drawing its dataset with
    ``build`` (default: a VACE one) where it names one."""
    results = []
    for words in launch_commands((WAN / relative).read_text()):
        train_py, argv = trainer_argv(words)
        assert train_py == WAN / "train.py"
        changes = changes or {}
        argv = small(small(argv, sizes), changes)
        argv += [word for key, value in changes.items() if key not in argv for word in (key, value)]
        args = build_parser(video=True).parse_args(argv)
        if args.dataset_metadata_path and not Path(args.dataset_metadata_path).is_file():
            build(args.dataset_base_path)
        try:
            results.append(trainer.main(WanVideoPipeline, argv, video=True))
        finally:
            reset_accelerate_state()
    return results


def trained_names(result: dict) -> set[str]:
    return {name for name, param in result["module"].named_parameters() if param.requires_grad}


# Wan2.1-VACE-1.3B's own run is the diffusers test's below.
@pytest.mark.parametrize("script", ["Wan2.1-VACE-1.3B-Preview", "Wan2.1-VACE-14B"])
def test_vace_lora_scripts_train_the_vace_blocks(workdir, script):
    (result,) = run_vace_script(f"lora/{script}.sh")
    assert result["global_step"] == 1 and all(torch.isfinite(torch.tensor(result["losses"])))
    names = trained_names(result)
    assert names and all(name.startswith("pipe.dit.vace_blocks.") and ".lora_" in name for name in names)
    lora = load_file(str(workdir / f"models/train/{script}_lora/epoch-0.safetensors"))
    assert lora and all(".vace_blocks." in f".{key}" for key in lora)
    assert any(".self_attn.q." in key for key in lora) and not any(".attn1." in key for key in lora)


def test_vace_lora_loads_fully_into_diffusers_vace_pipeline(workdir, tiny_root):
    from diffusers import WanVACEPipeline
    from diffusers.pipelines.wan import pipeline_wan_vace
    from peft.utils import get_peft_model_state_dict

    if not hasattr(pipeline_wan_vace, "ftfy"):  # its prompt cleaning calls ftfy unguarded; not installed here
        pipeline_wan_vace.ftfy = types.SimpleNamespace(fix_text=lambda text: text)
    (result,) = run_vace_script("lora/Wan2.1-VACE-1.3B.sh", {"--learning_rate": "1e-2"})
    assert result["global_step"] == 1 and all(torch.isfinite(torch.tensor(result["losses"])))
    folder = workdir / "models/train/Wan2.1-VACE-1.3B_lora"
    twin = folder / "epoch-0.diffusers.safetensors"
    original = load_file(str(folder / "epoch-0.safetensors"))
    assert twin.is_file() and all(key.startswith("diffusion_model.vace_blocks.") for key in original)
    pipe = WanVACEPipeline.from_pretrained(str(tiny_root / WAN_VACE_MODEL_ID), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    kwargs = dict(prompt="a red cat", height=32, width=48, num_frames=5, num_inference_steps=2, output_type="pt",
                  guidance_scale=1.0, max_sequence_length=16)
    before = pipe(**kwargs, generator=torch.Generator().manual_seed(0)).frames
    pipe.load_lora_weights(str(twin))
    (adapter,) = pipe.get_list_adapters()["transformer"]
    loaded = get_peft_model_state_dict(pipe.transformer, adapter_name=adapter)
    trained = {name.removeprefix("pipe.dit.").replace(".default", "") for name in trained_names(result)}
    assert set(loaded) == trained and len(loaded) == 2 * 2 * 10  # A and B of 10 layers in each of 2 VACE blocks
    after = pipe(**kwargs, generator=torch.Generator().manual_seed(0)).frames
    assert (after - before).abs().max() > 1e-5


def test_a_lora_on_dit_leaves_the_vace_blocks_out_and_samples_take_the_control_inputs(workdir):
    folder = workdir / "data/diffsynth_example_dataset/wanvideo/Wan2.1-VACE-1.3B"
    build_vace_example_dataset(folder, num_videos=1, num_frames=6, size=(48, 32), mask=True)
    entry = {"prompt": "a ring", "vace_video": "vace_000.mp4", "vace_video_mask": "mask_000.mp4",
             "vace_reference_image": ["reference_000.png"]}
    (folder / "prompts.json").write_text(json.dumps([entry, {"prompt": "no control"}]))
    (result,) = run_vace_script("lora/Wan2.1-VACE-1.3B.sh", {
        "--lora_base_model": "dit", "--remove_prefix_in_ckpt": "pipe.dit.",
        "--validation_prompts": str(folder / "prompts.json"), "--validation_epochs": "1",
        "--validation_num_inference_steps": "1"})
    names = trained_names(result)
    assert names and all(name.startswith("pipe.dit.blocks.") for name in names)
    samples = sorted((workdir / "models/train/Wan2.1-VACE-1.3B_lora/samples").glob("*/*.mp4"))
    assert [path.name for path in samples] == ["00.mp4", "01.mp4"]


def test_wan22_vace_fun_trains_each_expert(workdir):
    high, low = run_vace_script("lora/Wan2.2-VACE-Fun-A14B.sh")
    for result, folder in ((high, "high_noise_model"), (low, "low_noise_model")):
        assert result["module"].pipe.model_configs["dit"].origin_file_pattern.startswith(folder)
        assert result["global_step"] == 1 and all(torch.isfinite(torch.tensor(result["losses"])))


@pytest.mark.parametrize("script", ["Wan2.1-VACE-1.3B", "Wan2.1-VACE-1.3B-Preview", "Wan2.1-VACE-14B",
                                    "Wan2.2-VACE-Fun-A14B"])
def test_vace_full_scripts_train_the_vace_blocks_alone(workdir, script):
    results = run_vace_script(f"full/{script}.sh")
    for result in results:
        assert result["global_step"] == 1 and all(torch.isfinite(torch.tensor(result["losses"])))
        names = trained_names(result)
        assert names and all(name.startswith(("pipe.dit.vace_blocks.", "pipe.dit.vace_patch_embedding."))
                             for name in names)
    outputs = sorted((workdir / "models/train").glob("*_full/epoch-0.safetensors"))
    assert len(outputs) == len(results)
    weights = load_file(str(outputs[0]))
    assert weights and all(key.startswith(("vace_blocks.", "vace_patch_embedding.")) for key in weights)
