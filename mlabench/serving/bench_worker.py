"""One process that runs ``vllm bench serve`` many times: serve-bench's shared bench process.

Started by :class:`mlabench.serving.bench_process.BenchProcess` with the Python of the vLLM install
that serve-bench drives (``PYTHON bench_worker.py``), so it imports nothing of mlabench: that
Python need not have it.  A ``vllm bench serve`` command in a fresh process spends 8-20 s importing
vLLM before its first request (15-20 s of a 21-s point at 4K, concurrency 1, on the H200 machine;
8 s on a 2-core CPU machine); here that is paid once per serve-bench run.  Each request runs vLLM's
own command-line entry point, ``vllm.entrypoints.cli.main.main``, with ``sys.argv`` set to the
command serve-bench would run, so its parsing, its benchmark (which seeds its random generators
from ``--seed`` on every call) and the result file it saves are the command's.

Protocol, one JSON object a line: the worker answers ``{"ready": true}`` once vLLM's command line
and ``vllm bench serve`` have imported, else ``{"ready": false, "why": "..."}`` and exits 1.  Then
for each request ``{"argv": ["vllm", "bench", "serve", ...], "log": PATH}`` on its standard input
it runs the command with file descriptors 1 and 2 appended to ``PATH`` and answers ``{"rc": N}``:
0, the code of a ``SystemExit``, or 1 for an exception (its traceback goes to ``PATH``).  Answers
go to the standard output it was started with; nothing else is written there.  It exits at the end
of its input.
"""

import json
import os
import sys
import traceback


def _answer(stream, **fields) -> None:
    stream.write(json.dumps(fields) + "\n")
    stream.flush()


def _exit_code(code) -> int:
    """The exit status of ``SystemExit(code)``, as the interpreter would give it."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def run_command(argv: list, log_path: str) -> int:
    """Run one ``vllm bench serve`` command line in this process, its output appended to
    ``log_path``; returns its exit status."""
    from vllm.entrypoints.cli.main import main as vllm_main

    saved = os.dup(1), os.dup(2)  # put back afterwards: output between commands is not theirs
    with open(log_path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    sys.argv = [str(a) for a in argv]
    try:
        vllm_main()
        return 0
    except SystemExit as exc:
        return _exit_code(exc.code)
    except Exception:  # noqa: BLE001 - the command's failure is its exit status, as in a process
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, old in zip((1, 2), saved):
            os.dup2(old, fd)
            os.close(old)


def main() -> int:
    """Serve requests until the end of standard input (module docstring)."""
    answers = os.fdopen(os.dup(1), "w")
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)  # what the imports print stays out of the answers
    try:
        import vllm.benchmarks.serve  # noqa: F401  (the benchmark; the CLI imports it lazily)
        import vllm.entrypoints.cli.benchmark.main  # noqa: F401
        import vllm.entrypoints.cli.main  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means: no shared process here
        _answer(answers, ready=False, why=f"{type(exc).__name__}: {exc}")
        return 1
    _answer(answers, ready=True)
    for line in sys.stdin:
        if line.strip():
            request = json.loads(line)
            _answer(answers, rc=run_command(request["argv"], request["log"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
