"""What only Krea 2 does: Krea's single-file layout read into diffusers' class, its LoRA names, Turbo's fixed shift
and the text encoder's taps. The shared checks (inference equal to diffusers', training, placements, split, LoRA
loading in diffusers, planner) run in the family kit."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from diffsynth.core.loader import ModelConfig
from diffsynth.pipelines.krea2.naming import NAMING
from diffsynth.pipelines.krea2.original import diffusers_key, identify, original_key, transformer_to_original
from diffsynth.pipelines.krea2.pipeline import DISTILLED_MU, Krea2Pipeline, _is_distilled, text_encoder_taps
from diffsynth.testing.tiny_krea2 import KREA2_RAW_MODEL_ID, KREA2_TURBO_MODEL_ID


@pytest.fixture(scope="module")
def diffusers_transformer(tiny_root):
    from diffusers import Krea2Transformer2DModel

    return Krea2Transformer2DModel.from_pretrained(str(tiny_root / KREA2_RAW_MODEL_ID / "transformer"))


def test_the_single_file_reads_as_the_diffusers_folder(tiny_root, diffusers_transformer):
    file = tiny_root / KREA2_RAW_MODEL_ID / "raw.safetensors"
    found = identify([file])
    assert found.class_name == "Krea2Transformer2DModel"
    assert {key: value for key, value in found.config.items()} == {
        key: (tuple(value) if isinstance(value, list) else value) for key, value in diffusers_transformer.config.items()
        if key in found.config}
    expected = diffusers_transformer.state_dict()
    assert set(found.entries) == set(expected)
    original = load_file(str(file))
    for key, entry in found.entries.items():
        tensor = original[entry.checkpoint_key]
        tensor = entry.convert(tensor) if entry.convert is not None else tensor
        assert torch.equal(tensor, expected[key]), key
    # The modulation tables are stored flat, as Krea's DoubleSharedModulation holds them.
    assert original["blocks.0.mod.lin"].dim() == 1 and "blocks.0.attn.wq.weight" in original


def test_the_key_maps_are_inverse_and_agree_with_diffusers_converter(diffusers_transformer):
    from diffusers.loaders.single_file_utils import convert_krea2_transformer_checkpoint_to_diffusers

    state = diffusers_transformer.state_dict()
    written = transformer_to_original(state)
    assert all(diffusers_key(original_key(key)) == key for key in state)
    converted = convert_krea2_transformer_checkpoint_to_diffusers(dict(written))
    assert set(converted) == set(state)
    assert all(torch.equal(converted[key], state[key]) for key in state)


def test_files_without_the_marker_are_not_krea2(tmp_path):
    from safetensors.torch import save_file

    save_file({"blocks.0.attn.wq.weight": torch.zeros(2, 2)}, str(tmp_path / "other.safetensors"))
    assert identify([tmp_path / "other.safetensors"]) is None


def test_lora_names_are_krea_modules(diffusers_transformer):
    cases = {"transformer_blocks.1.attn.to_q": "blocks.1.attn.wq", "transformer_blocks.0.ff.gate": "blocks.0.mlp.gate",
             "text_fusion.refiner_blocks.0.attn.to_gate": "txtfusion.refiner_blocks.0.attn.gate",
             "img_in": "first", "final_layer.linear": "last.linear", "time_mod_proj": "tproj.1"}
    for name, native in cases.items():
        assert NAMING.to_native(name) == native and NAMING.to_diffusers(native) == name
    linear = [name for name, module in diffusers_transformer.named_modules() if isinstance(module, torch.nn.Linear)]
    assert all(NAMING.to_diffusers(NAMING.to_native(name)) == name for name in linear)
    assert NAMING.to_native("transformer_blocks.0.attn.norm_q") is None


def test_turbo_samples_with_the_fixed_shift_and_raw_with_the_resolutions():
    assert _is_distilled(ModelConfig(model_id=KREA2_TURBO_MODEL_ID, origin_file_pattern="turbo.safetensors"))
    assert not _is_distilled(ModelConfig(model_id=KREA2_RAW_MODEL_ID, origin_file_pattern="raw.safetensors"))
    pipe = Krea2Pipeline(device="cpu", torch_dtype=torch.float32)
    pipe.is_distilled = True
    pipe.set_inference_timesteps(4, latent_shape=(1, 16, 128, 128))
    turbo = pipe.scheduler.sigmas.clone()
    pipe.is_distilled = False
    pipe.set_inference_timesteps(4, latent_shape=(1, 16, 128, 128))  # 4096 tokens: mu below 1.15
    assert turbo[1] > pipe.scheduler.sigmas[1]
    pipe.set_inference_timesteps(4, latent_shape=(1, 16, 128, 128), mu=DISTILLED_MU)
    assert torch.equal(pipe.scheduler.sigmas, turbo)


def test_the_taps_are_diffusers_defaults_for_qwen3_vl_4b():
    assert text_encoder_taps(36) == (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35)
