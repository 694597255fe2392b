"""``BasePipeline``: units, a denoiser, a scheduler and a decode step, plus model placement and the stage split.

A concrete pipeline (Qwen-Image, Wan) subclasses ``BasePipeline`` and provides:

- its models as attributes named ``dit``, ``vae``, ``text_encoder``, ... (``None`` while not loaded);
- ``unit_classes``: the units (``PipelineUnit``) that turn user inputs into the denoiser's inputs, in run order
  (``__init__`` builds ``self.units`` from them);
- ``model_fn(**inputs)``: one denoiser prediction from the merged state and ``timestep``;
- ``self.scheduler``: an object with ``timesteps`` and ``step(model_output, timestep, sample) -> sample``;
- ``decode(inputs_shared, inputs_posi, inputs_nega)``: turns the final latents into the output.

The shared ``__init__`` makes every slot of ``model_roles`` (and ``tokenizer``) and each of ``extra_attributes``,
then calls ``_after_init``; ``from_pretrained`` loads the models into their slots, then calls ``_after_load`` with
the pipeline's own options; ``training_inputs`` builds a sample's state from ``training_media``, ``training_state``
and ``derived_training_inputs``. A pipeline overrides those hooks rather than the three methods.

``denoise`` runs the whole inference loop with classifier-free guidance, and training runs ``run_units`` and
``model_fn`` through the same code, so the two cannot drift apart. The classes the pipeline is built from live in
``pipeline_unit.py`` and ``unit_graph.py`` and are re-exported here.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..core.device import resolve_device
from ..core.loader import ModelConfig, SharedLoad, load_components, load_skeleton, model_class_name
from ..core.loader.loading import load_tokenizer, resolve_dtype
from ..core.loader.original_layout import join_parts
from .pipeline_unit import SCOPES, PipelineUnit, PipelineUnitRunner
from .unit_graph import (
    PruneCacheUnit,
    StateKey,
    UnitAccess,
    required_cache_keys,
    split_pipeline_units,
    stage_one_units,
    unit_access,
)

__all__ = ["SCOPES", "BasePipeline", "PipelineUnit", "PipelineUnitRunner", "PruneCacheUnit", "StateKey",
           "UnitAccess", "required_cache_keys", "split_pipeline_units", "stage_one_units", "unit_access"]

_MISSING = object()


class BasePipeline(torch.nn.Module):
    """Shared machinery of all pipelines; see the module docstring for what a subclass provides.

    Args:
        device: The compute device; intermediate tensors and onloaded models go here.
        torch_dtype: The dtype for intermediate tensors; None: the class's ``default_torch_dtype``.
        offload_device: Where models not in use wait (normally the CPU).
        manage_model_devices: Let ``load_models_to_device`` move models. Turn it off when something else owns
            placement (an ``OffloadTrainingManager``, or everything fits and should stay put): moving whole models
            per unit saves device memory at the cost of a host-to-device copy of each model every time it is used.
    """

    #: Pipeline slot of each model class, e.g. ``{"QwenImageTransformer2DModel": "dit"}``.
    model_roles: dict[str, str] = {}
    #: Where the tokenizer comes from when a text encoder is loaded and no config names a tokenizer.
    default_tokenizer_config: ModelConfig | None = None
    #: ``--lora_target_modules`` names of the model's original code base mapped to the diffusers module names: a
    #: suffix, or a tuple of patterns over whole module names (``lora_targets.TargetAliases``).
    lora_target_aliases: dict[str, str | tuple[str, ...]] = {}
    #: The layers an unset ``--lora_target_modules`` trains: those the reference's LoRA scripts for the model name.
    #: Empty: the flag is required.
    default_lora_target_modules: str = ""
    #: Whether an empty ``--lora_target_modules`` trains every ``nn.Linear`` of the LoRA base model (the reference's
    #: Stable Diffusion scripts pass ``""``); otherwise an empty value is refused.
    empty_lora_targets_train_all_linear: bool = False
    #: Models onloaded for the denoising loop.
    denoising_model_names: tuple[str, ...] = ("dit",)
    #: The LoRA layout ``--align_to_opensource_format`` writes: the reference's "open-source format", kohya's for
    #: most families, diffusers' names where the reference aligns to those.
    aligned_lora_layout: str = "kohya"
    #: State keys ``model_fn`` reads besides ``latents`` and ``timestep`` (the loss keeps them exact in the split).
    model_fn_params: tuple[str, ...] = ()
    #: Metadata columns every training sample needs.
    training_columns: tuple[str, ...] = ()
    #: Metadata columns ``training_media`` reads where a row has them (LTX-2: ``frame_rate``); part of a cached
    #: sample's fingerprint, and not warned about as unread.
    optional_columns: tuple[str, ...] = ()
    #: ``--extra_inputs`` names a sample may lack because ``training_inputs`` derives them (Wan: the first frame).
    derived_inputs: tuple[str, ...] = ()
    #: ``--extra_inputs`` names ``training_media`` reads from the sample (Qwen-Image-Layered: ``layer_num``), used
    #: though no unit may read them in training.
    media_inputs: tuple[str, ...] = ()
    #: ``--extra_inputs`` file columns a row may leave empty, the state then lacking the input (LTX-2: the sound of
    #: ``input_audio``, so that clips with and without sound share a dataset and a batch).
    optional_inputs: tuple[str, ...] = ()
    #: Keyword arguments of ``from_pretrained`` (and ``companion_configs``) beyond the shared ones, which the trainer
    #: fills from flags only some pipelines take (Qwen-Image: ``processor_config``, ``zero_cond_t``).
    load_options: tuple[str, ...] = ()
    #: State inputs that must hold loaded images, so a dataset column feeding one belongs in ``--data_file_keys``.
    image_inputs: tuple[str, ...] = ()
    #: Extra inputs that make the dataset keep images' transparency (RGBA) when ``--extra_inputs`` names one.
    alpha_inputs: tuple[str, ...] = ()
    #: Pairs of extra inputs whose lists a row must give at one length (EliGen: a mask per entity prompt).
    paired_list_inputs: tuple[tuple[str, str], ...] = ()
    #: Extra inputs that condition one sample alone, which a batch of several cannot hold (EliGen's entities).
    unbatched_inputs: tuple[str, ...] = ()
    #: The type of each input a metadata column may feed through ``--extra_inputs`` (``core.data.cells``); a CSV
    #: cell is text, so the dataset converts those columns (e.g. ``seed`` to an int) and refuses cells that do not.
    input_types: dict[str, Any] = {}
    #: Text embeddings whose length varies by sample, each with the key of its token mask: a batch pads them to its
    #: longest with a mask of the real tokens (``batches.collate_states``).
    padded_inputs: dict[str, str] = {}
    #: Latent cells per side of one transformer token: 2 where the transformer patches 2x2 latents itself, 1 where
    #: the state holds latents already patchified (FLUX.2). Resolution-dependent timestep shifts count tokens by it.
    latent_patch_size: int = 2
    #: Whether the training latents are a ``(batch, channels, [frames,] height, width)`` grid that a loss mask image
    #: can be resized onto (``--masked_loss``); False for latents packed into tokens of several streams (LTX-2).
    maskable_latents: bool = True

    #: The dtype a pipeline built without ``torch_dtype`` computes in.
    default_torch_dtype: torch.dtype = torch.float32
    #: The units, in run order; each pipeline builds its own instances (``build_units``).
    unit_classes: tuple[type[PipelineUnit], ...] = ()
    #: Attributes besides the model slots that a pipeline starts with, and their initial values (immutable ones:
    #: every instance gets the same object), e.g. a processor loaded later.
    extra_attributes: dict[str, Any] = {}
    #: What a training sample's state holds besides its media and columns (``training_inputs``), e.g. no CFG.
    training_state: dict[str, Any] = {}
    #: Names the reference's flags (``--trainable_models``, ``--lora_base_model``, ``--remove_prefix_in_ckpt``) give
    #: to a part of a loaded model, which diffusers keeps in one class: ``{name: (model, its child modules)}``,
    #: e.g. Wan VACE's ``vace`` (``vace_blocks`` and ``vace_patch_embedding`` of ``dit``). A LoRA on the model itself
    #: then leaves its parts out, as the reference's separate models do.
    model_parts: dict[str, tuple[str, tuple[str, ...]]] = {}
    #: Models that ``--enable_model_cpu_offload`` and ``--blocks_to_swap`` cannot place yet, and why: a run loading
    #: one with either flag stops before loading (Z-Image's ControlNet computes with the transformer's modules).
    unplaceable_models: dict[str, str] = {}

    def __init__(self, device: str | torch.device = "cpu", torch_dtype: torch.dtype | None = None,
                 offload_device: str | torch.device = "cpu", manage_model_devices: bool = True) -> None:
        super().__init__()
        self.device = resolve_device(device, "device")
        self.offload_device = resolve_device(offload_device, "offload_device")
        torch_dtype = self.default_torch_dtype if torch_dtype is None else torch_dtype
        if not isinstance(torch_dtype, torch.dtype):
            raise TypeError(f"torch_dtype={torch_dtype!r} is not a torch.dtype; use e.g. torch.bfloat16")
        self.torch_dtype = torch_dtype
        self.manage_model_devices = manage_model_devices
        self.units: list[PipelineUnit] = self.build_units()
        self.unit_runner = PipelineUnitRunner()
        #: The config each slot was loaded from (flags that name models by config map to slots through it).
        self.model_configs: dict[str, ModelConfig] = {}
        self.scheduler: Any = None
        # Every slot exists before loading, empty; ``_assign`` puts any model without a slot's class in "tokenizer".
        for name in (*dict.fromkeys(self.model_roles.values()), "tokenizer"):
            setattr(self, name, None)
        for name, value in self.extra_attributes.items():
            setattr(self, name, value)
        self._after_init()

    def build_units(self) -> list[PipelineUnit]:
        """The pipeline's units, in run order: one instance of each of ``unit_classes``."""
        return [unit_class() for unit_class in self.unit_classes]

    def _after_init(self) -> None:
        """Sets what a pipeline needs beyond its slots and ``extra_attributes`` (a scheduler); by default nothing."""

    @classmethod
    def from_pretrained(cls, torch_dtype: torch.dtype | str = torch.bfloat16, device: str | torch.device = "cpu",
                        model_configs: Sequence[ModelConfig] = (), tokenizer_config: ModelConfig | None = None,
                        offload_device: str | torch.device = "cpu",
                        skeleton_configs: Sequence[ModelConfig] = (),
                        shared_weights: Callable[[ModelConfig], SharedLoad | None] | None = None,
                        **options: Any) -> BasePipeline:
        """Loads the models the configs name and puts each in its slot by class (``model_roles``), then lets the
        pipeline finish with ``_after_load(**options)``.

        Models are loaded onto ``offload_device`` and moved to ``device`` only while a unit computes with them, so
        the device never holds the text encoder and the transformer at once; pass ``offload_device=device`` to keep
        everything resident (faster when it fits).

        Args:
            torch_dtype: Weight and activation dtype.
            device: The compute device.
            model_configs: One config per model (any subset of the pipeline's models).
            tokenizer_config: The tokenizer folder. When a text encoder is loaded and no config names a tokenizer,
                the ``tokenizer/`` folder of the text encoder's repository is used, else ``default_tokenizer_config``.
            offload_device: Where models wait while not in use.
            skeleton_configs: Entries of ``model_configs`` to build without weights (on the meta device), for
                models held but never computed with (``--offload_models`` in split training).
            shared_weights: For each config, how to load its weights once per machine into host memory the run's
                processes share (``SharedLoad``), or None for this process's own copy; None: no sharing. Every
                process of the run must then load the same configs.
            options: The keyword arguments of the pipeline's ``_after_load`` (Qwen-Image: ``processor_config``,
                ``zero_cond_t``); see there.

        Raises:
            TypeError: An option ``_after_load`` does not take.
            ValueError: A config loads a model class this pipeline has no slot for, or two configs fill one slot.
        """
        taken = list(inspect.signature(cls._after_load).parameters)[1:]
        unknown = sorted(set(options) - set(taken))
        if unknown:
            raise TypeError(f"{cls.__name__}.from_pretrained got unexpected keyword arguments {unknown}; besides the "
                            f"shared ones it takes {taken}")
        dtype = resolve_dtype(torch_dtype)
        pipe = cls(device=device, torch_dtype=dtype, offload_device=offload_device)
        for config in model_configs:
            if config in skeleton_configs:
                components = [load_skeleton(config, torch_dtype=dtype)]
            else:
                # a file holding several models (a single-file release) gives each the pipeline has a slot for
                shared = shared_weights(config) if shared_weights is not None else None
                components = load_components(config, torch_dtype=dtype, device=pipe.offload_device, shared=shared,
                                             wanted=cls.model_roles.__contains__)
            for component in components:
                pipe._assign(component, config)
        tokenizer = cls._companions(pipe.model_configs, tokenizer_config).get("tokenizer")
        if tokenizer is not None:
            pipe._assign(load_tokenizer(tokenizer), tokenizer)
        pipe._after_load(**options)
        return pipe

    def _after_load(self) -> None:
        """Finishes a pipeline ``from_pretrained`` has loaded the models of (a companion folder, a setting read from
        the release); its keyword arguments are ``from_pretrained``'s options beyond the shared ones. By default
        nothing."""

    @classmethod
    def companion_configs(cls, model_configs: Sequence[ModelConfig], tokenizer_config: ModelConfig | None = None,
                          inputs: Sequence[str] = (), **options: Any) -> list[ModelConfig]:
        """The folders ``from_pretrained`` reads besides the models' own, such as the tokenizer beside the text encoder.

        Each model's slot is found from the class its ``config.json`` names, so the models' files must be resolved
        first. A launcher resolves these too before any process loads, so that they are downloaded once per machine.
        ``inputs`` are the state inputs the run feeds (``--extra_inputs``) and ``options`` the ``load_options`` it
        passes to ``from_pretrained``; a pipeline whose companions depend on them (Qwen-Image-Edit's processor) reads
        them, the others ignore them.
        """
        return list(cls._companions(cls.config_roles(model_configs), tokenizer_config).values())

    @classmethod
    def config_roles(cls, model_configs: Sequence[ModelConfig]) -> dict[str, ModelConfig]:
        """The slot each config fills (``tokenizer`` for a folder without weights), from the class its files name;
        configs of classes the pipeline has no slot for are left out."""
        roles = {}
        for config in model_configs:
            name = model_class_name(config)
            role = "tokenizer" if name is None else cls.model_roles.get(name)
            if role is not None:
                roles[role] = config
        return roles

    @classmethod
    def _companions(cls, roles: dict[str, ModelConfig], tokenizer_config: ModelConfig | None) -> dict[str, ModelConfig]:
        """The companion folders by slot, given the config of each slot loaded so far: here, when a text encoder is
        loaded without a tokenizer, ``tokenizer_config``, else the ``tokenizer/`` folder of the text encoder's
        repository, else ``default_tokenizer_config``. Pipelines with more companions extend it."""
        if "text_encoder" not in roles or "tokenizer" in roles:
            return {}
        config = tokenizer_config or _sibling_tokenizer(roles["text_encoder"]) or cls.default_tokenizer_config
        return {"tokenizer": config} if config is not None else {}

    @classmethod
    def slots_of(cls, class_names: Sequence[str | None]) -> list[str | None]:
        """The slot each model of these classes takes when loaded in this order, as ``_assign`` will put it, without
        loading anything; None for a class the pipeline has no slot for (or a folder without weights)."""
        return [cls.model_roles.get(name) if name else None for name in class_names]

    def _assign(self, component: Any, config: ModelConfig) -> str:
        """Puts ``component`` in its slot and returns the slot's name."""
        name = self.model_roles.get(type(component).__name__)
        if name is None and not isinstance(component, torch.nn.Module):
            name = "tokenizer"
        if name is None:
            raise ValueError(f"{config.describe()} loads {type(component).__name__}, which {type(self).__name__} has "
                             f"no slot for; it takes {sorted(self.model_roles)} and a tokenizer")
        held = getattr(self, name, None)
        if held is not None:
            # The other half of a model cut in two files (a VAE's encoder file and decoder file) joins the held one.
            if isinstance(held, torch.nn.Module) and join_parts(held, component):
                return name
            raise ValueError(f"{config.describe()} loads a second {name}; give each model one config")
        setattr(self, name, component)
        self.model_configs[name] = config
        return name

    @classmethod
    def required_columns(cls, extra_inputs: Sequence[str] = ()) -> list[str]:
        """The metadata columns a training sample must have: ``training_columns`` and the ``--extra_inputs`` that
        cannot be derived from them."""
        return [*cls.training_columns, *(name for name in extra_inputs if name not in cls.derived_inputs)]

    def training_inputs(self, sample: dict[str, Any], extra_inputs: Sequence[str] = ()) -> tuple[dict, dict, dict]:
        """The unit state for one dataset sample: its media (``training_media``), then ``training_state``, then the
        ``extra_inputs`` columns (which may override that state; an ``optional_inputs`` column the row leaves empty
        is left out), then what the pipeline derives (``derived_training_inputs``); the prompt is the positive
        branch's, the negative one stays empty."""
        given = [name for name in extra_inputs if name not in self.derived_inputs
                 and (name in sample or name not in self.optional_inputs)]
        inputs_shared = {
            **self.training_media(sample), **self.training_state, **{name: sample[name] for name in given},
            **self.derived_training_inputs(sample, extra_inputs),
        }  # fmt: skip
        return inputs_shared, {"prompt": sample["prompt"]}, {}

    def training_media(self, sample: dict[str, Any]) -> dict[str, Any]:
        """The state of a sample's media columns (an image pipeline: ``input_image`` and its size)."""
        raise NotImplementedError(f"{type(self).__name__} must implement training_media(sample) to train")

    def derived_training_inputs(self, sample: dict[str, Any], extra_inputs: Sequence[str]) -> dict[str, Any]:
        """The ``derived_inputs`` of a sample, which ``training_inputs`` puts last; by default none."""
        return {}

    def loss_regions(self, inputs_shared: dict) -> tuple[tuple[slice, ...] | None, ...]:
        """The parts of the latents a training loss compares (each an index into them; None for all of it), whose
        mean squared errors it adds up, each averaged on its own. By default the whole latents; pipelines whose inputs
        fix part of the latents (a given first frame) leave that part out, and LTX-2 scores its video's tokens and its
        sound's apart. An index may start with a ``(batch,)`` bool tensor instead of a slice: the samples the region
        scores (LTX-2's sound, in a batch mixing clips with and without it); the others add 0 for it."""
        return (None,)

    @classmethod
    def host_model(cls, name: str) -> str:
        """The model holding ``name``: a part's host (``model_parts``), a ``<model>.<path>``'s model, else ``name``."""
        if name in cls.model_parts:
            return cls.model_parts[name][0]
        return name.split(".", 1)[0]

    @classmethod
    def part_scope(cls, name: str, model: torch.nn.Module) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """``(inside, outside)``: the child modules of ``model`` (what ``name`` resolves to) that training ``name``
        covers and those it leaves to its parts; both empty for a model without parts present in it.

        Raises:
            ValueError: ``name`` is a part that ``model`` lacks.
        """
        present = {child for child, _ in model.named_children()}
        if "." in name and name not in cls.model_parts:  # a submodule path: that module alone
            return (name.split(".", 1)[1],), ()
        if name in cls.model_parts:
            host, children = cls.model_parts[name]
            missing = [child for child in children if child not in present]
            if missing:
                raise ValueError(f"{name} is part of {host}, but the loaded {type(model).__name__} has no "
                                 f"{', '.join(missing)}; load a model that has it, or name {host} instead")
            return children, ()
        outside = tuple(prefix for host, prefixes in cls.model_parts.values() if host == name
                        for prefix in prefixes if prefix in present)
        return (), outside

    def model_names(self) -> list[str]:
        """The names of the models this pipeline holds (its child modules)."""
        return [name for name, _ in self.named_children()]

    def load_models_to_device(self, model_names: Iterable[str]) -> None:
        """Moves the named models to ``device`` and every other model to ``offload_device``.

        Does nothing while ``manage_model_devices`` is off. Names of slots that hold no model (``None``, or a
        tokenizer) are accepted and skipped, so stage 2 can run without the models it does not need. Models already
        in place are not touched.

        Raises:
            ValueError: A name is not an attribute of the pipeline at all (a typo in ``onload_model_names``).
        """
        if not self.manage_model_devices:
            return
        if isinstance(model_names, str):
            raise TypeError(f"model_names={model_names!r} is a string; pass a list, e.g. [{model_names!r}]")
        wanted = set(model_names)
        unknown = sorted(name for name in wanted if getattr(self, name, _MISSING) is _MISSING)
        if unknown:
            raise ValueError(f"unknown model names {unknown}; {type(self).__name__} holds {self.model_names()} "
                             "(fix the unit's onload_model_names)")
        # Offload first, so the device never holds the outgoing and the incoming models at once.
        children = list(self.named_children())
        for name, model in children:
            if name not in wanted:
                self._place(model, self.offload_device)
        for name, model in children:
            if name in wanted:
                self._place(model, self.device)

    @staticmethod
    def _place(model: torch.nn.Module, device: torch.device) -> None:
        tensors = itertools.chain(model.parameters(), model.buffers())
        # resolve_device filled in a bare "cuda" index, so this compares like with like.
        if any(tensor.device != device for tensor in tensors):
            model.to(device)

    def run_units(self, inputs_shared: dict, inputs_posi: dict, inputs_nega: dict,
                  units: Sequence[PipelineUnit] | None = None) -> tuple[dict, dict, dict]:
        """Runs ``units`` (default: all of ``self.units``) in order through ``self.unit_runner``."""
        for unit in self.units if units is None else units:
            inputs_shared, inputs_posi, inputs_nega = self.unit_runner(unit, self, inputs_shared, inputs_posi,
                                                                       inputs_nega)
        return inputs_shared, inputs_posi, inputs_nega

    def set_inference_timesteps(self, num_inference_steps: int, denoising_strength: float = 1.0, *,
                                latent_shape: tuple[int, ...]) -> None:
        """Sets the scheduler's sampling schedule for latents of ``latent_shape`` (some shifts depend on size)."""
        self.scheduler.set_timesteps(num_inference_steps, denoising_strength)

    def model_fn(self, **inputs: Any) -> torch.Tensor:
        """One denoiser prediction; receives the merged state (shared, then one branch) and ``timestep``."""
        raise NotImplementedError(f"{type(self).__name__} must implement model_fn(**inputs)")

    def decode(self, inputs_shared: dict, inputs_posi: dict, inputs_nega: dict) -> Any:
        """Turns the state after denoising (``inputs_shared["latents"]``) into the pipeline's output."""
        raise NotImplementedError(f"{type(self).__name__} must implement decode(inputs_shared, inputs_posi, "
                                  "inputs_nega)")

    def sample_input_problems(self, inputs: set[str]) -> list[str]:
        """What is wrong with rendering a prompt that gives the image ``inputs`` (``edit_image``, ``input_image``) with
        the loaded models; checked before training renders samples. Pipelines whose models need or refuse an image
        say so; by default nothing."""
        return []

    def save_output(self, output: Any, stem: Path, fps: int = 16) -> Path:
        """Writes what ``__call__`` returned to ``stem`` with the suffix of its kind (a sample while training);
        ``fps`` is the frame rate of a video."""
        raise NotImplementedError(f"{type(self).__name__} must implement save_output(output, stem, fps)")

    def predict_noise(self, inputs_shared: dict, inputs_posi: dict, inputs_nega: dict,
                      timestep: Any) -> torch.Tensor:
        """The guided prediction (``guide``), or just the positive one when ``cfg_scale`` is 1.

        CFG doubles the denoiser's work per step, which is why a scale of exactly 1 skips the negative pass.
        """
        prediction = self.model_fn(**_merge(inputs_shared, inputs_posi, "inputs_posi", timestep))
        cfg_scale = inputs_shared.get("cfg_scale", 1)
        if cfg_scale == 1:
            return prediction
        negative = self.model_fn(**_merge(inputs_shared, inputs_nega, "inputs_nega", timestep))
        return self.guide(prediction, negative, cfg_scale)

    def guide(self, positive: torch.Tensor, negative: torch.Tensor, cfg_scale: float) -> torch.Tensor:
        """Combines the two CFG predictions: ``negative + cfg_scale * (positive - negative)``.

        Pipelines whose reference rescales the result (Qwen-Image) override this.
        """
        return negative + cfg_scale * (positive - negative)

    @torch.no_grad()
    def denoise(self, inputs_shared: dict, inputs_posi: dict, inputs_nega: dict,
                latents_key: str = "latents", progress_bar: bool = False) -> Any:
        """Inference: run the units, step the scheduler over its timesteps, decode.

        Args:
            inputs_shared: User inputs for both branches, including ``cfg_scale`` (default 1).
            inputs_posi: Positive-branch inputs (e.g. ``{"prompt": ...}``).
            inputs_nega: Negative-branch inputs (e.g. ``{"negative_prompt": ...}``).
            latents_key: The shared key the units leave the initial latents under.
            progress_bar: Show a tqdm bar over the denoising steps, on a terminal only (in a log file its redraws
                would pile up into one long line).

        Returns:
            Whatever ``decode`` returns.

        Raises:
            ValueError: No scheduler is set, or the units left no ``latents_key``.
        """
        if self.scheduler is None:
            raise ValueError(f"{type(self).__name__}.scheduler is None; set it to an object with timesteps and "
                             "step(model_output, timestep, sample) before denoising")
        inputs_shared, inputs_posi, inputs_nega = self.run_units(inputs_shared, inputs_posi, inputs_nega)
        if inputs_shared.get(latents_key) is None:
            raise ValueError(f"no {latents_key!r} in inputs_shared after the units ran; a unit must output it, "
                             f"or pass latents_key= the key that holds the latents")
        self.load_models_to_device(self.denoising_model_names)
        # tqdm's disable=None turns the bar off where its stream is not a terminal.
        for timestep in tqdm(self.scheduler.timesteps, desc="denoising", disable=None if progress_bar else True):
            prediction = self.predict_noise(inputs_shared, inputs_posi, inputs_nega, timestep)
            inputs_shared[latents_key] = self.scheduler.step(prediction, timestep, inputs_shared[latents_key])
        return self.decode(inputs_shared, inputs_posi, inputs_nega)

    def split_pipeline_units(self, model_names: Iterable[str], final_keys: Iterable[str | StateKey] = ()
                             ) -> tuple[list[PipelineUnit], list[PipelineUnit]]:
        """``(related, unrelated)`` units of this pipeline; see ``unit_graph.split_pipeline_units``."""
        return split_pipeline_units(self.units, model_names, final_keys)


def _sibling_tokenizer(text_encoder_config: ModelConfig) -> ModelConfig | None:
    """The tokenizer of the repository the text encoder came from, when it is a repository: its ``tokenizer/``
    folder, or the tokenizer files beside weights kept at the root (Gemma's and other language models' releases)."""
    if text_encoder_config.model_id is None:
        return None
    at_root = "/" not in (text_encoder_config.origin_file_pattern or "")
    return ModelConfig(model_id=text_encoder_config.model_id,
                       origin_file_pattern="tokenizer*" if at_root else "tokenizer/")


def _merge(inputs_shared: dict, branch: dict, branch_name: str, timestep: Any) -> dict:
    overlap = sorted((set(inputs_shared) & set(branch)) | ({"timestep"} & (set(inputs_shared) | set(branch))))
    if overlap:
        raise ValueError(f"keys {overlap} appear twice among inputs_shared, {branch_name} and the loop's timestep; "
                         "keep each key in one place so model_fn gets one unambiguous value")
    return {**inputs_shared, **branch, "timestep": timestep}
