"""LTX-2 (text- and image-to-audio+video): the family's room (its pipeline, units and media helpers).

The pipeline's public names are imported on first use, so that importing the package imports no model library.
"""

from typing import TYPE_CHECKING

from ...core.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    ".pipeline": ["LTX2AudioVideoPipeline", "ModelConfig"], ".media": ["save_video_with_audio", "save_wav"],
})

if TYPE_CHECKING:
    from .media import save_video_with_audio, save_wav
    from .pipeline import LTX2AudioVideoPipeline, ModelConfig

__all__ = ["LTX2AudioVideoPipeline", "ModelConfig", "save_video_with_audio", "save_wav"]
