"""LTX-2.3's own key layout (the reference's ``DiffSynth-Studio/LTX-2.3-Repackage`` transformer and
``text_encoder_post_modules`` with its per-stream Gemma projections): every tensor of the files is used and equals the
diffusers-layout one, the pipeline loaded from them renders what the diffusers-layout one does, and the Gemma width
falls back to the 12B's where the metadata leaves it out."""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from diffsynth.core.loader import ModelConfig, ModelLoadError
from diffsynth.core.loader.loading import load_model_from_files
from diffsynth.pipelines import LTX2AudioVideoPipeline
from diffsynth.pipelines.ltx2.original import GEMMA_WIDTH, connectors_config, identify
from diffsynth.testing.tiny_ltx23 import (
    LTX23_MODEL_ID,
    LTX23_PATTERNS,
    LTX23_REPACKAGE_MODEL_ID,
    LTX23_REPACKAGE_PATTERNS,
)
from tests.pipelines.test_ltx2 import SLOTS, distance
from tests.pipelines.test_ltx23 import load_ours, render_ours
from tests.pipelines.test_original_ltx2 import PARITY, plain

FOLDERS = {"dit": "transformer", "connectors": "connectors"}


def diffusers_model(tiny_root, slot: str) -> torch.nn.Module:
    files = sorted((tiny_root / LTX23_MODEL_ID / FOLDERS[slot]).glob("*.safetensors"))
    return load_model_from_files(files, torch_dtype=torch.float32)


@pytest.mark.parametrize("slot", ["dit", "connectors"])
def test_every_tensor_of_the_file_loads_into_the_diffusers_model_unchanged(tiny_root, slot):
    file = tiny_root / LTX23_REPACKAGE_MODEL_ID / LTX23_REPACKAGE_PATTERNS[slot]
    loaded = load_model_from_files([file], torch_dtype=torch.float32)
    reference = diffusers_model(tiny_root, slot)
    # the transformer without a caption projection records no prompt width, which nothing then reads
    unused = {"caption_channels"} if slot == "dit" else set()
    assert type(loaded) is type(reference) and plain(loaded.config, unused) == plain(reference.config, unused)
    ours, theirs = loaded.state_dict(), reference.state_dict()
    assert len(load_file(str(file))) == len(ours) and set(ours) == set(theirs)
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)
    if slot == "connectors":
        assert loaded.config.per_modality_projections and loaded.config.proj_bias
        assert (loaded.config.video_hidden_dim, loaded.config.audio_hidden_dim) == (16, 8)


def test_the_pipeline_from_the_repackaged_files_renders_what_the_diffusers_one_does(tiny_root):
    configs = [ModelConfig(model_id=LTX23_REPACKAGE_MODEL_ID, origin_file_pattern=pattern)
               for pattern in LTX23_REPACKAGE_PATTERNS.values()]
    configs += [ModelConfig(model_id=LTX23_MODEL_ID, origin_file_pattern=LTX23_PATTERNS[slot])
                for slot in SLOTS if slot not in LTX23_REPACKAGE_PATTERNS]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        repackaged = LTX2AudioVideoPipeline.from_pretrained(torch.float32, "cpu", configs)
    reference = render_ours(load_ours(tiny_root))
    assert max(distance(render_ours(repackaged), reference)) < PARITY
    assert min(distance(render_ours(repackaged, seed=8), reference)) > 100 * PARITY


def test_without_the_gemma_width_in_the_metadata_the_12bs_is_read(tiny_root):
    file = tiny_root / LTX23_REPACKAGE_MODEL_ID / "text_encoder_post_modules.safetensors"
    shapes = {key: tuple(tensor.shape) for key, tensor in load_file(str(file)).items()}
    for stream, width in (("video", 4096), ("audio", 2048)):
        shapes[f"text_embedding_projection.{stream}_aggregate_embed.weight"] = (width, GEMMA_WIDTH * 49)
    with safe_open(str(file), framework="pt") as handle:
        metadata = json.loads(handle.metadata()["config"])["transformer"]
    del metadata["caption_channels"]
    config = connectors_config(shapes, metadata, file)
    assert (config["caption_channels"], config["text_proj_in_factor"]) == (GEMMA_WIDTH, 49)
    assert (config["video_hidden_dim"], config["audio_hidden_dim"]) == (4096, 2048)


def test_a_projection_that_gemmas_width_does_not_divide_is_refused(tmp_path, tiny_root):
    source = tiny_root / LTX23_REPACKAGE_MODEL_ID / "text_encoder_post_modules.safetensors"
    with safe_open(str(source), framework="pt") as handle:
        section = json.loads(handle.metadata()["config"])
    section["transformer"]["caption_channels"] = 7
    file = tmp_path / "text_encoder_post_modules.safetensors"
    save_file(load_file(str(source)), str(file), metadata={"config": json.dumps(section)})
    with pytest.raises(ModelLoadError, match="reads 96 features, not a multiple of Gemma's width 7"):
        identify([file])


def test_a_missing_audio_projection_is_refused_by_name(tmp_path, tiny_root):
    source = tiny_root / LTX23_REPACKAGE_MODEL_ID / "text_encoder_post_modules.safetensors"
    tensors = load_file(str(source))
    del tensors["text_embedding_projection.audio_aggregate_embed.weight"]
    file = tmp_path / "text_encoder_post_modules.safetensors"
    with safe_open(str(source), framework="pt") as handle:
        save_file(tensors, str(file), metadata=handle.metadata())
    with pytest.raises(ModelLoadError, match="lacks 'text_embedding_projection.audio_aggregate_embed.weight'"):
        identify([file])
