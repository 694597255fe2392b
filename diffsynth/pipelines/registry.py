"""The registry of model families: each family's room declares one ``FamilySpec`` in its ``spec.py``, and every table
of the package (the planner, ``plan.py``, the LoRA namings and tool loaders, fp8, full-model writing, the reference
trainer's refusals, ``diffsynth-launch families``, the docs) reads it here.

A spec is data: importing this module or a ``spec.py`` imports no model library (not even torch), so the trainer's flag
checks and the planner's CLI can read it before anything heavy loads. What is code (a pipeline class, the planner's
denoiser inputs, an original-layout reader) is named as ``"package.module:attribute"`` and imported on first use by
``load``.

Families are found, not listed: every subpackage of ``diffsynth/pipelines/`` with a ``spec.py`` that defines ``SPEC``.
"""

from __future__ import annotations

import fnmatch
import functools
import importlib
import pkgutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PACKAGE = __name__.rpartition(".")[0]
ROOMS = Path(__file__).resolve().parent


def load(reference: str) -> Any:
    """The attribute ``"package.module:attribute"`` names, imported."""
    module, sep, attribute = reference.partition(":")
    if not sep:
        raise ValueError(f"{reference!r} must be 'package.module:attribute'")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class Release:
    """A released denoiser the planner knows without its files.

    Attributes:
        architecture: The planner's name for it (``--architecture``), e.g. ``"wan2.1-t2v-14b"``.
        config: Its diffusers config (the class's ``__init__`` arguments that differ from diffusers' defaults).
        model_ids: Repository ids (shell patterns, matched ignoring case) whose files hold it.
        denoiser_class: Its diffusers class where it is not the family's ``denoiser_class`` (one of its
            ``other_denoiser_classes``, e.g. Wan VACE's).
    """

    architecture: str
    config: Mapping[str, Any] = field(default_factory=dict)
    model_ids: tuple[str, ...] = ()
    denoiser_class: str | None = None


@dataclass(frozen=True)
class OriginalCheckpoint:
    """How a full fine-tune is written in the layout of the model's original release (``--full_checkpoint_format
    original``).

    Attributes:
        convert: ``"module:function"``, ``state_dict -> state_dict`` under the original names.
        folder_config: ``"module:function"``, ``model -> config.json`` of an original folder; None for a single file.
    """

    convert: str
    folder_config: str | None = None


@dataclass(frozen=True)
class LoraTools:
    """How the real tools load this family's LoRA files, for the LoRA checks (``lora.tools``).

    Attributes:
        diffusers_loader: The diffusers ``LoraLoaderMixin`` class whose ``lora_state_dict`` reads them.
        comfyui_key_map: Which of ComfyUI's LoRA key maps the model gets: ``"native"`` (``diffusion_model.`` and
            ``lora_unet_`` names), ``"native_bare"`` (also the bare and ``transformer.`` names), ``"lumina2"`` (the
            Lumina2/NextDiT map) or ``"bfl"`` (the map onto BFL's fused layout).
        diffsynth_studio_loader: ``"native"`` (keys under the native names), ``"native_or_diffusers"`` (also
            diffusers' names under ``transformer.``, which it renames: Krea 2) or ``"bfl"`` (its loader for BFL-layout
            models, which renames and fuses).
    """

    diffusers_loader: str
    comfyui_key_map: str = "native"
    diffsynth_studio_loader: str = "native"

    def __post_init__(self) -> None:
        if self.comfyui_key_map not in ("native", "native_bare", "lumina2", "bfl"):
            raise ValueError(f"comfyui_key_map={self.comfyui_key_map!r} must be native, native_bare, lumina2 or bfl")
        if self.diffsynth_studio_loader not in ("native", "native_or_diffusers", "bfl"):
            raise ValueError(f"diffsynth_studio_loader={self.diffsynth_studio_loader!r} must be native, "
                             "native_or_diffusers or bfl")


