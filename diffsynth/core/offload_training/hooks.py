"""The residency driver: the one module that hooks units and tells a policy when their weights are needed.

Per-leaf offload with prefetch, classic block swap and the H2D-only ring are one state machine around a list of
*units* (modules whose calls bracket the use of their weights). The driver observes the moments and a
``ResidencyPolicy`` decides what to load and evict at each:

- a pass starts: the root's forward pre-hook outside backward (unit 0's without a root) -> ``on_pass_start``;
- a unit runs forward: its pre-hook -> ``before_forward``; its forward hook -> ``after_forward``;
- a unit is re-run inside backward (gradient checkpointing): its hooks during a backward -> ``before_recompute``,
  ``after_recompute``;
- the gradient of a unit's output arrives: a pre-hook on each output's autograd node, if asked ->
  ``on_backward_start``;
- a unit's input gradients are complete: an identity autograd node on its inputs -> ``on_backward_done``.

A module's backward has no hook that fires once all of its input gradients exist when its inputs arrive as keyword
arguments or when it is not a leaf; routing the inputs through one identity node gives that moment exactly: for one
input a view of it (``view_as``, whose node's pre-hook runs once the unit's contribution to that gradient is
complete), for several one autograd function (``UnitBoundary``). Pending backwards are counted per unit; a graph
dropped without a backward frees its boundary, which releases the count, so a discarded forward never pins a unit.
Reentrant checkpointing runs the forward without grad, so its recompute is bracketed instead. While the root runs
the driver can also replace what autograd saves (``saved_tensor_hooks``): the offload manager saves references to
weights instead of device copies.

The hooks run for every unit call, a few hundred times per step (one per leaf module by default), so they do what
the moment needs and no more: one scan of the inputs, no generator over flat tensor arguments, pre-hooks on C++
autograd nodes rather than tensor hooks or a Python autograd function wherever one input allows.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn


class UnitBoundary(torch.autograd.Function):
    """Identity on a unit's inputs whose backward runs once the unit's input gradients are complete."""

    @staticmethod
    def forward(ctx: Any, on_backward_done: Any, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.on_backward_done = on_backward_done
        return tensors

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        if ctx.on_backward_done is not None:
            ctx.on_backward_done()
        return (None, *grads)


def grad_inputs(args: tuple, kwargs: dict) -> tuple[list[int], list[str]]:
    """The positions and keyword names of the tensor arguments that need a gradient (top level only)."""
    positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    keys = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor) and v.requires_grad] if kwargs else []
    return positions, keys


def wrap_inputs(on_backward_done: Callable[..., None] | None, args: tuple, kwargs: dict, positions: list[int],
                keys: list[str]) -> tuple[tuple, dict] | None:
    """Routes the inputs at ``positions`` and ``keys`` (``grad_inputs``) through one identity node whose backward
    calls ``on_backward_done`` (None: nothing to call, the same ops only).

    Returns:
        The forward-pre-hook result ``(args, kwargs)`` with those inputs replaced, or None when there are none (then
        there is no moment to mark, and nothing is wrapped).
    """
    count = len(positions) + len(keys)
    if not count:
        return None
    if count == 1:
        tensor = args[positions[0]] if positions else kwargs[keys[0]]
        alias = tensor.view_as(tensor)  # the view a custom function makes of an input it returns: the same ops
        if on_backward_done is not None:
            alias.grad_fn.register_prehook(on_backward_done)
        wrapped = (alias,)
    else:
        wrapped = UnitBoundary.apply(on_backward_done, *[args[i] for i in positions], *[kwargs[k] for k in keys])
    if positions:
        args = list(args)
        for i, tensor in zip(positions, wrapped):
            args[i] = tensor
        args = tuple(args)
    if keys:
        kwargs = dict(kwargs)
        for key, tensor in zip(keys, wrapped[len(positions):]):
            kwargs[key] = tensor
    return args, kwargs


def _nested_input_needs_grad(args: tuple, kwargs: dict) -> bool:
    """Whether a tensor inside a container argument (a list, a dict, a dataclass) needs a gradient."""
    return any(tensor.requires_grad for value in (*args, *kwargs.values()) if not isinstance(value, torch.Tensor)
               for tensor in iter_tensors(value))


def iter_tensors(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor inside ``value``: nested lists, tuples, dicts and dataclasses (model outputs)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from iter_tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from iter_tensors(item)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for item in dataclasses.fields(value):
            yield from iter_tensors(getattr(value, item.name))


_graph_task_id = torch._C._current_graph_task_id


def inside_backward() -> bool:
    """Whether autograd is running a backward pass now (a forward here is a checkpoint recompute)."""
    return _graph_task_id() != -1


class ResidencyMeter:
    """Bytes of weights a policy holds on the device now, and their peak (what the planner predicts per policy);
    weights placed on the device for good (a LoRA, the unmanaged parts of a block-swapped model) are not counted.
    ``copies`` indexes the offload manager's live device copies by storage address (to recognise saved weights).

    A ``parent`` meter (``attach``) counts the same bytes too: one meter over several models' policies gives the
    peak of what they hold at once.
    """

    def __init__(self) -> None:
        self.current = 0
        self.peak = 0
        self.copies: dict[int, Any] = {}
        self.parent: ResidencyMeter | None = None

    def attach(self, parent: ResidencyMeter) -> None:
        """Counts this meter's bytes in ``parent`` from now on, those held now included."""
        parent.add(self.current)
        self.parent = parent

    def add(self, nbytes: int) -> None:
        self.current += nbytes
        self.peak = max(self.peak, self.current)
        if self.parent is not None:
            self.parent.add(nbytes)

    def sub(self, nbytes: int) -> None:
        self.current -= nbytes
        if self.parent is not None:
            self.parent.sub(nbytes)

    def reset_peak(self) -> None:
        self.peak = self.current


