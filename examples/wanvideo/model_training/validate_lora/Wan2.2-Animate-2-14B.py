"""Renders one clip with Wan2.2-Animate-2-14B and a trained LoRA merged into its transformer, from a character image and a
driving clip as its training used, to see what the LoRA learned (``wan_validate.py``: the flags, their checks and the
steps).

    python examples/wanvideo/model_training/validate_lora/Wan2.2-Animate-2-14B.py \
        --lora_path ./models/train/Wan2.2-Animate-2-14B_lora/epoch-4.safetensors \
        --animate2_reference_image character.png --animate2_reference_video driving.mp4 \
        --prompt "a person dancing" --height 640 --width 352
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # wan_validate.py, also when this file is imported
import wan_validate  # noqa: E402

NAME = "Wan2.2-Animate-2-14B"
MODEL_ID_WITH_ORIGIN_PATHS = wan_validate.model_id_with_origin_paths(NAME)


def main(argv: Sequence[str] | None = None) -> Path:
    """Renders the clip (``wan_validate.main``); returns the video file written."""
    return wan_validate.main(NAME, argv)


if __name__ == "__main__":
    main()
