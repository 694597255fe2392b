"""Tiny random-weight FLUX.1 repos (``black-forest-labs/FLUX.1-dev``, ``FLUX.1-Kontext-dev`` and ``FLUX.1-Krea-dev``)
in the released layout: BFL's single files and the diffusers folders beside them.

Each repo holds what the released one does:

- ``flux1-dev.safetensors`` (``flux1-kontext-dev.safetensors``, ``flux1-krea-dev.safetensors``): the transformer in
  BFL's layout, and ``ae.safetensors``: the VAE in the LDM layout (``pipelines/flux/original.py`` writes both);
- ``transformer/`` (``FluxTransformer2DModel``, sharded with an index) holding the same weights as the single file,
  ``vae/`` (``AutoencoderKL``) the same as ``ae.safetensors``;
- ``text_encoder/`` (``CLIPTextModel``, one ``model.safetensors``), ``text_encoder_2/`` (``T5EncoderModel``, sharded
  ``model-0000i-of-0000n.safetensors`` with an index), ``tokenizer/`` (CLIP's byte-level BPE), ``tokenizer_2/`` (T5);
- ``scheduler/scheduler_config.json`` (FLUX.1's flow-match Euler with dynamic shifting) and ``model_index.json``
  naming ``FluxPipeline`` (``FluxKontextPipeline`` for Kontext), so diffusers' own pipelines load the folder.

The reference's commands load the text encoders and the VAE of FLUX.1-dev beside Kontext's and Krea's transformers,
so the three repos share them (written once per root and seed, hard-linked into each repo); each transformer has its
own seed. The transformer is 2 heads of 32 (rotary axes 4, 14, 14, FLUX.1's proportions) over 64 packed latent
channels, with guidance embedding as in the [dev] releases; its text widths are the tiny encoders' (T5's for
``joint_attention_dim``, CLIP's pooled output for ``pooled_projection_dim``).
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from ..pipelines.flux.original import FLUX1_LATENT_CHANNELS, FLUX1_VAE_CONFIG, transformer_to_original, vae_to_original
from .tiny_common import link_or_copy, model_index, padded, prepare_repo, seeded, write_json
from .tiny_wan import build_t5_tokenizer

if TYPE_CHECKING:
    from transformers import CLIPTokenizer

FLUX1_DEV_MODEL_ID = "black-forest-labs/FLUX.1-dev"
FLUX1_KONTEXT_MODEL_ID = "black-forest-labs/FLUX.1-Kontext-dev"
FLUX1_KREA_MODEL_ID = "black-forest-labs/FLUX.1-Krea-dev"

# Patterns that select each component, as the reference's FLUX.1 commands give them.
FLUX1_PATTERNS = {
    "dit": "flux1-dev.safetensors",
    "text_encoder": "text_encoder/model.safetensors",
    "text_encoder_2": "text_encoder_2/*.safetensors",
    "vae": "ae.safetensors",
    "tokenizer": "tokenizer/",
    "tokenizer_2": "tokenizer_2/",
}
FLUX1_KONTEXT_PATTERNS = {**FLUX1_PATTERNS, "dit": "flux1-kontext-dev.safetensors"}
FLUX1_KREA_PATTERNS = {**FLUX1_PATTERNS, "dit": "flux1-krea-dev.safetensors"}

# scheduler/scheduler_config.json of the FLUX.1 [dev] releases: the pipelines pass mu from the image's token count,
# between base_shift at 256 tokens and max_shift at 4096.
FLUX1_SCHEDULER_CONFIG = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": True,
}

CLIP_HIDDEN_SIZE = 24  # the transformer's pooled_projection_dim
CLIP_MAX_LENGTH = 77  # CLIP's positions; the pipelines pad CLIP prompts to the tokenizer's model_max_length
# The released text_encoder/model.safetensors names CLIPTextModel's tensors text_model.*; transformers 5 saves them
# without the prefix (and strips it when it loads).
CLIP_RELEASED_PREFIX = "text_model."
T5_HIDDEN_SIZE = 32  # the transformer's joint_attention_dim
TRANSFORMER_CONFIG = {
    "patch_size": 1, "in_channels": 4 * FLUX1_LATENT_CHANNELS, "num_layers": 2, "num_single_layers": 4,
    "attention_head_dim": 32, "num_attention_heads": 2, "joint_attention_dim": T5_HIDDEN_SIZE,
    "pooled_projection_dim": CLIP_HIDDEN_SIZE, "guidance_embeds": True, "axes_dims_rope": (4, 14, 14),
}  # fmt: skip
TRANSFORMER_SHARD_SIZE = "1MB"  # three shards, as the releases have
# Words the tiny CLIP tokenizer merges into one token each (every other word is spelled in bytes).
CLIP_WORDS = ("a", "the", "of", "and", "in", "on", "with", "cat", "dog", "man", "woman", "red", "blue", "photo",
              "image")  # fmt: skip

# Per release: its single file, its pipeline, and the seed offset of its transformer.
_RELEASES = {
    FLUX1_DEV_MODEL_ID: ("flux1-dev.safetensors", "FluxPipeline", 3),
    FLUX1_KONTEXT_MODEL_ID: ("flux1-kontext-dev.safetensors", "FluxKontextPipeline", 4),
    FLUX1_KREA_MODEL_ID: ("flux1-krea-dev.safetensors", "FluxPipeline", 5),
}
_CLIP, _T5, _VAE = range(3)  # seed offsets of the shared parts
_COMPONENTS = {
    "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
    "text_encoder": ("transformers", "CLIPTextModel"),
    "text_encoder_2": ("transformers", "T5EncoderModel"),
    "tokenizer": ("transformers", "CLIPTokenizer"),
    "tokenizer_2": ("transformers", "T5TokenizerFast"),
    "transformer": ("diffusers", "FluxTransformer2DModel"),
    "vae": ("diffusers", "AutoencoderKL"),
}
_SHARED_FOLDERS = ("text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "vae")
_SHARED_FILES = ("ae.safetensors",)
_SHARED_CACHE = ".flux1_shared"


def build_clip_tokenizer() -> CLIPTokenizer:
    """A byte-level BPE ``CLIPTokenizer`` like ``openai/clip-vit-large-patch14``'s, in small: the 256 byte symbols
    with and without the end-of-word mark, the merges of ``CLIP_WORDS``, then ``<|startoftext|>`` and
    ``<|endoftext|>`` (also the padding), with CLIP's 77-token limit."""
    from transformers import CLIPTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    vocab = {symbol: index for index, symbol in enumerate(symbols + [symbol + "</w>" for symbol in symbols])}
    merges: list[tuple[str, str]] = []
    for word in CLIP_WORDS:
        pieces = [*word[:-1], word[-1] + "</w>"]
        merged = pieces[0]
        for piece in pieces[1:]:
            if (merged, piece) not in merges:
                merges.append((merged, piece))
            merged += piece
            vocab.setdefault(merged, len(vocab))
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab[special] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=CLIP_MAX_LENGTH)


