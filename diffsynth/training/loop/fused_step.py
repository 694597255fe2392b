"""The fused backward and optimizer step (``--fused_optimizer_step``): each weight is updated as soon as its gradient
is complete in backward, and the gradient is freed at once, so the whole set of gradients never exists.

For a full fine-tune the gradients are as large as the trained weights (in their dtype): the fused step saves that
much memory at the peak of backward, where the plain step holds every gradient until ``optimizer.step()``. It costs
one small optimizer call per weight instead of one batched call (no ``foreach`` batching across weights).

- **One optimizer, stepped a weight at a time.** The run's optimizer is built as usual over every trained weight;
  a weight's update calls its ``step()`` with the optimizer's parameter groups narrowed, for that call, to one
  group holding only that weight (the group's current hyperparameters: the learning-rate schedule still applies).
  So the optimizer's ``state_dict()`` is the plain step's, and checkpoints of fused and plain runs resume either way.
- **Where the hook runs.** A weight's ``register_post_accumulate_grad_hook``. Under ``--enable_optimizer_cpu_offload``
  the offload manager moves each gradient to the host first; its ``register_host_steps`` then runs the update on the
  host master (``core.offload_training``).
- **Non-finite values.** The loss is checked before backward: a NaN or inf loss runs no backward and the step is
  skipped, as the plain step skips it. A gradient is checked before its weight's update (one device sync per
  weight): from the first non-finite one on, no weight of that backward is updated, and the step counts as skipped
  for ``--max_nonfinite_steps`` and for the EMA. The weights updated before it keep their update (they cannot be
  taken back; every weight stays finite).
- **What it cannot do**, refused when the flags are checked or, before any model loads, once the launch is
  known: gradient accumulation and clipping need every gradient at once (``--gradient_accumulation_steps`` > 1,
  ``--max_grad_norm``); fp16's gradient scaler unscales all gradients together; several processes average gradients
  after backward (DDP's buckets, the offload managers' ``after_backward``); DeepSpeed and block swap own their
  gradients.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..config.training import TrainingSection


def process_problems(training: TrainingSection, num_processes: int) -> list[str]:
    """``--fused_optimizer_step`` against the launched processes (checked before any model loads)."""
    if not training.fused_optimizer_step or num_processes == 1:
        return []
    return [f"--fused_optimizer_step runs in one process, not {num_processes}: the gradients are averaged across "
            "processes only after backward, when the fused step has already applied them; launch one process, or "
            "drop --fused_optimizer_step"]


class FusedOptimizerStep:
    """Applies ``optimizer`` per weight from gradient hooks, freeing each gradient after its update.

    Args:
        optimizer: The run's optimizer, not a wrapper (accelerate's ``AcceleratedOptimizer`` reads through to it).
        params: The trained weights, all in ``optimizer``'s parameter groups.
        placers: The run's placers; offload managers with host-trained weights run those weights' updates.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.nn.Parameter],
                 placers: Iterable[object] = ()) -> None:
        self.optimizer = optimizer
        # By position: loading a state dict replaces the group dicts (in the same order).
        self._group_of = {id(param): index for index, group in enumerate(optimizer.param_groups)
                          for param in group["params"]}
        missing = [param for param in params if id(param) not in self._group_of]
        if missing:
            raise ValueError(f"{len(missing)} trained weight(s) are in no parameter group of the optimizer")
        # Autograd runs the hooks of CUDA weights on its device thread: the narrowing of param_groups is guarded.
        self._lock = threading.Lock()
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        on_host: set[int] = set()
        for placer in placers:
            register = getattr(placer, "register_host_steps", None)
            if register is not None:
                on_host.update(id(param) for param in register(self._update))
        for param in params:
            if id(param) not in on_host:
                self._handles.append(param.register_post_accumulate_grad_hook(self._update))
        self.clean = True
        self.updated = 0

    def begin(self) -> None:
        """Starts a step's backward: no non-finite gradient seen, no weight updated yet."""
        self.clean, self.updated = True, 0

    def _update(self, param: torch.nn.Parameter) -> None:
        grad = param.grad
        if grad is None:
            return
        if self.clean and not bool(torch.isfinite(grad).all()):
            self.clean = False
        if self.clean:
            self._step_one(param)
            self.updated += 1
        param.grad = None

    def _step_one(self, param: torch.nn.Parameter) -> None:
        with self._lock:
            groups = self.optimizer.param_groups
            group = groups[self._group_of[id(param)]]
            alone = {**group, "params": [param]}
            self.optimizer.param_groups = [alone]
            try:
                self.optimizer.step()
            finally:
                self.optimizer.param_groups = groups
            # An optimizer that keeps counters in its group (not torch's, nor bitsandbytes') writes them to the copy.
            group.update((key, value) for key, value in alone.items() if key != "params")

    def remove(self) -> None:
        """Detaches the hooks on device-trained weights (the offload managers detach theirs in ``remove()``)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
