"""The validation-loss section: a held-out set whose mean loss is measured while training (docs Validation loss).

With a split run the validation set follows the training set: ``*:data_process`` caches it (from
``--validation_dataset_metadata_path``) into ``<output_path>/validation``, next to the training cache, and ``*:train``
reads that cache from ``<validation_dataset_base_path>/validation`` (default: the training ``--dataset_base_path``,
the stage-1 output). A set without ``--validation_loss_steps`` is measured once, at the end of training.
"""

from __future__ import annotations

import argparse
import dataclasses

from .section import Section

#: The folder of a stage-1 output that holds the validation set's cache.
VALIDATION_CACHE_DIR = "validation"


@dataclasses.dataclass(frozen=True)
class ValidationLossSection(Section):
    """The ``--validation_dataset_*`` and ``--validation_loss_steps`` flags; the files are checked at start-up
    (``startup.dataset.build_validation_dataset``), before the models load."""

    validation_dataset_metadata_path: str | None = None
    validation_dataset_base_path: str | None = None
    validation_loss_steps: int | None = None

    LOWER_BOUNDS = (("validation_loss_steps", 1, True, "--validation_loss_steps 100"),)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, video: bool = False) -> None:
        """Adds the Validation loss group."""
        group = parser.add_argument_group("Validation loss")
        group.add_argument("--validation_dataset_metadata_path", type=str, default=None,
                           help="Metadata file (.csv, .json or .jsonl, the training set's columns) of a held-out "
                                "validation set: its mean loss at fixed timesteps and noise (the same weights give "
                                "the same value) is logged as val_loss. For a split run pass it to the "
                                "*:data_process stage, which caches the set in output_path/validation.")
        group.add_argument("--validation_dataset_base_path", type=str, default=None,
                           help="Folder the validation metadata's file paths are relative to; for a *:train task, the "
                                "stage-1 output whose validation/ folder holds the cached set. Unset: "
                                "--dataset_base_path.")
        group.add_argument("--validation_loss_steps", type=int, default=None,
                           help="Measure the validation loss every N optimizer steps and at the end of training; "
                                "unset with a validation set: at the end only.")

    @property
    def measured(self) -> bool:
        """Whether a flag of this section is given (the run then measures a validation loss, or is refused)."""
        return any(value is not None for value in self.flags().values())

    def base_path(self, dataset_base_path: str) -> str:
        """The validation set's folder: ``--validation_dataset_base_path``, else the training one."""
        return self.validation_dataset_base_path or dataset_base_path


def validation_loss_problems(section: ValidationLossSection, task: str, family: str, stage: str | None) -> list[str]:
    """The validation-loss flags against the task's stage: what each stage reads, and steps without a set."""
    metadata, steps = section.validation_dataset_metadata_path, section.validation_loss_steps
    if stage == "data_process":
        if steps is not None:
            return [f"--validation_loss_steps {steps} has no effect on --task {task}, which trains nothing; pass it "
                    f"to the {family}:train run (keep --validation_dataset_metadata_path here to cache the set)"]
        if metadata is None and section.validation_dataset_base_path is not None:
            return [f"--validation_dataset_base_path {section.validation_dataset_base_path} has no effect without "
                    "--validation_dataset_metadata_path; add the validation metadata file, or drop it"]
        return []
    if stage == "train":
        if metadata is not None:
            return [f"--task {task} reads the validation set from the stage-1 cache "
                    f"(<--validation_dataset_base_path>/{VALIDATION_CACHE_DIR}), not a metadata file; drop "
                    f"--validation_dataset_metadata_path {metadata!r} and pass it to the {family}:data_process run"]
        return []
    if metadata is None:
        given = [f"--{name} {value}" for name, value in section.flags().items() if value is not None]
        if given:
            return [f"{' and '.join(given)} without a validation set: pass --validation_dataset_metadata_path FILE "
                    "(a .csv / .json / .jsonl with the training set's columns), or drop "
                    f"{' and '.join(flag.split()[0] for flag in given)}"]
    return []
