"""Worker processes: one per GPU, all serving one job (a tuning study; later a sweep's points).

The parent writes the job's payload (JSON) into the run folder and starts ``python -m
mlabench.tune.worker_pool ENTRY PAYLOAD INDEX`` once per device, with only that device visible
(``CUDA_VISIBLE_DEVICES``, or ``HIP_VISIBLE_DEVICES`` on ROCm).  ``ENTRY`` is
``"module:function"``, called as ``function(payload, index)``.  Workers share results through an
append-only run folder (:func:`append_shared` serialises appends across processes) and whatever
store the job coordinates on (an Optuna storage for tuning).  Each worker's output goes to
``<log_dir>/worker-<index>.log``; a worker that fails makes :func:`supervise` raise with its
error: the line it sent through a pipe (:data:`ERROR_FD_ENV`; it arrives when the log cannot be
written, e.g. on a full disk), else the last line of its log.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlabench.errors import ConfigError, MlabenchError, WorkerError
from mlabench.records.record import Record
from mlabench.records.store import ResultStore
from mlabench.run_files import APPEND_LOCK_FILE, CLAIMS_FOLDER, WORKER_PAYLOAD_FILE, worker_log_file
from mlabench.serving.lifecycle import die_with_parent

#: Comma-separated modules every worker imports first (e.g. one that registers extra backends).
IMPORTS_ENV = "MLABENCH_WORKER_IMPORTS"
#: The file descriptor a worker writes its one-line error to before it exits non-zero.
ERROR_FD_ENV = "MLABENCH_WORKER_ERROR_FD"


@dataclass
class Worker:
    """A started worker: its index, the device it sees (None: the parent's devices) and its log."""

    index: int
    device: str | None
    process: subprocess.Popen
    log_path: Path
    error_fd: int | None = None  # read end of the pipe the worker writes its error line to


def parse_devices(text: str | None) -> list[str | None]:
    """``"0,1"`` -> ``["0", "1"]``; None -> ``[None]`` (one worker, the devices this process sees).

    Raises :class:`ConfigError` for an empty list, a repeat or a non-integer index.
    """
    if text is None:
        return [None]
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items or any(not x.isdigit() for x in items):
        raise ConfigError(f"--gpus takes comma-separated GPU indices, e.g. 0,1; got {text!r}")
    if len(set(items)) != len(items):
        raise ConfigError(f"--gpus names a GPU twice: {text!r}")
    return items


def worker_devices(gpus: str | None, workers: int | None) -> list[str | None]:
    """One entry per worker process: the GPU indices of ``gpus`` (``"0,1"``: :func:`parse_devices`),
    else ``workers`` (default 1) times None (each worker sees the devices of this host).

    Raises :class:`ConfigError` for ``workers`` below 1 or given with ``gpus``, or a bad ``gpus``.
    """
    if workers is not None and (workers < 1 or gpus):
        raise ConfigError("--workers takes a count >= 1, and not with --gpus")
    return parse_devices(gpus) if gpus else [None] * (workers or 1)


def device_env(device: str | None, rocm: bool, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a worker that sees only GPU ``device`` (unchanged for None).

    ROCm builds of torch read ``HIP_VISIBLE_DEVICES`` first and then index ``CUDA_VISIBLE_DEVICES``
    into what is left, so exactly one of the two is set.
    """
    env = dict(os.environ if base is None else base)
    if device is not None:
        env.pop("CUDA_VISIBLE_DEVICES" if rocm else "HIP_VISIBLE_DEVICES", None)
        env["HIP_VISIBLE_DEVICES" if rocm else "CUDA_VISIBLE_DEVICES"] = device
    return env


def start_workers(entry: str, payload: dict[str, Any], devices: list[str | None], log_dir: Path,
                  rocm: bool = False, extra_env: dict[str, str] | None = None) -> list[Worker]:
    """Start one worker per entry of ``devices`` running ``entry(payload, index)``.

    ``extra_env`` reaches the workers through their environment, not the payload file (e.g. a
    database URL holding a password).
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    payload_path = log_dir / WORKER_PAYLOAD_FILE
    payload_path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    workers = []
    for index, device in enumerate(devices):
        log_path = log_dir / worker_log_file(index)
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "mlabench.tune.worker_pool", entry, str(payload_path), str(index)],
                env={**device_env(device, rocm), **(extra_env or {}), ERROR_FD_ENV: str(write_fd)},
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, pass_fds=(write_fd,),
                preexec_fn=die_with_parent(signal.SIGKILL),
            )
        os.close(write_fd)
        workers.append(Worker(index, device, proc, log_path, read_fd))
    return workers


def supervise(workers: list[Worker], poll: Callable[[], None] | None = None, interval_s: float = 0.5) -> None:
    """Wait for every worker, calling ``poll`` every ``interval_s`` seconds (and once at the end).

    Ctrl-C terminates the workers and re-raises.  Raises :class:`WorkerError` naming the first
    worker that exited non-zero and its error line (exit 2 or 3 as the worker's, else 1).
    """
    try:
        while any(w.process.poll() is None for w in workers):
            if poll:
                poll()
            time.sleep(interval_s)
    except KeyboardInterrupt:
        for w in workers:
            if w.process.poll() is None:
                w.process.terminate()
        for w in workers:
            w.process.wait()
        raise
    if poll:
        poll()
    errors = [(w, _sent_error(w)) for w in workers]
    for w, sent in errors:
        if w.process.returncode:
            where = f"GPU {w.device}" if w.device is not None else "this host's devices"
            raise WorkerError(f"worker {w.index} ({where}) exited with {w.process.returncode}: "
                              f"{sent or last_line(w.log_path)} (log: {w.log_path})", w.process.returncode)


