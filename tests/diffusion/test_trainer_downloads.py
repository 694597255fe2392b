"""Downloads before loading: every folder a pipeline reads, its companions included, is fetched once per machine,
inside the trainer's barrier, before any process loads."""

import pytest
from accelerate import Accelerator

from diffsynth.core.loader import ModelConfig, resolve
from diffsynth.core.loader.tiny_models import (QWEN_IMAGE_MODEL_ID, QWEN_IMAGE_PATTERNS, WAN_I2V_MODEL_ID,
                                               WAN_I2V_PATTERNS)
from diffsynth.diffusion.parsers import parse_args
from diffsynth.diffusion.trainer import load_pipeline
from diffsynth.pipelines.qwen_image import QwenImagePipeline
from diffsynth.pipelines.wan_video import WanVideoPipeline

from ..core.loader.test_resolve import FakeDownloader

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
