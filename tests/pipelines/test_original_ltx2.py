"""LTX-2's own key layout (the reference's ``DiffSynth-Studio/LTX-2-Repackage`` files) and Gemma-3's released one:
every tensor of the files is used and equals the diffusers-layout one, the pipeline loaded from them renders the same
frames and waveform, the config comes from the tensors and the metadata, and the files this loader cannot read are
refused by name."""

from pathlib import Path

import pytest
import torch
from diffusers import LTX2VideoTransformer3DModel
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from diffsynth.core.files import atomic_save_safetensors
from diffsynth.core.loader import ModelConfig, ModelLoadError
from diffsynth.core.loader.loading import load_model_from_files
from diffsynth.pipelines import LTX2AudioVideoPipeline
from diffsynth.pipelines.ltx2.original import DIT_PREFIX, identify, transformer_config, transformer_key_to_original
from diffsynth.testing.tiny_common import seeded
from diffsynth.testing.tiny_ltx2 import LTX2_MODEL_ID, LTX2_PATTERNS, _connectors, _transformer
from diffsynth.testing.tiny_ltx2_repackage import (
    GEMMA_MODEL_ID,
    GEMMA_PATTERN,
    LTX2_REPACKAGE_MODEL_ID,
    LTX2_REPACKAGE_PATTERNS,
    official_metadata,
)

from .test_ltx2 import SLOTS, distance, load_ours, render_ours

PARITY = 1e-6
FOLDERS = {"dit": "transformer", "connectors": "connectors"}


def plain(config, unused=frozenset()) -> dict:
    """A model config without diffusers' private entries and ``unused``, tuples as lists."""
    return {key: list(value) if isinstance(value, tuple) else value for key, value in config.items()
            if not key.startswith("_") and key not in unused}


def diffusers_model(tiny_root: Path, slot: str) -> torch.nn.Module:
    files = sorted((tiny_root / LTX2_MODEL_ID / FOLDERS[slot]).glob("*.safetensors"))
    return load_model_from_files(files, torch_dtype=torch.float32)


@pytest.mark.parametrize("slot", ["dit", "connectors"])
def test_every_tensor_of_the_file_loads_into_the_diffusers_model_unchanged(tiny_root, slot):
    file = tiny_root / LTX2_REPACKAGE_MODEL_ID / LTX2_REPACKAGE_PATTERNS[slot]
    loaded = load_model_from_files([file], torch_dtype=torch.float32)
    reference = diffusers_model(tiny_root, slot)
    assert type(loaded) is type(reference)
    assert plain(loaded.config) == plain(reference.config)
    ours, theirs = loaded.state_dict(), reference.state_dict()
    # one file tensor per model tensor: none left over, none missing
    assert len(load_file(str(file))) == len(ours) and set(ours) == set(theirs)
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)


def test_the_pipeline_from_the_repackaged_files_renders_what_the_diffusers_one_does(tiny_root):
    slots = [slot for slot in SLOTS if slot not in LTX2_REPACKAGE_PATTERNS]
    configs = [ModelConfig(model_id=LTX2_REPACKAGE_MODEL_ID, origin_file_pattern=pattern)
               for pattern in LTX2_REPACKAGE_PATTERNS.values()]
    configs += [ModelConfig(model_id=LTX2_MODEL_ID, origin_file_pattern=LTX2_PATTERNS[slot]) for slot in slots]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        repackaged = LTX2AudioVideoPipeline.from_pretrained(torch.float32, "cpu", configs)
    reference = render_ours(load_ours(tiny_root))
    # The weights are bit for bit the same (above); the renders differ by a few 1e-7 only because the tensors sit at
    # other addresses (CPU kernels vectorise by alignment): cloning both transformers' weights makes them equal.
    assert max(distance(render_ours(repackaged), reference)) < PARITY
    # with teeth: the same pipeline with another seed is far from it
    assert min(distance(render_ours(repackaged, seed=8), reference)) > 100 * PARITY


