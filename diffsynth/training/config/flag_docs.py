"""The flag reference the docs embed, rendered from the parsers: the trainer's flags by group, and the reference
trainer's flags with their status here. ``scripts/update_flag_docs.py`` writes both into the training docs and a test
compares them, so the docs cannot drift from the code."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from .reference_flags import NOTES, REFERENCE_FLAGS, UNSUPPORTED


def _format_default(default: object) -> str:
    text = json.dumps(default) if isinstance(default, str) else str(default)
    return "unset" if default is None else f"`{_table_cell(text)}`"


def _table_cell(text: str) -> str:
    # Angle brackets would read as HTML tags in rendered Markdown; "%%" is argparse's escape for a percent sign.
    text = " ".join(text.split()).replace("%%", "%")
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def flag_table(parser: argparse.ArgumentParser) -> str:
    """Renders the parser's flags as Markdown: a ``###`` heading and a flag/default/description table per group.

    The docs embed this output, and a test compares them, so the docs cannot drift from the code.
    """
    sections = []
    for group in parser._action_groups:
        actions = [action for action in group._group_actions if not isinstance(action, argparse._HelpAction)]
        if not actions:
            continue
        rows = ["| Flag | Default | Description |", "| --- | --- | --- |"]
        for action in actions:
            description = action.help or ""
            if action.choices:
                description += f" Choices: {', '.join(map(str, action.choices))}."
            flag = action.option_strings[0] if action.option_strings else action.dest
            rows.append(f"| `{flag}` | {_format_default(action.default)} | {_table_cell(description)} |")
        sections.append(f"### {group.title}\n\n" + "\n".join(rows))
    return "\n\n".join(sections) + "\n"


def reference_flag_table(parsers: Sequence[argparse.ArgumentParser]) -> str:
    """Markdown: every reference flag (``reference_flags``), where the reference defines it, and its status in
    ``parsers`` (the image and the video trainer's)."""
    known = {option for parser in parsers for action in parser._actions for option in action.option_strings}
    rows = ["| Reference flag | Defined there in | Here |", "| --- | --- | --- |"]
    for flag, where in REFERENCE_FLAGS.items():
        if flag in UNSUPPORTED:
            status = f"accepted, refused when given: {UNSUPPORTED[flag]}"
        elif flag in known:
            status = "works" + (f" ({NOTES[flag]})" if flag in NOTES else "")
        else:
            status = "missing"
        rows.append(f"| `{flag}` | {where} | {_table_cell(status)} |")
    return "\n".join(rows) + "\n"
