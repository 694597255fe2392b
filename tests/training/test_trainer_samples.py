"""Samples while training through the CLI trainer: written at the steps asked, rendered with the live LoRA, without
changing what training learns, within the run's placement (the residency meter), and bad prompt files refused before
any model loads."""

import json

import av
import numpy as np
import pytest
import torch
from PIL import Image

from diffsynth.core.data.example_dataset import build_example_video_dataset
from diffsynth.core.loader import ModelConfig
from diffsynth.lora import load_lora
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
from diffsynth.testing.tiny_models import QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS, WAN_MODEL_ID, WAN_PATTERNS
from diffsynth.training.config.errors import FlagError
from diffsynth.training.config.parsers import parse_args
from diffsynth.training.config.validation_prompts import ValidationConfig
from diffsynth.training.entry import main
from tests.training.conftest import lora, max_difference
from tests.training.test_trainer import COMMON, PATTERN, cache, raw  # noqa: F401 - cache is a fixture

PROMPTS = "a red circle\n# a comment line\n\na blue square on the left\n"
OFFLOAD = ["--enable_model_cpu_offload"]


@pytest.fixture(autouse=True)
def in_process_runs(base, fresh_accelerate_state):
    """Every test here runs the trainer in-process on the tiny repos."""


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text(PROMPTS)
    return path


def sampling(path, *extra):
    return ["--validation_prompts", str(path), "--validation_num_inference_steps", "2", *extra]


def test_a_two_stage_offloaded_run_writes_samples_and_trains_the_lora_of_a_run_without(dataset, prompts, tmp_path):
    main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(tmp_path / "cache"), "--task",
                             "sft:data_process", "--offload_models", PATTERN["dit"], *OFFLOAD])
    stage_two = ["--dataset_base_path", str(tmp_path / "cache"), *COMMON, "--task", "sft:train", "--dataset_repeat",
                 "2", "--offload_models", f"{PATTERN['text_encoder']},{PATTERN['vae']}", *OFFLOAD]
    plain = main(QwenImagePipeline, [*stage_two, "--output_path", str(tmp_path / "plain")])
    sampled = main(QwenImagePipeline, [*stage_two, "--output_path", str(tmp_path / "sampled"),
                                       *sampling(prompts, "--validation_steps", "2", "--validation_epochs", "1")])
    # Six steps: samples after steps 2, 4 and 6 (the epoch's end falls on step 6: rendered once).
    folders = sorted(path.name for path in (tmp_path / "sampled" / "samples").iterdir())
    assert folders == ["step-2", "step-4", "step-6"]
    for folder in folders:
        files = sorted((tmp_path / "sampled" / "samples" / folder).iterdir())
        assert [path.name for path in files] == ["00.png", "01.png"]
        assert Image.open(files[0]).size == (64, 64)  # the square bucket of --max_pixels 4096
    assert sampled["losses"] == plain["losses"]
    assert max_difference(lora(tmp_path / "sampled", "epoch-0"), lora(tmp_path / "plain", "epoch-0")) == 0
    # The text encoder and VAE (weightless in this stage) were streamed one layer at a time, not held whole.
    streamed_bytes = sum(p.numel() * p.element_size() for name in ("text_encoder", "vae")
                         for p in load_tiny(name).parameters())
    largest_layer = max(layer_bytes(load_tiny(name)) for name in ("text_encoder", "vae"))
    for sampling_peak, training_peak in sampled["sample_peaks"].values():
        assert 0 < sampling_peak <= max(training_peak, largest_layer) < streamed_bytes / 4


def load_tiny(name):
    config = ModelConfig(model_id=QWEN_IMAGE_MODEL_ID, origin_file_pattern=QWEN_IMAGE_PATTERNS[name])
    return getattr(QwenImagePipeline.from_pretrained(torch.float32, "cpu", [config]), name)


def layer_bytes(model):
    """The bytes of the largest leaf module's own weights: what leaf offload holds at once at most, prefetch off."""
    return max(sum(t.numel() * t.element_size() for t in [*module.parameters(False), *module.buffers(False)])
               for module in model.modules())


def test_one_stage_offloaded_samples_hold_no_more_on_the_device_than_training(dataset, prompts, tmp_path):
    result = main(QwenImagePipeline, [*raw(dataset), *COMMON, *OFFLOAD, "--output_path", str(tmp_path / "out"),
                                      "--max_train_steps", "2", *sampling(prompts, "--validation_steps", "1")])
    assert sorted(result["sample_peaks"]) == [1, 2]
    for sampling_peak, training_peak in result["sample_peaks"].values():
        assert 0 < sampling_peak <= training_peak