class ResidencyPolicy:
    """What to load and evict at the moments the driver reports, units named by index; a new way of placing weights
    is a subclass and touches no hook. Defaults do nothing."""

    wants_backward_start = False
    """Whether the driver hooks unit outputs to report ``on_backward_start`` (one node pre-hook per output and call)."""

    def on_pass_start(self) -> None:
        """The root's forward begins outside backward (unit 0's, without a root)."""

    def before_forward(self, unit: int, needs_backward: bool, checkpointed: bool) -> None:
        """``unit`` will run a forward; ``needs_backward``: grad is on and the unit trains or an input needs a
        gradient; ``checkpointed``: saved-tensor hooks are active (checkpointing), so autograd keeps no weight."""

    def after_forward(self, unit: int, needs_backward: bool, bounded: bool) -> None:
        """``unit`` has queued its forward; ``needs_backward``: an output needs a gradient; ``bounded``: its inputs
        were wrapped, so ``on_backward_done`` will report the end of its backward (without, nothing will)."""

    def before_recompute(self, unit: int) -> None:
        """``unit`` is re-run inside backward (gradient checkpointing)."""

    def after_recompute(self, unit: int, needs_backward: bool) -> None:
        """``unit``'s re-run is done; ``needs_backward``: an output needs a gradient (without, no backward of this
        call will come: a unit fed only by inputs that need none, such as a timestep modulation, is done now)."""

    def on_backward_start(self, unit: int) -> None:
        """A gradient of ``unit``'s outputs has arrived (only with ``wants_backward_start``)."""

    def on_backward_done(self, unit: int) -> None:
        """The input gradients of ``unit``'s last pending call are complete."""


