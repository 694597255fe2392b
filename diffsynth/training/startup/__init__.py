"""What is checked and built before the first step: the flags against the pipeline's inputs and its models, the
accelerator and the launch (``launch_problems``), the dataset, the pipeline and the training module."""

from typing import TYPE_CHECKING

from ...core.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    ".dataset": ("build_dataset", "build_validation_dataset"),
    ".input_checks": ("check_inputs_used", "warn_about_unread_columns"),
    ".launch_checks": ("launch_problems",),
    ".model_checks": ("check_model_flags",),
    ".pipeline": ("build_training_module", "load_pipeline"),
})

if TYPE_CHECKING:
    from .dataset import build_dataset, build_validation_dataset
    from .input_checks import check_inputs_used, warn_about_unread_columns
    from .launch_checks import launch_problems
    from .model_checks import check_model_flags
    from .pipeline import build_training_module, load_pipeline

__all__ = ["build_dataset", "build_training_module", "build_validation_dataset", "check_inputs_used", "check_model_flags", "launch_problems",
           "load_pipeline", "warn_about_unread_columns"]
