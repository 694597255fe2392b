"""A file holding every LTX-2 component (JoyAI-Echo's release, LTX-2.3-shaped): named once, it gives the pipeline
its transformer, text connectors, both VAEs and the vocoder with bandwidth extension, each equal to the
diffusers-layout model, and the pipeline renders what the diffusers one does, the 48 kHz waveform included."""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from diffsynth.core.loader import ModelConfig, ModelLoadError
from diffsynth.core.loader.loading import load_components, load_model_from_files
from diffsynth.pipelines import LTX2AudioVideoPipeline
from diffsynth.pipelines.ltx2.original import identify
from diffsynth.testing.tiny_ltx23 import (
    JOYAI_ECHO_FILE,
    JOYAI_ECHO_MODEL_ID,
    LTX23_MODEL_ID,
    LTX23_PATTERNS,
    VOCODER_OUTPUT_RATE,
)
from tests.pipelines.test_ltx2 import distance
from tests.pipelines.test_ltx23 import load_ours, render_ours

PARITY = 1e-6
JOYAI = ModelConfig(model_id=JOYAI_ECHO_MODEL_ID, origin_file_pattern=JOYAI_ECHO_FILE)
# The diffusers folders the file's components match, by slot.
FOLDERS = {"dit": "transformer", "connectors": "connectors", "vae": "vae", "audio_vae": "audio_vae",
           "vocoder": "vocoder"}


def test_the_file_gives_each_component_equal_to_the_diffusers_one(tiny_root, monkeypatch):
    monkeypatch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
    components = load_components(JOYAI, torch_dtype=torch.float32)
    assert [type(model).__name__ for model in components] == [
        "LTX2VideoTransformer3DModel", "LTX2TextConnectors", "AutoencoderKLLTX2Video", "AutoencoderKLLTX2Audio",
        "LTX2VocoderWithBWE"]
    for model, folder in zip(components, FOLDERS.values()):
        reference = load_model_from_files([tiny_root / LTX23_MODEL_ID / folder], torch_dtype=torch.float32)
        ours, theirs = model.state_dict(), reference.state_dict()
        assert set(ours) == set(theirs) and all(torch.equal(ours[key], theirs[key]) for key in ours)
    # every tensor of the file is used but the video VAE's unused statistics
    file = tiny_root / JOYAI_ECHO_MODEL_ID / JOYAI_ECHO_FILE
    original = identify([file])
    used = {entry.checkpoint_key for model in (original, *original.others) for entry in model.entries.values()}
    assert set(load_file(str(file))) - used == {"vae.per_channel_statistics.channel",
                                                "vae.per_channel_statistics.mean-of-stds"}


def test_the_pipeline_from_the_file_renders_what_the_diffusers_one_does(tiny_root, monkeypatch):
    monkeypatch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
    configs = [JOYAI, ModelConfig(model_id=LTX23_MODEL_ID, origin_file_pattern=LTX23_PATTERNS["text_encoder"])]
    pipe = LTX2AudioVideoPipeline.from_pretrained(torch.float32, "cpu", configs)
    assert all(pipe.model_configs[slot] == JOYAI for slot in FOLDERS)
    assert pipe.audio_sample_rate == VOCODER_OUTPUT_RATE
    reference = render_ours(load_ours(tiny_root))
    assert max(distance(render_ours(pipe), reference)) < PARITY
    assert min(distance(render_ours(pipe, seed=8), reference)) > 100 * PARITY


@pytest.mark.parametrize("key", ["audio_vae.decoder.conv_out.conv.bias", "vocoder.bwe_generator.act_post.act.beta"])
def test_a_truncated_component_of_the_file_is_refused_naming_the_file_and_the_key(tmp_path, tiny_root, key):
    source = tiny_root / JOYAI_ECHO_MODEL_ID / JOYAI_ECHO_FILE
    tensors = load_file(str(source))
    del tensors[key]
    file = tmp_path / JOYAI_ECHO_FILE
    with safe_open(str(source), framework="pt") as handle:
        save_file(tensors, str(file), metadata=handle.metadata())
    with pytest.raises(ModelLoadError, match=rf"{JOYAI_ECHO_FILE} lacks .*{key.replace('.', '[.]')}"):
        identify([file])


def test_ltx2s_single_file_gives_every_component_the_vocoder_too(tmp_path, tiny_root, monkeypatch):
    # Lightricks' ltx-2-19b-dev.safetensors layout: the Repackage files put back together, with their metadata
    from diffsynth.testing.tiny_ltx2 import LTX2_MODEL_ID, LTX2_PATTERNS
    from diffsynth.testing.tiny_ltx2_repackage import LTX2_REPACKAGE_MODEL_ID
    from tests.pipelines import test_ltx2

    repackage = tiny_root / LTX2_REPACKAGE_MODEL_ID
    tensors = {key: value for file in sorted(repackage.glob("*.safetensors"))
               for key, value in load_file(str(file)).items()}
    with safe_open(str(repackage / "transformer.safetensors"), framework="pt") as handle:
        metadata = handle.metadata()
    folder = tmp_path / "Lightricks" / "LTX-2"
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "ltx-2-19b-dev.safetensors"), metadata=metadata)
    text_encoder = tmp_path / LTX2_MODEL_ID / "text_encoder"
    text_encoder.parent.mkdir(parents=True, exist_ok=True)
    text_encoder.symlink_to(tiny_root / LTX2_MODEL_ID / "text_encoder")
    (tmp_path / LTX2_MODEL_ID / "tokenizer").symlink_to(tiny_root / LTX2_MODEL_ID / "tokenizer")
    monkeypatch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tmp_path))
    pipe = LTX2AudioVideoPipeline.from_pretrained(torch.float32, "cpu", [
        ModelConfig(model_id=LTX2_MODEL_ID, origin_file_pattern="ltx-2-19b-dev.safetensors"),
        ModelConfig(model_id=LTX2_MODEL_ID, origin_file_pattern=LTX2_PATTERNS["text_encoder"])])
    assert all(pipe.model_configs[slot].origin_file_pattern == "ltx-2-19b-dev.safetensors"
               for slot in ("dit", "connectors", "vae", "audio_vae", "vocoder"))
    reference = test_ltx2.render_ours(test_ltx2.load_ours(tiny_root))
    assert max(distance(test_ltx2.render_ours(pipe), reference)) < PARITY
