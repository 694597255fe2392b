"""The trainer on the original Wan release layouts: a video-only dataset trains image-to-video from each clip's first
frame, an input_image column wins over it, and broken release files stop the run before training, naming the file."""

import json
import shutil

import pytest
import torch
from PIL import Image

from diffsynth.core.data.example_dataset import build_example_video_dataset
from diffsynth.core.loader import ModelFilesNotFoundError, ModelLoadError, resolve
from diffsynth.testing.tiny_models import (
    WAN_I2V_ORIGINAL_MODEL_ID,
    WAN_I2V_ORIGINAL_PATTERNS,
    WAN_ORIGINAL_MODEL_ID,
    WAN_ORIGINAL_PATTERNS,
)
from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
from diffsynth.training.entry import main

T2V = {name: f"{WAN_ORIGINAL_MODEL_ID}:{WAN_ORIGINAL_PATTERNS[name]}" for name in ("dit", "text_encoder", "vae")}
I2V = {name: f"{WAN_I2V_ORIGINAL_MODEL_ID}:{WAN_I2V_ORIGINAL_PATTERNS[name]}"
       for name in ("dit", "text_encoder", "vae", "image_encoder")}
COMMON = ["--lora_base_model", "dit", "--lora_target_modules", "q,k,v,o", "--lora_rank", "4", "--torch_dtype",
          "float32", "--seed", "0", "--height", "32", "--width", "48", "--num_frames", "5"]


@pytest.fixture(autouse=True)
def in_process_runs(fresh_accelerate_state):
    """Every test here runs the trainer in-process."""


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("videos")
    build_example_video_dataset(folder, num_videos=2, num_frames=6, size=(48, 32))
    return folder


def dataset(folder):
    return ["--dataset_base_path", str(folder), "--dataset_metadata_path", str(folder / "metadata.csv")]


def cache_of(argv, output):
    """Stage 1 of split training: the cached state of each sample, to see what the units were given."""
    main(WanVideoPipeline, [*argv, "--task", "sft:data_process", "--output_path", str(output)], video=True)
    from diffsynth.core.data import CacheDataset

    return [CacheDataset(str(output))[index] for index in range(2)]


def test_extra_input_image_takes_the_first_frame_or_the_column(base, videos, tmp_path):
    models = ["--model_id_with_origin_paths", ",".join(I2V.values()), "--offload_models", I2V["dit"],
              "--extra_inputs", "input_image"]
    from_frames = cache_of([*dataset(videos), *COMMON, *models], tmp_path / "frames")
    # The same clips with an input_image column naming a plain grey picture: the column wins.
    with_column = tmp_path / "with_column"
    shutil.copytree(videos, with_column)
    Image.new("RGB", (48, 32), (128, 128, 128)).save(with_column / "grey.png")
    lines = (with_column / "metadata.csv").read_text().splitlines()
    (with_column / "metadata.csv").write_text("\n".join([lines[0] + ",input_image",
                                                         *(line + ",grey.png" for line in lines[1:])]) + "\n")
    from_column = cache_of([*dataset(with_column), *COMMON, *models, "--data_file_keys", "video,input_image"],
                           tmp_path / "column")
    for frames, column in zip(from_frames, from_column):
        # y holds the condition latents after its 4 mask channels; a grey picture is not the clip's first frame
        assert frames["shared"]["y"].shape == (1, 20, 2, 4, 6)
        assert (frames["shared"]["y"][:, 4:, 0] - column["shared"]["y"][:, 4:, 0]).abs().max() > 1e-3
        assert frames["shared"]["clip_feature"] is not None
    assert torch.equal(from_column[0]["shared"]["y"], from_column[1]["shared"]["y"])  # the same picture for both


def broken_repo(tmp_path, tiny_root, monkeypatch, edit):
    repo = tmp_path / "models" / WAN_ORIGINAL_MODEL_ID
    shutil.copytree(tiny_root / WAN_ORIGINAL_MODEL_ID, repo)
    edit(repo)
    monkeypatch.setenv(resolve.BASE_PATH_ENV, str(tmp_path / "models"))


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def rename_class(repo):
    config = json.loads((repo / "config.json").read_text())
    (repo / "config.json").write_text(json.dumps({**config, "_class_name": "WanModelX"}))


@pytest.mark.parametrize(("edit", "models", "error", "message"), [
    (lambda repo: truncate(repo / "Wan2.1_VAE.pth"), T2V, ModelLoadError,
     r"Wan2\.1_VAE\.pth cannot be read .*truncated.*re-download"),
    (lambda repo: torch.save({"token_embedding.weight": torch.ones(2, 2), "step": 7},
                             repo / "models_t5_umt5-xxl-enc-bf16.pth"), T2V, ModelLoadError,
     r"models_t5_umt5-xxl-enc-bf16\.pth holds a int under key 'step'.*original file"),
    (rename_class, T2V, ModelLoadError, r"config\.json names diffusers class 'WanModelX'.*check the class name"),
    (lambda repo: None, {**T2V, "vae": f"{WAN_ORIGINAL_MODEL_ID}:Wan2.1_vae.pth"}, ModelFilesNotFoundError,
     r"(?s)pattern 'Wan2\.1_vae\.pth'.*the pattern matches no file.*Fix: put the repository's files"),
])  # fmt: skip
def test_broken_release_files_stop_the_run_before_training(tmp_path, tiny_root, videos, monkeypatch, edit, models,
                                                           error, message):
    broken_repo(tmp_path, tiny_root, monkeypatch, edit)
    monkeypatch.setenv(resolve.SKIP_DOWNLOAD_ENV, "true")
    output = tmp_path / "output"
    with pytest.raises(error, match=message):
        main(WanVideoPipeline, [*dataset(videos), *COMMON, "--model_id_with_origin_paths", ",".join(models.values()),
                                "--output_path", str(output)], video=True)
    assert not list(output.glob("*.safetensors"))


def test_a_pth_the_restricted_loader_refuses_ends_with_exit_code_2_and_no_traceback(tmp_path, tiny_root, videos,
                                                                                   monkeypatch, capsys):
    from diffsynth.training import cli

    text_encoder = "models_t5_umt5-xxl-enc-bf16.pth"
    # A whole module pickled instead of its state dict: weights_only=True refuses its classes.
    broken_repo(tmp_path, tiny_root, monkeypatch, lambda repo: torch.save(
        {"token_embedding.weight": torch.ones(2, 2), "module": torch.nn.Linear(1, 1)}, repo / text_encoder))
    monkeypatch.delenv("DIFFSYNTH_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        cli(WanVideoPipeline, [*dataset(videos), *COMMON, "--model_id_with_origin_paths", ",".join(T2V.values()),
                               "--output_path", str(tmp_path / "output")], video=True)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err, err[-3000:]
    assert f"{text_encoder} holds objects beyond tensors" in err and "weights_only=True" in err