class _PendingBackward:
    """One call of a unit whose backward is pending; called by its boundary, released when its graph dies."""

    __slots__ = ("driver", "generation", "open", "unit")

    def __init__(self, driver: ResidencyDriver, unit: int) -> None:
        self.driver, self.unit, self.generation, self.open = driver, unit, driver.generation, True
        driver.pending[unit] += 1

    def close(self) -> None:
        if self.open:
            self.open = False
            if self.generation == self.driver.generation:
                self.driver.pending[self.unit] -= 1

    def __call__(self, *_grads: Any) -> None:
        # Called by a ``UnitBoundary`` (no arguments) or as a node pre-hook (the gradients, left as they are).
        current = self.open and self.generation == self.driver.generation  # not a graph from before a reset
        self.close()
        if current and self.driver.pending[self.unit] == 0:
            self.driver.policy.on_backward_done(self.unit)

    def __del__(self) -> None:
        self.close()


class ResidencyDriver:
    """Hooks ``modules`` (the units, in order) and reports their moments to ``policy``.

    Args:
        modules: The units' modules; a policy names a unit by its index here.
        policy: Decides what to load and evict.
        root: The model whose forward starts a pass (and brackets the saved-tensor hooks); None: unit 0's forward.
        saved_tensor_hooks: ``(pack, unpack)`` used while the root runs: ``pack(tensor)`` returns a replacement to
            save, or None to save the tensor as usual (or as outer saved-tensor hooks do); ``unpack`` turns the
            replacement back into a tensor in backward.
        record_trace: Keep ``("forward",)``, ``("compute", unit)``, ``("recompute", unit)`` events, and whatever the
            policy ``record``s, in ``trace`` (for tests and diagnosis; grows every pass).
    """

    def __init__(self, modules: Sequence[nn.Module], policy: ResidencyPolicy, root: nn.Module | None = None,
                 saved_tensor_hooks: tuple[Callable[[torch.Tensor], Any], Callable[[Any], torch.Tensor]] | None = None,
                 record_trace: bool = False) -> None:
        self.policy, self.root = policy, root
        self.pending = [0] * len(modules)
        self.generation = 0
        self.trace: list[tuple] | None = [] if record_trace else None
        self._trainable = [any(p.requires_grad for p in module.parameters()) for module in modules]
        self._bounded = [False] * len(modules)
        self._boundary_nodes: list[Any] = [None] * len(modules)  # a call's one-input boundary, pre-hook to hook
        self._backward_starts = [functools.partial(self._backward_start, unit) for unit in range(len(modules))]
        self._saved_tensor_hooks = saved_tensor_hooks
        self._pushed = 0
        self._handles = []
        for unit, module in enumerate(modules):
            self._handles.append(module.register_forward_pre_hook(functools.partial(self._pre_hook, unit),
                                                                  with_kwargs=True))
            self._handles.append(module.register_forward_hook(functools.partial(self._post_hook, unit)))
        if root is not None:
            self._handles.append(root.register_forward_pre_hook(self._root_pre_hook, prepend=True))
            if saved_tensor_hooks is not None:
                self._handles.append(root.register_forward_hook(self._root_post_hook, always_call=True))

    def record(self, *event: Any) -> None:
        """Appends ``event`` to ``trace`` when tracing."""
        if self.trace is not None:
            self.trace.append(event)

    def reset(self) -> None:
        """Forgets every pending backward (a pass ended for good, e.g. ``after_backward()``)."""
        self.generation += 1
        self.pending = [0] * len(self.pending)

    def remove(self) -> None:
        """Detaches every hook."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # ---- hooks --------------------------------------------------------------------------------------------------

    def _pass_start(self) -> None:
        self.record("forward")
        self.policy.on_pass_start()

    def _root_pre_hook(self, module: nn.Module, args: tuple) -> None:
        if not inside_backward():
            self._pass_start()
        if self._saved_tensor_hooks is not None:
            self._push_saved_tensor_hooks()

    def _root_post_hook(self, module: nn.Module, args: tuple, output: Any) -> None:
        if self._pushed:
            self._pushed -= 1
            torch._C._autograd._pop_saved_tensors_default_hooks()

    def _pre_hook(self, unit: int, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        grad = torch.is_grad_enabled()
        if _graph_task_id() != -1:  # inside_backward(), without the call
            self.policy.before_recompute(unit)
            self.record("recompute", unit)
            if not grad:
                return None
            positions, keys = grad_inputs(args, kwargs)
            # Reentrant checkpointing ran the forward without grad; this re-run's graph is the one backpropagated.
            if self.pending[unit] == 0:
                return self._bracket(unit, args, kwargs, positions, keys)
            # Non-reentrant: the forward's graph is backpropagated, but the re-run must take the same ops, or the
            # tensors it saves differ from the forward's (matmul folds a 3-d input or not by whether it is a view).
            return wrap_inputs(None, args, kwargs, positions, keys)
        if unit == 0 and self.root is None:
            self._pass_start()
        positions, keys = grad_inputs(args, kwargs) if grad else ((), ())
        needs_backward = grad and (self._trainable[unit] or bool(positions) or bool(keys)
                                   or _nested_input_needs_grad(args, kwargs))
        # Saved-tensor hooks around the call (non-reentrant checkpointing): autograd keeps no weight of this unit.
        hooked = needs_backward and torch._C._autograd._top_saved_tensors_default_hooks(False) is not None
        self.policy.before_forward(unit, needs_backward, hooked)
        if self.trace is not None:
            self.trace.append(("compute", unit))
        wrapped = self._bracket(unit, args, kwargs, positions, keys) if grad else None
        self._bounded[unit] = wrapped is not None
        return wrapped

    def _bracket(self, unit: int, args: tuple, kwargs: dict, positions: list[int],
                 keys: list[str]) -> tuple[tuple, dict] | None:
        if not positions and not keys:
            return None  # no input needs a gradient: no boundary, so no backward will report this call
        wrapped = wrap_inputs(_PendingBackward(self, unit), args, kwargs, positions, keys)
        if len(positions) + len(keys) == 1:
            alias = wrapped[0][positions[0]] if positions else wrapped[1][keys[0]]
            self._boundary_nodes[unit] = alias.grad_fn
        return wrapped

    def _post_hook(self, unit: int, module: nn.Module, args: tuple, output: Any) -> None:
        recompute = _graph_task_id() != -1
        needs_backward = False
        if torch.is_grad_enabled():
            outputs = (output,) if isinstance(output, torch.Tensor) else iter_tensors(output)
            hook_outputs = not recompute and self.policy.wants_backward_start
            boundary = self._boundary_nodes[unit]
            for tensor in outputs:
                node = tensor.grad_fn
                if node is not None and tensor.requires_grad:
                    needs_backward = True
                    if not hook_outputs:
                        break
                    # An output that is the boundary's view of an input has no backward of this unit to announce
                    # (and its pre-hook would run after the boundary's, which ends the unit's backward).
                    if node is not boundary:
                        node.register_prehook(self._backward_starts[unit])
        self._boundary_nodes[unit] = None  # holding the node would keep its graph alive
        if recompute:
            self.policy.after_recompute(unit, needs_backward)
        else:
            self.policy.after_forward(unit, needs_backward, self._bounded[unit])

    def _backward_start(self, unit: int, grads: tuple) -> None:
        self.policy.on_backward_start(unit)

    def _push_saved_tensor_hooks(self) -> None:
        pack_own, unpack_own = self._saved_tensor_hooks
        outer_pack, outer_unpack = torch._C._autograd._top_saved_tensors_default_hooks(False) or (None, None)

        def pack(tensor: torch.Tensor) -> tuple[Callable[[Any], torch.Tensor] | None, Any]:
            replacement = pack_own(tensor)
            if replacement is not None:
                return unpack_own, replacement
            return (outer_unpack, outer_pack(tensor)) if outer_pack is not None else (None, tensor)

        def unpack(packed: tuple[Callable[[Any], torch.Tensor] | None, Any]) -> torch.Tensor:
            unpack_with, value = packed
            return unpack_with(value) if unpack_with is not None else value

        torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)
        self._pushed += 1
