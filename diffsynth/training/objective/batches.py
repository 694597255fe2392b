"""Batches for training: which samples share a shape, one state from several samples' states, and their draws.

Every sample goes through the pipeline's units on its own (as without batches, and as stage 1 caches it); only what
the loss reads is then joined into one batch for the denoiser (``collate_states``): tensors are concatenated along
the batch dimension, and text embeddings of different lengths are zero-padded to the longest with a mask of their
real tokens, as diffusers' pipelines pad a batch of prompts (Qwen-Image's ``encoder_hidden_states_mask``, dropped
when no token is padding; Wan's embeddings arrive zero-padded to 512 tokens already). The loss is then averaged per
sample, and each sample draws its timestep and noise from its own generator (``runner.sample_generators``), keyed by its
position in the run's stream of samples, so a batch of B trains what B micro-steps of gradient accumulation at batch
1 train on the same samples.

Which samples may share a batch (``bucket_keys``): for a raw dataset, those whose data files load to the same shapes
(``UnifiedDataset.bucket_key``: aspect-ratio buckets of images and frames, frame counts, and for Qwen-Image-Edit the
edit images' buckets too, since their reference latents are packed beside the target's); for a stage-1 cache, those
whose cached tensors have the same shapes, text embeddings aside (they are padded). In a mix of several datasets
(``DatasetMix``) each draw has its row's key, so rows of different datasets share a batch when their shapes agree.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

import torch

from ...core.data import CacheDataset, UnifiedDataset
from ...core.data.buckets import BucketBatchSampler, describe_buckets
from ...core.data.mix import DatasetMix
from ...diffusion.pipeline_unit import SCOPES
from ...diffusion.unit_graph import StateKey

logger = logging.getLogger(__name__)

State = tuple[dict, dict, dict]


def collate_states(states: Sequence[State], keys: Iterable[StateKey], padded: Mapping[str, str]) -> State:
    """One batched state holding ``keys`` of the per-sample ``states`` (each of batch 1).

    Args:
        states: ``(shared, posi, nega)`` of every sample, after its units ran.
        keys: The state keys the loss reads (``LatentsLoss.required_keys``); keys absent from every sample are left
            out.
        padded: Text-embedding key -> the key of its token mask (``BasePipeline.padded_inputs``).

    Returns:
        The batched state; a batch of one is returned as it is.

    Raises:
        ValueError: Samples differ in a shape that cannot be padded (a bucketing fault), or in a plain value.
    """
    if len(states) == 1:
        return states[0]
    batched: State = ({}, {}, {})
    masks = set(padded.values())
    for scope, name in keys:
        position = SCOPES.index(scope)
        if name in masks or all(name not in state[position] for state in states):
            continue
        values = [state[position].get(name) for state in states]
        if name in padded:
            embeddings, mask = pad_embeddings(values, [state[position].get(padded[name]) for state in states])
            batched[position][name], batched[position][padded[name]] = embeddings, mask
        else:
            batched[position][name] = _join(values, f"{scope}/{name}")
    return batched


def pad_embeddings(embeddings: Sequence[torch.Tensor], masks: Sequence[torch.Tensor | None]
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(1, L_i, D)`` embeddings zero-padded to ``(B, max L_i, D)`` and their ``(B, max L_i)`` mask of real tokens
    (1) and padding (0); the mask is None when no token of the batch is padding, as diffusers leaves it.

    A sample's own mask (None: all its tokens are real) is padded with zeros too.
    """
    length = max(embedding.shape[1] for embedding in embeddings)
    rows, mask_rows = [], []
    for embedding, mask in zip(embeddings, masks):
        own = torch.ones(1, embedding.shape[1], dtype=torch.long, device=embedding.device) if mask is None else mask
        missing = length - embedding.shape[1]
        rows.append(torch.nn.functional.pad(embedding, (0, 0, 0, missing)))
        mask_rows.append(torch.nn.functional.pad(own.long(), (0, missing)))
    mask = torch.cat(mask_rows)
    return torch.cat(rows), None if bool(mask.all()) else mask


