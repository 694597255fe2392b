"""One host copy of the frozen weights per machine, shared by the run's processes there (offload, block swap).

``segment.py`` holds the shared memory and tells which tensors live in it; ``local_group.py`` finds the processes of
a machine. The loader fills a segment once per machine (``core/loader/shared_loading.py``); offload and block swap
stream from it in place.
"""

from .local_group import LocalGroup, machine_key
from .segment import (
                      SEGMENT_PREFIX,
                      SegmentOffer,
                      SharedSegment,
                      is_shared_host,
                      memory_files_supported,
                      shared_span,
                      shared_storage,
)

__all__ = ["SEGMENT_PREFIX", "LocalGroup", "SegmentOffer", "SharedSegment", "is_shared_host", "machine_key",
           "memory_files_supported", "shared_span", "shared_storage"]
