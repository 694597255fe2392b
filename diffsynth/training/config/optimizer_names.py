"""The optimizer ``--customized_optimizer`` names: a dotted class path (``torch.optim.Adam``,
``bitsandbytes.optim.AdamW8bit``), imported while the flags are checked so that a typo or a missing package costs
seconds, not a model load; and the paged bitsandbytes optimizers, which page their state through CUDA memory.

This module imports torch only inside :func:`resolve_optimizer_class`, so the parser that uses the names answers a
flag error before torch loads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def resolve_optimizer_class(path: str) -> type[torch.optim.Optimizer]:
    """Imports the optimizer class ``path`` names (``package.module.Class``).

    Raises:
        ValueError: ``path`` is not dotted, its module does not import, it has no such attribute, or the attribute is
            not a ``torch.optim.Optimizer`` subclass; the message names the flag, the value and the fix.
    """
    import torch  # here, not at the top: the flags are parsed before torch is imported

    flag = f"--customized_optimizer {path}"
    module_name, dot, class_name = path.rpartition(".")
    if not dot or not module_name or not class_name:
        raise ValueError(f"{flag} is not a dotted class path; pass e.g. --customized_optimizer torch.optim.Adam")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"{flag}: module {module_name} does not import ({error}); install its package (e.g. pip "
                         f"install {module_name.split('.')[0]}) or fix the path") from None
    found = getattr(module, class_name, None)
    if found is None:
        raise ValueError(f"{flag}: module {module_name} has no {class_name}; check the spelling (e.g. "
                         f"torch.optim.AdamW)")
    if not (isinstance(found, type) and issubclass(found, torch.optim.Optimizer)):
        raise ValueError(f"{flag} names {found!r}, which is not a torch.optim.Optimizer subclass; name an optimizer "
                         "class such as torch.optim.Adam")
    return found


def is_paged_optimizer(path: str) -> bool:
    """Whether ``--customized_optimizer`` names a paged bitsandbytes optimizer (``bitsandbytes.optim.Paged*``)."""
    return path.startswith("bitsandbytes.") and path.rpartition(".")[2].startswith("Paged")


def unpaged_optimizer(path: str) -> str:
    """The unpaged twin of a paged bitsandbytes optimizer path (``PagedAdamW8bit`` -> ``AdamW8bit``)."""
    module_name, _, class_name = path.rpartition(".")
    return f"{module_name}.{class_name.removeprefix('Paged')}"
