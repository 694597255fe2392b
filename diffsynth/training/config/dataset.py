"""The dataset section: where the samples are, their size, and how they are batched (docs Batches)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from typing import Any

from ...core.data.bad_samples import ON_BAD_SAMPLE_CHOICES
from .dataset_entries import DATASETS_KEY, DatasetEntry, entry_problems, parse_entries
from .errors import FlagError, split_csv
from .section import Section

# VAE downsampling (8) times the transformer's 2x2 patching, for both Qwen-Image and Wan.
SIZE_MULTIPLE = 16
MIN_PIXELS = 256


def _add_size_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--height", type=int, default=None,
                       help="Fixed sample height in pixels (a multiple of 16); unset resizes each sample to fit "
                            "--max_pixels, keeping its aspect ratio.")
    group.add_argument("--width", type=int, default=None,
                       help="Fixed sample width in pixels (a multiple of 16); give it together with --height.")
    group.add_argument("--max_pixels", type=int, default=1024 * 1024,
                       help="Pixel budget per frame when --height/--width are unset; larger samples are scaled down.")


@dataclasses.dataclass(frozen=True)
class DatasetSection(Section):
    """The dataset, sample size and batch flags; ``num_frames`` is None for the image trainer."""

    dataset_base_path: str = ""
    dataset_metadata_path: str | None = None
    dataset_repeat: int = 1
    dataset_num_workers: int = 0
    data_file_keys: str = "image,video"
    on_bad_sample: str = "stop"
    allow_partial_cache: bool = False
    height: int | None = None
    width: int | None = None
    max_pixels: int = 1024 * 1024
    num_frames: int | None = None
    allow_shorter_videos: bool = False
    frame_rate: float | None = None
    batch_size: int = 1
    aspect_ratio_buckets: bool = False
    reg_dataset_metadata_path: str | None = None
    reg_dataset_base_path: str | None = None
    prior_loss_weight: float = 1.0
    #: The config file's ``datasets:`` entries (no command-line flag; ``dataset_entries``).
    datasets: tuple[DatasetEntry, ...] = ()

    LOWER_BOUNDS = (
        ("dataset_repeat", 1, True, "--dataset_repeat 1"),
        ("dataset_num_workers", 0, True, "--dataset_num_workers 0"),
        ("max_pixels", MIN_PIXELS, True, "--max_pixels 1048576 (1024x1024)"),
        ("batch_size", 1, True, "--batch_size 1"),
        ("prior_loss_weight", 0.0, True, "--prior_loss_weight 1.0"),
        ("frame_rate", 0.0, False, "--frame_rate 24 (the clips' frames per second)"),
    )

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, video: bool = False) -> None:
        """Adds the Dataset group, the Image size (or, for ``video``, Video size) group and the Batches group."""
        group = parser.add_argument_group("Dataset")
        group.add_argument("--dataset_base_path", type=str, default="",
                           help="Folder the metadata's file paths are relative to; for a *:train task, the stage-1 "
                                "cache folder (the --output_path of the *:data_process run).")
        group.add_argument("--dataset_metadata_path", type=str, default=None,
                           help="Metadata file (.csv, .json or .jsonl) listing the samples and their prompts.")
        group.add_argument("--dataset_repeat", type=int, default=1,
                           help="Times each epoch walks the dataset; use 1 for a *:data_process run.")
        group.add_argument("--dataset_num_workers", type=int, default=0,
                           help="DataLoader worker processes; 0 reads in the training process.")
        group.add_argument("--data_file_keys", type=str, default="image,video",
                           help="Comma list of metadata columns that hold file paths to load.")
        group.add_argument("--on_bad_sample", type=str, default="stop", choices=ON_BAD_SAMPLE_CHOICES,
                           help="A sample whose file fails to decode (checked at start-up for datasets up to a "
                                "gigapixel, else when first read): stop names its row and file and ends the run; skip "
                                "warns, counts it and trains (or caches) without it.")
        group.add_argument("--allow_partial_cache", action="store_true",
                           help="For a *:train task: train on the samples a stage-1 cache holds even when some are "
                                "missing (an interrupted stage 1), instead of refusing.")
        if video:
            group = parser.add_argument_group("Video size")
            _add_size_flags(group)
            group.add_argument("--num_frames", type=int, default=81,
                               help="Frames per video sample; 4k+1 (e.g. 49, 81), as the video VAE compresses time by "
                                    "4.")
            group.add_argument("--allow_shorter_videos", action="store_true",
                               help="Trim clips shorter than --num_frames to their largest 4k+1 frame count instead of "
                                    "refusing them (samples then differ in length).")
            group.add_argument("--frame_rate", type=float, default=None,
                               help="LTX-2: the clips' frames per second, for rows without a frame_rate column (the "
                                    "column wins where a row has it; unset: 24, the reference's default). It sets "
                                    "how many seconds of sound a clip of --num_frames frames holds and the video's "
                                    "time positions. The clips are read as they are, not resampled to it. Refused "
                                    "for models that read no frame rate.")
        else:
            _add_size_flags(parser.add_argument_group("Image size"))
        group = parser.add_argument_group("Batches")
        group.add_argument("--batch_size", type=int, default=1,
                           help="Samples per micro-batch, of one shape: images (and video frames) are brought to "
                                "aspect-ratio buckets under --max_pixels and each batch is drawn from one bucket (a "
                                "bucket's last batch of an epoch may be smaller). The loss is averaged per sample. For "
                                "a split run, pass it to stage 1 too, so the cache holds the samples at bucket sizes.")
        group.add_argument("--aspect_ratio_buckets", action="store_true",
                           help="Bring images to aspect-ratio buckets even at --batch_size 1 (implied above 1), e.g. "
                                "for a stage-1 cache that later runs train at several batch sizes.")
        group = parser.add_argument_group("Regularization images")
        group.add_argument("--reg_dataset_metadata_path", type=str, default=None,
                           help="Metadata file of regularization (prior-preservation) images, e.g. images the base "
                                "model made of the class: each epoch pairs every training draw with one of them, "
                                "cycling them as kohya's sd-scripts does (docs Datasets). For a split run, pass it "
                                "to stage 1.")
        group.add_argument("--reg_dataset_base_path", type=str, default=None,
                           help="Folder the regularization metadata's file paths are relative to; default "
                                "--dataset_base_path.")
        group.add_argument("--prior_loss_weight", type=float, default=1.0,
                           help="Weight of each regularization sample's loss (0 leaves them out of the gradient); "
                                "their mean loss is logged as loss_prior.")

    @classmethod
    def from_flags(cls, flags: Mapping[str, Any]) -> DatasetSection:
        """The section of parsed flags; a config file's ``datasets:`` list (raw) becomes checked entries."""
        raw = flags.get(DATASETS_KEY)
        if not raw:
            return super().from_flags({**flags, DATASETS_KEY: ()})
        entries, problems = parse_entries(raw, video=flags.get("num_frames") is not None)
        try:
            section = super().from_flags({**flags, DATASETS_KEY: entries})
        except FlagError as error:
            raise FlagError(problems + error.problems) from None
        if problems:
            raise FlagError(problems)
        return section

    @property
    def mixed(self) -> bool:
        """Whether the run reads several datasets or regularization images (a ``DatasetMix``), not one dataset."""
        return bool(self.datasets) or self.reg_dataset_metadata_path is not None

    def entries(self) -> tuple[DatasetEntry, ...]:
        """The run's datasets with the flags filled in (:meth:`resolve`): the ``datasets:`` entries (or
        ``--dataset_metadata_path``), then the ``--reg_dataset_metadata_path`` images."""
        entries = list(self.datasets) or [DatasetEntry(metadata_path=self.dataset_metadata_path or "")]
        if self.reg_dataset_metadata_path is not None:
            entries.append(DatasetEntry(metadata_path=self.reg_dataset_metadata_path,
                                        base_path=self.reg_dataset_base_path, is_reg=True))
        return tuple(self.resolve(entry) for entry in entries)

    def resolve(self, entry: DatasetEntry) -> DatasetEntry:
        """``entry`` with what it leaves unset taken from the run's flags (folder, sizes, frames, file columns)."""
        return entry.resolved({"base_path": self.dataset_base_path, "height": self.height, "width": self.width,
                               "max_pixels": self.max_pixels, "num_frames": self.num_frames,
                               "data_file_keys": self.data_file_keys})

    @property
    def bucketed(self) -> bool:
        """Whether the run buckets its samples: ``--batch_size`` above 1, or ``--aspect_ratio_buckets``."""
        return self.batch_size > 1 or self.aspect_ratio_buckets

    @property
    def column_defaults(self) -> dict[str, Any]:
        """The values a sample takes for the columns its row lacks, from flags: ``--frame_rate`` for ``frame_rate``."""
        return {} if self.frame_rate is None else {"frame_rate": self.frame_rate}

    @property
    def file_keys(self) -> list[str]:
        """The metadata columns that hold file paths (``--data_file_keys``)."""
        return split_csv(self.data_file_keys)

    def flags(self) -> dict[str, Any]:
        flags = super().flags()
        if self.num_frames is None:  # the image trainer has no video flags
            del flags["num_frames"], flags["allow_shorter_videos"], flags["frame_rate"]
        if self.datasets:
            flags[DATASETS_KEY] = [entry.to_config() for entry in self.datasets]
        else:  # a run without the list writes no key for it
            del flags[DATASETS_KEY]
        return flags

    def problems(self) -> list[str]:
        entries = [problem for index, entry in enumerate(self.datasets) for problem in entry_problems(index, entry)]
        return super().problems() + self._size_problems() + entries

    def _size_problems(self) -> list[str]:
        problems = []
        height, width = self.height, self.width
        if (height is None) != (width is None):
            given, missing = ("--height", "--width") if width is None else ("--width", "--height")
            problems.append(f"{given} {height if width is None else width} was given without {missing}; pass both "
                            f"for a fixed size, or neither to size samples by --max_pixels")
        for flag, value in (("--height", height), ("--width", width)):
            if value is not None and (value <= 0 or value % SIZE_MULTIPLE):
                nearest = max(SIZE_MULTIPLE, round(value / SIZE_MULTIPLE) * SIZE_MULTIPLE)
                problems.append(f"{flag} {value} must be a positive multiple of {SIZE_MULTIPLE} (the VAE and patch "
                                f"stride); pass e.g. {flag} {nearest}")
        frames = self.num_frames
        if frames is not None and (frames < 1 or frames % 4 != 1):
            suggestion = max(1, round((frames - 1) / 4) * 4 + 1)
            problems.append(f"--num_frames {frames} must be 4k+1 (the video VAE compresses time by 4); pass e.g. "
                            f"--num_frames {suggestion}")
        return problems
