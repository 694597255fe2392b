"""The reference's Wan full fine-tunes (DiffSynth-Studio fed7b18, ``examples/wanvideo/model_training/full``) run as
written on the tiny original-layout repos through the trainer's ``main``, and the ones for releases not supported
here stop with one line naming the release before any model loads.

Each ``accelerate launch`` command runs in this process from a scratch working folder with only what a user on a
small machine would change: the dataset (drawn at the path the script names), sizes, epochs and repeats, and
``DIFFSYNTH_MODEL_BASE_PATH`` pointing at the tiny repos (plus the releases that share a tiny repo's layout, such as
the 14B text-to-video, 720P and Fun InP ones, under their own ids: see ``model_root``). The DeepSpeed configs the scripts
name (8 GPUs: ZeRO-2 with the optimizer on the CPU, ZeRO-3) are checked with accelerate's own config reader.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import torch
from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
from tests.examples.helpers import assert_deepspeed_config, linked_model_root
from tests.examples.test_wan_image_scripts import WAN_ALIASES
from tests.pipelines.family_helpers import refused_before_loading

from .test_qwen_full_scripts import changed_weights, checkpoint_weights, transformer_weights
from .test_scripts import launch_commands, trainer_argv
from .test_wan_scripts import TI2V_VIDEO, VIDEO, WAN, run_script

FULL = WAN / "full"
# Script -> (the accelerate config it names or None, the folder of each command's transformer in the tiny repos).
RELEASES = {
    "Wan2.1-T2V-1.3B": (None, ["Wan-AI/Wan2.1-T2V-1.3B"]),
    "Wan2.1-T2V-14B": ("accelerate_config_14B.yaml", ["Wan-AI/Wan2.1-T2V-14B"]),
    "Wan2.1-I2V-14B-480P": ("accelerate_config_14B.yaml", ["Wan-AI/Wan2.1-I2V-14B-480P"]),
    "Wan2.1-I2V-14B-720P": ("accelerate_config_14B.yaml", ["Wan-AI/Wan2.1-I2V-14B-720P"]),
    "Wan2.2-T2V-A14B": ("accelerate_config_14B.yaml", ["Wan-AI/Wan2.2-T2V-A14B/high_noise_model",
                                                       "Wan-AI/Wan2.2-T2V-A14B/low_noise_model"]),
    "Wan2.2-I2V-A14B": ("accelerate_config_14B.yaml", ["Wan-AI/Wan2.2-I2V-A14B/high_noise_model",
                                                       "Wan-AI/Wan2.2-I2V-A14B/low_noise_model"]),
    "Wan2.2-TI2V-5B": (None, ["Wan-AI/Wan2.2-TI2V-5B"]),
    "Wan2.1-FLF2V-14B-720P": ("accelerate_config_14B.yaml", ["Wan-AI/Wan2.1-FLF2V-14B-720P"]),
    "Wan2.1-Fun-1.3B-InP": (None, ["PAI/Wan2.1-Fun-1.3B-InP"]),
    "Wan2.1-Fun-14B-InP": ("accelerate_config_14B.yaml", ["PAI/Wan2.1-Fun-14B-InP"]),
    "Wan2.2-Fun-A14B-InP": ("accelerate_config_14B.yaml", ["PAI/Wan2.2-Fun-A14B-InP/high_noise_model",
                                                           "PAI/Wan2.2-Fun-A14B-InP/low_noise_model"]),
}
CONFIGS = {"accelerate_config_14B.yaml": (2, "cpu"), "accelerate_config_zero3.yaml": (3, "none")}


@pytest.fixture(scope="module")
def model_root(tiny_root, tmp_path_factory) -> Path:
    """The tiny repos, plus the releases that share a tiny repo's layout under their own ids (``WAN_ALIASES``)."""
    return linked_model_root(tiny_root, tmp_path_factory.mktemp("wan_full_model_root"), WAN_ALIASES)


def test_the_reference_scripts_and_configs_exist():
    names = {path.name for path in FULL.iterdir()}
    assert {*(f"{name}.sh" for name in RELEASES), *CONFIGS} <= names


@pytest.mark.parametrize("release", list(RELEASES))
def test_script_trains_every_weight_of_the_transformer(workdir, model_root, release):
    config, transformers = RELEASES[release]
    launches = launch_commands((FULL / f"{release}.sh").read_text())
    assert len(launches) == len(transformers)
    for words in launches:
        assert (f"examples/wanvideo/model_training/full/{config}" if config else None) == (
            words[words.index("--config_file") + 1] if "--config_file" in words else None), shlex.join(words)
    results = run_script(f"full/{release}.sh", TI2V_VIDEO if "TI2V" in release else VIDEO)
    for words, result, transformer in zip(launches, results, transformers):
        assert result["global_step"] == 2 and all(torch.isfinite(torch.tensor(result["losses"])))
        dit = result["module"].pipe.model_configs["dit"]
        assert str(Path(dit.model_id, dit.origin_file_pattern).parent) == transformer  # the expert the command names
        _, argv = trainer_argv(words)
        saved = checkpoint_weights(workdir / argv[argv.index("--output_path") + 1] / "epoch-0")
        # the release's original names, as diffusers' own single-file loader renames them (FLF2V's image positions,
        # which it leaves out, as its conversion script names them)
        released = convert_wan_transformer_to_diffusers(transformer_weights(model_root / transformer))
        if "img_emb.emb_pos" in released:
            released["condition_embedder.image_embedder.pos_embed"] = released.pop("img_emb.emb_pos")
        unchanged = set(saved) - set(changed_weights(saved, released))
        # Every weight moved but the RMSNorm scales: stored in bf16 at 1.0, where a 1e-5 step is below the resolution.
        assert len(unchanged) < len(saved) / 4 and all(torch.all(released[key] == 1) for key in unchanged), unchanged