def test_samples_are_rendered_with_the_lora_as_it_is_at_that_step(dataset, prompts, tmp_path):
    output = tmp_path / "out"
    main(QwenImagePipeline, [*raw(dataset), *COMMON, "--output_path", str(output), "--learning_rate", "2e-2",
                             "--max_train_steps", "3", "--save_steps", "3",
                             *sampling(prompts, "--validation_steps", "3", "--validation_seed", "7")])
    sample = np.asarray(Image.open(output / "samples" / "step-3" / "01.png"), dtype=np.int16)
    configs = [ModelConfig(model_id=QWEN_IMAGE_MODEL_ID, origin_file_pattern=QWEN_IMAGE_PATTERNS[name])
               for name in ("dit", "text_encoder", "vae")]
    pipe = QwenImagePipeline.from_pretrained(torch.float32, "cpu", configs)

    def render():
        image = pipe("a blue square on the left", height=64, width=64, seed=7, num_inference_steps=2,
                     progress_bar=False)
        return np.asarray(image, dtype=np.int16)

    base = render()
    load_lora(pipe.dit, output / "step-3.safetensors")
    merged = render()
    # The sample is the picture of the LoRA of step 3 (up to rounding), not of the base model.
    assert np.abs(sample - merged).max() <= 1
    assert np.abs(sample - base).sum() > 10 * np.abs(sample - merged).sum()


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    return build_example_video_dataset(tmp_path_factory.mktemp("videos"), num_videos=2, num_frames=6).parent


def test_a_wan_run_writes_video_samples_at_the_epochs_asked(videos, tmp_path):
    entries = [{"prompt": "a ball rolling", "height": 48, "width": 80, "num_frames": 5, "fps": 8, "seed": 2},
               "a square sliding"]
    (tmp_path / "prompts.json").write_text(json.dumps(entries))
    models = ",".join(f"{WAN_MODEL_ID}:{WAN_PATTERNS[name]}" for name in ("dit", "text_encoder", "vae"))
    argv = [*raw(videos), "--model_id_with_origin_paths", models, "--lora_base_model", "dit", "--lora_target_modules",
            "q,k,v,o", "--lora_rank", "4", "--torch_dtype", "float32", "--seed", "5", "--max_pixels", "4096",
            "--num_frames", "5", "--num_epochs", "2"]
    plain = main(WanVideoPipeline, [*argv, "--output_path", str(tmp_path / "plain")], video=True)
    main(WanVideoPipeline, [*argv, "--output_path", str(tmp_path / "out"),
                            *sampling(tmp_path / "prompts.json", "--validation_epochs", "1")], video=True)
    assert sorted(path.name for path in (tmp_path / "out" / "samples").iterdir()) == ["step-2", "step-4"]
    with av.open(str(tmp_path / "out" / "samples" / "step-4" / "00.mp4")) as container:
        stream = container.streams.video[0]
        frames = list(container.decode(stream))
        assert (stream.average_rate, len(frames), frames[0].width, frames[0].height) == (8, 5, 80, 48)
    with av.open(str(tmp_path / "out" / "samples" / "step-4" / "01.mp4")) as container:
        assert container.streams.video[0].average_rate == 16  # Wan's rate when the entry gives none
    assert max_difference(lora(tmp_path / "out", "epoch-1"), lora(tmp_path / "plain", "epoch-1")) == 0
    assert plain["global_step"] == 4


def write_image(path, size=(96, 64)):
    Image.new("RGB", size, "red").save(path)
    return path.name


@pytest.mark.parametrize("content, extra, fragments", [
    (None, [], ["does not exist"]),
    ("", [], ["holds no prompt"]),
    ("[1, 2", [], ["is not valid JSON"]),
    ('{"prompt": "x"}', [], ["holds a JSON dict", "must be a list"]),
    ('[{"prompt": "x", "strength": 2}]', [], ["entry 1", "unknown key 'strength'"]),
    ('["ok", {"height": 64, "width": 64}]', [], ["entry 2", 'needs a non-empty "prompt"']),
    ('[{"prompt": "x", "height": 64}]', [], ['gives one of "height" and "width"']),
    ('[{"prompt": "x", "edit_image": ["missing.png"]}]', [], ['"edit_image"', "missing.png", "not an image"]),
    ('[{"prompt": "x", "height": 512, "width": 512}]', [], ["512x512 is larger than training's frames (4096"]),
    ('[{"prompt": "x", "num_frames": 5}]', [], ['"num_frames" is for video']),
    ("a cat", ["--validation_steps", "0"], ["--validation_steps 0 must be at least 1"]),
    ("a cat", ["--validation_epochs", None], ["needs --validation_steps N and/or --validation_epochs N"]),
])  # fmt: skip
def test_bad_prompt_files_and_flags_fail_before_any_model_loads(tmp_path, capsys, content, extra, fragments):
    path = tmp_path / ("prompts.json" if content and content[0] in "[{" else "prompts.txt")
    if content is not None:
        path.write_text(content)
    flags = ["--validation_epochs", "1", *extra] if None not in extra else []
    with pytest.raises(SystemExit):
        parse_args([*COMMON, "--dataset_metadata_path", "m.csv", "--validation_prompts", str(path), *flags])
    error = capsys.readouterr().err
    assert all(fragment in error for fragment in fragments), error


