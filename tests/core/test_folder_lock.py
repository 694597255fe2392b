"""The folder lock: one holder, a clear refusal naming it, stale locks taken over by the documented rules."""

import json
import logging
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict, replace

import pytest

from diffsynth.core import folder_lock
from diffsynth.core.folder_lock import (LOCK_FILE, STALE_AFTER_SECONDS, FolderLock, FolderLockedError, LockHolder,
                                        process_start, read_lock)


def write_lock(folder, holder, age=0.0):
    path = folder / LOCK_FILE
    path.write_text(json.dumps(asdict(holder)))
    mtime = time.time() - age
    os.utime(path, (mtime, mtime))
    return path


def finished_pid():
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_held_folder_refuses_a_second_holder_and_names_the_first(tmp_path):
    with FolderLock(tmp_path, purpose="--task sft", run_id="first") as first:
        record = json.loads((tmp_path / LOCK_FILE).read_text())
        assert record["run_id"] == "first" and record["pid"] == os.getpid()
        assert record["host"] == socket.gethostname() and record["purpose"] == "--task sft"
        with pytest.raises(FolderLockedError, match=f"in use by run first \\(--task sft\\), process {os.getpid()} on "
                                                    f"host {socket.gethostname()}, started "):
            FolderLock(tmp_path, run_id="second").acquire()
        assert read_lock(tmp_path)[0] == first.holder  # the refused one left the lock alone
    assert not (tmp_path / LOCK_FILE).exists()
    assert sorted(os.listdir(tmp_path)) == []  # no temporary or tombstone left behind
    with FolderLock(tmp_path, run_id="second"):  # free again
        pass


def test_a_lock_of_a_process_that_ended_on_this_host_is_taken_over(tmp_path, caplog):
    dead = replace(LockHolder.this_process("dead-run", "--task sft"), pid=finished_pid(), pid_start=None)
    write_lock(tmp_path, dead)
    with caplog.at_level(logging.WARNING), FolderLock(tmp_path, run_id="new") as lock:
        assert read_lock(tmp_path)[0] == lock.holder
    assert f"taking over the stale lock {tmp_path / LOCK_FILE} of run dead-run" in caplog.text
    assert f"process {dead.pid} is no longer running" in caplog.text


def test_a_reused_pid_does_not_keep_a_lock(tmp_path):
    # This process is alive, but the lock records another start time: the pid belonged to an earlier process.
    start = process_start(os.getpid())
    if start is None:
        pytest.skip("no /proc: process start times are unknown here")
    write_lock(tmp_path, replace(LockHolder.this_process("old", ""), pid_start=start - 1))
    with FolderLock(tmp_path, run_id="new") as lock:
        assert read_lock(tmp_path)[0] == lock.holder


@pytest.mark.parametrize("pid", ["ended", "ours"])
def test_a_lock_of_another_container_with_our_host_name_holds_while_its_heartbeat_is_fresh(tmp_path, pid):
    # Two containers, one host name, one shared folder: a pid that is free (or is this process) here may be the
    # other container's live run, so only the heartbeat can tell.
    pid = finished_pid() if pid == "ended" else os.getpid()
    elsewhere = replace(LockHolder.this_process("other-container", "--task sft:train"), pid=pid,
                        namespace="another-boot/pid:[4026532999]")
    assert elsewhere.host == socket.gethostname()
    write_lock(tmp_path, elsewhere, age=STALE_AFTER_SECONDS - 60)
    with pytest.raises(FolderLockedError) as refused:
        FolderLock(tmp_path).acquire()
    assert refused.value.holder == elsewhere
    write_lock(tmp_path, elsewhere, age=STALE_AFTER_SECONDS + 60)
    with FolderLock(tmp_path, run_id="new") as lock:
        assert read_lock(tmp_path)[0] == lock.holder


