"""What is checked and built before the first step: the flags against the pipeline's inputs and its models."""

from .input_checks import check_inputs_used, warn_about_unread_columns
from .model_checks import check_model_flags

__all__ = ["check_inputs_used", "check_model_flags", "warn_about_unread_columns"]
