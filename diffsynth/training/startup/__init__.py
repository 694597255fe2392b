"""What is checked and built before the first step: the flags against the pipeline's inputs and its models, the
accelerator, the dataset, the pipeline and the training module."""

from typing import TYPE_CHECKING

from ...core.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    ".dataset": ("build_dataset",),
    ".input_checks": ("check_inputs_used", "warn_about_unread_columns"),
    ".model_checks": ("check_model_flags",),
    ".pipeline": ("build_training_module", "load_pipeline"),
})

if TYPE_CHECKING:
    from .dataset import build_dataset
    from .input_checks import check_inputs_used, warn_about_unread_columns
    from .model_checks import check_model_flags
    from .pipeline import build_training_module, load_pipeline

__all__ = ["build_dataset", "build_training_module", "check_inputs_used", "check_model_flags", "load_pipeline",
           "warn_about_unread_columns"]