def test_a_lock_that_records_no_namespace_is_judged_by_its_heartbeat(tmp_path):
    # As an older version wrote it: our host name, a pid that has ended here, a fresh heartbeat.
    record = asdict(replace(LockHolder.this_process("old-version", ""), pid=finished_pid()))
    record.pop("namespace", None)
    (tmp_path / LOCK_FILE).write_text(json.dumps(record))
    with pytest.raises(FolderLockedError):
        FolderLock(tmp_path).acquire()


def test_this_process_records_its_namespace(tmp_path):
    namespace = folder_lock.process_namespace()
    if sys.platform.startswith("linux"):
        assert namespace is not None and namespace.endswith(os.readlink("/proc/self/ns/pid"))
    with FolderLock(tmp_path, run_id="mine"):
        assert json.loads((tmp_path / LOCK_FILE).read_text())["namespace"] == namespace


def test_another_hosts_lock_holds_while_its_heartbeat_is_fresh(tmp_path):
    remote = replace(LockHolder.this_process("remote", "--task sft:train"), host="other-machine", pid=1)
    write_lock(tmp_path, remote, age=STALE_AFTER_SECONDS - 60)
    with pytest.raises(FolderLockedError) as refused:
        FolderLock(tmp_path).acquire()
    assert refused.value.holder == remote and "on host other-machine" in str(refused.value)
    write_lock(tmp_path, remote, age=STALE_AFTER_SECONDS + 60)
    with FolderLock(tmp_path, run_id="new") as lock:
        assert read_lock(tmp_path)[0] == lock.holder


def test_an_unreadable_lock_holds_until_it_is_old(tmp_path):
    path = tmp_path / LOCK_FILE
    path.write_text("{not json")
    with pytest.raises(FolderLockedError, match="a process whose lock file cannot be read"):
        FolderLock(tmp_path).acquire()
    old = time.time() - STALE_AFTER_SECONDS - 60
    os.utime(path, (old, old))
    with FolderLock(tmp_path, run_id="new") as lock:
        assert read_lock(tmp_path)[0] == lock.holder


def test_release_leaves_a_lock_that_is_no_longer_its_own(tmp_path):
    lock = FolderLock(tmp_path, run_id="mine")
    lock.acquire()
    other = replace(lock.holder, run_id="theirs")
    write_lock(tmp_path, other)  # e.g. taken over after this holder was presumed dead
    lock.release()
    assert read_lock(tmp_path)[0] == other


def test_the_heartbeat_refreshes_the_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(folder_lock, "HEARTBEAT_SECONDS", 0.05)
    with FolderLock(tmp_path):
        old = time.time() - 1000
        os.utime(tmp_path / LOCK_FILE, (old, old))
        deadline = time.time() + 10
        while read_lock(tmp_path)[1] > 500 and time.time() < deadline:
            time.sleep(0.05)
        assert read_lock(tmp_path)[1] < 500


def test_a_lock_held_by_another_live_process_is_refused_until_it_is_killed(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom diffsynth.core.folder_lock import FolderLock\n"
         "FolderLock(sys.argv[1], 'holder').acquire()\nprint('held', flush=True)\ntime.sleep(600)\n", str(tmp_path)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderLockedError, match=f"process {holder.pid} on host"):
            FolderLock(tmp_path).acquire()
    finally:
        holder.kill()  # SIGKILL: no chance to release
        holder.wait()
    with FolderLock(tmp_path, run_id="after") as lock:
        assert read_lock(tmp_path)[0] == lock.holder


def test_a_file_system_without_hard_links_still_gets_an_exclusive_lock(tmp_path, monkeypatch):
    def unsupported(source, target):
        raise OSError(95, "Operation not supported")

    monkeypatch.setattr(folder_lock.os, "link", unsupported)
    with FolderLock(tmp_path, run_id="first") as first:
        assert read_lock(tmp_path)[0] == first.holder
        with pytest.raises(FolderLockedError, match="in use by run first"):
            FolderLock(tmp_path).acquire()
    assert os.listdir(tmp_path) == []
