"""Renders one clip and its sound with LTX-2.3-I2AV and a trained LoRA merged into its transformer, to see what the
LoRA learned (``ltx2_validate.py``: the flags, their checks and the steps).

    python examples/ltx2/model_training/validate_lora/LTX-2.3-I2AV.py \
        --lora_path ./models/train/LTX2.3-I2AV_lora/epoch-4.safetensors \
        --input_image first_frame.png

``lora/LTX-2.3-I2AV-splited.sh`` writes that file.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # ltx2_validate.py, also when this file is imported
import ltx2_validate  # noqa: E402

NAME = "LTX-2.3-I2AV"
MODEL_ID_WITH_ORIGIN_PATHS = ltx2_validate.model_id_with_origin_paths(NAME)


def main(argv: Sequence[str] | None = None) -> Path:
    """Renders the clip (``ltx2_validate.main``); returns the video file written."""
    return ltx2_validate.main(NAME, argv)


if __name__ == "__main__":
    main()
