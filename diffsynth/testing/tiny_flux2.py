"""Tiny random-weight FLUX.2 [klein] repos (``black-forest-labs/FLUX.2-klein-4B``, ``-9B``, ``-base-4B``,
``-base-9B``), written in the released diffusers layout.

Each repo holds ``transformer/`` (``Flux2Transformer2DModel``, sharded), ``text_encoder/`` (``Qwen3ForCausalLM``,
sharded), ``tokenizer/`` (byte-level Qwen tokenizer with Qwen3's chat template), ``vae/`` (``AutoencoderKLFlux2``, one
file), ``scheduler/scheduler_config.json`` and ``model_index.json`` naming ``Flux2KleinPipeline`` with its
``is_distilled`` switch (true for the step-distilled klein-4B / 9B, false for the base models, which use CFG), so
diffusers' own ``Flux2KleinPipeline.from_pretrained`` loads the folder.

diffusers stacks the text encoder's hidden states 9, 18 and 27, so the tiny encoder has 28 layers; the transformer's
``joint_attention_dim`` is three times its hidden size. The transformer has as many single-stream blocks as the real
one (20 for 4B, 24 for 9B), because the reference's LoRA scripts name ``single_transformer_blocks.0..N.attn.to_out``
one by one and the trainer refuses targets that match no module. The 9B tiny differs in shape from the 4B one (a wider
text encoder, one more double-stream block), as the real releases do.

A size's base and distilled repos share the text encoder, tokenizer and VAE (as the released ones do): they are written
once per seed and size into a hidden folder under ``root`` and hard-linked into each repo, which keeps the four builds
fast.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from .tiny_common import SHARD_SIZE, link_or_copy, model_index, padded, prepare_repo, seeded, write_json

if TYPE_CHECKING:
    import torch

FLUX2_KLEIN_4B_MODEL_ID = "black-forest-labs/FLUX.2-klein-4B"
FLUX2_KLEIN_9B_MODEL_ID = "black-forest-labs/FLUX.2-klein-9B"
FLUX2_KLEIN_BASE_4B_MODEL_ID = "black-forest-labs/FLUX.2-klein-base-4B"
FLUX2_KLEIN_BASE_9B_MODEL_ID = "black-forest-labs/FLUX.2-klein-base-9B"

# Patterns that select each component, as the reference's klein scripts give them.
FLUX2_PATTERNS = {
    "dit": "transformer/*.safetensors",
    "text_encoder": "text_encoder/*.safetensors",
    "vae": "vae/diffusion_pytorch_model.safetensors",
    "tokenizer": "tokenizer/",
}

# scheduler/scheduler_config.json of the klein releases: flow-match Euler with exponential dynamic shifting; the
# pipeline passes its own ``mu`` (FLUX.2's empirical rule), so the seq-len line below is not what sets the shift.
FLUX2_SCHEDULER_CONFIG = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "invert_sigmas": False,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "shift_terminal": None,
    "stochastic_sampling": False,
    "time_shift_type": "exponential",
    "use_beta_sigmas": False,
    "use_dynamic_shifting": True,
    "use_exponential_sigmas": False,
    "use_karras_sigmas": False,
}

# Per size: the text encoder's hidden size, the double-stream block count and the single-stream block count.
_SIZES = {"4B": (16, 2, 20), "9B": (24, 3, 24)}
TEXT_ENCODER_LAYERS = 28  # hidden states 9, 18 and 27 are read
# Per release: its size, whether it is step-distilled, and the seed offset of its transformer.
_RELEASES = {
    FLUX2_KLEIN_4B_MODEL_ID: ("4B", True, 1),
    FLUX2_KLEIN_BASE_4B_MODEL_ID: ("4B", False, 3),
    FLUX2_KLEIN_9B_MODEL_ID: ("9B", True, 5),
    FLUX2_KLEIN_BASE_9B_MODEL_ID: ("9B", False, 7),
}
_COMPONENTS = {
    "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
    "text_encoder": ("transformers", "Qwen3ForCausalLM"),
    "tokenizer": ("transformers", "Qwen2Tokenizer"),
    "transformer": ("diffusers", "Flux2Transformer2DModel"),
    "vae": ("diffusers", "AutoencoderKLFlux2"),
}
_SHARED_CACHE = ".flux2_klein_shared"


def _write_shared(folder: Path, size: str, seed: int) -> None:
    """Writes ``tokenizer/``, ``text_encoder/`` (seed ``seed``) and ``vae/`` (seed ``seed + 2``) into ``folder``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from .tiny_z_image import build_qwen3_tokenizer  # the byte-level Qwen3 tokenizer the Z-Image repos use too

    tokenizer = build_qwen3_tokenizer()
    tokenizer.save_pretrained(folder / "tokenizer")
    token = tokenizer.convert_tokens_to_ids
    hidden = _SIZES[size][0]
    config = Qwen3Config(
        vocab_size=padded(len(tokenizer)), hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=TEXT_ENCODER_LAYERS, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
        max_position_embeddings=1024, tie_word_embeddings=size == "4B", bos_token_id=token("<|endoftext|>"),
        eos_token_id=token("<|im_end|>"), pad_token_id=token("<|endoftext|>"),
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    )  # fmt: skip
    with seeded(seed):
        text_encoder = Qwen3ForCausalLM(config)
    text_encoder.save_pretrained(folder / "text_encoder", max_shard_size=SHARD_SIZE)
    write_flux2_vae(folder / "vae", seed + 2)


