"""Pipeline units: the declared steps a pipeline runs before denoising, and the runner that feeds them.

A pipeline keeps its working state in three dicts: ``inputs_shared`` (everything both CFG branches use),
``inputs_posi`` and ``inputs_nega`` (what differs between the positive and the negative branch, e.g. the prompt and
its embedding). A unit declares which keys it reads and writes; the runner reads exactly those keys, calls
``process``, and stores the result. The split into training stages (``unit_graph.py``) trusts these declarations and
nothing else, so a unit that reads or writes an undeclared key breaks split training silently. The runner therefore
rejects undeclared outputs.

Three kinds of unit:

- plain: reads ``input_params`` from ``inputs_shared`` and writes its outputs there;
- ``separate_cfg``: runs once for the positive branch (arguments from ``input_params_posi``, looked up in
  ``inputs_posi``) and, when CFG is on (``inputs_shared["cfg_scale"] != 1``), once for the negative branch
  (``input_params_nega``, looked up in ``inputs_nega``); both passes also get ``input_params`` from ``inputs_shared``.
  With CFG off the positive outputs are copied into ``inputs_nega`` too, so that every declared write really
  happens; the split analysis relies on that;
- ``take_over``: receives and returns the three dicts and does what it likes with them.

A unit may leave out a declared output that it has nothing to produce for (the key then keeps its previous value or
stays absent). If an earlier unit may already have written that key, also declare it as an input: "unchanged" is then
still a function of what the unit read, which is what the split assumes of every write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base_pipeline import BasePipeline

# The three state dicts, by the names the split analysis and the cache-pruning unit use for them.
SCOPES: tuple[str, str, str] = ("shared", "posi", "nega")


def _name_tuple(value: Iterable[str] | None, argument: str) -> tuple[str, ...]:
    """Normalises a declared list of names; a bare string is a common slip that would be read as its characters."""
    if value is None:
        return ()
    if isinstance(value, str):
        raise TypeError(f"{argument}={value!r} is a string; pass a tuple of names, e.g. {argument}=({value!r},)")
    names = tuple(value)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"{argument} holds {name!r}, which is not a string; declare keys by name")
    return names


def _name_mapping(value: Mapping[str, str] | None, argument: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{argument}={value!r} must be a dict from process() argument name to state key, "
                        f"e.g. {{'prompt': 'prompt'}}")
    return dict(value)


class PipelineUnit:
    """One declared step of a pipeline.

    Subclasses pass their declarations to ``__init__`` and implement ``process``.

    Args:
        separate_cfg: Run once per CFG branch; see the module docstring.
        take_over: ``process`` receives and returns the three state dicts.
        input_params: Names read from ``inputs_shared``; each is passed to ``process`` under the same name.
        output_params: Keys of the dict ``process`` returns (for a ``take_over`` unit: the keys it may write).
        input_params_posi: ``{argument: key}``: for the positive pass, ``process`` gets ``inputs_posi[key]`` as
            ``argument``.
        input_params_nega: The same for the negative pass, looked up in ``inputs_nega``.
        onload_model_names: Pipeline models (``dit``, ``vae``, ...) the unit computes with; the runner moves them to
            the compute device first, and the split treats the unit as trainable when one of them is trained.
        seperate_cfg: The reference implementation's spelling of ``separate_cfg``, accepted as an alias.

    Raises:
        ValueError: Contradictory declarations (both ``separate_cfg`` and ``take_over``; positive and negative
            arguments that differ; branch arguments on a plain unit).
    """

    def __init__(self, separate_cfg: bool = False, take_over: bool = False,
                 input_params: Iterable[str] | None = None, output_params: Iterable[str] | None = None,
                 input_params_posi: Mapping[str, str] | None = None,
                 input_params_nega: Mapping[str, str] | None = None,
                 onload_model_names: Iterable[str] | None = None, *, seperate_cfg: bool | None = None) -> None:
        if seperate_cfg is not None:
            if separate_cfg and not seperate_cfg:
                raise ValueError("separate_cfg=True and seperate_cfg=False contradict each other; pass only one")
            separate_cfg = bool(seperate_cfg)
        if separate_cfg and take_over:
            raise ValueError("a unit cannot be both separate_cfg and take_over; a take_over unit handles both "
                             "CFG branches itself, so drop separate_cfg")
        self.separate_cfg = bool(separate_cfg)
        self.take_over = bool(take_over)
        self.input_params = _name_tuple(input_params, "input_params")
        self.output_params = _name_tuple(output_params, "output_params")
        self.input_params_posi = _name_mapping(input_params_posi, "input_params_posi")
        self.input_params_nega = _name_mapping(input_params_nega, "input_params_nega")
        self.onload_model_names = _name_tuple(onload_model_names, "onload_model_names")
        has_branch_params = bool(self.input_params_posi or self.input_params_nega)
        if self.separate_cfg and set(self.input_params_posi) != set(self.input_params_nega):
            # process() is one function called for both passes, so both must supply the same arguments.
            raise ValueError(f"{type(self).__name__}: input_params_posi arguments {sorted(self.input_params_posi)} "
                             f"and input_params_nega arguments {sorted(self.input_params_nega)} must be the same")
        if has_branch_params and not (self.separate_cfg or self.take_over):
            raise ValueError(f"{type(self).__name__} declares input_params_posi/input_params_nega but is not "
                             "separate_cfg; set separate_cfg=True or move the keys to input_params")

    @property
    def seperate_cfg(self) -> bool:
        """Alias of ``separate_cfg`` under the reference implementation's spelling."""
        return self.separate_cfg

    def fetch_input_params(self) -> list[str]:
        """All state keys the unit declares it reads, shared and per-branch, each once, in declaration order."""
        names = [*self.input_params, *self.input_params_posi.values(), *self.input_params_nega.values()]
        return list(dict.fromkeys(names))

    def fetch_output_params(self) -> list[str]:
        """All state keys the unit declares it writes."""
        return list(self.output_params)

    def process(self, pipe: BasePipeline, **inputs: Any) -> Any:
        """Computes the unit's outputs.

        Args:
            pipe: The pipeline, for its models, device and dtype.
            **inputs: The declared inputs (a ``take_over`` unit gets ``inputs_shared``, ``inputs_posi`` and
                ``inputs_nega`` instead).

        Returns:
            A dict from output key to value; a ``take_over`` unit returns the three state dicts.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement process(pipe, **inputs)")

    def __repr__(self) -> str:
        kind = "take_over" if self.take_over else "separate_cfg" if self.separate_cfg else "plain"
        return (f"{type(self).__name__}({kind}, in={self.fetch_input_params()}, out={list(self.output_params)}, "
                f"models={list(self.onload_model_names)})")


class PipelineUnitRunner:
    """Feeds one unit its declared inputs and stores its outputs in the state dicts (updated in place)."""

    def __call__(self, unit: PipelineUnit, pipe: BasePipeline, inputs_shared: dict, inputs_posi: dict,
                 inputs_nega: dict) -> tuple[dict, dict, dict]:
        """Runs ``unit``.

        Args:
            unit: The unit.
            pipe: The pipeline; its ``load_models_to_device`` is called with the unit's models first.
            inputs_shared: State used by both CFG branches; ``cfg_scale`` (default 1) is read from here.
            inputs_posi: Positive-branch state.
            inputs_nega: Negative-branch state.

        Returns:
            ``(inputs_shared, inputs_posi, inputs_nega)`` after the unit.

        Raises:
            ValueError: The unit returned a key it did not declare, or a ``take_over`` unit returned something
                other than three dicts.
        """
        if unit.onload_model_names:
            # Model-free units leave placement alone, so a run of them does not shuffle weights back and forth.
            pipe.load_models_to_device(unit.onload_model_names)
        if unit.take_over:
            result = unit.process(pipe, inputs_shared=inputs_shared, inputs_posi=inputs_posi, inputs_nega=inputs_nega)
            if not (isinstance(result, tuple) and len(result) == 3 and all(isinstance(d, dict) for d in result)):
                raise ValueError(f"{unit!r} is take_over, so process() must return (inputs_shared, inputs_posi, "
                                 f"inputs_nega); it returned {type(result).__name__}")
            return result
        shared_args = {name: inputs_shared.get(name) for name in unit.input_params}
        if not unit.separate_cfg:
            inputs_shared.update(self._call(unit, pipe, shared_args))
            return inputs_shared, inputs_posi, inputs_nega
        posi_args = {arg: inputs_posi.get(key) for arg, key in unit.input_params_posi.items()}
        posi_outputs = self._call(unit, pipe, {**shared_args, **posi_args})
        inputs_posi.update(posi_outputs)
        if inputs_shared.get("cfg_scale", 1) != 1:
            nega_args = {arg: inputs_nega.get(key) for arg, key in unit.input_params_nega.items()}
            inputs_nega.update(self._call(unit, pipe, {**shared_args, **nega_args}))
        else:
            inputs_nega.update(posi_outputs)
        return inputs_shared, inputs_posi, inputs_nega

    @staticmethod
    def _call(unit: PipelineUnit, pipe: BasePipeline, arguments: dict[str, Any]) -> dict[str, Any]:
        outputs = unit.process(pipe, **arguments)
        if not isinstance(outputs, Mapping):
            raise ValueError(f"{unit!r}.process() returned {type(outputs).__name__}; return a dict of its outputs")
        undeclared = sorted(set(outputs) - set(unit.output_params))
        if undeclared:
            raise ValueError(f"{unit!r} returned undeclared keys {undeclared}; add them to output_params, since "
                             "the split into training stages only sees declared outputs")
        return dict(outputs)
