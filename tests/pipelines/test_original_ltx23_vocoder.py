"""LTX-2.3's vocoder with bandwidth extension in LTX-2's own key layout (``DiffSynth-Studio/LTX-2.3-Repackage``'s
``audio_vocoder.safetensors``, the ``vocoder.`` group of JoyAI-Echo's / Lightricks' single file): the key map names
LTX-2's layers, every tensor of the file loads into diffusers' ``LTX2VocoderWithBWE`` unchanged with the diffusers
config, the pipeline from the Repackage files renders the 48 kHz waveform the diffusers layout does, a truncated file
is refused naming the file and the key, and the release's structure is read back from its tensors alone."""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from diffsynth.core.loader import ModelConfig, ModelLoadError
from diffsynth.core.loader.loading import load_model_from_files
from diffsynth.core.loader.state_dict import CheckpointEntry
from diffsynth.pipelines import LTX2AudioVideoPipeline
from diffsynth.pipelines.ltx2.original import identify
from diffsynth.pipelines.ltx2.original_audio import bwe_vocoder_config, bwe_vocoder_key_to_original, vocoder_model
from diffsynth.testing.tiny_ltx23 import (
    LTX23_MODEL_ID,
    LTX23_PATTERNS,
    LTX23_REPACKAGE_MODEL_ID,
    LTX23_REPACKAGE_PARTS,
    LTX23_REPACKAGE_PATTERNS,
    VOCODER_OUTPUT_RATE,
)
from tests.pipelines.test_ltx2 import distance
from tests.pipelines.test_ltx23 import load_ours, render_ours
from tests.pipelines.test_original_ltx2 import PARITY, plain

# diffusers' LTX-2.3 conversion config of the release's vocoder (scripts/convert_ltx2_to_diffusers.py, version 2.3).
RELEASE_BWE_VOCODER = {
    "in_channels": 128, "hidden_channels": 1536, "out_channels": 2, "upsample_kernel_sizes": [11, 4, 4, 4, 4, 4],
    "upsample_factors": [5, 2, 2, 2, 2, 2], "resnet_kernel_sizes": [3, 7, 11], "resnet_dilations": [[1, 3, 5]] * 3,
    "act_fn": "snakebeta", "antialias": True, "antialias_ratio": 2, "antialias_kernel_size": 12,
    "final_act_fn": None, "final_bias": False, "bwe_in_channels": 128, "bwe_hidden_channels": 512,
    "bwe_out_channels": 2, "bwe_upsample_kernel_sizes": [12, 11, 4, 4, 4], "bwe_upsample_factors": [6, 5, 2, 2, 2],
    "bwe_resnet_kernel_sizes": [3, 7, 11], "bwe_resnet_dilations": [[1, 3, 5]] * 3, "bwe_act_fn": "snakebeta",
    "bwe_antialias": True, "bwe_antialias_ratio": 2, "bwe_antialias_kernel_size": 12, "bwe_final_act_fn": None,
    "bwe_final_bias": False, "filter_length": 512, "hop_length": 80, "window_length": 512, "num_mel_channels": 64,
    "input_sampling_rate": 16000, "output_sampling_rate": 48000,
}  # fmt: skip


def vocoder_file(tiny_root: Path) -> Path:
    return tiny_root / LTX23_REPACKAGE_MODEL_ID / LTX23_REPACKAGE_PARTS["vocoder"]


def test_the_key_map_names_ltx2s_layers():
    expected = {
        "vocoder.conv_in.weight": "vocoder.vocoder.conv_pre.weight",
        "vocoder.upsamplers.3.bias": "vocoder.vocoder.ups.3.bias",
        "vocoder.resnets.4.acts1.2.act.beta": "vocoder.vocoder.resblocks.4.acts1.2.act.beta",
        "vocoder.resnets.0.acts2.0.downsample.filter": "vocoder.vocoder.resblocks.0.acts2.0.downsample.lowpass.filter",
        "bwe_generator.act_out.upsample.filter": "vocoder.bwe_generator.act_post.upsample.filter",
        "bwe_generator.conv_out.weight": "vocoder.bwe_generator.conv_post.weight",
        "mel_stft.stft_fn.forward_basis": "vocoder.mel_stft.stft_fn.forward_basis",
        "mel_stft.mel_basis": "vocoder.mel_stft.mel_basis",
    }  # fmt: skip
    assert {key: bwe_vocoder_key_to_original(key) for key in expected} == expected


def test_every_tensor_of_the_file_loads_into_the_diffusers_vocoder_unchanged(tiny_root):
    file = vocoder_file(tiny_root)
    tensors = load_file(str(file))
    assert any(key.startswith("vocoder.vocoder.resblocks.") for key in tensors)
    assert not any(".resnets." in key or "conv_in" in key for key in tensors)  # LTX-2's names, not diffusers'
    original = identify([file])
    assert original.class_name == "LTX2VocoderWithBWE"
    assert {entry.checkpoint_key for entry in original.entries.values()} == set(tensors)  # every tensor used
    loaded = load_model_from_files([file], torch_dtype=torch.float32)
    reference = load_model_from_files([tiny_root / LTX23_MODEL_ID / "vocoder"], torch_dtype=torch.float32)
    assert type(loaded) is type(reference) and plain(loaded.config) == plain(reference.config)
    ours, theirs = loaded.state_dict(), reference.state_dict()
    assert set(ours) == set(theirs) and all(torch.equal(ours[key], theirs[key]) for key in ours)


