"""Renders one clip with the Wan2.1-T2V-1.3B transformer that ``Wan2.1-T2V-1.3B.sh`` distilled (``--task
direct_distill``), at the 4 steps and without guidance (``--cfg_scale 1``) it was distilled for: the run's
``epoch-1.safetensors`` is loaded over the released transformer (``validate_full``'s flags, ``wan_validate.py``).

    python examples/wanvideo/model_training/special/direct_distill/validate.py --prompt "a corgi running on a beach"

Sample at the steps and guidance the distillation data used (its metadata's num_inference_steps and cfg_scale).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "validate_lora"))  # the shared wan_validate.py
import wan_validate  # noqa: E402

NAME = "Wan2.1-T2V-1.3B"
DEFAULTS = {"checkpoint_path": "./models/train/Wan2.1-T2V-1.3B_full_distill/epoch-1.safetensors", "steps": 4,
            "cfg_scale": 1.0}


def main(argv: Sequence[str] | None = None) -> Path:
    """Renders the clip (``wan_validate.main``); returns the video file written."""
    return wan_validate.main(NAME, argv, full=True, defaults=DEFAULTS)


if __name__ == "__main__":
    main()
