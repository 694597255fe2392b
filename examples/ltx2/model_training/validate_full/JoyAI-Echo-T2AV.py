"""Renders one clip and its sound with JoyAI-Echo-T2AV and a full fine-tune of its transformer loaded over the released
weights, to see what the fine-tune learned (``validate_lora/ltx2_validate.py``: the flags, their checks and the steps).

    python examples/ltx2/model_training/validate_full/JoyAI-Echo-T2AV.py \
        --checkpoint_path ./models/train/JoyAI-Echo-T2AV-full/epoch-4.safetensors

``full/JoyAI-Echo-T2AV-splited.sh`` writes that file (the transformer's trained weights under their own names); the
other models load from the release's files, as the reference's script loads them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validate_lora"))  # the shared ltx2_validate.py
import ltx2_validate  # noqa: E402

NAME = "JoyAI-Echo-T2AV"
MODEL_ID_WITH_ORIGIN_PATHS = ltx2_validate.model_id_with_origin_paths(NAME)


def main(argv: Sequence[str] | None = None) -> Path:
    """Renders the clip (``ltx2_validate.main``); returns the video file written."""
    return ltx2_validate.main(NAME, argv, full=True)


if __name__ == "__main__":
    main()
