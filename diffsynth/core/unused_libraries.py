"""Optional libraries that a command does not use, kept out of its process.

diffusers, peft and transformers import bitsandbytes as soon as it is installed, to know its quantized layers, and
bitsandbytes imports torch's compiler stack on the way: over a second of every start-up on a CPU machine, for runs
that use no 8-bit or 4-bit feature at all. A command-line entry whose flags use no such feature calls
:func:`keep_out` before those libraries are imported; they then find the library not installed (``find_spec``
answers None for a module that ``sys.modules`` maps to None) and skip it.

Only command-line entries do this, once they know their flags: it lasts for the whole process, and an ``import`` of
the library later in that process fails.
"""

from __future__ import annotations

import sys

# Libraries that look for optional ones when they are first imported; once one of them is in, keeping out is too late.
_LOOKING_LIBRARIES = ("diffusers", "peft", "transformers")


def keep_out(name: str) -> bool:
    """Marks the library ``name`` as not installed for the rest of this process.

    Does nothing when ``name`` or a library that looks for it (diffusers, peft, transformers) is already imported:
    the marking would change nothing there, and would only break what uses ``name``.

    Returns:
        Whether ``name`` is now kept out.
    """
    if name in sys.modules or any(library in sys.modules for library in _LOOKING_LIBRARIES):
        return sys.modules.get(name, ...) is None
    sys.modules[name] = None
    return True
