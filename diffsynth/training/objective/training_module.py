"""``DiffusionTrainingModule``: a pipeline prepared for training one task stage.

It freezes every model, then makes trainable what the flags ask for (whole models, or a peft LoRA on one model),
turns on gradient checkpointing, picks the units of the task's stage from the unit-graph split, and computes the loss
of a batch of samples of one shape. The runner sees only this module.

Stages: ``sft`` runs every unit and the loss each step; ``sft:data_process`` runs only the units that do not depend on
a trained model and returns the (pruned) state for the cache; ``sft:train`` runs the remaining units on a cached state,
then the loss. The split is computed from the unit declarations with the loss's keys as final readers, so both stages
see exactly the values one-stage training computes.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ...core.data.dataset import is_blank
from ...core.data.fingerprint import digest, weights_digest
from ...core.finite import NonFiniteTensorError
from ...core.fp8 import holds_fp8_layers, store_model_in_fp8
from ...core.gradient import gradient_checkpoint_forward
from ...core.quant import QuantConfig, quantize_model
from ...diffusion.base_pipeline import (
    BasePipeline,
    PipelineUnit,
    required_cache_keys,
    split_pipeline_units,
    stage_one_units,
)
from ..config.errors import FlagError, task_stage
from ..config.timesteps import TimestepFlags
from .adapter import AdapterSettings, DoraBaseWeights, inject_adapter, load_adapter_checkpoint
from .batches import collate_states
from .loss import LOSSES, FlowMatchSFTLoss, weighted_mean
from .lora_targets import effective_lora_targets, resolve_lora_targets, scoped_targets
from .loss_mask import LOSS_MASK_KEY, MASK_COLUMN, LossMask, pixel_mask, with_latent_grid_mask
from .timestep_sampling import TimestepSampling

logger = logging.getLogger(__name__)

CACHE_FORMAT_VERSION = 1


def move_to_device(value: Any, device: torch.device) -> Any:
    """``value`` with every tensor inside dicts, lists and tuples moved to ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, Mapping):
        return {key: move_to_device(item, device) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(move_to_device(item, device) for item in value)
    return value


class DiffusionTrainingModule(torch.nn.Module):
    """A pipeline, its trainable parameters, its stage's units and its loss.

    Args:
        pipe: The pipeline, with its models loaded.
        task: ``sft`` / ``direct_distill``, optionally with ``:data_process`` or ``:train``.
        trainable_models: Models trained in full (``--trainable_models``).
        lora_base_model: The model that gets a LoRA (``--lora_base_model``).
        lora_target_modules: Module name suffixes the LoRA wraps.
        lora_rank: LoRA rank.
        lora_alpha: LoRA alpha (scale ``alpha / rank``); defaults to the rank.
        lora_checkpoint: A LoRA file to continue training from.
        use_gradient_checkpointing: Recompute each transformer block in backward instead of keeping activations.
        use_gradient_checkpointing_offload: Also keep the block inputs saved for recompute on the CPU.
        extra_inputs: Dataset columns passed into the pipeline state as they are.
        prune_cache: Stage 1 keeps only the keys stage 2 reads.
        timestep_boundaries: ``(min, max)`` fractions of the training grid the SFT loss draws timesteps from.
        timestep_sampling: The SFT loss's timestep rule and weighting; default the reference's.
        fp8_models: Models whose frozen Linear and convolution weights are stored in float8 (after the LoRA is
            injected, so the LoRA itself stays float32).
        preset_lora: ``(model name, LoRA file)``: a LoRA merged into that model's frozen weights first
            (``--preset_lora_model`` / ``--preset_lora_path``, differential LoRA training). Skipped for a model this
            stage holds without weights.
        quant_models: Models whose frozen Linear weights are quantized (``--quant_options``), each with its
            ``core.quant.QuantConfig``; after the LoRA is injected, like ``fp8_models``.
        adapter: The adapter's type (``--lora_type``, ``--use_dora``, ``--lokr_factor``); its rank and alpha are
            ``lora_rank`` and ``lora_alpha``. Default: a plain LoRA.
        loss_mask: Weigh the loss by each row's ``mask`` column (``--masked_loss``, ``loss_mask``); None: unmasked.
        column_defaults: Values for the columns a row lacks or leaves empty (``--frame_rate`` for ``frame_rate``); a
            row's own value wins.

    Raises:
        ValueError: A named model is missing from the pipeline, a target module matches nothing, or nothing is
            trainable in a training stage.
    """

    def __init__(self, pipe: BasePipeline, task: str = "sft", trainable_models: Sequence[str] = (),
                 lora_base_model: str | None = None, lora_target_modules: Sequence[str] = (), lora_rank: int = 32,
                 lora_alpha: float | None = None, lora_checkpoint: str | Path | None = None,
                 use_gradient_checkpointing: bool = False, use_gradient_checkpointing_offload: bool = False,
                 extra_inputs: Sequence[str] = (), prune_cache: bool = True,
                 timestep_boundaries: tuple[float, float] = (0.0, 1.0), fp8_models: Sequence[str] = (),
                 preset_lora: tuple[str, str | Path] | None = None,
                 quant_models: Mapping[str, QuantConfig] | None = None,
                 timestep_sampling: TimestepFlags | None = None, adapter: AdapterSettings | None = None,
                 loss_mask: LossMask | None = None, column_defaults: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.adapter = adapter or AdapterSettings()
        self.task = task
        self.family, self.stage = task_stage(task)
        self.pipe = pipe
        self.loss = (FlowMatchSFTLoss(*timestep_boundaries, TimestepSampling.of(timestep_sampling or TimestepFlags()),
                                      mask=loss_mask) if self.family == "sft" else LOSSES[self.family](mask=loss_mask))
        self.extra_inputs = tuple(extra_inputs)
        self.column_defaults = dict(column_defaults or {})
        self.trainable_models = tuple(trainable_models)
        self.lora_base_model = lora_base_model
        self.trained_model_names = tuple(name for name in dict.fromkeys([*trainable_models, lora_base_model]) if name)
        if not self.trained_model_names and self.stage == "data_process":
            # Some of the reference's stage-1 commands leave the training flags to stage 2: what stage 2 trains is
            # then the denoiser, whose inputs the cache holds.
            self.trained_model_names = pipe.denoising_model_names[:1]
        self.lora_config: dict[str, Any] = {}
        self.last_sample_losses: torch.Tensor | None = None
        pipe.requires_grad_(False)
        pipe.eval()
        if preset_lora is not None:
            self._merge_preset_lora(*preset_lora)
        if self.adapter.use_dora and lora_base_model in (*fp8_models, *(quant_models or {})):
            # peft's DoRA reads the base weight's row norms every step; it cannot read fp8 or quantized storage. The
            # trainer refuses this before loading (startup.model_checks); this guards the Python API.
            raise ValueError(f"--use_dora on {lora_base_model}, whose weights --fp8_models / --quant_options store "
                             "compressed: DoRA needs the base weights as they are; drop --use_dora or the storage flag")
        if self.stage != "data_process":
            self._make_trainable(lora_target_modules, lora_rank, lora_alpha, lora_checkpoint)
            self._enable_gradient_checkpointing(use_gradient_checkpointing, use_gradient_checkpointing_offload)
        self._store_in_fp8(fp8_models)
        self._quantize(quant_models or {})
        final_keys = self.loss_keys = self.loss.state_keys(pipe)
        related, unrelated = split_pipeline_units(pipe.units, self.trained_model_names, final_keys)
        self.cache_keys = sorted(required_cache_keys(related, final_keys))
        self.related_units: list[PipelineUnit] = related
        self.unrelated_units: list[PipelineUnit] = unrelated
        if self.stage == "data_process":
            self.unrelated_units = stage_one_units(pipe.units, self.trained_model_names, final_keys, prune_cache)
            self.related_units = []
        elif self.stage == "train":
            self.unrelated_units = []
        self._check_skeletons()

    def active_model_names(self) -> list[str]:
        """The models this stage computes with: its units' models, and the trained models outside stage 1."""
        names = [name for unit in (*self.unrelated_units, *self.related_units) for name in unit.onload_model_names]
        if self.stage != "data_process":
            names += [*self.trained_model_names, *self.pipe.denoising_model_names]
        return [name for name in dict.fromkeys(names) if isinstance(getattr(self.pipe, name, None), torch.nn.Module)]

    def _check_skeletons(self) -> None:
        """Models built without weights (``--offload_models``) must be ones this stage never computes with."""
        for name in self.active_model_names():
            if any(param.is_meta for param in getattr(self.pipe, name).parameters()):
                raise ValueError(f"--offload_models includes the {name} model, but --task {self.task} computes with "
                                 f"it; remove its entry from --offload_models")

    # ---- set-up -------------------------------------------------------------------------------------------------

    def _model(self, name: str, flag: str) -> torch.nn.Module:
        model = getattr(self.pipe, self.pipe.host_model(name), None)
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"{flag} names {name!r}, but the pipeline holds no such model; it holds "
                             f"{self.pipe.model_names()} (load it with --model_id_with_origin_paths or --model_paths)")
        return model

    def _merge_preset_lora(self, name: str, path: str | Path) -> None:
        """Merges a LoRA into a model's weights before anything else changes them (LoRA injection, fp8), so the
        offloader, block swap and a stage-1 cache all see the merged weights."""
        from ...lora import load_lora

        model = getattr(self.pipe, name, None)
        if not isinstance(model, torch.nn.Module) or any(param.is_meta for param in model.parameters()):
            logger.info("--preset_lora_model %s: not computed with in --task %s; nothing to merge", name, self.task)
            return
        try:
            merged = load_lora(model, path)
        except NonFiniteTensorError as error:  # exit code 3, as for --lora_checkpoint
            raise NonFiniteTensorError(f"--preset_lora_path {path}: {error}", error.names) from None
        except (FileNotFoundError, ValueError) as error:
            raise FlagError([f"--preset_lora_path {path}: {error}"]) from None
        logger.info("--preset_lora_path %s: merged into %d layers of %s", path, merged, name)

    def _make_trainable(self, lora_target_modules: Sequence[str], lora_rank: int, lora_alpha: float | None,
                        lora_checkpoint: str | Path | None) -> None:
        for name in self.trainable_models:
            model = self._model(name, "--trainable_models")
            inside, outside = self.pipe.part_scope(name, model)
            for child in inside or ("",):
                _submodule(model, child, name).requires_grad_(True)
            for child in outside:
                model.get_submodule(child).requires_grad_(False)
            model.train()
        if self.lora_base_model is not None:
            settings = dataclasses.replace(self.adapter, rank=lora_rank,
                                           alpha=lora_rank if lora_alpha is None else lora_alpha)
            self._inject_lora(self._model(self.lora_base_model, "--lora_base_model"), list(lora_target_modules),
                              settings, lora_checkpoint)
        if not any(p.requires_grad for p in self.parameters()):
            raise ValueError(f"--task {self.task} has nothing to train; set --lora_base_model (e.g. dit) with "
                             "--lora_target_modules, or --trainable_models")

    def _inject_lora(self, model: torch.nn.Module, target_modules: list[str], settings: AdapterSettings,
                     checkpoint: str | Path | None) -> None:
        from ...lora.base_layers import BaseLayers

        target_modules = effective_lora_targets(model, target_modules, type(self.pipe))
        if not target_modules:
            raise ValueError(f"--lora_base_model {self.lora_base_model} needs --lora_target_modules, e.g. "
                             "'to_q,to_k,to_v,to_out.0'")
        scope = self.pipe.part_scope(self.lora_base_model, model)
        target_modules = resolve_lora_targets(model, target_modules, self.pipe.lora_target_aliases,
                                              self.lora_base_model, scope)
        target_modules = scoped_targets(model, target_modules, *scope)
        inject_adapter(model, settings, target_modules)
        config = _plain_config(model) or {}
        self.lora_config = {"lora_rank": settings.rank, "lora_alpha": settings.alpha,
                            "lora_target_modules": target_modules, "lora_base_model": self.lora_base_model,
                            "base_model_class": type(model).__name__, "base_model_config": config,
                            "base_model_layers": BaseLayers.of(model)}
        if settings.kind != "lora":
            # A DoRA file's dora_scale is computed from the base weights when it is written.
            self.lora_config.update({"lora_type": settings.kind, "base_weights": DoraBaseWeights(model)})
        if checkpoint is not None:
            load_adapter_checkpoint(model, Path(checkpoint), settings)

    def _store_in_fp8(self, names: Sequence[str]) -> None:
        """Stores the frozen Linear and convolution weights of each named model in fp8 (see ``core.fp8``)."""
        for name in names:
            model = self._model(name, "--fp8_models")
            if name in self.trainable_models and self.stage != "data_process":
                raise ValueError(f"--fp8_models includes {name}, which --trainable_models trains in full; fp8 storage "
                                 "is for frozen weights: drop one of the two (a LoRA on an fp8 model trains)")
            if any(param.is_meta for param in model.parameters()):
                continue  # a skeleton from --offload_models holds no weights to convert
            if holds_fp8_layers(model):
                continue  # loaded in fp8 already: the host copy shared by the machine's processes is the fp8 one
            summaries = store_model_in_fp8(model)
            if summaries:
                logger.info("--fp8_models %s: %s", name, "; ".join(summaries))
            else:
                # The reference's commands list every model; one without such layers is no error.
                logger.warning("--fp8_models %s: %s has no Linear or convolution layer to store in fp8; it keeps its "
                               "dtype", name, type(model).__name__)

    def _quantize(self, configs: Mapping[str, QuantConfig]) -> None:
        """Quantizes the frozen Linear weights of each named model (``core.quant``); LoRA adapters stay float32."""
        for name, config in configs.items():
            model = self._model(name, "--quant_options")
            if name in self.trainable_models and self.stage != "data_process":
                raise ValueError(f"--quant_options quantizes {name}, which --trainable_models trains in full; drop "
                                 "one of the two (a LoRA on a quantized model trains)")
            if any(param.is_meta for param in model.parameters()):
                continue  # a skeleton from --offload_models holds no weights
            logger.info("--quant_options %s: %s", name, quantize_model(model, config).summary())

    def _enable_gradient_checkpointing(self, enabled: bool, offload: bool) -> None:
        if not enabled:
            return
        checkpoint = functools.partial(_checkpoint_block, offload=offload)
        for name in self.trained_model_names:
            model = self._model(name, "--use_gradient_checkpointing")
            if getattr(model, "_supports_gradient_checkpointing", False):
                model.enable_gradient_checkpointing(gradient_checkpointing_func=checkpoint)
            else:
                logger.warning("--use_gradient_checkpointing: %s (%s) has no checkpointed blocks; it trains without",
                               type(model).__name__, name)

    # ---- running ------------------------------------------------------------------------------------------------

    def cache_info(self) -> dict[str, Any]:
        """What a stage-1 cache must agree on with stage 2: pipeline, stage-2 units, keys and trained models."""
        configs = {}
        for name in self.trained_model_names:
            config = _plain_config(getattr(self.pipe, self.pipe.host_model(name), None))
            if config is not None:
                configs[name] = config
        split = split_pipeline_units(self.pipe.units, self.trained_model_names, self.loss_keys)
        return {
            "format": CACHE_FORMAT_VERSION, "pipeline": type(self.pipe).__name__, "task": self.family,
            "trained_models": list(self.trained_model_names), "stage_two_units": [type(u).__name__ for u in split[0]],
            "cache_keys": [list(key) for key in self.cache_keys], "model_configs": configs,
            **({"masked_loss": True} if self.loss.mask is not None else {}),  # a cache's masks are for --masked_loss
        }  # fmt: skip

    def stage_one_identity(self) -> dict[str, Any]:
        """What stage 1 computes with, for every cached sample's fingerprint: the pipeline, its dtype, the stage's
        units, each of their models (class, config, a digest of its weights) and the pre-processors (tokenizer, image
        processor) as they would save themselves.

        Call it before the models are placed: an offload manager leaves placeholders in place of the weights.
        """
        models: dict[str, Any] = {}
        for name in self.active_model_names():
            model = getattr(self.pipe, name)
            models[name] = {"class": type(model).__name__, "config": _plain_config(model),
                            "weights": weights_digest(model)}
        for name, component in vars(self.pipe).items():
            identity = _preprocessor_identity(component)
            if identity is not None:
                models[name] = {"class": type(component).__name__, "state": identity}
        # Defaults enter only when given, so that caches made without them keep their fingerprints.
        defaults = {"column_defaults": self.column_defaults} if self.column_defaults else {}
        return {"pipeline": type(self.pipe).__name__, "torch_dtype": str(self.pipe.torch_dtype),
                "units": [type(unit).__name__ for unit in self.unrelated_units], "models": models, **defaults}

    def pipeline_inputs(self, sample: dict[str, Any]) -> tuple[dict, dict, dict]:
        """The initial state of one sample: a dataset row, or a cached state in stage 2 (moved to the device)."""
        if self.stage == "train":
            return tuple(move_to_device(dict(sample[scope]), self.pipe.device) for scope in ("shared", "posi", "nega"))
        given = {name: value for name, value in sample.items()
                 if name not in self.column_defaults or not is_blank(value)}
        shared, posi, nega = self.pipe.training_inputs({**self.column_defaults, **given}, self.extra_inputs)
        mask = pixel_mask(sample.get(MASK_COLUMN)) if self.loss.mask is not None else None
        return ({**shared, LOSS_MASK_KEY: mask} if mask is not None else shared), posi, nega

    @torch.no_grad()
    def process_sample(self, sample: dict[str, Any]) -> dict[str, dict]:
        """Stage 1: runs the stage's units on one dataset row and returns the state to cache."""
        state = self.pipe.run_units(*self.pipeline_inputs(sample), units=self.unrelated_units)
        if self.loss.mask is not None:
            state = with_latent_grid_mask(state)  # the cache holds the mask at the latents' small size
        return {scope: move_to_device(values, torch.device("cpu")) for scope, values in zip(("shared", "posi", "nega"),
                                                                                           state)}

    def forward(self, samples: Sequence[dict[str, Any]], generators: Sequence[torch.Generator | None] | None = None,
                sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        """The loss of a batch of samples of one shape, averaged per sample (each times its ``sample_weights``
        entry, e.g. ``--prior_loss_weight`` for regularization samples); ``last_sample_losses`` keeps the
        unweighted per-sample values for the logs.

        Each sample runs the stage's units alone; what the loss reads is then joined into one batch
        (``batches.collate_states``). ``generators`` holds one generator per sample for its timestep and noise.
        """
        if self.stage == "data_process":
            raise RuntimeError("a data_process task computes no loss; call process_sample")
        states = []
        for sample in samples:
            state = self.pipeline_inputs(sample)
            with torch.no_grad():
                # Units independent of the trained models need no graph: this is the work stage 1 caches.
                state = self.pipe.run_units(*state, units=self.unrelated_units)
            state = self.pipe.run_units(*state, units=self.related_units)
            states.append(with_latent_grid_mask(state) if self.loss.mask is not None else state)
        state = collate_states(states, self.loss_keys, self.pipe.padded_inputs)
        losses = self.loss.per_sample(self.pipe, *state, generators=generators)
        self.last_sample_losses = losses.detach()
        return weighted_mean(losses, sample_weights)

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Trainable weights named from this module (``pipe.dit....``), detached, on the CPU."""
        return {name: param.detach().cpu() for name, param in self.named_parameters() if param.requires_grad}

    def load_trainable_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Restores what ``trainable_state_dict`` returned (resuming); every trainable weight must be present."""
        own = {name: param for name, param in self.named_parameters() if param.requires_grad}
        if set(state) != set(own):
            missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
            raise ValueError(f"the checkpoint's trainable weights differ from this run's (missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]}); resume with the same LoRA and trainable-model flags")
        reshaped = [name for name, value in state.items() if value.shape != own[name].shape]
        if reshaped:
            name = reshaped[0]
            raise ValueError(f"the checkpoint's {name} has shape {tuple(state[name].shape)}, this run's "
                             f"{tuple(own[name].shape)} ({len(reshaped)} weights differ); resume with the "
                             "--lora_rank (and --trainable_models) the checkpoint was trained with")
        with torch.no_grad():
            for name, value in state.items():
                own[name].copy_(value)


def _plain_config(model: Any) -> dict[str, Any] | None:
    """A model's config as a dict, without private keys (``_name_or_path``: the folder it came from, at any depth) or
    library versions, which say nothing about what the model computes."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    return _public_entries(config.to_dict() if hasattr(config, "to_dict") else dict(config))


def _public_entries(values: Any) -> Any:
    if not isinstance(values, Mapping):
        return values
    return {key: _public_entries(value) for key, value in values.items()
            if not str(key).startswith("_") and not str(key).endswith("_version")}


def _preprocessor_identity(component: Any) -> str | None:
    """A digest of a tokenizer's full definition or an image processor's settings; None for anything else."""
    tokenizer = getattr(component, "backend_tokenizer", None)
    if tokenizer is not None:
        return digest(tokenizer.to_str())
    to_json_string = getattr(component, "to_json_string", None)
    if callable(to_json_string) and not isinstance(component, torch.nn.Module):
        return digest(to_json_string())
    return None


def _submodule(model: torch.nn.Module, path: str, flag_value: str) -> torch.nn.Module:
    """``model``'s module at ``path``, in the model's names or its release's (the family's LoRA naming maps them).

    Raises:
        ValueError: Neither names a module of ``model``.
    """
    from ...lora import naming_for

    for candidate in (path, naming_for(model).to_diffusers(path)):
        try:
            if candidate is not None:
                return model.get_submodule(candidate)
        except AttributeError:
            continue
    raise ValueError(f"--trainable_models {flag_value}: {type(model).__name__} has no module {path!r} (in its own "
                     "or its release's names); name a module it has, e.g. dit.blocks.0")


def _checkpoint_block(block: torch.nn.Module, *args: Any, offload: bool, **kwargs: Any) -> Any:
    # Keyword inputs too: Wan2.2-Animate-2's transformer hands its blocks the K/V cache and the pass by keyword.
    return gradient_checkpoint_forward(block, True, offload, *args, **kwargs)
