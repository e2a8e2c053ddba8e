"""A serve-bench run that names its GPUs is read beside kernel runs of that device only."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "results"
SERVE = RESULTS / "cpu-vllm/serve-20261130T105730Z-cpu-tiny"
SWEEP = RESULTS / "h200/kimi-k3-tp8/kimi-k3-tp8-20261130-105953-511"


def _serve_run(tmp_path: Path, gpus) -> Path:
    run = tmp_path / SERVE.name
    shutil.copytree(SERVE, run)
    if gpus is not None:
        manifest = json.loads((run / "manifest.json").read_text())
        (run / "manifest.json").write_text(json.dumps({**manifest, "gpus": gpus}))
    return run


@pytest.mark.parametrize(("gpus", "refused"), [
    (None, False),  # recorded before serve-bench named its GPUs: not checked
    ([{"name": "NVIDIA H200"}], False),
    ([], True),  # a CPU vLLM server beside an H200 sweep
    ([{"name": "NVIDIA H100 80GB HBM3"}], True),
])
def test_a_serving_run_on_another_device_than_the_kernel_runs_is_refused(tmp_path, gpus, refused):
    """The report titled "NVIDIA H200" read a CPU serving run beside an H200 sweep (its TPOT and
    the sweep's prediction side by side) since serve-bench recorded no GPU."""
    from mlabench.errors import ResultsError
    from mlabench.report.runs import load_runs

    paths = [_serve_run(tmp_path, gpus), SWEEP]
    if not refused:
        assert len(load_runs(paths).serve_runs) == 1
        return
    with pytest.raises(ResultsError, match=f"serve-bench run {SERVE.name} served on .*the kernel runs ran on NVIDIA H200"):
        load_runs(paths)
