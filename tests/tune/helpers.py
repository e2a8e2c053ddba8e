"""Shared set-up of the tuner tests: a run folder and an in-process objective on a tiny shape."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mlabench.backends import get_backend
from mlabench.records.store import ResultStore
from mlabench.tune.manifest import run_manifest
from mlabench.tune.space import (
    Bucket, TuneConfig, buckets_of, resolve_sampler, shape_dims, study_space, tune_shape, wave_cap,
)
from mlabench.tune.studies import make_sampler, optuna_module
from mlabench.tune.trial_worker import Objective
from mlabench.tune.worker_pool import RecordIndex


def tiny_config(backend: str, timing, **kw: Any) -> TuneConfig:
    """One bucket (0, 48] of a 2-head shape, measured at its upper edge only (one length)."""
    values = dict(backend=backend, heads=2, batch=[1], buckets=[48], page_size=16, timing=timing, trials=64,
                  representative="upper", lengths_per_bucket=1)
    values.update(kw)
    return TuneConfig.model_validate(values)


def run_in_process(tmp_path: Path, cfg: TuneConfig, bucket: Bucket | None = None) -> tuple[Any, ResultStore]:
    """One study of ``cfg`` (its first batch size, ``bucket`` or its first bucket) optimised in this
    process with the real objective, in an in-memory storage."""
    optuna = optuna_module()
    store = ResultStore.create(tmp_path / "run", run_manifest("run", 1.0, {}))
    backend = get_backend(cfg.backend)
    bucket = bucket or buckets_of(cfg.buckets, cfg.representative, cfg.lengths_per_bucket)[0]
    shapes = {n: tune_shape(shape_dims(cfg), cfg.batch[0], n) for n in bucket.measured()}
    shape = shapes[bucket.measured()[-1]]
    dims, fixed = study_space(backend, shape, cfg, bucket.measured(), wave_cap(backend, shape, cfg.max_waves))
    study = optuna.create_study(sampler=make_sampler(resolve_sampler(cfg, dims), dims, 0))
    objective = Objective(backend, shapes, dims, fixed, store, RecordIndex(store), cfg, None)
    study.optimize(objective, n_trials=cfg.trials)
    return study, store


def export_lookups(policy: Any, folder: Path, batches: list[int], lengths: list[int]) -> dict[str, list]:
    """The lookup of every (batch, length) through each export of ``policy`` written into ``folder``:
    ``{"json": ..., "python": ..., "cpp": ...}``, each a list of ``(batch, length, num_kv_splits, rest)``
    (``rest``: the other parameters as text, in ``param_names`` order).  The C++ header is compiled
    with g++ (a test that needs it fails without it) and run."""
    from mlabench.policy.exports import write_exports
    from mlabench.policy.tuned import load_policy

    paths = write_exports(policy, folder)
    spec = importlib.util.spec_from_file_location(f"generated_policy_{id(folder)}", paths["python"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    others = [n for n in policy.param_names if n != "num_kv_splits"]

    def row(b: int, n: int, params: dict[str, Any]) -> tuple:
        return (b, n, int(params["num_kv_splits"]), " ".join(str(params[k]) for k in others))

    from_json = load_policy(paths["json"])
    out = {"json": [row(b, n, from_json.lookup(b, n)) for b in batches for n in lengths],
           "python": [row(b, n, module.lookup(b, n)) for b in batches for n in lengths]}
    if shutil.which("g++") is None:
        pytest.fail("g++ is needed to check the C++ export (apt-get install g++)")
    fmt = "%lld %lld %d" + " %s" * len(others)
    fields = "".join(f", std::to_string(c.{k}).c_str()" if not isinstance(policy.batches[0].entries[0].params[k], str)
                     else f", c.{k}" for k in others)
    main = folder / "main.cpp"
    main.write_text('#include "policy.h"\n#include <cstdio>\n#include <string>\nint main() {\n'
                    f"  const long long b[] = {{{', '.join(map(str, batches))}}};\n"
                    f"  const long long n[] = {{{', '.join(map(str, lengths))}}};\n"
                    "  for (long long x : b) for (long long y : n) {\n"
                    "    const auto c = mlabench_policy::lookup(x, y);\n"
                    f'    std::printf("{fmt}\\n", x, y, c.num_kv_splits{fields});\n'
                    "  }\n}\n")
    exe = folder / "main"
    subprocess.run(["g++", "-std=c++17", "-Wall", "-Werror", "-I", str(folder), str(main), "-o", str(exe)], check=True)
    lines = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines()
    out["cpp"] = [(int(w[0]), int(w[1]), int(w[2]), " ".join(w[3:])) for w in (line.split() for line in lines)]
    return out
