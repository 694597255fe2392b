"""``UnifiedDataset``: the rows of a metadata file, with their data-file columns loaded by the file operators.

A metadata file (``.csv``, ``.json`` holding a list of objects, or ``.jsonl`` with one object a line) has one row per
sample. Columns named in ``data_file_keys`` hold a path relative to ``--dataset_base_path``, or several: a JSON list,
or in a CSV cell the paths separated by commas (``"a.jpg,b.jpg"``, as for Qwen-Image-Edit-2509's edit images). They
are replaced by the loaded file when a sample is read: an image becomes a PIL image, a video a list of PIL frames, and
several paths a list of those. Every other column passes through unchanged (CSV cells are strings).

Everything that can be checked without decoding an image is checked at construction: the metadata file, the required
columns and cells (a prompt must be text: a JSON number or object there is refused), and the header of every data
file (for a video, also its frame count against ``--num_frames``). A typo in row 9,000 therefore fails in seconds, not
after an hour of training, and the problems of every row are reported at once (``metadata.raise_row_problems``), so
one run lists all there is to fix; decoding waits for ``__getitem__`` so that construction stays cheap in every
dataloader worker. Construction also adds up the pixels a full decode would produce: the trainer decodes every file
at start-up (``find_bad_rows``) when that is affordable, and a file that fails to decode there or later is handled as
``--on_bad_sample`` says (``bad_samples``).

For stage 1, ``fingerprint`` says what a row's cached sample is computed from (``fingerprint``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from torch.utils.data import Dataset

from .bad_samples import SKIPPED_KEY, BadSample, BadSampleError, check_on_bad_sample
from .cells import CellType, convert_row
from .errors import DataFileNotFoundError, DatasetError, MissingColumnsError
from .fingerprint import FileIdentity, SampleFingerprint
from .metadata import raise_row_problems, read_metadata
from .operators import (
    DECODE_RULES_VERSION,
    DEFAULT_DIVISION_FACTOR,
    DEFAULT_MAX_PIXELS,
    FileOperator,
    ResizeConfig,
    operator_for,
)
from .video import DEFAULT_NUM_FRAMES, LoadVideo

DEFAULT_DATA_FILE_KEYS = ("image", "video")
DEFAULT_REQUIRED_COLUMNS = ("prompt",)
#: Columns the pipelines read as text. A CSV cell always is; a JSON value there that is not a string (``123``,
#: ``{"k": 1}``) is no prompt, and is refused with its row instead of being encoded (or cached) as something else.
TEXT_COLUMNS = ("prompt",)


def check_repeat(repeat: int) -> None:
    """Rejects a ``--dataset_repeat`` that is not an integer of at least 1."""
    if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
        raise DatasetError(f"--dataset_repeat {repeat!r} must be an integer of at least 1 (1 reads each sample once)")


def is_blank(value: Any) -> bool:
    """Whether a metadata cell is empty: missing (None) or only whitespace."""
    return value is None or (isinstance(value, str) and not value.strip())


class CheckedDataset(NamedTuple):
    """What ``check_dataset`` learnt.

    Attributes:
        rows: The metadata rows.
        decode_pixels: The pixels a full decode of every data file produces (video frames counted as used).
        options: The dataset options the data files' operators take (``num_frames`` only when there are videos).
    """

    rows: list[dict[str, Any]]
    decode_pixels: int
    options: tuple[str, ...]


def check_dataset(base_path: str | os.PathLike, metadata_path: str | os.PathLike,
                  data_file_keys: Sequence[str] = DEFAULT_DATA_FILE_KEYS,
                  required_columns: Sequence[str] = DEFAULT_REQUIRED_COLUMNS,
                  resize: ResizeConfig | None = None,
                  file_options: Mapping[str, Any] | None = None, column_types: Mapping[str, CellType] | None = None,
                  optional_file_keys: Sequence[str] = (),
                  paired_lists: Sequence[tuple[str, str]] = ()) -> CheckedDataset:
    """Checks a dataset without decoding any image: metadata, required cells, and every data file's header.

    Opening each file's header costs one small read per file, so this is fast even for large datasets; a file whose
    pixel data is truncated still passes and fails later, when it is decoded. A video whose container stores no frame
    count (webm, mkv) has its packets counted, which reads more of the file but still decodes nothing.

    Args:
        base_path: The folder data-file paths are relative to (``--dataset_base_path``).
        metadata_path: The metadata file (``--dataset_metadata_path``).
        data_file_keys: Columns holding data-file paths (``--data_file_keys``).
        required_columns: Columns every row must fill.
        resize: The sizing rule; each image must give a non-empty target size under it. Default ``ResizeConfig()``.
        file_options: Settings for the operators that name them in ``FileOperator.options`` (a video's
            ``num_frames`` and ``allow_shorter``); the operators' defaults apply to missing ones.
        column_types: Columns whose cells are converted (``cells.convert_cells``), e.g. ``{"seed": integer}``.
        optional_file_keys: Data-file columns a row may leave empty (a loss mask, LTX-2's sound); an empty cell is
            dropped from the row, as if the column were absent, instead of being refused, also in a required
            column (which the metadata must still have).
        paired_lists: Pairs of columns whose lists a row must give at one length (EliGen's prompts and masks).

    Returns:
        The metadata rows (typed columns converted), the pixels their files decode to, and the operator options
        they use.

    Raises:
        DataFileNotFoundError: The base folder or the metadata file is missing, or every problem of the rows is a
            missing data file.
        DatasetError: Any other problem; the message names the file, the row, the column and the fix, for every
            row (``raise_row_problems``).
    """
    resize = resize or ResizeConfig()
    base = Path(base_path)
    if not base.is_dir():
        raise DataFileNotFoundError(f"--dataset_base_path {base} is not a folder; point it at the dataset's folder")
    rows, columns = read_metadata(metadata_path)
    if not rows:
        raise DatasetError(f"metadata {metadata_path} has no rows; add one row per training sample")
    if Path(metadata_path).suffix.lower() == ".csv":
        rows = [_split_file_lists(row, data_file_keys) for row in rows]
    missing = [column for column in required_columns if column not in columns]
    if missing:
        raise MissingColumnsError(
            f"metadata {metadata_path} has no column {', '.join(map(repr, missing))} (columns found: "
            f"{', '.join(map(repr, columns)) or 'none'}); rename the column that holds it", missing, list(columns)
        )
    problems: list[DatasetError | DataFileNotFoundError] = []
    converted, pixels, options = [], 0, {}
    for number, row in enumerate(rows, start=1):
        where = f"row {number}"
        blank = [column for column in required_columns
                 if column not in optional_file_keys and is_blank(row.get(column))]
        problems += [DatasetError(f"{where} has no value in column {column!r}; fill it in or remove the row")
                     for column in blank]
        problems += [DatasetError(f"{where} column {column!r} holds {row[column]!r}, not text; write it as a JSON "
                                  'string, e.g. "a cat"') for column in TEXT_COLUMNS
                     if column in row and row[column] is not None and not isinstance(row[column], str)]
        row, cell_problems = convert_row(row, column_types or {})
        row = {key: value for key, value in row.items() if key not in optional_file_keys or not is_blank(value)}
        problems += [DatasetError(f"{where} {problem}")
                     for problem in cell_problems + _length_problems(row, paired_lists)]
        converted.append(row)
        for key in data_file_keys:
            if key not in row or key in blank:
                continue
            try:
                for relative in _file_list(row[key], where, key):
                    operator, file_pixels = _check_file(base / relative, where, key, resize, file_options)
                    pixels += file_pixels
                    options.update(dict.fromkeys(operator.options))
            except (DatasetError, DataFileNotFoundError) as error:
                problems.append(error)  # the cell's first bad file; the rows after it are still checked
    raise_row_problems(metadata_path, problems)
    return CheckedDataset(converted, pixels, tuple(options))


def _length_problems(row: Mapping[str, Any], paired_lists: Sequence[tuple[str, str]]) -> list[str]:
    """One problem per pair of ``paired_lists`` columns whose cells in ``row`` hold lists of different lengths."""
    problems = []
    for first, second in paired_lists:
        if first in row and second in row:
            sizes = [len(row[column]) if isinstance(row[column], list) else 1 for column in (first, second)]
            if sizes[0] != sizes[1]:
                problems.append(f"holds {sizes[0]} entries in column {first!r} and {sizes[1]} in {second!r}; give "
                                "one entry of each per item (e.g. one mask per entity prompt)")
    return problems


def _split_file_lists(row: dict[str, Any], data_file_keys: Sequence[str]) -> dict[str, Any]:
    """A CSV row with each data-file cell that names several paths (``"a.jpg, b.jpg"``) turned into their list.

    CSV cells are flat text, so a comma is how a CSV row lists several files; blanks between commas are left in, for
    the check to name.
    """
    return {key: [part.strip() for part in value.split(",")]
            if key in data_file_keys and isinstance(value, str) and "," in value else value
            for key, value in row.items()}


def _file_list(value: Any, where: str, key: str) -> list[str]:
    """A data-file cell as a list of paths; a cell holds one path or a list of them."""
    values = value if isinstance(value, list) else [value]
    if not values or any(is_blank(item) or not isinstance(item, str) for item in values):
        raise DatasetError(
            f"{where} column {key!r} holds {value!r}; it must be a file path relative to --dataset_base_path (or a "
            f"list of them). Fill it in, remove the row, or leave {key!r} out of --data_file_keys"
        )
    return values


def _check_file(path: Path, where: str, key: str, resize: ResizeConfig,
                file_options: Mapping[str, Any] | None) -> tuple[FileOperator, int]:
    """Checks one data file's header; returns its operator and the pixels it decodes to."""
    try:
        operator = operator_for(path, key)
        if not path.is_file():
            raise DataFileNotFoundError(
                f"{path} does not exist; fix the path (relative to --dataset_base_path) or remove the row"
            )
        return operator, operator.check(path, resize, **operator.settings(file_options))
    except (DatasetError, DataFileNotFoundError) as error:
        raise type(error)(f"{where} column {key!r}: {error}") from error


class UnifiedDataset(Dataset):
    """Samples from a metadata file; data-file columns are decoded lazily, other columns pass through.

    Args:
        base_path: The folder data-file paths are relative to (``--dataset_base_path``).
        metadata_path: The metadata file (``--dataset_metadata_path``): ``.csv``, ``.json`` or ``.jsonl``.
        repeat: How many times each row appears per epoch (``--dataset_repeat``); saves the per-epoch overhead on
            small datasets.
        data_file_keys: Columns holding data-file paths (``--data_file_keys``); absent ones are ignored.
        height: Fixed image height (``--height``), with ``width``; otherwise sizes follow ``max_pixels``.
        width: Fixed image width (``--width``).
        max_pixels: Pixel budget for images without a fixed size (``--max_pixels``).
        required_columns: Columns every row must fill.
        division_factor: Every image side is a multiple of this.
        num_frames: Frames per video sample (``--num_frames``), of the form 4k+1: the first ``num_frames`` frames of
            each video. Ignored for images.
        allow_shorter_videos: Trim a video with fewer than ``num_frames`` frames to its largest 4k+1 count instead of
            failing at construction; samples may then differ in length.
        on_bad_sample: ``"stop"``: a file that fails to decode raises ``BadSampleError`` naming row and file;
            ``"skip"``: see ``bad_samples`` (replaced by the next readable row, or marked, as ``keep_row_indices``
            says).
        keep_row_indices: Sample ``i`` is always row ``i`` (stage 1, whose cache files are named by row): excluded
            and undecodable rows give ``{SKIPPED_KEY: [...]}`` instead of data. Otherwise (training) excluded rows
            leave the epoch and an undecodable row is replaced by the next readable one (of its bucket, with
            ``buckets``).
        column_types: Columns converted to the type the pipeline reads them as (a CSV cell is text), e.g.
            ``{"seed": cells.integer}``; see ``cells``.
        optional_file_keys: Data-file columns a row may leave empty (see ``check_dataset``). They are left out of
            ``bucket_key``: the trainer checks that they match the shape of their row's image or video.
        buckets: Bring images and frames to aspect-ratio buckets (``buckets``) so that samples can share batches;
            ``bucket_key`` then tells which samples share a shape.
        optional_columns: Columns the pipeline reads where a row has them (LTX-2's ``frame_rate``): like the
            required ones, part of each sample's fingerprint.
        keep_alpha: Decode images as RGBA instead of compositing transparency on white (Qwen-Image-Layered).
        paired_lists: Pairs of columns whose lists must be of one length (see ``check_dataset``).

    Raises:
        DataFileNotFoundError, DatasetError: See ``check_dataset``; also a ``repeat`` below 1, a ``num_frames`` not
            of the form 4k+1, and a video shorter than ``num_frames`` unless ``allow_shorter_videos``.
    """

    def __init__(self, base_path: str | os.PathLike, metadata_path: str | os.PathLike, repeat: int = 1,
                 data_file_keys: Sequence[str] = DEFAULT_DATA_FILE_KEYS, height: int | None = None,
                 width: int | None = None, max_pixels: int = DEFAULT_MAX_PIXELS,
                 required_columns: Sequence[str] = DEFAULT_REQUIRED_COLUMNS,
                 division_factor: int = DEFAULT_DIVISION_FACTOR, num_frames: int = DEFAULT_NUM_FRAMES,
                 allow_shorter_videos: bool = False, on_bad_sample: str = "stop",
                 keep_row_indices: bool = False, column_types: Mapping[str, CellType] | None = None,
                 buckets: bool = False, optional_file_keys: Sequence[str] = (),
                 optional_columns: Sequence[str] = (), keep_alpha: bool = False,
                 paired_lists: Sequence[tuple[str, str]] = ()) -> None:
        check_repeat(repeat)
        check_on_bad_sample(on_bad_sample)
        if isinstance(data_file_keys, str) or isinstance(required_columns, str):
            raise DatasetError("data_file_keys and required_columns take a list of column names, not one string")
        self.resize = ResizeConfig(height=height, width=width, max_pixels=max_pixels, division_factor=division_factor,
                                   buckets=buckets)
        # Validated even for an image-only dataset: a bad --num_frames is a typo worth reporting before files are read.
        video = LoadVideo(num_frames=num_frames, allow_shorter=allow_shorter_videos)
        self.file_options = {"num_frames": video.num_frames, "allow_shorter": video.allow_shorter}
        self.keep_alpha = keep_alpha
        self.base_path = Path(base_path)
        self.metadata_path = Path(metadata_path)
        self.repeat = repeat
        self.data_file_keys = tuple(data_file_keys)
        #: The columns a pipeline reads from a row; only they enter a sample's fingerprint.
        self.read_columns = tuple(dict.fromkeys([*required_columns, *optional_columns, *data_file_keys]))
        self.on_bad_sample = on_bad_sample
        self.keep_row_indices = keep_row_indices
        self.optional_file_keys = tuple(optional_file_keys)
        checked = check_dataset(self.base_path, self.metadata_path, self.data_file_keys, tuple(required_columns),
                                self.resize, self.file_options, column_types, self.optional_file_keys,
                                paired_lists)
        self.rows, self.decode_pixels, self._used_options = checked
        #: Rows left out because their files failed to decode (``exclude``), by row index.
        self.excluded: dict[int, BadSample] = {}
        self._order = list(range(len(self.rows)))
        self._row_keys: dict[int, tuple] = {}

    def __len__(self) -> int:
        return len(self._order) * self.repeat

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Sample ``index`` with its data files decoded: a PIL image per image, a list of PIL frames per video.

        Raises:
            BadSampleError: A data file fails to decode and ``on_bad_sample`` is ``"stop"``.
        """
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} is out of range for a dataset of {len(self)} samples")
        position = index % len(self._order)
        row = self._order[position]
        if row in self.excluded:
            return {SKIPPED_KEY: [self.excluded[row]]}
        try:
            return self.load_row(row)
        except BadSampleError as error:
            if self.on_bad_sample == "stop":
                raise
            if self.keep_row_indices:
                return {SKIPPED_KEY: [error.bad]}
            return self._replacement(position, [error.bad])

    def load_row(self, row: int) -> dict[str, Any]:
        """Row ``row`` (0-based) with its data files decoded, whatever ``on_bad_sample`` says.

        Raises:
            BadSampleError: A data file fails to decode; the message names the row, the column and the file.
        """
        sample = dict(self.rows[row])
        for key in self.data_file_keys:
            if key in sample:
                value = sample[key]
                paths = value if isinstance(value, list) else [value]
                loaded = [self._load(row, relative, key) for relative in paths]
                sample[key] = loaded if isinstance(value, list) else loaded[0]
        return sample

    def describe_sample(self, index: int) -> str:
        """Where sample ``index`` comes from, for messages: its metadata row (numbered from 1, as the dataset checks
        number them) and its data files."""
        row = self._order[index % len(self._order)]
        cells = self.rows[row]
        files = [f"{key}: {cells[key]}" for key in self.data_file_keys if key in cells]
        return f"metadata {self.metadata_path} row {row + 1}" + (f" ({', '.join(files)})" if files else "")

    def _load(self, row: int, relative: str, key: str) -> Any:
        path = self.base_path / relative
        operator = operator_for(path, key)
        try:
            settings = operator.settings(self.file_options)
            if self.keep_alpha and operator.kind == "image":
                settings["keep_alpha"] = True
            return operator.load(path, self.resize, **settings)
        except DatasetError as error:
            bad = BadSample(row, key, relative, str(error))
            message = (f"metadata {self.metadata_path} {bad.describe()}; pass --on_bad_sample skip to go on without "
                       "it")
            raise BadSampleError(message, bad) from error

    def _replacement(self, position: int, skipped: list[BadSample]) -> dict[str, Any]:
        """The next readable row after ``position`` in this epoch's rows (of the same bucket, with buckets: the batch
        it joins needs its shape), carrying what was skipped to reach it."""
        bucket = self.row_key(self._order[position]) if self.resize.buckets else None
        for offset in range(1, len(self._order)):
            row = self._order[(position + offset) % len(self._order)]
            if bucket is not None and self.row_key(row) != bucket:
                continue
            try:
                return {**self.load_row(row), SKIPPED_KEY: skipped}
            except BadSampleError as error:
                skipped.append(error.bad)
        described = "; ".join(bad.describe() for bad in skipped[:3])
        where = f"of bucket {self.describe_bucket(bucket)} " if bucket is not None else ""
        raise DatasetError(f"no row {where}of metadata {self.metadata_path} decodes ({described}); check the files")

    def find_bad_rows(self, rows: Sequence[int]) -> list[BadSample]:
        """Decodes every data file of ``rows`` in full and returns the rows that fail (the start-up check)."""
        bad = []
        for row in rows:
            try:
                self.load_row(row)
            except BadSampleError as error:
                bad.append(error.bad)
        return bad

    def exclude(self, bad: Sequence[BadSample]) -> None:
        """Leaves the rows of ``bad`` out: of the epoch, or (``keep_row_indices``) as marked holes.

        Every process must exclude the same rows, or their epochs differ in length.
        """
        self.excluded.update({sample.index: sample for sample in bad})
        if not self.keep_row_indices:
            self._order = [row for row in range(len(self.rows)) if row not in self.excluded]
            if not self._order:
                raise DatasetError(f"no row of metadata {self.metadata_path} decodes; check the files")

    # ---- buckets --------------------------------------------------------------------------------------------------

    def use_size_multiple(self, multiple: int) -> None:
        """Makes bucket sides multiples of ``multiple`` (the loaded model's; known only once it is built). Call it
        before reading any sample; it changes nothing without buckets or with a fixed size, whose sides the flags
        checks already hold to the model's multiple."""
        if self.resize.buckets and not self.resize.fixed and multiple != self.resize.division_factor:
            self.resize = dataclasses.replace(self.resize, division_factor=multiple)
            self._row_keys.clear()

    def row_key(self, row: int) -> tuple:
        """The shape of row ``row`` once loaded: ``(column, shape)`` for each of its data files, in column order,
        ``shape`` being ``(width, height)`` for an image and ``(width, height, frames)`` for a video. Read from the
        files' headers (a video's first frame) once, then remembered."""
        if row not in self._row_keys:
            cells, shapes = self.rows[row], []
            for key in self.data_file_keys:
                if key in cells and key not in self.optional_file_keys:
                    for relative in cells[key] if isinstance(cells[key], list) else [cells[key]]:
                        path = self.base_path / relative
                        operator = operator_for(path, key)
                        if operator.shape is None:
                            raise DatasetError(f"{path} (column {key!r}) is a {operator.kind} file, whose shape the "
                                               "dataset cannot tell before loading it, so it cannot be batched; "
                                               "train with --batch_size 1")
                        shapes.append((key, operator.shape(path, self.resize, **operator.settings(self.file_options))))
            self._row_keys[row] = tuple(shapes)
        return self._row_keys[row]

    def bucket_key(self, index: int) -> tuple:
        """The shape of sample ``index`` (``row_key`` of its row): samples with equal keys can share a batch."""
        return self.row_key(self._order[index % len(self._order)])

    @staticmethod
    def describe_bucket(key: tuple) -> str:
        """A bucket for the dataset summary, e.g. ``image 768x512`` or ``video 832x480x81 + input_image 832x480``."""
        return " + ".join(f"{column} {'x'.join(map(str, shape))}" for column, shape in key) or "no files"

    def fingerprint_settings(self) -> dict[str, Any]:
        """The settings that shape every decoded sample (a part of each stage-1 fingerprint)."""
        # Buckets enter only when used, so that the samples of caches made without them keep their fingerprints.
        return {"height": self.resize.height, "width": self.resize.width, "max_pixels": self.resize.max_pixels,
                "division_factor": self.resize.division_factor, "data_file_keys": list(self.data_file_keys),
                "decode_rules": DECODE_RULES_VERSION, **({"buckets": True} if self.resize.buckets else {}),
                **({"keep_alpha": True} if self.keep_alpha else {}),
                **{name: self.file_options[name] for name in self._used_options}}

    def fingerprint(self, row: int, models: str, previous: SampleFingerprint | None = None) -> SampleFingerprint:
        """What sample ``row`` is computed from (see ``fingerprint``): its files, cells, settings and ``models``.

        Args:
            row: The row index.
            models: The digest of the stage-1 models' identity.
            previous: The fingerprint stored with the cached sample; its file hashes are reused for files whose size
                and modification time are unchanged.
        """
        cells = self.rows[row]
        files = []
        for key in self.data_file_keys:
            if key in cells:
                for relative in cells[key] if isinstance(cells[key], list) else [cells[key]]:
                    known = previous.known_file(relative) if previous is not None else None
                    files.append(FileIdentity.of(relative, self.base_path / relative, known))
        read = {column: cells[column] for column in self.read_columns if column in cells}
        return SampleFingerprint.build(files, read, self.fingerprint_settings(), models)
