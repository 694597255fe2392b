"""The reference's Wan2.2-Animate-2 scripts (DiffSynth-Studio fed7b18, ``lora/`` and ``full/``, base and Distilled)
run as written on the tiny release through the trainer's ``main``: stage 1 (``--task sft:data_process``) caches with
the T5, CLIP and Wan2.1 VAE files, stage 2 trains the release's single-file transformer on that cache. Only the sizes,
epochs and repeats are made small, the dataset is drawn at the path each names. The LoRA trains ``self_attn.q,k,v``
through both passes and loads fully into diffusers' transformer by ``load_lora_adapter``; the full fine-tune trains the
listed ``dit.blocks.N.block.self_attn.*`` layers and nothing else. A one-stage run renders samples from a prompt file
naming the Animate-2 inputs, and block swap and model offload train the same LoRA.
"""

from __future__ import annotations

import functools
import json
import re

import pytest
import torch
from safetensors.torch import load_file

from diffsynth.pipelines.wan_video.example_animate import build_animate2_example_dataset
from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
from diffsynth.testing.tiny_wan_animate2 import tiny_wan_animate2_transformer
from diffsynth.training import entry as trainer
from tests.conftest import reset_accelerate_state
from tests.examples.helpers import linked_model_root
from tests.examples.test_wan_image_scripts import WAN_ALIASES

from .test_scripts import launch_commands, trainer_argv
from .test_wan_scripts import VIDEO, WAN, small
from .test_wan_vace_scripts import run_vace_script, trained_names

build = functools.partial(build_animate2_example_dataset, num_videos=1, num_frames=5, size=(48, 32))
run = functools.partial(run_vace_script, sizes={**VIDEO, "--num_frames": "5"}, build=build)
SELF_ATTENTION = re.compile(r"blocks\.\d+\.self_attn\.to_[qkv]\.")


@pytest.fixture(scope="module")
def model_root(tiny_root, tmp_path_factory):
    """The tiny repos, with the Wan2.1 VAE the scripts take from Wan-AI/Wan2.1-T2V-14B."""
    return linked_model_root(tiny_root, tmp_path_factory.mktemp("wan_animate2_model_root"), WAN_ALIASES)


@pytest.mark.parametrize("variant", ["", "-Distilled"])
def test_the_lora_scripts_train_both_passes_and_load_into_diffusers(workdir, variant):
    from peft.utils import get_peft_model_state_dict

    _, result = run(f"lora/Wan2.2-Animate-2-14B{variant}.sh")
    assert result["global_step"] == 1 and all(torch.isfinite(torch.tensor(result["losses"])))
    names = trained_names(result)
    assert names and all(SELF_ATTENTION.search(name) and ".lora_" in name for name in names)
    folder = workdir / f"models/train/Wan2.2-Animate-2-14B{variant}_lora"
    lora = load_file(str(folder / "epoch-0.safetensors"))
    # the release's names, under the universal layout's prefix
    assert lora and all(re.match(r"diffusion_model\.blocks\.\d+\.block\.self_attn\.[qkv]\.", key) for key in lora)
    twin = load_file(str(folder / "epoch-0.diffusers.safetensors"))
    transformer = tiny_wan_animate2_transformer(int(bool(variant)))
    transformer.load_lora_adapter(twin, adapter_name="trained")
    loaded = get_peft_model_state_dict(transformer, adapter_name="trained")
    assert set(loaded) == {key.removeprefix("transformer.") for key in twin}  # every layer, none left over
    assert all(torch.equal(loaded[key.removeprefix("transformer.")], twin[key]) for key in twin)


@pytest.mark.parametrize("variant", ["", "-Distilled"])
def test_the_full_scripts_train_the_listed_self_attention_layers(workdir, variant):
    # The script lists the 40 blocks of the release; the tiny one has two (sizes aside, as written).
    listed = ",".join(f"dit.blocks.{block}.block.self_attn.{name}" for block in range(2) for name in "qkv")
    _, result = run(f"full/Wan2.2-Animate-2-14B{variant}.sh", {"--trainable_models": listed})
    assert result["global_step"] == 1 and all(torch.isfinite(torch.tensor(result["losses"])))
    names = trained_names(result)
    assert names and all(SELF_ATTENTION.search(name) for name in names)
    weights = load_file(str(workdir / f"models/train/Wan2.2-Animate-2-14B{variant}_full/epoch-0.safetensors"))
    initial = tiny_wan_animate2_transformer(int(bool(variant))).state_dict()
    assert set(weights) == {key for key in initial if SELF_ATTENTION.match(key)}
    assert max((weights[key] - initial[key]).abs().max().item() for key in weights) > 1e-6


def test_one_stage_training_renders_samples_and_block_swap_and_offload_give_the_plain_lora(workdir):
    """The scripts' first command with the transformer added and the task one-stage: the prompt file's samples need
    the encoders, which the split's second stage does not load. Swapping a block (its K/V cache handed over by
    keyword) or offloading the models trains the same LoRA."""
    (words, _) = launch_commands((WAN / "lora/Wan2.2-Animate-2-14B.sh").read_text())
    argv = small(trainer_argv(words)[1], {**VIDEO, "--num_frames": "5", "--task": "sft", "--learning_rate": "1e-2"})
    index = argv.index("--model_id_with_origin_paths") + 1
    argv[index] += ",Wan-AI/Wan2.2-Animate-2-14B:wan_animate_2/wan_animate_2_bf16.safetensors"
    data = argv[argv.index("--dataset_base_path") + 1]
    build(data)
    entry = {"prompt": "a dancer", "animate2_reference_image": "character_000.png",
             "animate2_reference_video": "driving_000.mp4", "animate2_prompt_ref": "a person"}
    (workdir / data / "prompts.json").write_text(json.dumps([entry]))
    argv += ["--seed", "3"]
    samples = ["--validation_prompts", f"{data}/prompts.json", "--validation_epochs", "1",
               "--validation_num_inference_steps", "1"]
    loras = []
    for name, extra in (("plain", samples), ("swap", ["--blocks_to_swap", "1"]),
                        ("offload", ["--enable_model_cpu_offload"])):
        try:
            result = trainer.main(WanVideoPipeline, [*argv, *extra, "--output_path", name], video=True)
        finally:
            reset_accelerate_state()
        assert result["global_step"] == 1
        loras.append(load_file(str(workdir / name / "epoch-0.safetensors")))
    assert [path.name for path in sorted((workdir / "plain/samples").glob("*/*.mp4"))] == ["00.mp4"]
    for other in loras[1:]:
        assert set(other) == set(loras[0])
        assert max((loras[0][key] - other[key]).abs().max().item() for key in loras[0]) < 1e-5
    assert max(loras[0][key].abs().max().item() for key in loras[0] if ".lora_B." in key) > 1e-3  # it trained
