"""A run over several machines: the start-up agreement of every process on flags and code, the watch that names a
lost process, the process-group timeout (see docs/en/Multi_Node.md)."""

from .agreement import ProcessIdentity, agreement_problems, gather_identities
from .watch import PROCESS_TIMEOUT_ENV, ProcessWatch, lost_process_line, process_group_timeout

__all__ = ["PROCESS_TIMEOUT_ENV", "ProcessIdentity", "ProcessWatch", "agreement_problems", "gather_identities",
           "lost_process_line", "process_group_timeout"]
