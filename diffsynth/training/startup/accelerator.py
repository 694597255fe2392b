"""The run's ``Accelerator`` and the seed every process agrees on."""

from __future__ import annotations

import atexit
import os
import random
import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from ..config.training import TrainingSection


def make_accelerator(training: TrainingSection) -> Any:
    """The run's ``Accelerator``: accumulation, mixed precision, DDP's unused-parameter search, CPU fallback, and
    the process group's timeout (``DIFFSYNTH_PROCESS_TIMEOUT``, :mod:`..machines.watch`)."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    from ..machines.watch import process_group_timeout

    # Without CUDA, ask for the CPU explicitly: a multi-process launch would otherwise look for GPUs. Under a
    # DeepSpeed launch the flag would switch DeepSpeed off, so DeepSpeed picks its (CPU) accelerator itself.
    deepspeed_launch = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    handlers = [DistributedDataParallelKwargs(find_unused_parameters=training.find_unused_parameters)]
    if (timeout := process_group_timeout()) is not None:
        handlers.append(process_group_handler(timeout))
    accelerator = Accelerator(
        cpu=not torch.cuda.is_available() and not deepspeed_launch,
        gradient_accumulation_steps=training.gradient_accumulation_steps,
        mixed_precision=training.mixed_precision,
        kwargs_handlers=handlers,
    )
    if torch.distributed.is_initialized():
        # Gloo's worker threads still hold work objects when the interpreter finalises, and freeing them then
        # aborts the process (SIGABRT after a finished run). The group goes first, while Python is whole; the
        # caller may still use it until then (``main`` returns with it alive).
        atexit.unregister(destroy_process_group_at_exit)
        atexit.register(destroy_process_group_at_exit)
    return accelerator


def process_group_handler(timeout: timedelta) -> Any:
    """accelerate's ``InitProcessGroupKwargs`` that passes ``timeout`` on to the process group.

    accelerate passes on only values that differ from its handler's default (10 minutes), which would leave gloo at
    torch's 30 minutes for ``DIFFSYNTH_PROCESS_TIMEOUT=600``; a microsecond more keeps that value passed.
    """
    from accelerate.utils import InitProcessGroupKwargs

    if timeout == InitProcessGroupKwargs().timeout:
        timeout += timedelta(microseconds=1)
    return InitProcessGroupKwargs(timeout=timeout)


def destroy_process_group_at_exit() -> None:
    """Destroys the default process group if it is still up (registered with ``atexit``)."""
    import torch

    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def exit_process(code: int) -> NoReturn:
    """Ends the process with ``code``; after a multi-process run without finalising the interpreter.

    Destroying the group at exit (:func:`destroy_process_group_at_exit`) still leaves, in about one run in six, a
    gloo thread whose C++ destructor runs among the static destructors and aborts the finished process (``terminate
    called without an active exception``, SIGABRT in place of its exit code). A process that took part in a group
    therefore runs its exit handlers (the group's destruction, logging's flush, temporary folders), flushes its
    streams and leaves with ``os._exit``, which runs no static destructor.
    """
    torch = sys.modules.get("torch")
    distributed = torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized()
    if not distributed:
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe has nothing left to lose
            pass
    os._exit(code)


def agree_on_seed(accelerator: Any, seed: int | None) -> int:
    """``seed``, or one drawn on the main process and shared, so every process shuffles the data alike."""
    from accelerate.utils import broadcast_object_list

    if seed is not None:
        return seed
    drawn = [random.SystemRandom().randrange(2**31)]
    if accelerator.num_processes > 1:
        broadcast_object_list(drawn)
    return drawn[0]
