"""`{env:NAME}` in `[prediction]`: a serve-bench run records each variant's launch env as its server
got it, and the prediction reads the records of what the server ran (the served policy), not of
any policy a pattern matches."""

import json
import shutil
from pathlib import Path

import pytest

from mlabench.deploy.prediction import PredictionSpec
from mlabench.errors import ConfigError
from tests.cli.test_cli import run

REPO = Path(__file__).resolve().parents[2]
SERVED = REPO / "results/h200/serving/serve-20261205T180702Z-h200-proxy"
SWEEPS = REPO / "results/h200/serving/sweep"
QO1_K3 = "/work/main/results/h200/deploy/qo1-k3/tune-kimi-k3-tp8-20261205-122236-527/policy.json"
#: mlabench's kernel in [prediction], reading the policy its server was launched with
ENV_KERNEL = {"backend": "gluon-splitkv", "params": {"split_policy": "device:{env:MLABENCH_SPLIT_POLICY}"}}


def _prediction(kernel):
    return {"layers": 61, "reference": "fm", "short_input_len": 4096,
            "kernels": {"fm": {"backend": "flashmla"}, "ours": kernel}}


def test_env_reads_the_served_policys_records_only(tmp_path, monkeypatch, capsys):
    """Run 4 served qo1-k3 (batch 16 only in its sweeps); `device:*` read the qo1 policy's records
    at concurrency 1.  With `{env:...}` the prediction reads qo1-k3's at c=16 and says at c=1 that
    no record of that policy exists, naming it."""
    run_dir = tmp_path / SERVED.name
    shutil.copytree(SERVED, run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["launch_env"] = {"mlabench": {"MLABENCH_SPLIT_POLICY": QO1_K3, "MLABENCH_SPLIT_MODE": "device"}}
    manifest["config"]["prediction"]["kernels"]["mlabench"] = ENV_KERNEL
    manifest["config"]["prediction"]["reference"] = "flashmla"
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    code, out, err = run(["serve-bench", "--from-run", str(run_dir), "--json"]
                         + [f"--predict-from={s}" for s in sorted(SWEEPS.iterdir())], monkeypatch, capsys)
    assert code in (0, 1), err
    prediction = json.loads(out)[-1]
    rows = {(r["variant"], r["input_len"], r["concurrency"]): r for r in prediction["rows"]}
    assert rows[("mlabench", 32768, 16)]["predicted_ms"] is not None
    assert rows[("mlabench", 32768, 1)]["predicted_ms"] is None
    notes = " ".join(prediction["notes"])
    assert f"mlabench: {{env:MLABENCH_SPLIT_POLICY}} is {QO1_K3}, as its server was launched" in notes
    assert f"no correct gluon-splitkv record with split_policy=device:{QO1_K3} at batch 1" in notes
    assert "qo1/tune" not in notes  # no other policy's records read


def test_a_run_that_did_not_record_the_variable_is_one_line(monkeypatch, capsys):
    """A run from before launch envs were recorded (or a variant whose launch sets no such
    variable), here given the committed config's [prediction]: the prediction says so instead of
    reading nothing or every policy's records."""
    with pytest.raises(ConfigError, match="the run records no MLABENCH_SPLIT_POLICY in ours's launch env"):
        PredictionSpec.of(_prediction(ENV_KERNEL), ["fm", "ours"], {})
    code, _, err = run(["serve-bench", "--from-run", str(SERVED), "--predict-from", str(SWEEPS), "--json",
                        str(REPO / "configs/serve/h200-kimi-k3-tp8-proxy.toml")], monkeypatch, capsys)
    assert code != 0 and "Traceback" not in err
    assert "reads {env:MLABENCH_SPLIT_POLICY}: the run records no MLABENCH_SPLIT_POLICY in mlabench's" in " ".join(err.split())
    # the way out fits any parameter (a fresh user's review: "a pattern (device:*)" read as the fix
    # for num_kv_splits too)
    assert "write the value itself instead (a path value may be a pattern, e.g. device:*;" in " ".join(err.split())
