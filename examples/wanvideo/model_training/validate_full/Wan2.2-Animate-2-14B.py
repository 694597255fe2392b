"""Renders one clip with Wan2.2-Animate-2-14B and a full fine-tune of its self-attention layers loaded over the
released weights, from a character image and a driving clip as its training used, to see what the fine-tune learned
(``validate_lora/wan_validate.py``: the flags, their checks and the steps).

    python examples/wanvideo/model_training/validate_full/Wan2.2-Animate-2-14B.py \
        --checkpoint_path ./models/train/Wan2.2-Animate-2-14B_full/epoch-1.safetensors \
        --animate2_reference_image character.png --animate2_reference_video driving.mp4 \
        --prompt "a person dancing" --height 640 --width 352

``full/Wan2.2-Animate-2-14B.sh`` writes that file (the trained layers under the transformer's own names); the other models load
from the release's files, as it trains on them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validate_lora"))  # the shared wan_validate.py
import wan_validate  # noqa: E402

NAME = "Wan2.2-Animate-2-14B"
MODEL_ID_WITH_ORIGIN_PATHS = wan_validate.model_id_with_origin_paths(NAME)


def main(argv: Sequence[str] | None = None) -> Path:
    """Renders the clip (``wan_validate.main``); returns the video file written."""
    return wan_validate.main(NAME, argv, full=True)


if __name__ == "__main__":
    main()
