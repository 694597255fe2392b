"""What every part of the trainer shares: the flag error and the small helpers that read flag values.

It imports nothing of the package, so any module of it can raise a ``FlagError`` without an import circle.
"""

from __future__ import annotations

from collections.abc import Sequence

TASKS = ("sft", "sft:data_process", "sft:train", "direct_distill", "direct_distill:data_process",
         "direct_distill:train")


class FlagError(ValueError):
    """One or more flags conflict; ``problems`` holds one message per conflict, each naming flag, value and fix."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def split_csv(value: str | None) -> list[str]:
    """Splits a comma list such as ``"q, k,,v"`` into ``["q", "k", "v"]``; None or blanks give ``[]``."""
    if not value:
        return []
    return [item.strip() for item in value.split(",") if item.strip()]


def task_stage(task: str) -> tuple[str, str | None]:
    """Splits a ``--task`` value into its family and split-training stage.

    Args:
        task: One of :data:`TASKS`, e.g. ``"sft:train"``.

    Returns:
        ``(family, stage)``: ``("sft", "train")``, or ``("sft", None)`` for an unsplit run.

    Raises:
        ValueError: ``task`` is not one of :data:`TASKS`.
    """
    if task not in TASKS:
        raise ValueError(f"--task {task!r} is not a known task; choose one of {', '.join(TASKS)}")
    family, _, stage = task.partition(":")
    return family, stage or None
