"""A serve-bench run records each variant's launch env as its server got it (``$VAR`` expanded),
and a resume its own: what ``{env:NAME}`` in ``[prediction]`` reads (tests/deploy/test_launch_env.py)."""

import json

import pytest

from mlabench.deploy.prediction import PredictionSpec
from mlabench.errors import ConfigError
from mlabench.serving.run_folder import recorded_launch_env
from tests.deploy.test_launch_env import ENV_KERNEL

from .conftest import BENCH_POLL, free_port, launch_table
from .test_cli import run_cli
from .test_resume import forget_last_record


def test_a_run_records_the_launch_env_expanded_and_a_resume_its_own(tmp_path, fake_vllm):
    """The variant's env names `$MY_POLICY`: the manifest holds its value; a resume launched with
    another adds it, and a prediction reading it then refuses the run (which policy served?)."""
    port = free_port()
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(f'baseline = "base"\nvllm_bin = "{fake_vllm}"\nmodel = "fake-model"\n{BENCH_POLL}'
                   f'concurrencies = [1]\n[bench]\nrandom_input_len = 64\nrandom_output_len = 8\n'
                   f'[[variants]]\nname = "base"\nbase_url = "http://127.0.0.1:{port}"\n'
                   f"{launch_table(port, 'ok', tmp_path / 'pid')}"
                   'env = { MLABENCH_SPLIT_POLICY = "$MY_POLICY", MLABENCH_SPLIT_MODE = "device" }\n')
    r = run_cli("serve-bench", str(cfg), "--results-dir", str(tmp_path / "res"), env={"MY_POLICY": "/a/policy.json"})
    assert r.returncode == 0, r.stderr
    (run_dir,) = (tmp_path / "res").iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["launch_env"] == {"base": {"MLABENCH_SPLIT_POLICY": "/a/policy.json", "MLABENCH_SPLIT_MODE": "device"}}
    forget_last_record(run_dir)
    assert run_cli("serve-bench", "--resume", str(run_dir), env={"MY_POLICY": "/b/policy.json"}).returncode == 0
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert recorded_launch_env(manifest)["base"] == {"MLABENCH_SPLIT_POLICY": ["/a/policy.json", "/b/policy.json"],
                                                     "MLABENCH_SPLIT_MODE": ["device"]}
    with pytest.raises(ConfigError, match=r"ran with 2 values of it across the run's sessions \(/a/policy.json; /b"):
        PredictionSpec.of({"layers": 1, "reference": "base", "short_input_len": 64,
                           "kernels": {"base": ENV_KERNEL}}, ["base"], recorded_launch_env(manifest))
