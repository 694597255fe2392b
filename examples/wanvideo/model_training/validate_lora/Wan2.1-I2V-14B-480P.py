"""Renders one clip with Wan2.1-I2V-14B-480P and a trained LoRA merged into its transformer, with the control inputs
its training used, to see what the LoRA learned (``wan_validate.py``: the flags, their checks and the steps).

    python examples/wanvideo/model_training/validate_lora/Wan2.1-I2V-14B-480P.py \
        --lora_path ./models/train/Wan2.1-I2V-14B-480P_lora/epoch-4.safetensors \
        --input_image first.png --prompt "a corgi running on a beach"
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # wan_validate.py, also when this file is imported
import wan_validate  # noqa: E402

NAME = "Wan2.1-I2V-14B-480P"
MODEL_ID_WITH_ORIGIN_PATHS = wan_validate.model_id_with_origin_paths(NAME)


def main(argv: Sequence[str] | None = None) -> Path:
    """Renders the clip (``wan_validate.main``); returns the video file written."""
    return wan_validate.main(NAME, argv)


if __name__ == "__main__":
    main()
