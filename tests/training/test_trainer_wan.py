"""The CLI trainer on the tiny Wan and a generated video dataset: bad videos named (the family kit,
``tests/pipelines/test_family_kit.py``, checks the runs)."""

import shutil
from pathlib import Path

import pytest

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
