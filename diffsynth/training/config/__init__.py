"""The run's flags: the argparse groups, their checks, and the reference trainer's flags."""

from .parsers import build_parser, parse_args

__all__ = ["build_parser", "parse_args"]
