"""Process helpers shared by the tests that kill a parent and count what it leaves running."""

from __future__ import annotations

import os
import signal
import subprocess
import time


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited and waiting to be reaped, does not)."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def survivors_of_sigkill(parent: subprocess.Popen, pids: list[int], wait_s: float) -> list[int]:
    """SIGKILL ``parent``, give its children ``pids`` up to ``wait_s`` seconds to end, then kill
    and return the ones still running (an empty list: none outlived it)."""
    assert pids and all(pid_alive(p) for p in pids), "the children are not all running"
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + wait_s
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if pid_alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    return left