def write_flux2_vae(folder: Path, seed: int) -> None:
    """Writes a tiny ``AutoencoderKLFlux2`` (32 latent channels) with random batch-norm statistics into ``folder``."""
    import torch
    from diffusers import AutoencoderKLFlux2

    with seeded(seed):
        vae = AutoencoderKLFlux2(
            block_out_channels=(8, 16, 16, 16), layers_per_block=1, norm_num_groups=8, latent_channels=32,
        )
        # The released VAE's batch-norm statistics normalise the patchified latents; random ones make the tests see
        # whether they are applied.
        vae.bn.running_mean.copy_(torch.randn_like(vae.bn.running_mean) * 0.1)
        vae.bn.running_var.copy_(torch.rand_like(vae.bn.running_var) + 0.5)
    vae.save_pretrained(folder)


def tiny_flux2_transformer(seed: int, double_blocks: int, single_blocks: int, text_hidden: int,
                           guidance_embeds: bool, timestep_channels: int = 32) -> torch.nn.Module:
    """A tiny ``Flux2Transformer2DModel``: 2 heads of 16, reading prompt embeddings of three stacked text-encoder
    layers of width ``text_hidden``; ``guidance_embeds`` for a guidance-distilled model; ``timestep_channels`` wide
    sinusoidal embeddings of the timestep and guidance (the releases' 256, which ComfyUI fixes, or fewer)."""
    from diffusers import Flux2Transformer2DModel

    with seeded(seed):
        return Flux2Transformer2DModel(
            patch_size=1, in_channels=128, num_layers=double_blocks, num_single_layers=single_blocks,
            attention_head_dim=16, num_attention_heads=2, joint_attention_dim=3 * text_hidden,
            timestep_guidance_channels=timestep_channels, mlp_ratio=3.0, axes_dims_rope=(4, 4, 4, 4),
            guidance_embeds=guidance_embeds,
        )  # fmt: skip


def write_flux2_transformer(folder: Path, seed: int, double_blocks: int, single_blocks: int, text_hidden: int,
                            guidance_embeds: bool) -> None:
    """Writes :func:`tiny_flux2_transformer` into ``folder``, sharded."""
    transformer = tiny_flux2_transformer(seed, double_blocks, single_blocks, text_hidden, guidance_embeds)
    transformer.save_pretrained(folder, max_shard_size=SHARD_SIZE)


def _shared_parts(root: Path, size: str, seed: int) -> Path:
    """The folder of one size's shared parts for ``seed`` under ``root``, written on first use."""
    folder = Path(root) / _SHARED_CACHE / f"{size}-seed-{seed}"
    if not (folder / "vae" / "config.json").is_file():
        partial = folder.with_name(folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        _write_shared(partial, size, seed)
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
    return folder


def build_tiny_flux2_klein(root: Path, model_id: str = FLUX2_KLEIN_4B_MODEL_ID, seed: int = 0) -> Path:
    """Writes a tiny FLUX.2 [klein] repo at ``root/<model_id>`` and returns its folder (float32 weights).

    Args:
        root: The model base folder (a ``DIFFSYNTH_MODEL_BASE_PATH``).
        model_id: One of the four klein releases.
        seed: Seed of the random weights; a size's base and distilled repos share text encoder and VAE per seed.

    Raises:
        ValueError: ``model_id`` is not a klein release.
    """
    if model_id not in _RELEASES:
        raise ValueError(f"model_id={model_id!r} is not a FLUX.2 [klein] release; choose from {sorted(_RELEASES)}")
    size, distilled, transformer_seed = _RELEASES[model_id]
    repo = prepare_repo(root, model_id)
    shared = _shared_parts(root, size, seed)
    for name in ("tokenizer", "text_encoder", "vae"):
        shutil.copytree(shared / name, repo / name, copy_function=link_or_copy)
    hidden, double_blocks, single_blocks = _SIZES[size]
    write_flux2_transformer(repo / "transformer", seed + transformer_seed, double_blocks, single_blocks, hidden,
                            guidance_embeds=False)
    write_json(repo / "scheduler" / "scheduler_config.json", FLUX2_SCHEDULER_CONFIG)
    write_json(repo / "model_index.json", model_index("Flux2KleinPipeline", _COMPONENTS, is_distilled=distilled))
    return repo


FLUX2_BUILDERS = {
    "flux2_klein_4b": functools.partial(build_tiny_flux2_klein, model_id=FLUX2_KLEIN_4B_MODEL_ID),
    "flux2_klein_base_4b": functools.partial(build_tiny_flux2_klein, model_id=FLUX2_KLEIN_BASE_4B_MODEL_ID),
    "flux2_klein_9b": functools.partial(build_tiny_flux2_klein, model_id=FLUX2_KLEIN_9B_MODEL_ID),
    "flux2_klein_base_9b": functools.partial(build_tiny_flux2_klein, model_id=FLUX2_KLEIN_BASE_9B_MODEL_ID),
}
