"""The masked-loss section: ``--masked_loss`` and ``--unmasked_weight`` (docs Masked_Loss).

Each row's grayscale ``mask`` file (a file column, so ``--data_file_keys`` lists it) weighs the loss of every latent
element: white learns, black is ignored, gray in between; ``objective.loss_mask`` computes it. The checks against the
dataset and task flags (``masked_loss_problems``) make sure the masks are loaded exactly when they are used.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import TYPE_CHECKING

from .section import Section

if TYPE_CHECKING:
    from .dataset import DatasetSection
    from .training import TrainingSection

#: The metadata column holding each row's mask file (listed in ``--data_file_keys``).
MASK_COLUMN = "mask"


@dataclasses.dataclass(frozen=True)
class MaskedLossSection(Section):
    """The masked-loss flags; ``unmasked_weight`` None means the default, 0."""

    masked_loss: bool = False
    unmasked_weight: float | None = None

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, video: bool = False) -> None:
        """Adds the Masked loss group."""
        media = "video (a mask video of as many frames, or one image for every frame)" if video else "image"
        group = parser.add_argument_group("Masked loss")
        group.add_argument("--masked_loss", action="store_true",
                           help=f"Weigh the loss by each row's grayscale mask, the metadata column 'mask' (list it "
                                f"in --data_file_keys, e.g. image,mask): white pixels learn, black ones are "
                                f"ignored, gray ones count in proportion. The mask has the size of its {media} and is "
                                "resized with it; a row with an empty cell trains unmasked.")
        group.add_argument("--unmasked_weight", type=float, default=None,
                           help="Loss weight of the black part of the masks, 0 to 1 (each pixel weighs W + (1 - W) * "
                                "mask); 1 turns masking off. Unset: 0.")

    @property
    def weight(self) -> float:
        """``--unmasked_weight``, 0 when unset."""
        return 0.0 if self.unmasked_weight is None else float(self.unmasked_weight)

    def problems(self) -> list[str]:
        problems = super().problems()
        value = self.unmasked_weight
        if value is None or not math.isfinite(value):
            return problems
        if not 0.0 <= value <= 1.0:
            problems.append(f"--unmasked_weight {value} must lie between 0 (ignore the black part of the masks) and 1 "
                            "(weigh it fully); pass e.g. --unmasked_weight 0.1")
        if not self.masked_loss:
            problems.append(f"--unmasked_weight {value} has no effect without --masked_loss; add --masked_loss (and "
                            "the mask column to --data_file_keys), or drop it")
        return problems


def masked_loss_problems(masked: MaskedLossSection, dataset: DatasetSection, training: TrainingSection) -> list[str]:
    """The masks are loaded when, and only when, a run uses them: the mask column is in ``--data_file_keys`` with
    ``--masked_loss`` and without, and a stage 1, which caches the masks, takes no weight (stage 2 applies it)."""
    task, family, stage = training.task, training.family, training.stage
    if stage == "train":
        return []  # the masks come from the stage-1 cache, which stage 2 checks was made with --masked_loss
    keys = dataset.data_file_keys
    problems = []
    if masked.masked_loss and MASK_COLUMN not in dataset.file_keys:
        problems.append(f"--masked_loss reads each row's mask from the metadata column {MASK_COLUMN!r}, but "
                        f"--data_file_keys {keys!r} does not load it; pass --data_file_keys {keys},{MASK_COLUMN}")
    if not masked.masked_loss and MASK_COLUMN in dataset.file_keys:
        problems.append(f"--data_file_keys {keys!r} loads the {MASK_COLUMN!r} column, but without --masked_loss the "
                        f"masks would be ignored; add --masked_loss, or drop {MASK_COLUMN} from --data_file_keys")
    if masked.masked_loss and stage == "data_process" and masked.unmasked_weight is not None:
        problems.append(f"--unmasked_weight {masked.unmasked_weight} has no effect on --task {task}, which caches the "
                        f"masks themselves; pass it to the {family}:train run")
    return problems
