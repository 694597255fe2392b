"""The tiny repos: real layout, deterministic, readable by diffusers' own pipelines, and equal to our loading."""

import json

import pytest
import torch

from diffsynth.core.loader import ModelConfig, load_model, load_tokenizer
from diffsynth.testing.tiny_models import (
    QWEN_IMAGE_EDIT_2509_MODEL_ID,
    QWEN_IMAGE_EDIT_2511_MODEL_ID,
    QWEN_IMAGE_EDIT_MODEL_ID,
    QWEN_IMAGE_PATTERNS,
    QWEN_VL_PREPROCESSOR_CONFIG,
    QWEN_IMAGE_SCHEDULER_CONFIG,
    TINY_MARKER,
    WAN_PATTERNS,
    build_tiny_qwen_image,
    main,
)

from tests.core.loader.conftest import QWEN, WAN


def test_qwen_image_repo_has_the_real_layout(tiny_root):
    repo = tiny_root / QWEN
    transformer = sorted(p.name for p in (repo / "transformer").glob("*.safetensors"))
    assert len(transformer) >= 2 and all(n.startswith("diffusion_pytorch_model-0000") for n in transformer)
    index = json.loads((repo / "transformer" / "diffusion_pytorch_model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == transformer
    assert len(list((repo / "text_encoder").glob("model-0000*-of-0000*.safetensors"))) >= 2
    assert (repo / "text_encoder" / "model.safetensors.index.json").is_file()
    assert [p.name for p in (repo / "vae").glob("*.safetensors")] == ["diffusion_pytorch_model.safetensors"]
    assert (repo / "tokenizer" / "tokenizer_config.json").is_file()
    scheduler = json.loads((repo / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler == QWEN_IMAGE_SCHEDULER_CONFIG and scheduler["use_dynamic_shifting"] is True
    index = json.loads((repo / "model_index.json").read_text())
    assert index["_class_name"] == "QwenImagePipeline"
    assert index["transformer"] == ["diffusers", "QwenImageTransformer2DModel"]
    assert index["text_encoder"] == ["transformers", "Qwen2_5_VLForConditionalGeneration"]


@pytest.mark.parametrize(("model_id", "pipeline", "zero_cond_t"), [
    (QWEN_IMAGE_EDIT_MODEL_ID, "QwenImageEditPipeline", False),
    (QWEN_IMAGE_EDIT_2509_MODEL_ID, "QwenImageEditPlusPipeline", False),
    (QWEN_IMAGE_EDIT_2511_MODEL_ID, "QwenImageEditPlusPipeline", True),
])
def test_edit_repos_have_the_real_layout(tiny_root, model_id, pipeline, zero_cond_t):
    repo = tiny_root / model_id
    index = json.loads((repo / "model_index.json").read_text())
    assert index["_class_name"] == pipeline and index["processor"] == ["transformers", "Qwen2VLProcessor"]
    assert json.loads((repo / "processor" / "preprocessor_config.json").read_text()) == QWEN_VL_PREPROCESSOR_CONFIG
    assert (repo / "processor" / "video_preprocessor_config.json").is_file()
    assert (repo / "processor" / "tokenizer_config.json").is_file()
    assert json.loads((repo / "transformer" / "config.json").read_text())["zero_cond_t"] is zero_cond_t
    assert len(list((repo / "transformer").glob("diffusion_pytorch_model-0000*.safetensors"))) >= 2
    # The released Edit repositories hold Qwen-Image's text encoder and VAE, and a transformer of their own.
    for shared in ("vae/diffusion_pytorch_model.safetensors", "text_encoder/model-00001-of-00004.safetensors"):
        assert (repo / shared).read_bytes() == (tiny_root / QWEN / shared).read_bytes()
    transformer = "transformer/diffusion_pytorch_model-00001-of-00004.safetensors"
    assert (repo / transformer).read_bytes() != (tiny_root / QWEN / transformer).read_bytes()


def test_wan_repo_has_the_real_layout(tiny_root):
    repo = tiny_root / WAN
    assert len(list((repo / "transformer").glob("diffusion_pytorch_model-*.safetensors"))) >= 2
    assert len(list((repo / "text_encoder").glob("model-*.safetensors"))) >= 2
    index = json.loads((repo / "model_index.json").read_text())
    assert index["_class_name"] == "WanPipeline" and index["text_encoder"] == ["transformers", "UMT5EncoderModel"]
    scheduler = json.loads((repo / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler["_class_name"] == "UniPCMultistepScheduler" and scheduler["flow_shift"] == 3.0


def test_the_text_encoders_fit_the_transformers(tiny_root):
    for model_id, hidden, dim in ((QWEN, "text_config", "joint_attention_dim"), (WAN, "d_model", "text_dim")):
        text = json.loads((tiny_root / model_id / "text_encoder" / "config.json").read_text())
        width = text[hidden]["hidden_size"] if hidden == "text_config" else text[hidden]
        assert width == json.loads((tiny_root / model_id / "transformer" / "config.json").read_text())[dim]


def test_builds_are_deterministic_for_a_seed(tiny_root, tmp_path):
    again = build_tiny_qwen_image(tmp_path / "again", seed=0)
    for file in sorted((tiny_root / QWEN).rglob("*")):
        if file.is_file():
            assert file.read_bytes() == (again / file.relative_to(tiny_root / QWEN)).read_bytes(), file
    other = build_tiny_qwen_image(tmp_path / "other", seed=1)
    name = "vae/diffusion_pytorch_model.safetensors"
    assert (other / name).read_bytes() != (tiny_root / QWEN / name).read_bytes()


def test_the_builder_never_overwrites_a_real_repository(tmp_path):
    real = tmp_path / QWEN
    real.mkdir(parents=True)
    (real / "weights.safetensors").write_bytes(b"precious")
    with pytest.raises(FileExistsError, match=TINY_MARKER):
        build_tiny_qwen_image(tmp_path)
    assert (real / "weights.safetensors").read_bytes() == b"precious"


def test_cli_writes_the_requested_repos(tmp_path, capsys):
    assert main(["--output", str(tmp_path), "--only", "wan"]) == 0
    assert (tmp_path / WAN / TINY_MARKER).is_file() and not (tmp_path / QWEN).exists()
    assert WAN in capsys.readouterr().out
    assert main(["--output", str(tmp_path), "--only", "wan", "--seed", "3"]) == 0  # a tiny repo is rebuilt


def ours(model_id, patterns, dtype):
    def load(name):
        return load_model(ModelConfig(model_id=model_id, origin_file_pattern=patterns[name]), dtype)

    tokenizer = load_tokenizer(ModelConfig(model_id=model_id, origin_file_pattern=patterns["tokenizer"]))
    return dict(transformer=load("dit"), text_encoder=load("text_encoder"), vae=load("vae"), tokenizer=tokenizer)


def test_diffusers_qwen_image_pipeline_loads_the_repo_and_matches_our_components(base):
    from diffusers import QwenImagePipeline

    reference = QwenImagePipeline.from_pretrained(str(base / QWEN), dtype=torch.float32)
    rebuilt = QwenImagePipeline(scheduler=reference.scheduler, **ours(QWEN, QWEN_IMAGE_PATTERNS, torch.float32))
    kwargs = dict(prompt="a red cat", height=64, width=64, num_inference_steps=2, output_type="pt")
    expected = reference(**kwargs, generator=torch.Generator().manual_seed(0)).images
    actual = rebuilt(**kwargs, generator=torch.Generator().manual_seed(0)).images
    assert expected.shape == (1, 3, 64, 64) and expected.std() > 0
    assert torch.equal(actual, expected)


def test_diffusers_wan_pipeline_loads_the_repo_and_matches_our_components(base):
    from diffusers import WanPipeline

    reference = WanPipeline.from_pretrained(str(base / WAN), dtype=torch.float32)
    rebuilt = WanPipeline(scheduler=reference.scheduler, **ours(WAN, WAN_PATTERNS, torch.float32))
    kwargs = dict(prompt="a red cat", height=32, width=32, num_frames=5, num_inference_steps=2, output_type="pt",
                  max_sequence_length=16)  # fmt: skip
    expected = reference(**kwargs, generator=torch.Generator().manual_seed(0)).frames
    actual = rebuilt(**kwargs, generator=torch.Generator().manual_seed(0)).frames
    assert expected.shape == (1, 5, 3, 32, 32) and expected.std() > 0
    assert torch.equal(actual, expected)
