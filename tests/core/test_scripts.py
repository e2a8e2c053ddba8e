"""The shell and Python scripts under ``scripts/`` that a user runs as the README writes them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_cli import run

REPO = Path(__file__).resolve().parents[2]

#: A ``python3`` that has no torch and logs every pip command line instead of installing.
FAKE_PYTHON = """#!/bin/sh
case "$*" in
  *"import torch"*) exit 1 ;;
  "-m pip"*) echo "$*" >> "$PIP_LOG" ;;
esac
case "$*" in
  *"--no-index"*) [ -z "$NO_LOCAL_TORCH" ] || exit 1 ;;
esac
exit 0
"""


def test_setup_on_a_cpu_machine_takes_torch_from_pytorchs_cpu_index(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(FAKE_PYTHON)
    (bin_dir / "python3").chmod(0o755)
    (bin_dir / "dirname").symlink_to(shutil.which("dirname"))  # the script's only outside tool; no nvidia-smi
    log = tmp_path / "pip.log"
    env = {"PATH": str(bin_dir), "PIP_LOG": str(log), "HOME": str(tmp_path),
           "MLABENCH_WHEELS": str(tmp_path / "no-such-folder")}
    subprocess.run([shutil.which("bash"), str(REPO / "scripts/setup.sh")], env=env, check=True, timeout=60)
    torch_line, mlabench_line = log.read_text().splitlines()
    assert "--index-url https://download.pytorch.org/whl/cpu" in torch_line and "torch==2.13.0" in torch_line
    assert mlabench_line.endswith(" -e .")  # torch, now installed, is not asked for again
    # issue 25 item 14: a local wheel folder is tried first, asking no index (offline: 50 retry
    # warnings), and PyTorch's index only when it has no torch
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    log.unlink()
    subprocess.run([shutil.which("bash"), str(REPO / "scripts/setup.sh")], env={**env, "MLABENCH_WHEELS": str(wheels)},
                   check=True, timeout=60)
    local_line, mlabench_line = log.read_text().splitlines()
    assert f"--no-index --find-links {wheels} torch==2.13.0" in local_line and "index-url" not in local_line
    log.unlink()
    subprocess.run([shutil.which("bash"), str(REPO / "scripts/setup.sh")],
                   env={**env, "MLABENCH_WHEELS": str(wheels), "NO_LOCAL_TORCH": "1"}, check=True, timeout=60)
    local_line, torch_line, mlabench_line = log.read_text().splitlines()
    assert "--no-index" in local_line and "--index-url https://download.pytorch.org/whl/cpu" in torch_line


def test_h200_readme_tables_runs_as_the_readme_writes_it_outside_an_install(tmp_path):
    # The checkout off the path; what else $PYTHONPATH holds (packages installed with --target, as on
    # the GPU image) stays.
    outer = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
             if p and not Path(p).resolve().is_relative_to(REPO)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": os.pathsep.join(outer)}
    done = subprocess.run([sys.executable, "scripts/h200_readme_tables.py"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "| batch | context | floor µs |" in done.stdout


def load_hopper_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("h200_hopper_kernel", REPO / "scripts" / "h200_hopper_kernel.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_hopper_kernel_script_writes_a_run_folder_that_compare_and_plot_read(tmp_path, monkeypatch, capsys):
    """The script's records also go into OUT/run/ through mlabench's manifest and store (measured here on
    the CPU with torch-splitkv, the GPU-only timing loop left out), so `compare --from OUT` reads them."""
    import json

    from mlabench.backends import backend_families, get_backend
    from mlabench.errors import ResultsError
    from mlabench.measure.timing import TimingConfig
    from mlabench.shapes import MLADecodeShape
    from mlabench.sweep.compare import recorded_records
    from mlabench.bench.shape_bench import ShapeBench
    from mlabench.sweep.summary import compare_table

    script = load_hopper_script()
    args = script.argparse.Namespace(batch_n=2, contexts_b1=[64, 128], contexts_bn=[64], point_budget_s=0.01)
    env = {"copy_tbps": 0.05, "read_tbps": 0.08}
    out = tmp_path / "out"
    store = script.open_run(out, env, script.run_config(args, script.timing_config(args), ["torch-splitkv"]))
    run_id = store.manifest().run_id
    fast = TimingConfig(warmup_iters=0, min_samples=3, max_samples=3, budget_s=0.01)
    with open(out / "records.jsonl", "w") as fh:
        for batch, ctx in ((1, 64), (1, 128), (2, 64)):
            bench = ShapeBench(MLADecodeShape.uniform(batch, ctx, 12, page_size=16), fast)
            for splits in (1, 2):
                rec = bench.run(get_backend("torch-splitkv"), {"num_kv_splits": splits}, copy_bw_tbps=env["copy_tbps"],
                                run_id=run_id, read_bw_tbps=env["read_tbps"])
                script.keep(rec, fh, store)
    store.write_csv()
    manifest = json.loads((out / "run" / "manifest.json").read_text())
    assert (manifest["copy_bandwidth_tbps"], manifest["read_bandwidth_tbps"]) == (0.05, 0.08)
    assert manifest["git_revision"] and manifest["versions"]["torch"] and manifest["device"]["name"]
    assert manifest["config"]["batch"] == [1, 2] and manifest["config"]["context_lens"] == [64, 128]
    assert manifest["config"]["script"]["args"]["batch_n"] == 2 and manifest["run_id"].startswith("hopper-kernel-")
    assert (out / "records.jsonl").read_text() == (out / "run" / "results.jsonl").read_text()
    assert len((out / "run" / "results.csv").read_text().splitlines()) == 7

    code, table, err = run(["compare", "--from", str(out), "--json"], monkeypatch, capsys)
    # no persistent kernel on the CPU: the error alone; the table compare would print, from the same records
    assert code == 1 and not table and err.strip().endswith("these runs have torch-splitkv"), err
    rows = compare_table(recorded_records([out]), backend_families()).as_dicts()
    assert {(r["batch"], r["context"], r["split-KV"]) for r in rows} == {(1, 64, "torch-splitkv"),
                                                                       (1, 128, "torch-splitkv"),
                                                                       (2, 64, "torch-splitkv")}
    assert all(r["split-KV µs"] > 0 and r["split-KV % floor"] > 0 for r in rows)
    code, drawn, err = run(["plot", "--from", str(out), "--out", str(tmp_path / "figs"), "--kind", "latency"],
                               monkeypatch, capsys)
    assert code == 0 and drawn.split() and all(Path(p).is_file() for p in drawn.split()), err
    with pytest.raises(ResultsError, match="already holds a run"):
        script.open_run(out, env, {})


def test_h200_integrity_refuses_a_missing_policy_in_one_line_before_measuring(tmp_path):
    # the whole script ran on this CPU with a tiny policy (its header gives the command); here only its
    # refusal, which costs no measurement
    env = {**os.environ, "POLICY": str(tmp_path / "missing.json")}
    done = subprocess.run(["bash", str(REPO / "scripts/h200_integrity.sh"), str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().endswith(f"error: policy not found: {tmp_path}/missing.json")
    assert not list((tmp_path / "out").glob("*.json")) and not (tmp_path / "out" / "run.log").exists()


def test_mt_profile_source_summary_rebuilds_the_committed_table():
    """``scripts/h200_mt_profile.py --source``'s summary, run again on the committed per-instruction
    exports (results/h100/deploy/mt-profile/*-sass.csv.gz), gives the committed ``source.md``
    that docs/multi-token-tile.md quotes; and a sample ncu names no reason for counts as "other"."""
    import gzip
    import importlib.util

    spec = importlib.util.spec_from_file_location("mt_profile", REPO / "scripts" / "h200_mt_profile.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    folder = REPO / "results" / "h100" / "deploy" / "mt-profile"
    parts = [f"**{case}**\n\n" + script.loop_summary(gzip.open(folder / f"{case}-sass.csv.gz", "rt").read())
             for case in ("mt1-ram2", "mt1-ram2-products", "flashmla")]
    assert "\n".join(parts) == (folder / "source.md").read_text()
    header = f'"Address","Source","{script.SAMPLES}","Instructions Executed","stall_wait"'
    sample = "\n".join([header, '"0x10","HGMMA A","6","8","0"', '"0x20","BRA B","2","8","2"',
                        '"0x30","EXIT","1","1","1"'])
    table = script.loop_summary(sample)
    assert "| 8 | 2 | 88.9 | other 75%, wait 25% | `HGMMA A` (66.7%) |" in table
    assert table.index("| 8 |") < table.index("| 1 |")