def test_the_pipeline_from_the_repackaged_files_renders_the_diffusers_48_khz_waveform(tiny_root):
    configs = [ModelConfig(model_id=LTX23_REPACKAGE_MODEL_ID, origin_file_pattern=pattern)
               for pattern in (*LTX23_REPACKAGE_PATTERNS.values(), *LTX23_REPACKAGE_PARTS.values())]
    configs.append(ModelConfig(model_id=LTX23_MODEL_ID, origin_file_pattern=LTX23_PATTERNS["text_encoder"]))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        repackaged = LTX2AudioVideoPipeline.from_pretrained(torch.float32, "cpu", configs)
    assert repackaged.model_configs["vocoder"].origin_file_pattern == LTX23_REPACKAGE_PARTS["vocoder"]
    assert repackaged.audio_sample_rate == VOCODER_OUTPUT_RATE
    reference = render_ours(load_ours(tiny_root))
    assert max(distance(render_ours(repackaged), reference)) < PARITY
    # with teeth: another seed moves both the frames and the waveform far more
    assert min(distance(render_ours(repackaged, seed=8), reference)) > 100 * PARITY


@pytest.mark.parametrize("key", ["vocoder.vocoder.resblocks.0.acts2.1.act.alpha",
                                 "vocoder.bwe_generator.ups.2.weight", "vocoder.mel_stft.stft_fn.inverse_basis"])
def test_a_truncated_vocoder_file_is_refused_naming_the_file_and_the_key(tmp_path, tiny_root, key):
    source = vocoder_file(tiny_root)
    tensors = load_file(str(source))
    del tensors[key]
    file = tmp_path / source.name
    with safe_open(str(source), framework="pt") as handle:
        save_file(tensors, str(file), metadata=handle.metadata())
    with pytest.raises(ModelLoadError, match=rf"{source.name} lacks .*{key.replace('.', '[.]')}"):
        identify([file])


def test_an_extender_that_does_not_read_the_first_vocoders_mel_bins_is_refused(tiny_root):
    file = vocoder_file(tiny_root)
    shapes = {key: tuple(tensor.shape) for key, tensor in load_file(str(file)).items()}
    with safe_open(str(file), framework="pt") as handle:
        section = json.loads(handle.metadata()["config"])["vocoder"]
    bins, frequencies = shapes["vocoder.mel_stft.mel_basis"]
    shapes["vocoder.mel_stft.mel_basis"] = (bins + 1, frequencies)
    with pytest.raises(ModelLoadError, match=rf"{file.name}: the bandwidth extender reads {2 * bins} channels"):
        bwe_vocoder_config(shapes, section, file)


def test_the_final_activation_follows_ltx2s_metadata(tiny_root):
    file = vocoder_file(tiny_root)
    shapes = {key: tuple(tensor.shape) for key, tensor in load_file(str(file)).items()}
    with safe_open(str(file), framework="pt") as handle:
        section = json.loads(handle.metadata()["config"])["vocoder"]
    for flags, final in (({"use_tanh_at_final": False}, "clamp"), ({"apply_final_activation": True}, "tanh"),
                         ({"apply_final_activation": False, "use_tanh_at_final": True}, None)):
        main = {key: value for key, value in section["vocoder"].items()
                if key not in ("apply_final_activation", "use_tanh_at_final")}
        config = bwe_vocoder_config(shapes, {**section, "vocoder": {**main, **flags}}, file)
        assert config["final_act_fn"] == final and config["bwe_final_act_fn"] is None  # LTX-2 never ends the extender


def test_the_release_structure_is_read_from_its_tensors_alone():
    from accelerate import init_empty_weights
    from diffusers.pipelines.ltx2.vocoder import LTX2VocoderWithBWE

    with init_empty_weights():
        release = LTX2VocoderWithBWE(**RELEASE_BWE_VOCODER)
    entries = {bwe_vocoder_key_to_original(key): CheckpointEntry(file=Path("audio_vocoder.safetensors"),
                                                                 checkpoint_key=bwe_vocoder_key_to_original(key),
                                                                 shape=tuple(tensor.shape))
               for key, tensor in release.state_dict().items()}
    assert {"vocoder.vocoder.resblocks.17.acts2.2.act.beta", "vocoder.bwe_generator.ups.4.weight",
            "vocoder.vocoder.act_post.downsample.lowpass.filter", "vocoder.mel_stft.mel_basis"} <= set(entries)
    found = vocoder_model(Path("audio_vocoder.safetensors"), entries, {})  # the reference's splitter writes no metadata
    with init_empty_weights():
        built = LTX2VocoderWithBWE.from_config(found.config)
    assert plain(built.config) == plain(release.config)
    assert set(found.entries) == set(release.state_dict())
