"""LTX-2's VAEs and vocoder in its own key layout (``DiffSynth-Studio/LTX-2-Repackage``'s ``video_vae_encoder``,
``video_vae_decoder``, ``audio_vae_encoder``, ``audio_vae_decoder`` and ``audio_vocoder``): each file loads into the
diffusers class with every tensor used and equal to the diffusers-layout one, a half VAE encodes (or decodes) exactly
as the whole one and names the missing file when the other half is called, two halves join, the pipeline from the
files renders what the diffusers one does, and the release's structure is read back from its tensors alone."""

from pathlib import Path

import pytest
import torch
from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video
from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from diffsynth.core.loader import ModelConfig, ModelLoadError
from diffsynth.core.loader.loading import load_model_from_files
from diffsynth.core.loader.original_layout import AbsentPart, join_parts
from diffsynth.core.loader.state_dict import CheckpointEntry
from diffsynth.pipelines import LTX2AudioVideoPipeline
from diffsynth.pipelines.ltx2.original import identify
from diffsynth.pipelines.ltx2.original_audio import (
    audio_vae_key_to_original,
    audio_vae_model,
    vocoder_key_to_original,
    vocoder_model,
)
from diffsynth.pipelines.ltx2.original_vae import video_vae_key_namer, video_vae_model
from diffsynth.testing.tiny_ltx2 import LTX2_MODEL_ID, LTX2_PATTERNS
from diffsynth.testing.tiny_ltx2_repackage import LTX2_REPACKAGE_MODEL_ID, LTX2_REPACKAGE_PARTS, LTX2_REPACKAGE_PATTERNS

from .test_ltx2 import distance, load_ours, render_ours

PARITY = 1e-6
# Each part file: the diffusers folder it matches, the half it holds (None: the whole model).
PARTS = {"vae_encoder": ("vae", "encoder"), "vae_decoder": ("vae", "decoder"),
         "audio_vae_encoder": ("audio_vae", "encoder"), "audio_vae_decoder": ("audio_vae", "decoder"),
         "vocoder": ("vocoder", None)}
# Statistics of the release's video VAE that diffusers' class does not hold (the files keep them; loading skips them).
UNUSED = ("vae.per_channel_statistics.channel", "vae.per_channel_statistics.mean-of-stds")
_DECODER = ("decoder_block_out_channels", "decoder_layers_per_block", "decoder_spatio_temporal_scaling",
            "decoder_inject_noise", "upsample_type", "upsample_residual", "upsample_factor", "timestep_conditioning")
# Settings a half file does not describe (the other half's), and those diffusers leaves to be computed.
OTHER_HALF = {
    ("vae", "encoder"): (*_DECODER, "spatial_compression_ratio", "temporal_compression_ratio"),
    ("vae", "decoder"): ("block_out_channels", "layers_per_block", "spatio_temporal_scaling", "downsample_type",
                         "spatial_compression_ratio", "temporal_compression_ratio"),
    ("audio_vae", "encoder"): ("output_channels",), ("audio_vae", "decoder"): ("in_channels",),
}  # fmt: skip
# The tiny diffusers VAE's config keeps the class's default block types (four, three), of which its one block reads the
# first; the loaded config lists one per block.
BLOCK_TYPES = ("down_block_types", "upsample_type")


def part_file(tiny_root: Path, part: str) -> Path:
    return tiny_root / LTX2_REPACKAGE_MODEL_ID / LTX2_REPACKAGE_PARTS[part]


def diffusers_model(tiny_root: Path, folder: str) -> torch.nn.Module:
    return load_model_from_files([tiny_root / LTX2_MODEL_ID / folder], torch_dtype=torch.float32)


def plain(config) -> dict:
    return {key: list(value) if isinstance(value, tuple) else value for key, value in config.items()
            if not key.startswith("_")}


