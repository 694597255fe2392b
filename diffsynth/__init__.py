"""diffsynth: low-VRAM fine-tuning of large diffusion models."""

import os as _os

from .core.library_notices import quiet_library_notices as _quiet_library_notices

__version__ = "0.1.0"

# Before any library underneath is imported, so the notices they log on import (bitsandbytes' missing `kernels`) stay
# out of every entry point: the trainer, the scripts, the examples, a user's own code. DIFFSYNTH_DEBUG=1 keeps them.
_quiet_library_notices(debug=_os.environ.get("DIFFSYNTH_DEBUG") == "1")