def _sent_error(worker: Worker) -> str:
    """The error line ``worker`` sent through its pipe before exiting ("" when none came); closes
    the pipe."""
    if worker.error_fd is None:
        return ""
    try:
        return os.read(worker.error_fd, 4096).decode(errors="replace").strip()
    except OSError:  # nothing written (BlockingIOError while a grandchild holds the pipe open)
        return ""
    finally:
        os.close(worker.error_fd)
        worker.error_fd = None


def last_line(path: Path) -> str:
    """The last non-empty line of a text file ("" when there is none)."""
    try:
        lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


def worker_id() -> str:
    """``host:pid:start`` of this process (``start``: its start time in clock ticks since boot on
    Linux, so a reused pid is not taken for a live worker)."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_ticks(os.getpid())}"


def worker_alive(ident: str) -> bool | None:
    """Whether the process named by :func:`worker_id` still runs: None when it ran on another host."""
    host, pid, start = (ident.split(":") + ["", ""])[:3]
    if host != socket.gethostname() or not pid.isdigit():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return _start_ticks(int(pid)) == start


def _start_ticks(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def append_shared(store: ResultStore, record: Record) -> None:
    """Append ``record`` to ``store`` holding an exclusive lock, so records from several worker
    processes never interleave within a line."""
    with open(store.run_dir / APPEND_LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            store.append(record)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _claim_path(run_dir: Path, key: str) -> Path:
    folder = run_dir / CLAIMS_FOLDER
    folder.mkdir(exist_ok=True)
    return folder / hashlib.sha1(key.encode()).hexdigest()


def claim(run_dir: Path, key: str) -> bool:
    """Claim the measurement of record ``key`` in the run folder for this worker: True when this
    worker holds the claim (it was free, already this worker's, or its holder on this host is
    gone), False while another worker holds it.  Lets workers whose different jobs need the same
    measurement take it once; :func:`release` ends the claim once the record is appended."""
    path = _claim_path(run_dir, key)
    me = worker_id()
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                holder = path.read_text()
            except FileNotFoundError:
                continue  # released meanwhile: try again
            if holder == me:
                return True
            if holder and worker_alive(holder) is False:
                path.write_text(me)  # a worker killed while measuring: take its claim over
                return True
            return False
        with os.fdopen(fd, "w") as fh:
            fh.write(me)
        return True


def release(run_dir: Path, key: str) -> None:
    """End this worker's claim on ``key`` (nothing when another worker holds it)."""
    path = _claim_path(run_dir, key)
    try:
        if path.read_text() == worker_id():
            path.unlink()
    except FileNotFoundError:
        pass


class RecordIndex:
    """Keys of the records in a run folder, read incrementally (only new complete lines).

    Lets a worker see what any process already measured into the run (nothing measured twice).
    """

    def __init__(self, store: ResultStore):
        self.path = store.jsonl
        self.offset = 0
        self.by_key: dict[str, dict[str, Any]] = {}

    def get(self, key: str) -> dict[str, Any] | None:
        """The record (as a dict) with ``key``, re-reading what was appended since the last call."""
        if key not in self.by_key:
            self._refresh()
        return self.by_key.get(key)

    def _refresh(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1
        for line in data[:end].splitlines():
            if line.strip():
                rec = json.loads(line)
                self.by_key[rec["key"]] = rec
        self.offset += end


def main(argv: list[str] | None = None) -> int:
    """``python -m mlabench.tune.worker_pool ENTRY PAYLOAD INDEX``: run one worker; errors a user can cause
    print one ``error:`` line and exit with their code (2 bad input, 3 cannot run here)."""
    entry, payload_path, index = (argv if argv is not None else sys.argv[1:])[:3]
    for extra in filter(None, os.environ.get(IMPORTS_ENV, "").split(",")):
        importlib.import_module(extra.strip())  # e.g. a module registering out-of-tree backends
    module_name, func_name = entry.split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    payload = json.loads(Path(payload_path).read_text())
    try:
        func(payload, int(index))
    except MlabenchError as exc:
        _send_error(f"error: {exc}")
        try:
            print(f"error: {exc}", file=sys.stderr, flush=True)
        except OSError:  # the log's disk is full: the parent has the line from the pipe
            pass
        return int(exc.exit_code)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug: its traceback goes to the log, its last line to the parent too
        _send_error(f"{type(exc).__name__}: {exc}")
        raise
    return 0


def _send_error(line: str) -> None:
    """Write ``line`` to the parent's error pipe (:data:`ERROR_FD_ENV`), which needs no disk."""
    fd = os.environ.get(ERROR_FD_ENV, "")
    if fd.isdigit():
        try:
            os.write(int(fd), line.replace("\n", " ").encode()[:4000])
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(main())