def test_a_prompt_given_as_the_flags_value_is_the_one_sample():
    config = parse_args([*COMMON, "--dataset_metadata_path", "m.csv", "--validation_prompts", "a red circle",
                         "--validation_steps", "2"])
    validation = ValidationConfig.from_sections(config.validation, config.dataset)
    assert [prompt.prompt for prompt in validation.prompts] == ["a red circle"]
    assert validation.size(validation.prompts[0], 16) == (64, 64)  # the square bucket of --max_pixels 4096


def test_sampling_flags_need_prompts_and_a_training_stage(tmp_path, capsys, prompts):
    with pytest.raises(SystemExit):
        parse_args([*COMMON, "--dataset_metadata_path", "m.csv", "--validation_steps", "5"])
    assert "--validation_steps has no effect without --validation_prompts" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args([*COMMON, "--dataset_metadata_path", "m.csv", "--task", "sft:data_process",
                    *sampling(prompts, "--validation_steps", "5")])
    assert "--task sft:data_process trains nothing to render" in capsys.readouterr().err


def test_a_stage_two_without_the_text_encoder_cannot_render_and_says_so_before_loading(cache, prompts, tmp_path,
                                                                                     monkeypatch):
    from diffsynth.core.loader import loading

    monkeypatch.setattr(loading, "load_model_from_files", lambda *a, **k: pytest.fail("weights were loaded"))
    only_dit = [*COMMON]
    only_dit[1] = PATTERN["dit"]
    with pytest.raises(FlagError, match=r"--validation_prompts renders with text_encoder, vae.*--offload_models"):
        main(QwenImagePipeline, ["--dataset_base_path", str(cache), *only_dit, "--task", "sft:train",
                                 "--output_path", str(tmp_path / "out"), *sampling(prompts, "--validation_steps", "1")])


def test_samples_reach_tensorboard(tmp_path):
    from diffsynth.training.outputs.logger import ModelLogger

    class Writer:
        def __init__(self):
            self.images = []

        def add_image(self, tag, array, step, dataformats):
            self.images.append((tag, array.shape, step, dataformats))

        def flush(self):
            pass

    model_logger = ModelLogger(tmp_path)
    model_logger._tensorboard = writer = Writer()
    model_logger.log_sample(4, 1, Image.new("RGB", (32, 16)))
    model_logger.log_sample(4, 2, [Image.new("RGB", (32, 16))] * 3)  # a video without moviepy: its first frame
    assert writer.images == [("samples/01", (16, 32, 3), 4, "HWC"), ("samples/02", (16, 32, 3), 4, "HWC")]


def test_an_edit_run_renders_its_edit_prompts_at_the_edit_images_aspect_ratio(tmp_path, monkeypatch):
    from diffsynth.core.data.example_edit_dataset import build_example_edit_dataset
    from diffsynth.testing.tiny_models import QWEN_IMAGE_EDIT_2509_MODEL_ID
    from tests.training.test_trainer_edit import common

    monkeypatch.setattr(QwenImagePipeline, "edit_image_pixels", 64 * 64)
    monkeypatch.setattr(QwenImagePipeline, "edit_condition_pixels", 64 * 64)
    metadata = build_example_edit_dataset(tmp_path / "edits", num_samples=1, num_edit_images=2)
    write_image(tmp_path / "wide.png", (120, 60))
    write_image(tmp_path / "swatch.png", (40, 40))
    (tmp_path / "prompts.json").write_text(json.dumps([{"prompt": "paint it", "edit_image": ["swatch.png",
                                                                                             "wide.png"]}]))
    main(QwenImagePipeline, [*raw(metadata.parent), "--dataset_metadata_path", str(metadata),
                             *common(QWEN_IMAGE_EDIT_2509_MODEL_ID), "--output_path", str(tmp_path / "out"),
                             *sampling(tmp_path / "prompts.json", "--validation_steps", "1")])
    # The last edit image is 2:1; of the buckets of --max_pixels 4096, 80x48 has the nearest aspect ratio.
    assert Image.open(tmp_path / "out" / "samples" / "step-1" / "00.png").size == (80, 48)


def test_an_image_the_model_cannot_take_is_refused_before_training(videos, tmp_path, monkeypatch):
    from diffsynth.training.loop import training_loop

    write_image(tmp_path / "first.png")
    (tmp_path / "prompts.json").write_text(json.dumps([{"prompt": "a ball", "input_image": "first.png"}]))
    models = ",".join(f"{WAN_MODEL_ID}:{WAN_PATTERNS[name]}" for name in ("dit", "text_encoder", "vae"))
    monkeypatch.setattr(training_loop, "make_optimizer", lambda *a, **k: pytest.fail("training started"))
    with pytest.raises(ValueError, match=r"entry 1: \"input_image\" was given, but the transformer .* takes no image"):
        main(WanVideoPipeline, [*raw(videos), "--model_id_with_origin_paths", models, "--lora_base_model", "dit",
                                "--lora_target_modules", "q", "--torch_dtype", "float32", "--max_pixels", "4096",
                                "--num_frames", "5", "--output_path", str(tmp_path / "out"),
                                *sampling(tmp_path / "prompts.json", "--validation_steps", "1")], video=True)