def test_without_metadata_the_heads_are_ltx2s_and_the_widths_the_tensors(tmp_path, tiny_root):
    file = tiny_root / LTX2_REPACKAGE_MODEL_ID / "transformer.safetensors"
    shapes = {key: tuple(tensor.shape) for key, tensor in load_file(str(file)).items()}
    width = 32 * 128  # the release's: 32 heads of 128
    shapes[f"{DIT_PREFIX}patchify_proj.weight"] = (width, 128)
    shapes[f"{DIT_PREFIX}audio_patchify_proj.weight"] = (32 * 64, 128)
    config = transformer_config(shapes, {}, file)
    assert (config["num_attention_heads"], config["attention_head_dim"]) == (32, 128)
    assert (config["audio_num_attention_heads"], config["audio_attention_head_dim"]) == (32, 64)
    assert config["in_channels"] == 128 and config["num_layers"] == 2 and config["rope_double_precision"] is True
    assert not config["cross_attn_mod"]


def test_a_file_missing_a_tensor_is_refused_before_loading(tmp_path, tiny_root):
    source = tiny_root / LTX2_REPACKAGE_MODEL_ID / "transformer.safetensors"
    tensors = load_file(str(source))
    del tensors[f"{DIT_PREFIX}transformer_blocks.1.attn1.q_norm.weight"]
    file = tmp_path / "transformer.safetensors"
    with safe_open(str(source), framework="pt") as handle:
        save_file(tensors, str(file), metadata=handle.metadata())
    with pytest.raises(ModelLoadError, match=r"lacks 1 tensor.*transformer_blocks\.1\.attn1\.q_norm\.weight"):
        identify([file])


def test_files_of_other_layouts_are_left_to_their_readers(tmp_path, tiny_root):
    files = sorted((tiny_root / LTX2_MODEL_ID / "transformer").glob("*.safetensors"))
    assert identify(files) is None and identify(files[:1]) is None
    other = tmp_path / "model.safetensors"  # another model's VAE under a "vae." prefix
    save_file({"vae.encoder.conv_in.weight": torch.zeros(2, 2)}, str(other))
    assert identify([other]) is None


def test_gemma_in_its_released_layout_loads_with_the_tokenizer_at_the_repository_root(tiny_root):
    slots = [slot for slot in SLOTS if slot != "text_encoder"]
    configs = [ModelConfig(model_id=GEMMA_MODEL_ID, origin_file_pattern=GEMMA_PATTERN)]
    configs += [ModelConfig(model_id=LTX2_MODEL_ID, origin_file_pattern=LTX2_PATTERNS[slot]) for slot in slots]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        released = LTX2AudioVideoPipeline.from_pretrained(torch.float32, "cpu", configs)
    reference = load_ours(tiny_root)
    assert released.model_configs["tokenizer"].origin_file_pattern == "tokenizer*"
    assert released.tokenizer("a robot").input_ids == reference.tokenizer("a robot").input_ids
    ours, theirs = released.text_encoder.state_dict(), reference.text_encoder.state_dict()
    assert set(ours) == set(theirs) and all(torch.equal(ours[key], theirs[key]) for key in ours)
    # the release has no lm_head: it is tied to the embeddings
    assert "lm_head.weight" not in load_file(str(next((tiny_root / GEMMA_MODEL_ID).glob(GEMMA_PATTERN))))
    assert max(distance(render_ours(released), render_ours(reference))) < PARITY


def test_an_ltx23_shaped_transformer_reads_its_gates_and_modulation_from_the_tensors(tmp_path):
    # LTX-2.3's transformer: gated attention, modulated cross-attention with its prompt embedders, and no caption
    # projection (its connectors project the prompt)
    changes = {"gated_attn": True, "audio_gated_attn": True, "cross_attn_mod": True, "audio_cross_attn_mod": True,
               "use_prompt_embeddings": False, "perturbed_attn": True}
    with seeded(3):
        reference = LTX2VideoTransformer3DModel.from_config({**plain(_transformer().config), **changes})
    file = tmp_path / "transformer.safetensors"
    atomic_save_safetensors({transformer_key_to_original(key): tensor.contiguous()
                             for key, tensor in reference.state_dict().items()}, file,
                            metadata=official_metadata(reference, _connectors()))
    loaded = load_model_from_files([file], torch_dtype=torch.float32)
    # without a caption projection no tensor records the prompt width, which nothing then reads
    assert plain(loaded.config, unused={"caption_channels"}) == plain(reference.config, unused={"caption_channels"})
    ours, theirs = loaded.state_dict(), reference.state_dict()
    assert any(key.startswith("prompt_adaln.") for key in ours) and set(ours) == set(theirs)
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)
