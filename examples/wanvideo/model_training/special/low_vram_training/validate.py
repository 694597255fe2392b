"""Renders one clip with Wan2.1-I2V-14B-480P and the LoRA that ``Wan2.1-I2V-14B-480P.sh`` here trained merged into
its transformer (``validate_lora/Wan2.1-I2V-14B-480P.py`` with this run's file as the default ``--lora_path``).

    python examples/wanvideo/model_training/special/low_vram_training/validate.py \
        --input_image first.png --prompt "a corgi running on a beach"
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "validate_lora"))  # the shared wan_validate.py
import wan_validate  # noqa: E402

NAME = "Wan2.1-I2V-14B-480P"
DEFAULTS = {"lora_path": "./models/train/Wan2.1-I2V-14B-480P_lora_lowvram/epoch-4.safetensors"}


def main(argv: Sequence[str] | None = None) -> Path:
    """Renders the clip (``wan_validate.main``); returns the video file written."""
    return wan_validate.main(NAME, argv, defaults=DEFAULTS)


if __name__ == "__main__":
    main()