@dataclass(frozen=True)
class FamilySpec:
    """One model family, declared in its room ``diffsynth/pipelines/<name>/spec.py``.

    Attributes:
        name: The room's folder name, e.g. ``"qwen_image"``.
        title: What the family is called in tables and messages.
        pipeline: ``"module:Class"`` of its pipeline, as its ``train.py`` passes it to ``cli``.
        plan_name: The planner's ``--pipeline`` value.
        denoiser_class: The diffusers class of its denoiser (what a LoRA trains).
        video: Whether it trains on videos (``cli(..., video=True)``).
        model_ids: The released repositories it trains (their ids as the reference's scripts name them).
        releases: The released denoisers the planner knows without files.
        layouts: The released layouts it reads (for the families table).
        original_readers: ``"module:function"`` readers of its original layouts (``core.model_traits``).
        original_checkpoint: How a full fine-tune is written in its original layout; None where the release is a
            diffusers folder.
        prompt_tokens: Prompt tokens per sample the planner assumes (a long caption, or the padded length).
        planner_inputs: ``"module:function"``, ``(model, height, width, frames, dtype, batch, prompt_tokens) ->
            the denoiser's keyword inputs`` on the meta device; by default the room's ``planning:planner_inputs``.
        scheduler_presets: Flow-match scheduler settings by preset name (``FlowMatchScheduler`` arguments).
        lora_naming: ``"module:attribute"`` of its ``ModuleNaming`` (original-release layer names); by default the
            room's ``naming:NAMING``; None keeps diffusers' names.
        lora_tools: How the real tools load its LoRA files.
        fp8_input_casting_layers: Layers whose forward casts its input to their weight dtype (kept out of fp8).
        refused_model_ids: Repository id prefixes of the family's models this trainer does not run, and why.
        bitsandbytes_model_ids: Repository id prefixes of its releases packed in bitsandbytes' 4-bit layout, which
            need bitsandbytes to load whatever the flags say.
        other_denoiser_classes: Further classes of its denoisers, which share its LoRA naming, planner inputs and
            tools: diffusers classes of variants diffusers models apart (``WanVACETransformer3DModel``) and the room's
            subclasses of its class for variants with modules diffusers' class lacks (``WanFunTransformer3DModel``).
        reference_flags: The reference trainer's flags that only this family's ``train.py`` defines (all parse; the
            trainer's config says what it does with each).
        example_folder: Its ``examples/<folder>/model_training`` folder (the reference's scripts).
        docs_page: Its page under ``docs/en/``.
        block_swap: Whether ``--blocks_to_swap`` applies to its denoiser (a sequence of blocks ``find_block_sequence``
            finds); False for a UNet, which the trainer then refuses block swap for by name.
    """

    name: str
    title: str
    pipeline: str
    plan_name: str
    denoiser_class: str
    lora_tools: LoraTools
    example_folder: str
    docs_page: str
    planner_inputs: str = ""
    video: bool = False
    model_ids: tuple[str, ...] = ()
    releases: tuple[Release, ...] = ()
    layouts: tuple[str, ...] = ("diffusers",)
    original_readers: tuple[str, ...] = ()
    original_checkpoint: OriginalCheckpoint | None = None
    prompt_tokens: int = 512
    scheduler_presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    lora_naming: str | None = ""
    fp8_input_casting_layers: tuple[str, ...] = ()
    refused_model_ids: Mapping[str, str] = field(default_factory=dict)
    bitsandbytes_model_ids: tuple[str, ...] = ()
    reference_flags: tuple[str, ...] = ()
    other_denoiser_classes: tuple[str, ...] = ()
    block_swap: bool = True

    def __post_init__(self) -> None:
        # The room's own modules by convention: planning.py and naming.py beside the spec.
        room = f"{PACKAGE}.{self.name}"
        if not self.planner_inputs:
            object.__setattr__(self, "planner_inputs", f"{room}.planning:planner_inputs")
        if self.lora_naming == "":
            object.__setattr__(self, "lora_naming", f"{room}.naming:NAMING")
        for label, reference in (("pipeline", self.pipeline), ("planner_inputs", self.planner_inputs),
                                 *(("original_readers", r) for r in self.original_readers),
                                 *((("lora_naming", self.lora_naming),) if self.lora_naming else ())):
            module, sep, attribute = reference.partition(":")
            if not sep or not module.startswith(PACKAGE) or not attribute.isidentifier():
                raise ValueError(f"family {self.name!r}: {label}={reference!r} must be '{PACKAGE}.<module>:<name>'")
        if self.prompt_tokens < 1:
            raise ValueError(f"family {self.name!r}: prompt_tokens={self.prompt_tokens} must be at least 1")

    def pipeline_class(self) -> type:
        """The pipeline class (imports the model libraries)."""
        return load(self.pipeline)

    @property
    def architectures(self) -> list[str]:
        """The planner names of its releases."""
        return [release.architecture for release in self.releases]


class FamilyNotFound(LookupError):
    """No registered family matches; the message lists the ones there are."""


