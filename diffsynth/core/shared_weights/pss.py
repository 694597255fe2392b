"""Host memory of processes as the kernel accounts it: proportional set size (PSS), in total and for shared segments.

PSS charges each page to the processes that map it in equal parts, so the PSS of all processes of a machine adds up
to the memory they use together: a segment mapped by N processes counts once in the sum, a private copy per process
N times. Linux only (``/proc/<pid>/smaps_rollup`` and ``smaps``); the benchmark and the tests read it.
"""

from __future__ import annotations

from .segment import SEGMENT_PREFIX


def _kib_field(line: str) -> int:
    return int(line.split()[1]) * 1024


def process_pss(pid: int | str = "self") -> int:
    """Bytes of proportional set size of process ``pid`` (all its mappings)."""
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        return next(_kib_field(line) for line in rollup if line.startswith("Pss:"))


def segment_pss(pid: int | str = "self", name: str = "") -> int:
    """Bytes of proportional set size that process ``pid`` has in shared weight segments (its share of them), of
    every segment or of those whose name (the model's class) starts with ``name``."""
    total, in_segment = 0, False
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's header: address range first
                in_segment = len(fields) >= 6 and f"/memfd:{SEGMENT_PREFIX}:{name}" in line
            elif in_segment and fields[0] == "Pss:":
                total += _kib_field(line)
    return total