def _save_single_file(state_dict: dict, path: Path) -> None:
    from safetensors.torch import save_file

    save_file({key: tensor.contiguous() for key, tensor in state_dict.items()}, str(path), metadata={"format": "pt"})


def write_clip(folder: Path, hidden_size: int, seed: int, suffix: str = "", with_projection: bool = False) -> None:
    """Writes the tiny CLIP tokenizer to ``folder/tokenizer<suffix>`` and a random CLIP text encoder of
    ``hidden_size`` (two layers) to ``folder/text_encoder<suffix>/model.safetensors``, its tensors named as released:
    a ``CLIPTextModel``'s ``text_model.*``, or with ``with_projection`` a ``CLIPTextModelWithProjection`` (SDXL's
    second encoder), which transformers saves under those names itself."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    tokenizer = build_clip_tokenizer()
    tokenizer.save_pretrained(folder / f"tokenizer{suffix}")
    with seeded(seed):
        clip = (CLIPTextModelWithProjection if with_projection else CLIPTextModel)(CLIPTextConfig(
            vocab_size=padded(len(tokenizer)), hidden_size=hidden_size, intermediate_size=48,
            num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=CLIP_MAX_LENGTH,
            hidden_act="quick_gelu", projection_dim=hidden_size, bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        ))  # fmt: skip
    # A shard limit above the model's size keeps it in the one model.safetensors the reference's pattern names.
    clip.save_pretrained(folder / f"text_encoder{suffix}", max_shard_size="1GB")
    if not with_projection:
        _prefix_keys(folder / f"text_encoder{suffix}" / "model.safetensors", CLIP_RELEASED_PREFIX)


def _prefix_keys(path: Path, prefix: str) -> None:
    """Rewrites a safetensors file with ``prefix`` before every key."""
    from safetensors.torch import load_file

    _save_single_file({prefix + key: tensor for key, tensor in load_file(str(path)).items()}, path)


def _write_shared(folder: Path, seed: int) -> None:
    """Writes the tokenizers, text encoders and VAE (``vae/`` and ``ae.safetensors``) into ``folder``."""
    from diffusers import AutoencoderKL
    from transformers import T5Config, T5EncoderModel

    write_clip(folder, CLIP_HIDDEN_SIZE, seed + _CLIP)
    t5_tokenizer = build_t5_tokenizer()
    t5_tokenizer.save_pretrained(folder / "tokenizer_2")
    with seeded(seed + _T5):
        t5 = T5EncoderModel(T5Config(
            vocab_size=padded(len(t5_tokenizer)), d_model=T5_HIDDEN_SIZE, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
            relative_attention_num_buckets=8, relative_attention_max_distance=16, feed_forward_proj="gated-gelu",
            pad_token_id=t5_tokenizer.pad_token_id, eos_token_id=t5_tokenizer.eos_token_id, decoder_start_token_id=0,
        ))  # fmt: skip
    t5.save_pretrained(folder / "text_encoder_2", max_shard_size="50KB")
    with seeded(seed + _VAE):
        vae = AutoencoderKL(
            **FLUX1_VAE_CONFIG, in_channels=3, out_channels=3, latent_channels=FLUX1_LATENT_CHANNELS,
            block_out_channels=(32, 32, 64, 64), layers_per_block=1, down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4,
        )  # fmt: skip
    vae.save_pretrained(folder / "vae")
    _save_single_file(vae_to_original(vae.state_dict()), folder / "ae.safetensors")


def _shared_parts(root: Path, seed: int) -> Path:
    """The folder of the shared parts for ``seed`` under ``root``, written on first use."""
    folder = Path(root) / _SHARED_CACHE / f"seed-{seed}"
    if not (folder / "ae.safetensors").is_file():
        partial = folder.with_name(folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        _write_shared(partial, seed)
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
    return folder


def build_tiny_flux1(root: Path, model_id: str = FLUX1_DEV_MODEL_ID, seed: int = 0) -> Path:
    """Writes a tiny FLUX.1 repo (``FLUX.1-dev``, ``-Kontext-dev`` or ``-Krea-dev``) at ``root/<model_id>`` and returns
    its folder (float32 weights).

    Args:
        root: The model base folder (a ``DIFFSYNTH_MODEL_BASE_PATH``).
        model_id: One of the three releases.
        seed: Seed of the random weights; the three repos share text encoders and VAE per seed.

    Raises:
        ValueError: ``model_id`` is not one of the three releases.
    """
    from diffusers import FluxTransformer2DModel

    if model_id not in _RELEASES:
        raise ValueError(f"model_id={model_id!r} is not a FLUX.1 release built here; choose from {sorted(_RELEASES)}")
    single_file, pipeline, transformer_seed = _RELEASES[model_id]
    repo = prepare_repo(root, model_id)
    shared = _shared_parts(root, seed)
    for name in _SHARED_FOLDERS:
        shutil.copytree(shared / name, repo / name, copy_function=link_or_copy)
    for name in _SHARED_FILES:
        link_or_copy(str(shared / name), str(repo / name))
    with seeded(seed + transformer_seed):
        transformer = FluxTransformer2DModel(**TRANSFORMER_CONFIG)
    transformer.save_pretrained(repo / "transformer", max_shard_size=TRANSFORMER_SHARD_SIZE)
    _save_single_file(transformer_to_original(transformer.state_dict()), repo / single_file)
    write_json(repo / "scheduler" / "scheduler_config.json", FLUX1_SCHEDULER_CONFIG)
    write_json(repo / "model_index.json", model_index(pipeline, _COMPONENTS))
    return repo


FLUX1_BUILDERS = {
    "flux1_dev": functools.partial(build_tiny_flux1, model_id=FLUX1_DEV_MODEL_ID),
    "flux1_kontext_dev": functools.partial(build_tiny_flux1, model_id=FLUX1_KONTEXT_MODEL_ID),
    "flux1_krea_dev": functools.partial(build_tiny_flux1, model_id=FLUX1_KREA_MODEL_ID),
}
