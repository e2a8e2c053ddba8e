"""Server lifecycle: launch ``vllm serve`` in its own process group, wait for health, stop cleanly.

Stop order is SIGINT, then SIGTERM, then SIGKILL, each sent to the whole process group (vLLM
forks engine-core and worker processes), with a grace period between steps, so that no process is
left behind on success, error or Ctrl-C.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path
from typing import Callable

from mlabench.errors import DependencyError, ServerError
from mlabench.serving.config import LaunchSpec, expand


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a text file ('' when it does not exist)."""
    try:
        with open(path, errors="replace") as fh:
            return "".join(deque(fh, maxlen=lines)).rstrip()
    except FileNotFoundError:
        return ""


def http_get(url: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
    """GET ``url``; returns (status, body). Raises ``OSError`` (URLError) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read() if exc.fp else b""


def is_healthy(base_url: str, timeout_s: float = 5.0) -> bool:
    """True when ``GET {base_url}/health`` answers 200 (vLLM's OpenAI server health route)."""
    try:
        status, _ = http_get(base_url.rstrip("/") + "/health", timeout_s)
    except (OSError, ValueError):
        return False
    return status == 200


def served_model(base_url: str, timeout_s: float = 10.0) -> str:
    """First model id of ``GET /v1/models``; raises :class:`ServerError` when it cannot be read."""
    try:
        status, body = http_get(base_url.rstrip("/") + "/v1/models", timeout_s)
        if status != 200:
            raise ServerError(f"{base_url}/v1/models answered HTTP {status}")
        return json.loads(body)["data"][0]["id"]
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise ServerError(f"cannot read the served model from {base_url}/v1/models: {exc}") from None


def require_reachable(base_url: str) -> None:
    """Raise :class:`ServerError` unless the server at ``base_url`` answers /health with 200."""
    if not is_healthy(base_url):
        raise ServerError(f"no healthy server at {base_url} (GET /health did not answer 200)")


#: Linux's prctl option asking for a signal when the parent dies (``<linux/prctl.h>``).
PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` for :class:`subprocess.Popen`: the child asks the kernel for ``sig`` when
    the process that started it dies, however it dies (``kill -9`` included), so no server, bench or
    worker outlives the command.  Linux only (``prctl(PR_SET_PDEATHSIG)``, prctl(2)); elsewhere it
    does nothing.  The signal follows the parent *thread*: start children from the thread that
    waits for them.  A parent already gone by then (it died between fork and exec) is caught by
    comparing the parent pid, and the child exits at once."""
    parent = os.getpid()

    def preexec() -> None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        except (OSError, AttributeError):
            return  # not Linux: nothing to ask for
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def stop_group(proc: subprocess.Popen, grace_s: float = 30.0) -> int | None:
    """Stop ``proc`` and its process group: SIGINT, then SIGTERM, then SIGKILL.

    Waits ``grace_s`` seconds after SIGINT and after SIGTERM. Returns the exit code of ``proc``
    (None if it could not be reaped). Safe to call on a process that already exited: the group is
    still signalled, since children can outlive the leader.
    """
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = proc.pid  # leader gone; its group id was its pid (start_new_session)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break  # nothing left in the group
        deadline = time.monotonic() + (grace_s if sig != signal.SIGKILL else 5.0)
        while time.monotonic() < deadline:
            if proc.poll() is not None and not _group_alive(pgid):
                break
            time.sleep(0.1)
        else:
            continue
        break
    try:
        return proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return None


def _group_alive(pgid: int) -> bool:
    """True while a process of group ``pgid`` still runs.  A zombie (exited, waiting for its new
    parent to reap it) holds nothing and does not count: an init that reaps slowly, as in some
    containers, would otherwise add seconds to every stop.  Without ``/proc`` any member counts."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for entry in proc.iterdir():
        try:  # /proc/<pid>/stat: "pid (comm) state ppid pgrp ..."
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split() if entry.name.isdigit() else []
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def launch_argv(spec: LaunchSpec, vllm_bin: str) -> list[str]:
    """The command line of ``spec`` after ``{vllm_bin}``, ``$VAR`` and ``~`` expansion."""
    return [expand(a.replace("{vllm_bin}", vllm_bin)) for a in spec.command]


def require_launchable(spec: LaunchSpec, vllm_bin: str) -> None:
    """Raise :class:`ServerError` unless the program of ``spec``'s command exists and is executable
    (looked up on ``PATH``, or relative to ``spec.cwd``), checked before anything is started;
    :class:`DependencyError` (exit 3, a package missing here) where that program is ``{vllm_bin}``;
    :class:`ConfigError` for a ``$VAR`` of the command or of its ``env`` that is not set (an ``env``
    value was first expanded at launch, after earlier variants had run)."""
    for value in spec.env.values():
        expand(value)
    program = launch_argv(spec, vllm_bin)[0]
    if os.sep in program and not os.path.isabs(program) and spec.cwd:
        program = os.path.join(expand(spec.cwd), program)
    if shutil.which(program) is None:
        if spec.command and "{vllm_bin}" in spec.command[0]:
            raise DependencyError(f"cannot start server: {program!r} is not an executable program here "
                                  "(set MLABENCH_VLLM_BIN, --vllm-bin or the config's vllm_bin)")
        raise ServerError(f"cannot start server: {program!r} is not an executable program here")


class ManagedServer:
    """A server launched from a :class:`LaunchSpec`, used as a context manager.

    ``with ManagedServer(spec, base_url, log_path) as srv:`` starts the command in a new session
    (its own process group) with stdout/stderr going to ``log_path``, waits until ``/health``
    answers 200, and on exit (normal, exception or KeyboardInterrupt) stops the whole group.

    Health is tried every ``poll_s`` seconds (default ``spec.health_poll_s``; tests use short
    ones).  Raises :class:`ServerError` when the command cannot start, exits before it is healthy
    (the message carries the tail of its log), or is not healthy within ``spec.health_timeout_s``.
    """

    def __init__(
        self,
        spec: LaunchSpec,
        base_url: str,
        log_path: Path,
        vllm_bin: str = "vllm",
        on_wait: Callable[[float], None] | None = None,
        poll_s: float | None = None,
    ) -> None:
        self.spec = spec
        self.base_url = base_url
        self.log_path = Path(log_path)
        self.vllm_bin = vllm_bin
        self.on_wait = on_wait
        self.poll_s = spec.health_poll_s if poll_s is None else poll_s
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    def argv(self) -> list[str]:
        """The command line after ``{vllm_bin}``, ``$VAR`` and ``~`` expansion."""
        return launch_argv(self.spec, self.vllm_bin)

    def start(self) -> None:
        """Start the process and wait for health (see the class docstring for errors)."""
        if is_healthy(self.base_url, timeout_s=2.0):
            raise ServerError(
                f"something already answers at {self.base_url}; refusing to launch a second server "
                "there (stop it, or give the variant no [launch] to use it as it is)"
            )
        env = {**os.environ, **self.spec.expanded_env()}
        argv = self.argv()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        log.write(f"# mlabench launch: {' '.join(argv)}\n".encode())
        log.flush()
        t0 = time.monotonic()
        try:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                cwd=expand(self.spec.cwd) if self.spec.cwd else None, start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        except OSError as exc:
            raise ServerError(f"cannot start server {argv[0]!r}: {exc}") from None
        finally:
            log.close()
        try:
            self._wait_healthy(t0)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0

    def _wait_healthy(self, t0: float) -> None:
        assert self.proc is not None
        deadline = t0 + self.spec.health_timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerError(
                    f"server exited with code {code} before it was healthy; last lines of its "
                    f"log:\n{log_tail(self.log_path)}"
                )
            if is_healthy(self.base_url, timeout_s=min(5.0, self.poll_s + 1)):
                return
            now = time.monotonic()
            if now >= deadline:
                raise ServerError(
                    f"server not healthy at {self.base_url}/health after "
                    f"{self.spec.health_timeout_s:.0f} s; last lines of its log:\n"
                    f"{log_tail(self.log_path)}"
                )
            if self.on_wait:
                self.on_wait(now - t0)
            time.sleep(self.poll_s)

    def alive(self) -> bool:
        """True while the launched process has not exited."""
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> int | None:
        """Stop the process group (idempotent); returns the exit code, if reaped."""
        if self.proc is None:
            return None
        code = stop_group(self.proc, self.spec.stop_grace_s)
        with open(self.log_path, "ab") as log:
            log.write(f"# mlabench stopped server, exit code {code}\n".encode())
        return code

    def __enter__(self) -> "ManagedServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