@pytest.mark.parametrize("part", list(PARTS))
def test_every_tensor_of_the_part_file_loads_into_the_diffusers_model_unchanged(tiny_root, part):
    folder, half = PARTS[part]
    file = part_file(tiny_root, part)
    loaded, reference = load_model_from_files([file], torch_dtype=torch.float32), diffusers_model(tiny_root, folder)
    assert type(loaded) is type(reference)
    ours, theirs = loaded.state_dict(), reference.state_dict()
    prefix = {None: "", "encoder": "encoder.", "decoder": "decoder."}[half]
    wanted = {key for key in theirs if key.startswith(prefix) or "." not in key}  # the half and the statistics
    # one file tensor per model tensor (but the release's unused statistics): none left over, none missing
    assert set(ours) == wanted and len(set(load_file(str(file))) - set(UNUSED)) == len(ours)
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)
    # the settings the file describes are the diffusers model's (the other half's come from the other file)
    described = [key for key in plain(loaded.config) if key not in (*OTHER_HALF.get((folder, half), ()), *BLOCK_TYPES)]
    assert _settings(loaded.config, described) == _settings(reference.config, described)
    if half is not None:
        other = getattr(loaded, "decoder" if half == "encoder" else "encoder")
        assert isinstance(other, AbsentPart) and not list(other.parameters())


