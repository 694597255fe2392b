"""Per-row mask files checked against their row's image or video, from the files' headers.

A mask is loaded like any data file (``operators``): sized from its own dimensions by the run's rule (fixed size,
``--max_pixels`` or buckets) and centre-cropped. It covers the same pixels as its image only when both start from the
same size, so a mask of another size is refused here, before training, naming the row and both files. A video's mask
is either one image (for every frame, of the frames' size) or a video whose trimmed frame count equals the clip's.
Sizes are compared as displayed (EXIF orientation and a video's stored rotation applied), as they are loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .dataset import UnifiedDataset
from .errors import DatasetError
from .metadata import raise_row_problems
from .operators import operator_for, read_image_header
from .video import LoadVideo, read_video_probe


def _first(cell: Any) -> str:
    return cell[0] if isinstance(cell, list) else cell


def _shape(path: Path, video: LoadVideo) -> tuple[int, ...]:
    """``(width, height)`` of an image as displayed, ``(width, height, frames)`` of a video (frames as loaded)."""
    if operator_for(path, "mask").kind == "image":
        return read_image_header(path)[2]
    info = read_video_probe(path, None, True)
    return (*info.shown, video.frames_to_take(info.frames, path))


def _row_problem(dataset: UnifiedDataset, row: int, mask_key: str, media_key: str) -> str | None:
    cells = dataset.rows[row]
    mask, media = cells[mask_key], _first(cells[media_key])
    if isinstance(mask, list):
        return f"holds {len(mask)} files; give one mask file per row"
    video = LoadVideo(**dataset.file_options)
    mask_shape = _shape(dataset.base_path / mask, video)
    media_shape = _shape(dataset.base_path / media, video)
    size = "x".join(map(str, mask_shape[:2]))
    if mask_shape[:2] != media_shape[:2]:
        return (f"{mask} is {size} pixels, but its {media_key} {media} is {'x'.join(map(str, media_shape[:2]))}; a "
                "mask must have the size of what it masks (as displayed), so that both are resized and cropped "
                "alike: save it at that size")
    if len(mask_shape) == 3 and len(media_shape) == 2:
        return f"{mask} is a video, but its row's {media_key} {media} is an image; give an image as its mask"
    if len(mask_shape) == 3 and mask_shape[2] != media_shape[2]:
        return (f"{mask} gives {mask_shape[2]} frames, but its video {media} gives {media_shape[2]}; give the mask "
                "video as many frames as the clip, or one mask image for every frame")
    return None


def check_masks(dataset: UnifiedDataset, mask_key: str, media_keys: Sequence[str]) -> int:
    """Checks the mask of every row that has one against the row's media (the first of ``media_keys`` it has).

    The dataset's construction already checked that each file exists and that its header reads.

    Args:
        dataset: The dataset, built with ``mask_key`` among its data-file and optional file columns.
        mask_key: The mask column.
        media_keys: The columns a mask may belong to, e.g. ``("image", "video")``.

    Returns:
        The number of rows with a mask.

    Raises:
        DatasetError: Every problem at once, each naming the row, the mask file and the fix.
    """
    problems, masked = [], 0
    for row, cells in enumerate(dataset.rows):
        if mask_key not in cells:
            continue
        masked += 1
        media_key = next((key for key in media_keys if key in cells), None)
        where = f"row {row + 1} column {mask_key!r}"
        if media_key is None:
            problems.append(DatasetError(f"{where} names {cells[mask_key]!r}, but the row has no "
                                         f"{' or '.join(media_keys)} to mask; fill it in or clear the mask cell"))
            continue
        try:
            problem = _row_problem(dataset, row, mask_key, media_key)
        except DatasetError as error:
            problem = str(error)
        if problem is not None:
            problems.append(DatasetError(f"{where}: {problem}"))
    raise_row_problems(dataset.metadata_path, problems)
    return masked