@functools.cache
def families() -> tuple[FamilySpec, ...]:
    """Every family's spec, in the order of their folder names."""
    found = []
    for module in sorted(pkgutil.iter_modules([str(ROOMS)]), key=lambda info: info.name):
        if module.ispkg and (ROOMS / module.name / "spec.py").is_file():
            spec = importlib.import_module(f"{PACKAGE}.{module.name}.spec").SPEC
            if spec.name != module.name:
                raise ValueError(f"{PACKAGE}.{module.name}.spec.SPEC is named {spec.name!r}; name it {module.name!r}")
            found.append(spec)
    _check_unique(found)
    return tuple(found)


def _check_unique(specs: Iterable[FamilySpec]) -> None:
    seen: dict[tuple[str, str], str] = {}
    for spec in specs:
        keys = [("plan name", spec.plan_name), ("pipeline", spec.pipeline), ("denoiser class", spec.denoiser_class),
                *(("architecture", name) for name in spec.architectures),
                *(("scheduler preset", name) for name in spec.scheduler_presets)]
        for key in keys:
            if key in seen:
                raise ValueError(f"families {seen[key]!r} and {spec.name!r} both declare the {key[0]} {key[1]!r}")
            seen[key] = spec.name


def family(name: str) -> FamilySpec:
    """The family of that folder name.

    Raises:
        FamilyNotFound: There is none.
    """
    return _only(lambda spec: spec.name == name,
                 f"no family {name!r}; the families are {', '.join(s.name for s in families())}")


def _only(matches: Callable[[FamilySpec], bool], missing: str) -> FamilySpec:
    found = next((spec for spec in families() if matches(spec)), None)
    if found is None:
        raise FamilyNotFound(missing)
    return found


def family_of_class(class_name: str) -> FamilySpec | None:
    """The family whose denoiser is ``class_name`` (a diffusers class name or a room's subclass of one), or None."""
    return next((spec for spec in families()
                 if class_name == spec.denoiser_class or class_name in spec.other_denoiser_classes), None)


def family_of_plan_name(plan_name: str) -> FamilySpec:
    """The family of a planner ``--pipeline`` value.

    Raises:
        FamilyNotFound: There is none.
    """
    return _only(lambda spec: spec.plan_name == plan_name,
                 f"no family plans as {plan_name!r}; choose one of {', '.join(plan_names())}")


def plan_names() -> list[str]:
    """The planner's ``--pipeline`` values, sorted."""
    return sorted(spec.plan_name for spec in families())


def releases() -> dict[str, tuple[FamilySpec, Release]]:
    """Every known release by its architecture name."""
    return {release.architecture: (spec, release) for spec in families() for release in spec.releases}


def released_architecture(model_ids: Iterable[str]) -> str | None:
    """The release that the repository ids name together; None when one of them is no known release or they name
    different denoisers (a Wan2.2 transformer beside Wan2.1's VAE)."""
    names = set()
    for model_id in model_ids:
        named = {release.architecture for spec in families() for release in spec.releases
                 for pattern in release.model_ids if fnmatch.fnmatchcase(model_id.lower(), pattern.lower())}
        if not named:
            return None
        names |= named
    return names.pop() if len(names) == 1 else None


def scheduler_preset(name: str) -> dict[str, Any]:
    """The flow-match settings of preset ``name`` (case ignored), from the family that declares it.

    Raises:
        ValueError: No family declares it.
    """
    presets = {key: value for spec in families() for key, value in spec.scheduler_presets.items()}
    if name.lower() not in presets:
        raise ValueError(f"scheduler preset {name!r} is unknown; choose one of {sorted(presets)}")
    return dict(presets[name.lower()])


def refused_model_ids() -> dict[str, str]:
    """Every family's refused repository id prefixes and why."""
    return {prefix: why for spec in families() for prefix, why in spec.refused_model_ids.items()}


def bitsandbytes_model_ids() -> tuple[str, ...]:
    """Every family's repository id prefixes of releases that need bitsandbytes to load."""
    return tuple(prefix for spec in families() for prefix in spec.bitsandbytes_model_ids)


def register_traits() -> None:
    """Registers what loading and fp8 storage must know of the families' models (``core.model_traits``)."""
    from ..core.model_traits import register_input_casting_layers, register_original_layout

    for spec in families():
        for reader in spec.original_readers:
            register_original_layout(reader)
        if spec.fp8_input_casting_layers:
            register_input_casting_layers(spec.denoiser_class, spec.fp8_input_casting_layers)
