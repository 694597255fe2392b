"""A tiny random-weight LTX-2 repo (``Lightricks/LTX-2``) in the released diffusers layout.

The components are the real classes diffusers' ``LTX2Pipeline`` assembles: ``LTX2VideoTransformer3DModel``
(``transformer/``, sharded), ``AutoencoderKLLTX2Video`` (``vae/``), ``AutoencoderKLLTX2Audio`` (``audio_vae/``),
``LTX2Vocoder`` (``vocoder/``) and ``LTX2TextConnectors`` (``connectors/``) from ``diffusers.pipelines.ltx2``, and
transformers' ``Gemma3ForConditionalGeneration`` (``text_encoder/``, sharded, with a one-layer SigLIP tower as the
release has one) with a ``GemmaTokenizer`` (``tokenizer/``), plus ``scheduler/`` and the root ``model_index.json``
naming ``LTX2Pipeline``. Both this package's loader and ``LTX2Pipeline.from_pretrained`` read it.

Sizes follow the constraints the classes put on each other: the Gemma hidden size is the connectors' and the
transformer's ``caption_channels`` and the connectors' attention width; the connectors read ``num_hidden_layers + 1``
stacked hidden states; the audio token width (latent channels x mel bins / 4) equals the video latent channels, as in
the release (128 each), so the two token streams have one width; the audio latents have the release's 8 channels (a
pipeline loaded without the audio VAE assumes them); the vocoder reads the audio VAE's stereo mel bins. The audio VAE
compresses 4x in time and in mel bins, as the release's, so that encoding a training clip's sound gives latents of
the transformer's width. The video VAE compresses 2x in time and space (encoder and decoder alike), so 32 x 32 pixels
and 5 frames make 3 x 16 x 16 latent tokens. The latent statistics of both VAEs are random rather than the classes'
zeros and ones, so that normalising latents is tested. The transformer's rotary positions use the release's VAE
scale factors (8, 32, 32), which LTX-2's own files do not record (``pipelines/ltx2/original.py`` assumes them), so
that the repackaged tiny files (``tiny_ltx2_repackage``) describe the same model.

No Gemma tokenizer files exist offline: the tokenizer is a ``GemmaTokenizer`` with Gemma's special tokens, the 256 byte
tokens and single characters, built from scratch; it pads on the left, as the Gemma chat tokenizer does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from ..pipelines.ltx2.units import SCHEDULER_CONFIG
from .tiny_common import SHARD_SIZE, model_index, padded, prepare_repo, seeded, write_json

LTX2_MODEL_ID = "Lightricks/LTX-2"

# Patterns that select each component of the tiny repo, as given to --model_id_with_origin_paths.
LTX2_PATTERNS = {
    "dit": "transformer/diffusion_pytorch_model*.safetensors",
    "text_encoder": "text_encoder/model*.safetensors",
    "connectors": "connectors/diffusion_pytorch_model.safetensors",
    "vae": "vae/diffusion_pytorch_model.safetensors",
    "audio_vae": "audio_vae/diffusion_pytorch_model.safetensors",
    "vocoder": "vocoder/diffusion_pytorch_model.safetensors",
    "tokenizer": "tokenizer/",
}


TEXT_HIDDEN_SIZE = 32
TEXT_LAYERS = 2
VIDEO_LATENT_CHANNELS = 8
AUDIO_LATENT_CHANNELS = 8
AUDIO_MEL_BINS = 4

GEMMA_SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")
GEMMA_IMAGE_TOKENS = ("<start_of_image>", "<end_of_image>", "<image_soft_token>")
_CHARACTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,!?'\"-:;\u2581"

_COMPONENTS = {
    "audio_vae": ("diffusers", "AutoencoderKLLTX2Audio"),
    "connectors": ("ltx2", "LTX2TextConnectors"),
    "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
    "text_encoder": ("transformers", "Gemma3ForConditionalGeneration"),
    "tokenizer": ("transformers", "GemmaTokenizer"),
    "transformer": ("diffusers", "LTX2VideoTransformer3DModel"),
    "vae": ("diffusers", "AutoencoderKLLTX2Video"),
    "vocoder": ("ltx2", "LTX2Vocoder"),
}
# Seed offsets per component.
_SEEDS = {"text_encoder": 0, "transformer": 1, "connectors": 2, "vae": 3, "audio_vae": 4, "vocoder": 5}


def build_gemma_tokenizer():
    """A ``GemmaTokenizer`` with Gemma's special and image tokens, byte-fallback tokens and single characters, adding
    ``<bos>`` and padding on the left."""
    from transformers import GemmaTokenizer

    vocab = {token: index for index, token in enumerate(GEMMA_SPECIAL_TOKENS)}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for token in (*_CHARACTERS, *GEMMA_IMAGE_TOKENS):
        vocab.setdefault(token, len(vocab))
    tokenizer = GemmaTokenizer(vocab=vocab, merges=[], add_bos_token=True)
    tokenizer.add_special_tokens({"additional_special_tokens": list(GEMMA_IMAGE_TOKENS)})
    tokenizer.padding_side = "left"
    return tokenizer


def _gemma(tokenizer):
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    token = tokenizer.convert_tokens_to_ids
    text = dict(
        vocab_size=padded(len(tokenizer)), hidden_size=TEXT_HIDDEN_SIZE, intermediate_size=64,
        num_hidden_layers=TEXT_LAYERS, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        max_position_embeddings=512, sliding_window=16, pad_token_id=token("<pad>"), bos_token_id=token("<bos>"),
        eos_token_id=token("<eos>"),
    )  # fmt: skip
    # One merged image token per 2 x 2 patches of a 28-pixel image.
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=1,
                          boi_token_index=token("<start_of_image>"), eoi_token_index=token("<end_of_image>"),
                          image_token_index=token("<image_soft_token>"))
    return Gemma3ForConditionalGeneration(config)


def _transformer(**switches):
    """The tiny transformer; ``switches`` are config entries set on top (LTX-2.3's, in ``tiny_ltx23``)."""
    from diffusers import LTX2VideoTransformer3DModel

    return LTX2VideoTransformer3DModel(
        in_channels=VIDEO_LATENT_CHANNELS, out_channels=VIDEO_LATENT_CHANNELS, patch_size=1, patch_size_t=1,
        num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
        audio_in_channels=AUDIO_LATENT_CHANNELS * AUDIO_MEL_BINS // 4,
        audio_out_channels=AUDIO_LATENT_CHANNELS * AUDIO_MEL_BINS // 4, audio_num_attention_heads=2,
        audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2, caption_channels=TEXT_HIDDEN_SIZE,
        vae_scale_factors=(8, 32, 32), rope_double_precision=False, rope_type="split", **switches,
    )  # fmt: skip


def _connectors(**switches):
    """The tiny text connectors; ``switches`` are config entries set on top (LTX-2.3's, in ``tiny_ltx23``)."""
    from diffusers.pipelines.ltx2 import LTX2TextConnectors

    config = {
        "caption_channels": TEXT_HIDDEN_SIZE, "text_proj_in_factor": TEXT_LAYERS + 1,
        "video_connector_num_attention_heads": 4, "video_connector_attention_head_dim": TEXT_HIDDEN_SIZE // 4,
        "video_connector_num_layers": 1, "video_connector_num_learnable_registers": None,
        "audio_connector_num_attention_heads": 4, "audio_connector_attention_head_dim": TEXT_HIDDEN_SIZE // 4,
        "audio_connector_num_layers": 1, "audio_connector_num_learnable_registers": None,
        "connector_rope_base_seq_len": 32, "rope_double_precision": False, "rope_type": "split",
    }  # fmt: skip
    return LTX2TextConnectors(**{**config, **switches})


def _random_statistics(model: torch.nn.Module) -> None:
    """Replaces the zero mean and unit std latent statistics with random ones (std within [0.5, 1.5])."""
    with torch.no_grad():
        model.latents_mean.copy_(torch.randn_like(model.latents_mean) * 0.2)
        model.latents_std.copy_(torch.rand_like(model.latents_std) + 0.5)


def _video_vae():
    from diffusers import AutoencoderKLLTX2Video

    vae = AutoencoderKLLTX2Video(
        in_channels=3, out_channels=3, latent_channels=VIDEO_LATENT_CHANNELS, block_out_channels=(8,),
        decoder_block_out_channels=(8,), layers_per_block=(1, 1), decoder_layers_per_block=(1, 1),
        spatio_temporal_scaling=(True,), decoder_spatio_temporal_scaling=(True,), decoder_inject_noise=(False, False),
        downsample_type=("spatiotemporal",), upsample_residual=(False,), upsample_factor=(1,), timestep_conditioning=False,
        patch_size=1, patch_size_t=1, encoder_causal=True, decoder_causal=False,
    )  # fmt: skip
    _random_statistics(vae)
    return vae


def _audio_vae():
    from diffusers import AutoencoderKLLTX2Audio

    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=AUDIO_LATENT_CHANNELS * AUDIO_MEL_BINS // 4, output_channels=2, ch_mult=(1, 1, 1),
        num_res_blocks=1,
        in_channels=2, resolution=32, latent_channels=AUDIO_LATENT_CHANNELS, sample_rate=16000, mel_hop_length=160,
        is_causal=True, mel_bins=AUDIO_MEL_BINS,
    )  # fmt: skip
    _random_statistics(audio_vae)
    return audio_vae