def _join(values: Sequence[Any], where: str) -> Any:
    if all(value is None for value in values):
        return None
    if all(isinstance(value, torch.Tensor) for value in values):
        shapes = {tuple(value.shape[1:]) for value in values}
        if len(shapes) > 1:
            raise ValueError(f"the samples of one batch differ in the shape of {where} ({sorted(shapes)}); samples "
                             "of one batch must come from one bucket")
        return torch.cat(list(values))
    if all(isinstance(value, (list, tuple)) for value in values) and len({len(value) for value in values}) == 1:
        return type(values[0])(_join(items, f"{where}/{index}") for index, items in enumerate(zip(*values)))
    if all(value == values[0] for value in values):
        return values[0]
    raise ValueError(f"the samples of one batch differ in {where} ({values[:3]}); they cannot share a batch")


def cache_bucket_key(dataset: CacheDataset, index: int, padded: Mapping[str, str]) -> tuple:
    """The shapes of a cached sample's tensors, its padded text embeddings left out."""
    ignored = set(padded) | set(padded.values())
    return tuple((name, shape) for name, shape in sorted(dataset.tensor_shapes(index).items())
                 if name.split("/")[-1] not in ignored)


def batch_sampler(dataset: UnifiedDataset | CacheDataset | DatasetMix, batch_size: int, buckets: bool, seed: int,
                  num_processes: int, padded: Mapping[str, str], log: bool = True) -> BucketBatchSampler:
    """The run's batch sampler; with ``buckets`` it groups the samples by shape and (with ``log``) logs the dataset
    summary: every bucket and its samples.

    A cache whose samples spread over many shapes (made without buckets) gives mostly batches of one; that is
    warned about, with the fix.
    """
    if not buckets:
        return BucketBatchSampler(len(dataset), batch_size, seed, num_processes)
    if isinstance(dataset, DatasetMix):
        # Each part's rows once (a header read each), then every draw takes its row's key.
        per_part = [_row_keys(part.dataset, padded) for part in dataset.parts]
        keys: list[Hashable] = [per_part[number][row] for number, row in dataset.locations()]
        first = dataset.parts[0].dataset
    else:
        per_row = _row_keys(dataset, padded)
        keys, first = [per_row[index % len(per_row)] for index in range(len(dataset))], dataset
    describe = _describe_cache_key if isinstance(first, CacheDataset) else UnifiedDataset.describe_bucket
    sampler = BucketBatchSampler(keys, batch_size, seed, num_processes)
    if not log:
        return sampler
    logger.info("dataset: %s", describe_buckets(sampler, describe))
    counts = sampler.bucket_counts().values()
    alone = sum(count for count in counts if count < batch_size)
    if batch_size > 1 and alone * 2 > len(keys):
        fix = ("rerun stage 1 with --batch_size (or --aspect_ratio_buckets) so that it caches the samples at bucket "
               "sizes" if isinstance(dataset, CacheDataset) else "lower --batch_size, or use fixed --height/--width")
        logger.warning("%d of %d samples sit in buckets smaller than --batch_size %d, so most batches are partly "
                       "filled; %s", alone, len(keys), batch_size, fix)
    return sampler


def _row_keys(dataset: UnifiedDataset | CacheDataset, padded: Mapping[str, str]) -> list[Hashable]:
    """The bucket key of each row (cache file) of ``dataset``, its repeats aside."""
    if isinstance(dataset, CacheDataset):
        return [cache_bucket_key(dataset, index, padded) for index in range(len(dataset.files))]
    return [dataset.bucket_key(index) for index in range(len(dataset) // dataset.repeat)]


def _describe_cache_key(key: tuple) -> str:
    latents = next((shape for name, shape in key if name.split("/")[-1] == "input_latents"), None)
    return f"latents {'x'.join(map(str, latents))}" if latents is not None else f"{len(key)} tensors"
