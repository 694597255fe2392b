"""The CLI trainer on the tiny Wan and a generated video dataset: two stages with offload, parity, diffusers load."""

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from diffsynth.core.data.example_dataset import build_example_video_dataset
from diffsynth.testing.tiny_models import WAN_MODEL_ID, WAN_PATTERNS
from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
from diffsynth.training.entry import main

PATTERN = {name: f"{WAN_MODEL_ID}:{WAN_PATTERNS[name]}" for name in ("dit", "text_encoder", "vae")}
COMMON = [
    "--model_id_with_origin_paths", ",".join(PATTERN.values()), "--lora_base_model", "dit",
    "--lora_target_modules", "q,k,v,o,ffn.0,ffn.2", "--lora_rank", "4", "--learning_rate", "1e-3",
    "--torch_dtype", "float32", "--seed", "5", "--max_pixels", "4096", "--num_frames", "5",
    "--use_gradient_checkpointing", "--num_epochs", "2", "--dataset_repeat", "2",
]  # fmt: skip


@pytest.fixture(autouse=True)
def in_process_runs(base, fresh_accelerate_state):
    """Every test here runs the trainer in-process on the tiny repos."""


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("videos")
    build_example_video_dataset(folder, num_videos=2, num_frames=6)
    return folder


def raw(folder):
    return ["--dataset_base_path", str(folder), "--dataset_metadata_path", str(folder / "metadata.csv")]


def train_wan(argv):
    return main(WanVideoPipeline, argv, video=True)


def test_two_stage_offloaded_training_equals_one_stage_and_loads_into_diffusers(videos, tmp_path, tiny_root):
    one = train_wan([*raw(videos), *COMMON, "--output_path", str(tmp_path / "one")])
    assert one["global_step"] == 8
    offload = ["--enable_model_cpu_offload"]
    stage_one = train_wan([*raw(videos), *COMMON, *offload, "--task", "sft:data_process", "--output_path",
                           str(tmp_path / "cache"), "--offload_models", PATTERN["dit"]])
    assert stage_one["cached"] == 2
    train_wan(["--dataset_base_path", str(tmp_path / "cache"), *COMMON, *offload, "--task", "sft:train",
               "--output_path", str(tmp_path / "two"), "--offload_models",
               f"{PATTERN['text_encoder']},{PATTERN['vae']}"])
    first, second = load_file(str(tmp_path / "one" / "epoch-1.safetensors")), load_file(
        str(tmp_path / "two" / "epoch-1.safetensors"))
    assert first.keys() == second.keys() and len(first) == 2 * 2 * 10
    assert max((first[k] - second[k]).abs().max().item() for k in first) < 1e-6
    assert max(first[k].abs().max().item() for k in first if "lora_B" in k) > 1e-4

    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(str(tiny_root / WAN_MODEL_ID), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)

    def generate():
        return pipe("a ball", height=32, width=32, num_frames=5, num_inference_steps=2, guidance_scale=1.0,
                    generator=torch.Generator().manual_seed(0), output_type="pt").frames

    before = generate()
    pipe.load_lora_weights(str(tmp_path / "two" / "epoch-1.safetensors"))
    loaded = [name for name, _ in pipe.transformer.named_parameters() if "lora_A" in name]
    assert len(loaded) == 2 * 10
    assert (generate() - before).abs().max() > 1e-5


def write_metadata(folder: Path, name: str) -> None:
    (folder / "metadata.csv").write_text(f"video,prompt\n{name},a clip\n")


def test_a_too_short_video_names_the_file_and_the_frames_needed(videos, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    clip = sorted(videos.glob("*.mp4"))[0]
    shutil.copy(clip, data / "short.mp4")
    write_metadata(data, "short.mp4")
    with pytest.raises(ValueError) as error:
        train_wan([*raw(data), *COMMON, "--num_frames", "81", "--output_path", str(tmp_path / "out")])
    message = str(error.value)
    assert "short.mp4" in message and "81" in message and "--num_frames" in message
    assert not (tmp_path / "out").exists()


def test_an_unreadable_video_is_named(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "broken.mp4").write_bytes(b"\x00not a video at all" * 10)
    write_metadata(data, "broken.mp4")
    with pytest.raises(ValueError, match="broken.mp4"):
        train_wan([*raw(data), *COMMON, "--output_path", str(tmp_path / "out")])


def test_h2d_block_swap_gives_the_plain_lora(videos, tmp_path):
    plain = train_wan([*raw(videos), *COMMON, "--output_path", str(tmp_path / "plain"), "--num_epochs", "1"])
    swapped = train_wan([*raw(videos), *COMMON, "--output_path", str(tmp_path / "swap"), "--num_epochs", "1",
                         "--blocks_to_swap", "2", "--block_swap_h2d_only"])
    assert plain["losses"] == swapped["losses"]
    first, second = (load_file(str(tmp_path / run / "epoch-0.safetensors")) for run in ("plain", "swap"))
    assert max((first[k] - second[k]).abs().max().item() for k in first) < 1e-6