def test_the_encoder_file_alone_encodes_the_latents_of_the_whole_diffusers_vae(tiny_root):
    encoder = load_model_from_files([part_file(tiny_root, "vae_encoder")], torch_dtype=torch.float32)
    whole = diffusers_model(tiny_root, "vae")
    video = torch.rand(1, 3, 5, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        ours, theirs = encoder.encode(video).latent_dist.mean, whole.encode(video).latent_dist.mean
    assert ours.shape == theirs.shape and torch.equal(ours, theirs)
    assert (encoder.spatial_compression_ratio, encoder.temporal_compression_ratio) == (
        whole.spatial_compression_ratio, whole.temporal_compression_ratio)
    audio_encoder = load_model_from_files([part_file(tiny_root, "audio_vae_encoder")], torch_dtype=torch.float32)
    audio_whole = diffusers_model(tiny_root, "audio_vae")
    mel = torch.randn(1, 2, 16, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(audio_encoder.encode(mel).latent_dist.mean, audio_whole.encode(mel).latent_dist.mean)


@pytest.mark.parametrize(("part", "call", "missing"), [
    ("vae_encoder", lambda vae: vae.decode(torch.zeros(1, 8, 2, 2, 2)), "video_vae_decoder.safetensors"),
    ("vae_decoder", lambda vae: vae.encode(torch.zeros(1, 3, 1, 8, 8)), "video_vae_encoder.safetensors"),
    ("audio_vae_encoder", lambda vae: vae.decode(torch.zeros(1, 8, 4, 1)), "audio_vae_decoder.safetensors"),
])  # fmt: skip
def test_calling_the_missing_half_names_the_file_to_add(tiny_root, part, call, missing):
    vae = load_model_from_files([part_file(tiny_root, part)], torch_dtype=torch.float32)
    with pytest.raises(ModelLoadError, match=rf"{LTX2_REPACKAGE_PARTS[part]} holds .* without its .*add {missing}"):
        call(vae)


def test_the_two_halves_join_into_the_whole_vae(tiny_root):
    first = load_model_from_files([part_file(tiny_root, "vae_decoder")], torch_dtype=torch.float32)
    second = load_model_from_files([part_file(tiny_root, "vae_encoder")], torch_dtype=torch.float32)
    whole = diffusers_model(tiny_root, "vae")
    assert join_parts(first, second)
    ours, theirs = first.state_dict(), whole.state_dict()
    assert set(ours) == set(theirs) and all(torch.equal(ours[key], theirs[key]) for key in ours)
    ignored = ("spatial_compression_ratio", "temporal_compression_ratio", *BLOCK_TYPES)
    assert {key: value for key, value in plain(first.config).items() if key not in ignored} == {
        key: value for key, value in plain(whole.config).items() if key not in ignored}
    assert (first.spatial_compression_ratio, first.temporal_compression_ratio) == (2, 2)
    # a whole model, or a half of the same side, is no other half: the caller reports a second model
    assert not join_parts(first, whole)
    assert not join_parts(load_model_from_files([part_file(tiny_root, "vae_encoder")], torch_dtype=torch.float32),
                          load_model_from_files([part_file(tiny_root, "vae_encoder")], torch_dtype=torch.float32))


def test_halves_of_two_different_models_are_refused(tmp_path, tiny_root):
    source = part_file(tiny_root, "vae_decoder")
    tensors = load_file(str(source))
    tensors["vae.per_channel_statistics.mean-of-means"] = tensors["vae.per_channel_statistics.mean-of-means"] + 1
    file = tmp_path / "video_vae_decoder.safetensors"
    save_file(tensors, str(file))
    first = load_model_from_files([part_file(tiny_root, "vae_encoder")], torch_dtype=torch.float32)
    with pytest.raises(ModelLoadError, match="describe different models.*latents_mean differs"):
        join_parts(first, load_model_from_files([file], torch_dtype=torch.float32))


def _configs(tiny_root, parts, diffusers_slots):
    configs = [ModelConfig(model_id=LTX2_REPACKAGE_MODEL_ID, origin_file_pattern=pattern)
               for pattern in (*LTX2_REPACKAGE_PATTERNS.values(), *(LTX2_REPACKAGE_PARTS[part] for part in parts))]
    configs += [ModelConfig(model_id=LTX2_MODEL_ID, origin_file_pattern=LTX2_PATTERNS[slot])
                for slot in diffusers_slots]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSYNTH_MODEL_BASE_PATH", str(tiny_root))
        return LTX2AudioVideoPipeline.from_pretrained(torch.float32, "cpu", configs)


@pytest.mark.parametrize("parts", [
    pytest.param(list(PARTS), id="both-halves"),
    pytest.param(["vae_decoder", "audio_vae_decoder", "vocoder"], id="decoders-as-the-reference-infers"),
])  # fmt: skip
def test_the_pipeline_from_the_repackaged_files_renders_what_the_diffusers_one_does(tiny_root, parts):
    repackaged = _configs(tiny_root, parts, ["text_encoder"])
    reference = render_ours(load_ours(tiny_root))
    assert max(distance(render_ours(repackaged), reference)) < PARITY
    # with teeth: another seed moves both the frames and the waveform far more
    assert min(distance(render_ours(repackaged, seed=8), reference)) > 100 * PARITY


def test_a_truncated_part_file_is_refused_naming_the_file_and_the_key(tmp_path, tiny_root):
    for part, key in (("vae_encoder", "vae.encoder.down_blocks.0.res_blocks.0.conv2.conv.bias"),
                      ("vae_decoder", "vae.decoder.up_blocks.1.conv.conv.bias"),
                      ("audio_vae_decoder", "audio_vae.decoder.up.1.block.1.conv1.conv.weight"),
                      ("audio_vae_encoder", "audio_vae.per_channel_statistics.std-of-means"),
                      ("vocoder", "vocoder.resblocks.1.convs2.2.bias")):
        source = part_file(tiny_root, part)
        tensors = load_file(str(source))
        del tensors[key]
        file = tmp_path / source.name
        with safe_open(str(source), framework="pt") as handle:
            save_file(tensors, str(file), metadata=handle.metadata())
        with pytest.raises(ModelLoadError, match=rf"{source.name} lacks .*{key.replace('.', '[.]')}"):
            identify([file])


# ---- the release's structure from its tensors alone (no metadata; built on the meta device) -----------------------

# diffusers' LTX-2 release configs (Lightricks/LTX-2 vae/, audio_vae/, vocoder/).
RELEASE_VAE = dict(
    latent_channels=128, block_out_channels=(256, 512, 1024, 2048), decoder_block_out_channels=(256, 512, 1024),
    layers_per_block=(4, 6, 6, 2, 2), decoder_layers_per_block=(5, 5, 5, 5),
    spatio_temporal_scaling=(True,) * 4, decoder_spatio_temporal_scaling=(True,) * 3,
    decoder_inject_noise=(False,) * 4, downsample_type=("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
    upsample_residual=(True,) * 3, upsample_factor=(2, 2, 2), timestep_conditioning=False, patch_size=4,
    decoder_causal=False, spatial_compression_ratio=32, temporal_compression_ratio=8,
)  # fmt: skip
# LTX-2.3's video VAE, as the reference's block lists describe it (other depths, a compression without more channels,
# non-residual upsamplers in another order).
LTX23_VAE = dict(
    RELEASE_VAE, block_out_channels=(256, 512, 1024, 1024), layers_per_block=(4, 6, 4, 2, 2),
    decoder_block_out_channels=(256, 512, 512, 1024), decoder_layers_per_block=(4, 6, 4, 2, 2),
    decoder_spatio_temporal_scaling=(True,) * 4, decoder_inject_noise=(False,) * 5,
    upsample_type=("spatiotemporal", "spatiotemporal", "temporal", "spatial"), upsample_residual=(False,) * 4,
    upsample_factor=(2, 2, 1, 2),
)  # fmt: skip
RELEASE_AUDIO_VAE = dict(base_channels=128, output_channels=2, ch_mult=(1, 2, 4), num_res_blocks=2, in_channels=2,
                         latent_channels=8, mel_bins=64, sample_rate=16000, mel_hop_length=160, is_causal=True)
RELEASE_VOCODER = dict(in_channels=128, hidden_channels=1024, out_channels=2, upsample_kernel_sizes=[16, 15, 8, 4, 4],
                       upsample_factors=[6, 5, 2, 2, 2], resnet_kernel_sizes=[3, 7, 11],
                       resnet_dilations=[[1, 3, 5]] * 3, output_sampling_rate=24000)


def _official_entries(model: torch.nn.Module, namer, extra=()) -> dict[str, CheckpointEntry]:
    names = {namer(key): tuple(tensor.shape) for key, tensor in model.state_dict().items()}
    names.update({key: names["vae.per_channel_statistics.mean-of-means"] for key in extra})
    return {key: CheckpointEntry(file=Path("release.safetensors"), checkpoint_key=key, shape=shape)
            for key, shape in names.items()}


def _settings(config, wanted: dict) -> dict:
    return {key: list(value) if isinstance(value, tuple) else value for key, value in config.items() if key in wanted}


@pytest.mark.parametrize("settings", [RELEASE_VAE, LTX23_VAE], ids=["ltx2", "ltx23-shaped"])
def test_the_video_vaes_structure_is_read_from_the_release_tensors(settings):
    from accelerate import init_empty_weights

    with init_empty_weights():
        release = AutoencoderKLLTX2Video.from_config(settings)
    entries = _official_entries(release, video_vae_key_namer(dict(release.config)), extra=UNUSED)
    # the reference's splitter layout: LTX-2's flat block lists (9 encoder blocks, 7 decoder blocks for LTX-2)
    if settings is RELEASE_VAE:
        assert {"vae.encoder.down_blocks.8.res_blocks.1.conv2.conv.weight",
                "vae.encoder.down_blocks.1.conv.conv.weight",
                "vae.decoder.up_blocks.6.res_blocks.4.conv1.conv.weight", "vae.decoder.up_blocks.1.conv.conv.weight",
                "vae.per_channel_statistics.std-of-means"} <= set(entries)
        assert not any(".resnets." in key or "mid_block" in key for key in entries)
    found = video_vae_model(Path("release.safetensors"), entries, {})
    assert _settings(found.config, settings) == _settings(settings, settings)
    assert set(found.entries) == set(release.state_dict()) and not found.absent


def test_the_audio_vae_and_vocoder_structure_is_read_from_the_release_tensors():
    from accelerate import init_empty_weights

    with init_empty_weights():
        audio, vocoder = AutoencoderKLLTX2Audio(**RELEASE_AUDIO_VAE), LTX2Vocoder(**RELEASE_VOCODER)
    found = audio_vae_model(Path("audio.safetensors"), _official_entries(audio, audio_vae_key_to_original), {})
    assert _settings(found.config, RELEASE_AUDIO_VAE) == _settings(RELEASE_AUDIO_VAE, RELEASE_AUDIO_VAE)
    assert set(found.entries) == set(audio.state_dict())
    found = vocoder_model(Path("vocoder.safetensors"), _official_entries(vocoder, vocoder_key_to_original), {})
    assert _settings(found.config, RELEASE_VOCODER) == _settings(RELEASE_VOCODER, RELEASE_VOCODER)
    assert {"vocoder.conv_pre.weight", "vocoder.ups.4.weight", "vocoder.resblocks.14.convs2.2.bias"} <= {
        entry.checkpoint_key for entry in found.entries.values()}
