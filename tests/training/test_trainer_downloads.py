"""Downloads before loading: every folder a pipeline reads, its companions included, is fetched once per machine,
inside the trainer's barrier, before any process loads."""

import os
import subprocess
import sys
import time

import pytest
from accelerate import Accelerator

from diffsynth.core.loader import ModelConfig, resolve
from diffsynth.testing.tiny_models import (
    QWEN_IMAGE_MODEL_ID,
    QWEN_IMAGE_PATTERNS,
    WAN_I2V_MODEL_ID,
    WAN_I2V_PATTERNS,
)
from diffsynth.pipelines.qwen_image.pipeline import QwenImagePipeline
from diffsynth.pipelines.wan_video.pipeline import WanVideoPipeline
from diffsynth.training.config.parsers import parse_args
from diffsynth.training.startup import load_pipeline
from tests.core.loader.test_resolve import FakeDownloader
from tests.training.test_trainer import TRAIN_PY

MODELS = ("dit", "text_encoder", "vae", "image_encoder")


@pytest.fixture
def downloader(tiny_root, tmp_path, monkeypatch):
    """An empty model base; downloads copy from the tiny Wan I2V repo and are recorded."""
    monkeypatch.setenv(resolve.BASE_PATH_ENV, str(tmp_path / "models"))
    fake = FakeDownloader(tiny_root / WAN_I2V_MODEL_ID)
    monkeypatch.setattr(resolve, "download_from_modelscope", fake)
    return fake


def test_companion_folders_are_downloaded_before_the_pipeline_loads(downloader, tmp_path, monkeypatch,
                                                                   fresh_accelerate_state):
    fetched_before_loading = []
    original = WanVideoPipeline.from_pretrained.__func__

    def from_pretrained(cls, **kwargs):
        fetched_before_loading.extend(pattern for _, _, patterns in downloader.calls for pattern in patterns)
        return original(cls, **kwargs)

    monkeypatch.setattr(WanVideoPipeline, "from_pretrained", classmethod(from_pretrained))
    models = ",".join(f"{WAN_I2V_MODEL_ID}:{WAN_I2V_PATTERNS[name]}" for name in MODELS)
    args = parse_args(["--model_id_with_origin_paths", models, "--lora_base_model", "dit", "--lora_target_modules",
                       "q,k", "--dataset_metadata_path", str(tmp_path / "metadata.csv"), "--torch_dtype", "float32",
                       "--output_path", str(tmp_path / "out")], video=True)
    pipe = load_pipeline(args, WanVideoPipeline, Accelerator(cpu=True))
    assert pipe.tokenizer is not None and pipe.image_processor is not None
    assert {"tokenizer/*", "image_processor/*"} <= set(fetched_before_loading)
    assert len(downloader.calls) == len(MODELS) + 2, "a folder was downloaded while the pipeline loaded"


def test_companion_configs_follow_the_slots_the_model_classes_fill(base):
    def qwen(*names):
        return [ModelConfig(model_id=QWEN_IMAGE_MODEL_ID, origin_file_pattern=QWEN_IMAGE_PATTERNS[n]) for n in names]

    tokenizer = ModelConfig(model_id=QWEN_IMAGE_MODEL_ID, origin_file_pattern="tokenizer/")
    assert QwenImagePipeline.companion_configs(qwen("dit", "text_encoder")) == [tokenizer]
    assert QwenImagePipeline.companion_configs(qwen("dit", "vae")) == []
    assert QwenImagePipeline.companion_configs(qwen("text_encoder", "tokenizer")) == []
    own = ModelConfig(path=str(base / QWEN_IMAGE_MODEL_ID / "tokenizer"))
    assert QwenImagePipeline.companion_configs(qwen("text_encoder"), tokenizer_config=own) == [own]


def test_an_offline_run_with_missing_models_fails_in_seconds_with_one_message(tmp_path):
    """The README's training section followed from the top on a machine without the models and without a hub in
    reach, run for real in processes of their own: the hubs' addresses point at a local port nobody listens on, so no
    test machine's network is used, and the user's view is the real path up to the hub check."""
    from tests.core.loader.test_reachability import closed_port
    from tests.docs.test_readme import training_commands

    dataset, trainings = training_commands()
    subprocess.run([sys.executable, *dataset[1:]], cwd=tmp_path, check=True, capture_output=True, timeout=120)
    hub = f"http://127.0.0.1:{closed_port()}"
    env = {name: value for name, value in os.environ.items()
           if not name.lower().endswith("_proxy") and not name.startswith("DIFFSYNTH_")}
    env.update({"MODELSCOPE_ENDPOINT": hub, "HF_ENDPOINT": hub, "OMP_NUM_THREADS": "1"})
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(TRAIN_PY), *trainings[0]], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    seconds = time.monotonic() - started
    assert done.returncode == 2, done.stderr[-3000:]
    assert seconds < 5, f"an offline run took {seconds:.1f} s to fail"
    assert "Traceback" not in done.stderr and done.stderr.count("error: ") == 1, done.stderr
    assert (f"model '{QWEN_IMAGE_MODEL_ID}', pattern '{QWEN_IMAGE_PATTERNS['dit']}': no usable files in "
            in done.stderr)
    assert f"The download failed: modelscope ({hub}) cannot be reached: cannot connect to 127.0.0.1:" in done.stderr
    assert [path.name for path in tmp_path.iterdir()] == ["data"]  # neither models/ nor the output folder is left
