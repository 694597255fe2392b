"""The notices of the libraries underneath that every command would print, kept out of the console; a
command calls :func:`quiet_library_notices` at its start."""

from __future__ import annotations

import logging


class _DropNotice(logging.Filter):
    """Drops a logger's records whose message starts with ``start``, unless it also holds ``unless``."""

    def __init__(self, start: str, unless: str | None = None):
        super().__init__()
        self.start, self.unless = start, unless

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not message.startswith(self.start) or (self.unless is not None and self.unless in message)


# The notices of the libraries underneath that nearly every command printed, though none says anything about the run
# and each reads like an error to a new user; by the logger that emits each, so its other records all pass.
LIBRARY_NOTICES = {
    # bitsandbytes' faster CPU kernel for NF4 is in the optional `kernels` package; its own kernel runs without it.
    "bitsandbytes.backends.cpu.ops": _DropNotice("Failed to load CPU gemm_4bit_forward from kernels-community"),
    # DeepSpeed, which accelerate imports, on a machine without CUDA (on stdout, through its own handler).
    "DeepSpeed": _DropNotice("Setting accelerator to CPU."),
    # diffusers on any `.to(dtype)`, listing even no modules; the loader keeps each class's float32 modules itself.
    "diffusers.models.modeling_utils": _DropNotice("There are modules in "),
    # The launcher's defaults for the options a command leaves out, as the README's commands do (a process per GPU,
    # one machine, no mixed precision, no dynamo); kept when it turned on several processes, which changes what runs.
    "accelerate.commands.launch": _DropNotice("The following values were not passed to `accelerate launch`",
                                              unless="More than one GPU was found"),
}


def quiet_library_notices(debug: bool = False) -> None:
    """Keeps :data:`LIBRARY_NOTICES` out of the console; with ``debug`` (``--debug``, ``DIFFSYNTH_DEBUG=1``) lets
    them through again. Call it before the libraries log, at a command's start; calling it again is harmless."""
    for name, notice in LIBRARY_NOTICES.items():
        if debug:
            logging.getLogger(name).removeFilter(notice)
        else:
            logging.getLogger(name).addFilter(notice)  # no-op when already there