def _vocoder():
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    return LTX2Vocoder(in_channels=2 * AUDIO_MEL_BINS, hidden_channels=32, out_channels=2, upsample_kernel_sizes=[4, 4],
                       upsample_factors=[2, 2], resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]],
                       output_sampling_rate=16000)


def build_tiny_ltx2(root: Path, model_id: str = LTX2_MODEL_ID, seed: int = 0) -> Path:
    """Writes the tiny LTX-2 repo at ``root/<model_id>`` (float32 weights; see the module docstring for the layout).

    Seeds: ``seed`` plus one offset per component (``_SEEDS``).
    """
    return write_ltx2_repo(prepare_repo(root, model_id), seed, {"transformer": _transformer,
                                                                 "connectors": _connectors, "vocoder": _vocoder},
                           _COMPONENTS)


def write_ltx2_repo(repo: Path, seed: int, builders: dict[str, Callable[[], torch.nn.Module]],
                    components: dict) -> Path:
    """Writes a tiny LTX-2-family repo in the diffusers layout at ``repo``: Gemma and its tokenizer, the VAEs, and the
    models ``builders`` give (``transformer``, ``connectors``, ``vocoder``), each under its seed offset."""
    tokenizer = build_gemma_tokenizer()
    tokenizer.save_pretrained(repo / "tokenizer")
    builders = {"text_encoder": lambda: _gemma(tokenizer), "vae": _video_vae, "audio_vae": _audio_vae, **builders}
    for folder, build in builders.items():
        with seeded(seed + _SEEDS[folder]):
            model = build()
        # The transformer and the text encoder are sharded with an index, like the release; the rest is one file.
        shard = SHARD_SIZE if folder in ("transformer", "text_encoder") else "1GB"
        model.save_pretrained(repo / folder, max_shard_size=shard)
    write_json(repo / "scheduler" / "scheduler_config.json", SCHEDULER_CONFIG)
    write_json(repo / "model_index.json", model_index("LTX2Pipeline", components))
    return repo


LTX2_BUILDERS = {"ltx2": build_tiny_ltx2}
