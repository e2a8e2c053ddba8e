"""Time one tuning job on one machine and on N machines sharing a PostgreSQL database (docs/tuning.md).

    python scripts/tune_machines.py POSTGRES_URL OUTDIR [N] -- TUNE FLAGS...

POSTGRES_URL names a server and a database to connect to (e.g.
``postgresql+psycopg2://postgres@127.0.0.1:5432/postgres``); two new databases are made on it, one
for the job alone and one shared.  Each machine is ``mlabench tune TUNE FLAGS --storage DB`` on a
core of its own (``taskset``), all N started at once.  Writes ``OUTDIR/timing.json``: each run's
wall time, the measuring time (first trial start to last trial end), the records measured and how
many were measured twice, and whether every machine exported the same policy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # mlabench from this checkout


def make_database(url: str) -> str:
    import psycopg2

    conn = psycopg2.connect(url.replace("postgresql+psycopg2://", "postgresql://"))
    conn.autocommit = True
    name = f"mlabench_tune_{uuid.uuid4().hex[:8]}"
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    conn.close()
    return url.rsplit("/", 1)[0] + "/" + name


def machines(db: str, outdir: Path, flags: list[str], n: int) -> list[dict]:
    """Run ``n`` machines at once; each one's wall time and run folder."""
    procs = []
    for i in range(n):
        pin = ["taskset", "-c", str(i % (os.cpu_count() or 1))] if shutil.which("taskset") else []
        folder = outdir / f"machine-{i}"
        argv = [*pin, sys.executable, "-m", "mlabench", "tune", *flags, "--storage", db, "--results-dir", str(folder)]
        log = open(outdir / f"machine-{i}.log", "w")
        procs.append((time.monotonic(), folder, subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                                 env={**os.environ, "OMP_NUM_THREADS": "1"})))
    out = []
    for start, folder, proc in procs:
        code = proc.wait()
        out.append({"exit": code, "wall_s": round(time.monotonic() - start, 1),
                    "run": str(next(folder.glob("tune-*"), folder))})
    return out


def summary(db: str, runs: list[dict]) -> dict:
    """Measuring time, records, repeats and policies of the runs on ``db``."""
    from mlabench.records.store import ResultStore
    from mlabench.tune.storage import open_storage, optuna_module

    optuna = optuna_module()
    storage = open_storage(db, Path("."))
    trials = [t for s in optuna.get_all_study_summaries(storage)
              for t in optuna.load_study(study_name=s.study_name, storage=storage).trials]
    done = [t for t in trials if t.datetime_complete]
    keys = [r.key for run in runs for r in ResultStore(Path(run["run"])).records()]
    policies = {json.dumps(json.loads((Path(run["run"]) / "policy.json").read_text())["batches"]) for run in runs}
    return {"machines": runs, "wall_s": max(r["wall_s"] for r in runs),
            "measuring_s": round((max(t.datetime_complete for t in done)
                                  - min(t.datetime_start for t in done)).total_seconds(), 1),
            "trials": len(trials), "records": len(keys), "measured_twice": len(keys) - len(set(keys)),
            "same_policy": len(policies) == 1, "policy_batches": json.loads(next(iter(policies)))}


def main() -> None:
    args = sys.argv[1:]
    split = args.index("--")
    url, outdir, *rest = args[:split]
    flags, n = args[split + 1:], int(rest[0]) if rest else 2
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    alone_db, shared_db = make_database(url), make_database(url)
    (outdir / "alone").mkdir()
    (outdir / "shared").mkdir()
    one = summary(alone_db, machines(alone_db, outdir / "alone", flags, 1))
    many = summary(shared_db, machines(shared_db, outdir / "shared", flags, n))
    result = {"command": ["mlabench", "tune", *flags, "--storage", "DB"], "cores": os.cpu_count(),
              "load_average": os.getloadavg(), "one_machine": one, f"{n}_machines": many,
              "wall_ratio": round(many["wall_s"] / one["wall_s"], 3),
              "measuring_ratio": round(many["measuring_s"] / one["measuring_s"], 3),
              "same_policy_as_one": one["policy_batches"] == many["policy_batches"]}
    (outdir / "timing.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}, indent=1))


if __name__ == "__main__":
    main()
