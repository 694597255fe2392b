"""Renders one clip with Wan2.2-Fun-A14B-Control-Camera and the experts' full fine-tunes loaded over the released
weights, with the control inputs its training used, to see what the fine-tune learned
(``validate_lora/wan_validate.py``: the flags, their checks and the steps).

    python examples/wanvideo/model_training/validate_full/Wan2.2-Fun-A14B-Control-Camera.py \
        --checkpoint_path ./models/train/Wan2.2-Fun-A14B-Control-Camera_high_noise_full/epoch-1.safetensors \
        --input_image first.png --camera_control_direction Left --prompt "a corgi running on a beach"

``full/Wan2.2-Fun-A14B-Control-Camera.sh`` writes that file (the transformer's trained weights under their own
names); the other models load from the release's original files, as it trains on them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validate_lora"))  # the shared wan_validate.py
import wan_validate  # noqa: E402

NAME = "Wan2.2-Fun-A14B-Control-Camera"
MODEL_ID_WITH_ORIGIN_PATHS = wan_validate.model_id_with_origin_paths(NAME)


def main(argv: Sequence[str] | None = None) -> Path:
    """Renders the clip (``wan_validate.main``); returns the video file written."""
    return wan_validate.main(NAME, argv, full=True)


if __name__ == "__main__":
    main()
