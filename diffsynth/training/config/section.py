"""The base of every run config section: a frozen dataclass whose fields are its flags, checked at construction.

A section owns its flags' argparse group (``add_arguments``) and the checks that need only its own flags
(``problems``); ``config.RunConfig`` puts the sections together and checks them against each other. Every float
flag must be a finite number (argparse's ``float`` takes ``nan`` and ``inf``), and flags with a lower bound are
checked against it, from each section's ``LOWER_BOUNDS``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from .errors import FlagError

SectionType = TypeVar("SectionType", bound="Section")


@dataclasses.dataclass(frozen=True)
class Section:
    """One concern's flags; the field names are the flags' names without ``--``.

    Subclasses set ``LOWER_BOUNDS`` (flag, bound, whether the bound itself is allowed, an example fix; unset
    optional flags are not checked), ``EXAMPLES`` (fixes for float flags without a bound) and ``ERROR`` (the
    ``FlagError`` subclass raised), and extend :meth:`problems`.

    Raises:
        FlagError: From construction, every problem of the section at once.
    """

    LOWER_BOUNDS: ClassVar[tuple[tuple[str, float, bool, str], ...]] = ()
    EXAMPLES: ClassVar[dict[str, str]] = {}
    ERROR: ClassVar[type[FlagError]] = FlagError

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise self.ERROR(problems)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, video: bool = False) -> None:
        """Adds the section's argparse group(s); ``video`` is set for the video trainer's parser."""
        raise NotImplementedError

    @classmethod
    def from_flags(cls: type[SectionType], flags: Mapping[str, Any]) -> SectionType:
        """The section of parsed flag values (flag name -> value); flags it does not own are ignored, missing ones
        take the field defaults."""
        return cls(**{field.name: flags[field.name] for field in dataclasses.fields(cls) if field.name in flags})

    def flags(self) -> dict[str, Any]:
        """Flag name -> value, as a config file writes them."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}

    def problems(self) -> list[str]:
        """The section's own problems, each naming the flag, the value and the fix."""
        return self._finite_problems() + self._bound_problems()

    def _finite_problems(self) -> list[str]:
        examples = {**{name: example for name, _, _, example in self.LOWER_BOUNDS}, **self.EXAMPLES}
        return [f"--{name} {value} must be a finite number (nan and inf are refused); pass e.g. "
                f"{examples.get(name, f'--{name} 1.0')}"
                for name, value in self.flags().items() if isinstance(value, float) and not math.isfinite(value)]

    def _bound_problems(self) -> list[str]:
        problems = []
        for name, bound, inclusive, example in self.LOWER_BOUNDS:
            value = getattr(self, name)
            if value is None or (isinstance(value, float) and not math.isfinite(value)):
                continue  # unset, or reported as not finite
            if value > bound or (inclusive and value == bound):
                continue
            relation = f"at least {bound}" if inclusive else f"greater than {bound}"
            problems.append(f"--{name} {value} must be {relation}; pass e.g. {example}")
        return problems
