"""The sections of a run's flags, in the order their flag groups appear in ``--help`` and the docs.

Apart from :mod:`run_config`, which checks them against each other, so that the parser is built from the sections
alone: none of them imports torch, and a flag error is answered before it loads.
"""

from __future__ import annotations

from .timesteps import TimestepFlags
from .console import ConsoleSection
from .dataset import DatasetSection
from .lora import LoraSection
from .masked_loss import MaskedLossSection
from .model import ModelSection
from .output import OutputSection
from .placement import PlacementConfig
from .section import Section
from .training import TrainingSection
from .validation import ValidationSection
from .validation_loss import ValidationLossSection

SECTIONS: dict[str, type[Section]] = {
    "dataset": DatasetSection, "model": ModelSection, "training": TrainingSection, "timesteps": TimestepFlags,
    "masked_loss": MaskedLossSection,
    "output": OutputSection, "validation": ValidationSection,
    "validation_loss": ValidationLossSection, "lora": LoraSection, "placement": PlacementConfig,
    "console": ConsoleSection,
}
