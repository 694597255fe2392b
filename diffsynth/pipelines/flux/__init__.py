"""FLUX.1 [dev], Krea and Kontext: the family's room (its spec, pipeline, units and original-layout readers).

The pipeline's public names are imported on first use, so that reading the family's spec imports no model library.
"""

from typing import TYPE_CHECKING

from ...core.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {".pipeline": ["FluxPipeline", "kontext_size"]})

if TYPE_CHECKING:
    from .pipeline import FluxPipeline, kontext_size

__all__ = ["FluxPipeline", "kontext_size"]