@pytest.mark.parametrize(("name", "stage_and_offload"), list(CONFIGS.items()))
def test_the_deepspeed_configs_are_accepted_by_accelerate(name, stage_and_offload):
    assert_deepspeed_config(FULL / name, *stage_and_offload)


def wan_files(repo: str, clip: bool = False, dit: str = "diffusion_pytorch_model*.safetensors") -> str:
    """A reference Wan command's --model_id_with_origin_paths for one release's original files."""
    files = [dit, "models_t5_umt5-xxl-enc-bf16.pth", "Wan2.1_VAE.pth"]
    files += ["models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth"] if clip else []
    return ",".join(f"{repo}:{name}" for name in files)


T2V_14B_ENCODERS = "Wan-AI/Wan2.1-T2V-14B:models_t5_umt5-xxl-enc-bf16.pth,Wan-AI/Wan2.1-T2V-14B:Wan2.1_VAE.pth"
DATA = ["--dataset_base_path", "data/d", "--dataset_metadata_path", "data/d/metadata.csv", "--height", "480",
        "--width", "832"]


def refused(models: str, *flags: str) -> list[str]:
    return [*DATA, "--model_id_with_origin_paths", models, *flags]




DANCER = ("wantodance_music_path,wantodance_reference_image,wantodance_fps,wantodance_keyframes,"
          "wantodance_keyframes_mask")
# The distinguishing flags of the reference's full/ Wan scripts for releases not supported here (each script's first
# command; the Wan2.2 experts' second commands differ only in low_noise_model/), and what the refusal line names.
# The Fun Control and Control-Camera scripts run: tests/examples/test_wan_fun_scripts.py.
REFUSED = {
    "LongCat-Video": (refused(f"meituan-longcat/LongCat-Video:dit/diffusion_pytorch_model*.safetensors,"
                              f"{T2V_14B_ENCODERS}", "--trainable_models", "dit"), "LongCat-Video"),
    "Video-As-Prompt-Wan2.1-14B": (
        refused("ByteDance/Video-As-Prompt-Wan2.1-14B:transformer/diffusion_pytorch_model*.safetensors,"
                + wan_files("Wan-AI/Wan2.1-I2V-14B-720P", clip=True).split(",", 1)[1], "--trainable_models", "vap",
                "--extra_inputs", "vap_video,input_image"), "Video-As-Prompt"),
    "Wan-Dancer-14B-global": (refused(wan_files("Wan-AI/Wan-Dancer-14B", True, "global_model.safetensors"),
                                      "--trainable_models", "dit", "--extra_inputs", f"{DANCER},framewise_decoding",
                                      "--framewise_decoding"), "Wan-Dancer"),
    "Wan-Dancer-14B-local": (refused(wan_files("Wan-AI/Wan-Dancer-14B", True, "local_model.safetensors"),
                                     "--trainable_models", "dit", "--extra_inputs", DANCER), "Wan-Dancer"),
    "Wan2.1-1.3b-speedcontrol-v1": (
        refused(wan_files("Wan-AI/Wan2.1-T2V-1.3B") + ",DiffSynth-Studio/Wan2.1-1.3b-speedcontrol-v1:model.safetensors",
                "--trainable_models", "motion_controller", "--extra_inputs", "motion_bucket_id"), "speed-control"),
    "Wan2.2-S2V-14B": (refused("Wan-AI/Wan2.2-S2V-14B:diffusion_pytorch_model*.safetensors,Wan-AI/Wan2.2-S2V-14B:"
                               "wav2vec2-large-xlsr-53-english/model.safetensors,"
                               + wan_files("Wan-AI/Wan2.2-S2V-14B").split(",", 1)[1], "--audio_processor_path",
                               "Wan-AI/Wan2.2-S2V-14B:wav2vec2-large-xlsr-53-english/", "--trainable_models", "dit",
                               "--extra_inputs", "input_image,input_audio,s2v_pose_video"), "Wan2.2-S2V"),
    "krea-realtime-video": (refused(f"krea/krea-realtime-video:krea-realtime-video-14b.safetensors,{T2V_14B_ENCODERS}",
                                    "--trainable_models", "dit"), "krea-realtime-video"),
}


@pytest.mark.parametrize("script", list(REFUSED))
def test_unsupported_scripts_stop_with_one_line_before_loading(workdir, script, capsys):
    argv, reason = REFUSED[script]
    assert reason in refused_before_loading(WanVideoPipeline, argv, workdir, capsys, video=True)
