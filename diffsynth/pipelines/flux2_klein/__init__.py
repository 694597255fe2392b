"""FLUX.2 [klein] and [dev]: the family's room (its spec, pipeline, units and prompt encoders).

The pipeline's public names are imported on first use, so that reading the family's spec imports no model library.
"""

from typing import TYPE_CHECKING

from ...core.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {".pipeline": ["Flux2KleinPipeline", "flux2_empirical_mu"]})

if TYPE_CHECKING:
    from .pipeline import Flux2KleinPipeline, flux2_empirical_mu

__all__ = ["Flux2KleinPipeline", "flux2_empirical_mu"]
