"""The dataset's masks for ``--masked_loss``, checked before any model loads (docs Masked_Loss).

With ``--masked_loss`` the ``mask`` column is an optional file column (an empty cell trains its row unmasked), and
each mask must have the size of its row's image or video (``core.data.masks``). Without it a ``mask`` column is
warned about, since the user may have meant to train with it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ...core.data.masks import check_masks
from ..config.errors import FlagError
from ..config.masked_loss import MASK_COLUMN

if TYPE_CHECKING:
    from ...core.data import UnifiedDataset
    from ...diffusion.base_pipeline import BasePipeline
    from ..config import RunConfig

logger = logging.getLogger(__name__)

#: The columns a mask belongs to: the image families' ``image``, Wan's ``video``.
MEDIA_COLUMNS = ("image", "video")


def optional_file_columns(config: RunConfig) -> tuple[str, ...]:
    """The file columns a row may leave empty: the mask under ``--masked_loss``."""
    return (MASK_COLUMN,) if config.masked_loss.masked_loss else ()


def check_dataset_masks(config: RunConfig, dataset: UnifiedDataset, pipeline_class: type[BasePipeline],
                        require_one: bool = True) -> None:
    """Refuses masks that do not fit their rows, a ``--masked_loss`` run of a pipeline whose latents take no mask,
    and (``require_one``: the training set) a ``--masked_loss`` run without any mask; warns about a mask column that
    a run without ``--masked_loss`` leaves unused.

    Raises:
        DatasetError: A mask's size or frame count differs from its image's or video's (every row named).
        FlagError: ``--masked_loss`` for a pipeline without ``maskable_latents``, or no row has a mask.
    """
    if not config.masked_loss.masked_loss:
        if any(MASK_COLUMN in row for row in dataset.rows):
            logger.warning("metadata %s has a %r column, which this run does not use: to weigh the loss by it, pass "
                           "--masked_loss and list it in --data_file_keys (e.g. %s,%s)", dataset.metadata_path,
                           MASK_COLUMN, config.dataset.data_file_keys, MASK_COLUMN)
        return
    if not pipeline_class.maskable_latents:
        raise FlagError([f"--masked_loss: {pipeline_class.__name__} trains on latents packed into tokens of several "
                         "streams (video and sound), which a mask image does not map onto; drop --masked_loss"])
    masked = check_masks(dataset, MASK_COLUMN, MEDIA_COLUMNS)
    if not masked and require_one:
        problem = (f"--masked_loss: no row of metadata {dataset.metadata_path} has a mask (column {MASK_COLUMN!r}), "
                   "so nothing would be masked; add the column with a mask file per row, or drop --masked_loss")
        raise FlagError([problem])
    logger.info("--masked_loss: %d of %d rows have a mask; the others train unmasked", masked, len(dataset.rows))
