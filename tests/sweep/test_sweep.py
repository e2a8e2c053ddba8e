import json

import pytest

from mlabench.backends import get_backend
from mlabench.backends.base import param_grid
from mlabench.backends.registry import select_backends
from mlabench.device import current_device
from mlabench.errors import BackendUnavailableError, ConfigError, Interrupted, UnknownBackendError
from mlabench.measure.timing import TimingConfig
from mlabench.records.store import ResultStore
from mlabench.sweep.config import (SweepConfig, check_sweep, default_sweep_config, expand, integer_params,
                                   load_sweep_config)
from mlabench.sweep.run import run_sweep
from mlabench.sweep.sentinel import health_notes

FAST = TimingConfig(warmup_iters=0, min_samples=3, max_samples=3, budget_s=0.01)


def small_config(**kw):
    base = dict(name="t", heads=[12], batch=[1, 2], context_lens=[16, 40], page_size=16,
                backends=["torch-splitkv"], params={"num_kv_splits": [1, 3]}, timing=FAST)
    base.update(kw)
    return SweepConfig(**base)


def test_shipped_kimi_config_expands_to_the_issue_grid():
    cfg = load_sweep_config("configs/sweeps/kimi-k3-tp8.toml")
    assert cfg.model == "kimi-k3" and cfg.tp == 8 and cfg.page_size == 64
    assert cfg.batch == [1, 16] and len(cfg.context_lens) == 8
    assert cfg.params["num_kv_splits"] == [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256]
    pts = expand(cfg, [get_backend("torch-splitkv")])
    assert len(pts) == 2 * 8 * 12 and {p.shape.num_heads for p in pts} == {12}


def test_param_grid_defaults_and_choices():
    from mlabench.shapes import MLADecodeShape

    b = get_backend("torch-splitkv")
    s = MLADecodeShape.uniform(1, 40960, 12)
    assert param_grid(b, s, {}) == [{"num_kv_splits": 128}]  # vLLM's heuristic: next_pow2(40960 // 512)
    assert param_grid(b, s, {"num_kv_splits": [4, 4, "7"]}) == [{"num_kv_splits": 4}, {"num_kv_splits": 7}]
    with pytest.raises(ConfigError, match="must be >= 1"):
        param_grid(b, s, {"num_kv_splits": [0]})
    with pytest.raises(ConfigError, match="must be <= 512"):
        param_grid(b, s, {"num_kv_splits": [513]})


def test_expand_rejects_a_stray_parameter():
    with pytest.raises(ConfigError, match="belongs to no backend"):
        expand(small_config(params={"block_q": [1]}), [get_backend("torch-splitkv")])


@pytest.mark.parametrize("backends, key, takers", [
    (["torch-splitkv"], "split_policy", "triton-splitkv, gluon-splitkv"),
    (["torch-splitkv"], "lazy_sum", "gluon-splitkv"),
    (["torch-splitkv"], "o_split", "gluon-splitkv"),
    (["triton-splitkv"], "fused_merge", "gluon-splitkv"),
])
def test_expand_rejects_a_parameter_no_backend_of_the_run_takes(backends, key, takers):
    """Issue 35 A3: a real key on the wrong backends was dropped without a word."""
    from mlabench.backends import gluon as _gluon  # noqa: F401  (registers gluon-splitkv)

    value = [1] if key in integer_params() else ["x"]
    cfg = small_config(backends=backends, params={"num_kv_splits": [1], key: value})
    with pytest.raises(ConfigError) as err:
        expand(cfg, [get_backend("torch-splitkv")])
    assert str(err.value) == (f"parameter {key!r} is taken only by {takers}, none of the backends of this "
                              f"sweep ({backends[0]})")
    # without names, the run's backends are the ones selected here
    with pytest.raises(ConfigError, match=f"none of the backends of this sweep \\(torch-splitkv\\)"):
        expand(small_config(backends=None, params={key: value}), [get_backend("torch-splitkv")])


@pytest.mark.parametrize("value,match", [(2, "fused_merge must be <= 1, got 2")])
def test_a_bad_value_is_named_even_for_a_backend_not_available_here(tmp_path, value, match):
    """A config's parameter value is checked against every named backend that declares it before
    the unavailable ones are left out (gluon-splitkv cannot run on this CPU machine)."""
    from mlabench.backends import gluon as _gluon  # noqa: F401  (registers gluon-splitkv)

    cfg = small_config(backends=["gluon-splitkv", "torch-splitkv"], params={"fused_merge": [value]})
    with pytest.raises(ConfigError, match=match):
        run_sweep(cfg, tmp_path, strict_backends=False)
    assert not any(tmp_path.iterdir())


def test_backend_selection():
    with pytest.raises(UnknownBackendError, match="known: .*reference"):
        select_backends(["nope"])
    with pytest.raises(BackendUnavailableError, match="aiter-asm is not available"):
        select_backends(["aiter-asm"])
    warned = []
    assert [b.name for b in select_backends(["aiter-asm", "torch-splitkv"], strict=False,
                                            warn=warned.append)] == ["torch-splitkv"]
    assert "skipping aiter-asm" in warned[0]
    default = [b.name for b in select_backends(None)]
    assert "reference" not in default
    on_gpu = current_device().is_gpu
    assert ("torch-splitkv" in default) == (not on_gpu)  # the portable backend, on a CPU only
    assert ("triton-splitkv" in default) == on_gpu  # GPU kernels stay out of a CPU sweep


def test_default_backends_on_a_gpu_are_the_gpu_kernels(monkeypatch):
    from mlabench.backends import registry
    from mlabench.device import DeviceInfo

    monkeypatch.setattr(registry, "current_device", lambda: DeviceInfo("cuda", "cuda", "H200", 132, 1, "sm_90", 1))
    names = [b.name for b in select_backends(None)]  # available: on a GPU, or TRITON_INTERPRET=1 on a CPU
    assert "triton-splitkv" in names and "triton-persistent" in names
    assert "torch-splitkv" not in names and "reference" not in names


@pytest.mark.parametrize("text, msg", [
    ("batch = [1,\n", "malformed TOML"),
    ("batch = [0]\n", "batch: must be > 0"),
    ("context_lens = [-1]\n", "context_lens: must be > 0"),
    ("colour = 'red'\n", "colour: unknown key"),
    ("[params]\nnum_kv_splits = []\n", r"^sweep config .*s\.toml: params: num_kv_splits must be a non-empty list$"),
    ("page_size = 7\n", r"s\.toml: page_size: must be one of \(1, 16, 64\), got 7$"),
    ("batch = true\n", "batch.0: Input should be a valid integer"),
    ('{"name": "x", "batch": [1]}', r"s\.toml: a sweep config is TOML, not JSON"),
    # strict: a string, a boolean or a float is not read as the integer it looks like
    ("page_size = true\n", r"s\.toml: page_size: Input should be a valid integer$"),
    ('batch = ["16"]\n', "batch.0: Input should be a valid integer$"),
    ("tp = 8.0\n", "tp: Input should be a valid integer$"),
    ("tp = 0\n", r"s\.toml: tp: Input should be greater than or equal to 1$"),  # was "--tp must be > 0"
    ("heads = 4.0\n", "heads.0: Input should be a valid integer$"),  # not "a valid list": one value is an axis
    ('[timing]\neager = "no"\n', "timing.eager: Input should be a valid boolean$"),
    ('[params]\nnum_kv_splits = "4"\n', "params: num_kv_splits takes integers, got '4'$"),
    ("[params]\nfused_merge = [true]\n", "params: fused_merge takes integers, got True$"),
])
def test_bad_sweep_files(tmp_path, text, msg):
    p = tmp_path / "s.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=msg):
        load_sweep_config(p)


def test_one_value_where_an_axis_is_a_list_is_an_axis_of_it(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text("batch = 16\ncontext_lens = 4096\nheads = 12\n[params]\nnum_kv_splits = 4\nsplit_policy = 'device'\n")
    cfg = load_sweep_config(p)
    assert (cfg.batch, cfg.context_lens, cfg.heads, cfg.qo_len) == ([16], [4096], [12], [1])
    assert cfg.params == {"num_kv_splits": [4], "split_policy": ["device"]}


def test_run_records_every_point_with_its_verdict(tmp_path):
    store, recs = run_sweep(small_config(), tmp_path)
    assert len(recs) == 2 * 2 * 2
    assert all(r.status == "ok" and r.verdict.passed and r.stats.n == 3 for r in recs)
    m = store.manifest()
    for r in recs:  # the floor against the run's read ceiling, the speed from the median, in their units
        assert r.floor_bandwidth == "read" and 0 < r.read_bandwidth_tbps <= m.read_bandwidth_tbps  # raised: higher
        assert r.floor_us == pytest.approx(r.bytes_moved / (r.read_bandwidth_tbps * 1e6), rel=1e-12)
        assert r.achieved_tbps == pytest.approx(r.bytes_moved / (r.stats.median_us * 1e-6) / 1e12, rel=1e-12)
        assert r.pct_of_floor == pytest.approx(100 * r.floor_us / r.stats.median_us, rel=1e-12)
    assert m.read_ceiling["tbps"] == m.read_bandwidth_tbps or m.read_ceiling.get("raised")
    assert (store.run_dir / "results.csv").exists() and (store.run_dir / "manifest.json").exists()


def test_interrupted_run_resumes_without_repeating_points(tmp_path):
    cfg = small_config()
    seen = []

    def stop_after_three(point, record, done, total):
        if record is not None:
            seen.append(point.key)
        if done == 3:
            raise KeyboardInterrupt

    with pytest.raises(Interrupted, match="3 of 8 points recorded") as info:
        run_sweep(cfg, tmp_path, progress=stop_after_three)
    (run_dir,) = list(tmp_path.iterdir())
    assert f"mlabench sweep --resume {run_dir}" in str(info.value) and info.value.exit_code == 130
    assert len(ResultStore(run_dir).records()) == 3
    assert len((run_dir / "results.csv").read_text().splitlines()) == 4  # CSV saved at the interrupt
    store = ResultStore(run_dir)  # what report and the sweep's summary say of the run folder
    assert store.manifest().planned_points == 8
    assert health_notes(store.manifest(), store.records())[0] == (
        "interrupted: 3 of the 8 points planned are recorded (a best configuration is the best of those measured: "
        "— marks a split count not measured); `mlabench sweep --resume` on this run folder measures the rest")
    from mlabench.report.runs import load_runs
    from mlabench.report.sections import kernel_environment

    runs = load_runs([run_dir])
    rows = kernel_environment(runs.kernel_runs[0], runs.records).rows
    assert ["points", "3 of 8 planned (3 ok)"] in rows
    assert [v for k, v in rows if k == "health"][0].startswith("interrupted: 3 of the 8 points")
    resumed = []
    _, recs = run_sweep(cfg, tmp_path, resume=run_dir,
                        progress=lambda p, r, d, t: r is not None and resumed.append(p.key))
    assert len(resumed) == 5 and not set(resumed) & set(seen)
    assert len(recs) == 8 and len({r.key for r in recs}) == 8
    assert not any(n.startswith("interrupted") for n in health_notes(ResultStore(run_dir).manifest(), recs))
    before = {name: (run_dir / name).read_bytes() for name in ("manifest.json", "sentinel.jsonl", "results.jsonl")}
    said = []
    _, again = run_sweep(cfg, tmp_path, resume=run_dir, warn=said.append)  # nothing left to do
    assert len(again) == 8
    assert said == [f"{run_dir}: every one of its 8 points is recorded; nothing to measure"]
    # no warm-up added to the manifest, no sentinel measured, no record touched
    assert {name: (run_dir / name).read_bytes() for name in before} == before


def test_a_wrong_backend_is_recorded_as_incorrect(tmp_path, monkeypatch):
    from mlabench.backends import torch_reference as reference

    real = reference.mla_decode_splitkv_torch

    def off_by_a_bit(*args, **kwargs):
        return real(*args, **kwargs).add_(0.5)

    monkeypatch.setattr(reference, "mla_decode_splitkv_torch", off_by_a_bit)
    _, recs = run_sweep(small_config(batch=[1], context_lens=[16]), tmp_path)
    assert {r.status for r in recs} == {"incorrect"}
    assert all(not r.verdict.passed and r.verdict.max_abs_err >= 0.49 for r in recs)
    from mlabench.sweep.summary import sweep_summary

    row = sweep_summary(recs).rows[0]
    assert row[3] == "(none ok)"  # a fast wrong answer never wins


def test_default_cpu_config_is_small():
    from mlabench.device import DeviceInfo

    cfg = default_sweep_config(DeviceInfo("cpu", "cpu", "cpu", 2, 0, "cpu", 0))
    assert cfg.name == "default-cpu" and max(cfg.context_lens) <= 1024
    gpu = default_sweep_config(DeviceInfo("cuda", "cuda", "H200", 132, 1, "sm_90", 1))
    assert max(gpu.context_lens) == 131072


def test_resume_refuses_another_configuration(tmp_path):
    """The refusal names the setting that differs and leaves the folder as it was, a torn last
    record included (it is cut off only when the resume is accepted)."""
    run_sweep(small_config(batch=[1], context_lens=[16]), tmp_path)
    (run_dir,) = list(tmp_path.iterdir())
    with open(run_dir / "results.jsonl", "a") as fh:  # a write cut short
        fh.write('{"key": "torn')
    before = (run_dir / "results.jsonl").read_bytes()
    with pytest.raises(ConfigError, match=r"another sweep configuration \(page_size: 16 there, 64 asked\)"):
        run_sweep(small_config(batch=[1], context_lens=[16], page_size=64), tmp_path, resume=run_dir)
    assert (run_dir / "results.jsonl").read_bytes() == before


def test_resume_of_a_run_of_another_device_says_so_before_looking_for_backends(tmp_path):
    """A fresh user's review: an H200 sweep resumed on a CPU listed its backends as unavailable here,
    then said "no backend available here"; the refusal docs/sweep.md promises comes first."""
    from mlabench.errors import ResultsError

    run_sweep(small_config(batch=[1], context_lens=[16]), tmp_path)
    (run_dir,) = list(tmp_path.iterdir())
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["device"]["name"] = "NVIDIA H200"
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ResultsError, match=r"was recorded with another device \(NVIDIA H200 there, .* here\); start a new run"):
        run_sweep(small_config(batch=[1], context_lens=[16], backends=["no-such-backend"]), tmp_path, resume=run_dir)


def test_repeated_axis_values_give_one_record_per_point(tmp_path):
    _, recs = run_sweep(small_config(batch=[1, 1], context_lens=[16, 16], params={"num_kv_splits": [1, 1]}),
                        tmp_path)
    assert len(recs) == 1


def test_heads_axis_without_a_model_and_with_one():
    cfg = small_config(heads=[8, 12], model=None)
    assert sorted({s.num_heads for s in expand_shapes(cfg)}) == [8, 12]
    with_model = small_config(heads=[8, 12], model="deepseek-v3", tp=8)
    shapes = expand_shapes(with_model)
    assert sorted({s.num_heads for s in shapes}) == [8, 12]  # the axis wins, the model sets the scale
    assert all(s.softmax_scale == pytest.approx(0.1352, abs=1e-4) for s in shapes)
    with pytest.raises(ConfigError, match="give a model"):
        expand_shapes(small_config(heads=None, model=None))


def expand_shapes(cfg):
    from mlabench.sweep.config import shapes_of

    return shapes_of(cfg)


def test_model_config_dims_reach_the_shape(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 32, "kv_lora_rank": 256,
                                                      "qk_rope_head_dim": 64, "qk_nope_head_dim": 128}))
    cfg = small_config(heads=None, model_config=str(tmp_path / "config.json"), tp=2)
    (shape,) = {(s.num_heads, s.kv_lora_rank, s.head_dim_qk) for s in expand_shapes(cfg)}
    assert shape == (16, 256, 320)


def test_the_manifest_and_the_summary_say_which_softmax_scale_ran(tmp_path):
    """Issue 25 item 7: the scale a sweep used, and where it came from, is in its manifest."""
    import json

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"num_attention_heads": 24, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                                  "qk_nope_head_dim": 128, "rope_scaling": {"type": "yarn", "factor": 40,
                                                                            "mscale_all_dim": 1.0,
                                                                            "apply_yarn_scaling": False}}))
    cfg = small_config(heads=None, model_config=str(config), tp=2, batch=[1], context_lens=[16],
                       params={"num_kv_splits": [1]})
    store, recs = run_sweep(cfg, tmp_path / "runs")
    said = f"softmax scale 0.072169 = (128 + 64) ** -0.5 (YaRN, apply_yarn_scaling false: no mscale) from {config}"
    assert store.manifest().softmax_scale == said
    assert recs[0].shape["softmax_scale"] == pytest.approx(192**-0.5)
    _, plain = run_sweep(small_config(batch=[1], context_lens=[16], params={"num_kv_splits": [1]}), tmp_path / "b")
    assert _.manifest().softmax_scale.startswith("softmax scale 0.041667 = 576 ** -0.5")


@pytest.mark.parametrize("name", ["../../etc/x", "a/b", ""])
def test_run_name_cannot_leave_the_results_folder(name):
    with pytest.raises(Exception, match="name"):
        SweepConfig(name=name)


def test_inputs_that_fail_to_allocate_become_error_rows(tmp_path, monkeypatch):
    from mlabench.sweep import runner

    def no_memory(*a, **k):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory\nmore")

    monkeypatch.setattr(runner, "ShapeBench", no_memory)
    _, recs = run_sweep(small_config(batch=[1], context_lens=[16]), tmp_path)
    assert len(recs) == 2 and {r.status for r in recs} == {"error"}
    assert all("can't allocate memory" in r.message for r in recs)


def test_flags_become_overrides_in_the_config_layout():
    from mlabench.sweep.config import sweep_overrides

    o = sweep_overrides(heads=[8], splits=[1, 2], budget_s=0.5, model_config="m/config.json")
    assert o["params"] == {"num_kv_splits": [1, 2]} and o["timing"] == {"budget_s": 0.5}
    assert o["model_config"] == "m/config.json" and o["heads"] == [8] and o["batch"] is None
    assert all(v is None for v in sweep_overrides().values())
    assert sweep_overrides(graph_captures=4)["timing"] == {"graph_captures": 4}
    assert sweep_overrides(budget_s=0.5, graph_captures=2)["timing"] == {"budget_s": 0.5, "graph_captures": 2}


def test_resolve_the_default_sweep_changed_by_flags():
    from mlabench.sweep.config import resolve_sweep_config, sweep_overrides

    assert resolve_sweep_config(None, sweep_overrides()) == default_sweep_config()
    changed = resolve_sweep_config(None, sweep_overrides(context_lens=[48]))
    assert changed.name == "sweep" and changed.model == "kimi-k3" and changed.context_lens == [48]
    heads_only = resolve_sweep_config(None, sweep_overrides(heads=[8, 16]))
    assert heads_only.model is None and heads_only.heads == [8, 16]  # a heads axis drops the model
    shipped = resolve_sweep_config("kimi-k3-tp8", sweep_overrides(batch=[4]))
    assert shipped.name == "kimi-k3-tp8" and shipped.batch == [4]
    # a model named on the default sweep runs at --tp, else 1 (as `check`), not Kimi K3's TP 8
    assert resolve_sweep_config(None, sweep_overrides(model="deepseek-v3")).tp == 1
    assert resolve_sweep_config(None, sweep_overrides(model="deepseek-v3", tp=8)).tp == 8
    assert resolve_sweep_config(None, sweep_overrides(context_lens=[48])).tp == 8
    assert resolve_sweep_config("kimi-k3-tp8", sweep_overrides(model="deepseek-v3")).tp == 8


def test_resume_policy_reruns_the_recorded_configuration(tmp_path):
    from mlabench.sweep.config import resolve_sweep_config, sweep_overrides

    cfg = small_config(batch=[1], context_lens=[16])
    store, _ = run_sweep(cfg, tmp_path)
    resumed = resolve_sweep_config(None, sweep_overrides(), resume=store.run_dir)
    assert resumed.order_seed is not None  # drawn, recorded, and kept by a resume
    assert resumed.visits == 1 and resumed.max_visits == 1  # resolved (the CPU's default) and recorded
    assert resumed.model_copy(update={"order_seed": None, "visits": None, "max_visits": None}) == cfg
    flagged = resolve_sweep_config(None, sweep_overrides(page_size=64), resume=store.run_dir)
    assert flagged.page_size == 64 and flagged.name == cfg.name  # run_sweep then refuses it
    with pytest.raises(ConfigError, match="another sweep configuration"):
        run_sweep(flagged, tmp_path, resume=store.run_dir)


def test_a_model_flag_replaces_the_files_model_whichever_kind(tmp_path):
    """``sweep --model-config ds_v3_config.json --tp 8`` drives the default sweep (which names
    kimi-k3), and ``--model`` replaces a config file's ``model_config`` (issue 8 item 6)."""
    import json

    from mlabench.sweep.config import resolve_sweep_config, sweep_overrides

    hf = tmp_path / "ds_v3_config.json"
    hf.write_text(json.dumps({"model_type": "deepseek_v3", "num_attention_heads": 128, "kv_lora_rank": 512,
                              "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                              "rope_scaling": {"type": "yarn", "factor": 40, "mscale_all_dim": 1.0}}))
    cfg = resolve_sweep_config(None, sweep_overrides(model_config=hf, tp=8))
    assert cfg.model is None and cfg.model_config_path == str(hf) and cfg.tp == 8
    assert {(s.num_heads, round(s.scale, 6)) for s in expand_shapes(cfg)} == {(16, 0.135234)}
    shipped = resolve_sweep_config("kimi-k3-tp8", sweep_overrides(model_config=hf))
    assert shipped.model is None and {s.num_heads for s in expand_shapes(shipped)} == {16}
    (tmp_path / "file.toml").write_text(f'model_config = "{hf}"\ntp = 8\n')
    back = resolve_sweep_config(str(tmp_path / "file.toml"), sweep_overrides(model="kimi-k3"))
    assert back.model == "kimi-k3" and back.model_config_path is None
    assert {s.num_heads for s in expand_shapes(back)} == {12}
    with pytest.raises(ConfigError, match="not both"):
        expand_shapes(resolve_sweep_config(None, sweep_overrides(model="kimi-k3", model_config=hf)))


@pytest.mark.parametrize("policy,said", [
    ("{bad", "split policy is not valid JSON"),
    ('{"num_kv_splits": {"1": [[100, -4]]}}', "num_kv_splits must be in 1..512"),
    (None, "split_policy must be empty, 'host[:FILE]' or 'device[:FILE]'"),
])
def test_a_bad_split_policy_is_one_error_before_anything_runs(tmp_path, monkeypatch, capsys, policy, said):
    """A sweep config's split_policy file (corrupt, negative counts) or mode is refused with one
    line and exit 2, and no run folder is made (it used to exit 0 with every point an error)."""
    from tests.cli.test_cli import run

    path = tmp_path / "policy.json"
    if policy is not None:
        path.write_text(policy)
    value = f"device:{path}" if policy is not None else "sideways"
    cfg = tmp_path / "s.toml"
    cfg.write_text(f'name = "bad-policy"\nheads = [4]\nbackends = ["torch-splitkv", "triton-splitkv"]\n'
                   f'batch = [1]\ncontext_lens = [64]\npage_size = 16\n[params]\nsplit_policy = ["{value}"]\n')
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    code, out, err = run(["sweep", "--config", str(cfg), "--results-dir", str(tmp_path / "res")],
                         monkeypatch, capsys)
    assert code == 2, (out, err)
    assert err.strip().startswith("error:") and said in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "res").exists()


def test_a_disk_filling_mid_run_leaves_whole_records_and_names_the_resume(tmp_path, monkeypatch):
    """Issue 25 item 5: the disk fills after three records; the fourth is not half-written, and the
    error names the full disk, what was kept and the command that resumes."""
    import errno
    import os

    from mlabench.errors import FileAccessError

    real_write, room = os.write, [25]  # part of the next line reaches the disk, then it is full

    def full(fd, data):
        if not room[0]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = real_write(fd, bytes(data)[:room[0]])
        room[0] -= n
        return n

    def fill_after_three(point, record, done, total):
        if record is not None and done == 3:
            monkeypatch.setattr("mlabench.files.os.write", full)

    with pytest.raises(FileAccessError) as info:
        run_sweep(small_config(), tmp_path, progress=fill_after_three)
    (run_dir,) = list(tmp_path.iterdir())
    said = str(info.value)
    assert "the disk is full" in said and "3 of 8 points recorded" in said, said
    assert said.endswith(f"free space, then continue with: mlabench sweep --resume {run_dir}") and "\n" not in said
    assert info.value.exit_code == 3  # the input was fine: this machine cannot go on (exit 2 said 'bad input')
    data = (run_dir / "results.jsonl").read_bytes()
    assert data.endswith(b"\n") and len(data.splitlines()) == 3
    monkeypatch.undo()
    _, recs = run_sweep(small_config(), tmp_path, resume=run_dir)
    assert len(recs) == 8


def test_sigterm_mid_sweep_ends_it_as_ctrl_c_does_naming_the_resume(tmp_path):
    """`timeout` or a job scheduler stops a sweep with SIGTERM: the records so far stay, and the
    command says how to continue (exit 130, as Ctrl-C), instead of dying with Python's default."""
    import os
    import signal
    import subprocess
    import sys
    import time

    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "mlabench", "sweep", "--heads", "12", "--batch", "1,2",
                             "--context", "16,40,64,128", "--page-size", "16", "--backend", "torch-splitkv",
                             "--splits", "1,2,3,4", "--budget-s", "0.5", "--results-dir", str(runs)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    deadline = time.monotonic() + 120
    while not any(p.stat().st_size for p in runs.glob("*/results.jsonl")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    (run_dir,) = list(runs.iterdir())
    kept = len(ResultStore(run_dir).records())
    assert proc.returncode == 130 and 0 < kept < 32, err
    assert "points recorded" in err and f"continue with: mlabench sweep --resume {run_dir}" in err, err


def test_a_shipped_config_may_be_named_with_its_suffix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no file of that name here
    assert load_sweep_config("kimi-k3-tp8.toml") == load_sweep_config("kimi-k3-tp8")
    with pytest.raises(ConfigError, match="sweep config not found: nope.toml does not exist"):
        load_sweep_config("nope.toml")
    (tmp_path / "afile").write_text("")
    with pytest.raises(ConfigError, match="sweep config not found: afile/x.toml: its folder afile is a file"):
        load_sweep_config("afile/x.toml")


def test_backend_flag_narrows_a_config_with_its_axes(tmp_path):
    """A fresh user's sweep --config kimi-k3-tp8 --backend triton-splitkv was refused: the file's
    head_padding axis (triton-persistent's) was taken by none of the run's backends."""
    cfg = load_sweep_config("kimi-k3-tp8", {"backends": ["torch-splitkv"]})
    assert cfg.backends == ["torch-splitkv"] and set(cfg.params) == {"num_kv_splits"}
    assert "head_padding" in load_sweep_config("kimi-k3-tp8").params  # the file alone keeps it
    both = load_sweep_config("kimi-k3-tp8", {"backends": ["triton-persistent"], "params": {"num_kv_splits": [4]}})
    assert both.params["num_kv_splits"] == [4] and "head_padding" in both.params  # a flag's axis stays
    typo = tmp_path / "typo.toml"  # a name no backend has is not narrowed away: expand refuses it
    typo.write_text("heads = 4\n[params]\nnum_kv_splitz = [4]\n")
    narrowed = load_sweep_config(typo, {"backends": ["torch-splitkv"]})
    assert narrowed.params == {"num_kv_splitz": [4]}
    with pytest.raises(ConfigError, match="'num_kv_splitz' belongs to no backend"):
        expand(narrowed, [get_backend("torch-splitkv")])
    p = tmp_path / "s.toml"
    p.write_text("backends = []\n")
    with pytest.raises(ConfigError, match=r"s\.toml: backends: must not be empty \(leave the key out"):
        load_sweep_config(p)


@pytest.mark.parametrize("body, says", [
    ('backends = ["nope"]', "unknown backend 'nope'"),
    ('model = "nope"', "unknown model 'nope'"),
    ('model = "kimi-k3"\ntp = 5', "kimi-k3: 96 heads are not divisible by tp=5"),
    ('heads = [12]\nq_dtype = "int3"', "q_dtype: dtype must be one of"),
    ('heads = [12]\nqo_len = [9]', "qo_len: must be 1-8 query tokens per request, got 9"),
    ('heads = [12]\n[params]\nbogus = [1]', "parameter 'bogus' belongs to no backend"),
    ('heads = [12]\nbackends = ["torch-splitkv"]\n[params]\nnum_kv_splits = [0]', "num_kv_splits must be >= 1"),
    ('heads = [12]\n[params]\nnum_kv_splits = [0]', "num_kv_splits must be >= 1"),  # no backend takes 0
])
def test_a_files_fields_that_do_not_go_together_are_named_with_the_file(tmp_path, body, says):
    """A fresh user's review: an unknown backend or model, a bad dtype or query-token count, a bad
    parameter in a sweep file were refused without naming the file; a flag's value is judged later,
    not blamed on the file."""
    path = tmp_path / "mine.toml"
    path.write_text(f'name = "t"\n{body}\n')
    with pytest.raises(ConfigError) as info:
        load_sweep_config(path)
    assert str(info.value).startswith(f"sweep config {path}: {says}")
    if "backends" in body:  # the same backend given as a flag: the file is not named
        path.write_text('name = "t"\nheads = [12]\n')
        cfg = load_sweep_config(path, {"backends": ["nope"]})
        with pytest.raises(ConfigError, match="^unknown backend 'nope'"):
            check_sweep(cfg)


def test_a_scripts_kernel_run_is_named_as_such_not_as_a_typo(tmp_path):
    """A fresh user's review: resuming the committed h200_hopper_kernel.py run (gunzipped) said
    "the manifest holds no sweep configuration (script: unknown key (a typo?))"."""
    import shutil
    from pathlib import Path

    from mlabench.errors import ResultsError
    from mlabench.sweep.config import recorded_config

    run = shutil.copytree(Path(__file__).resolve().parents[2] / "results/h200/hopper-kernel/run-72fb349/run",
                          tmp_path / "run")
    with pytest.raises(ResultsError, match=r"run was recorded by scripts/h200_hopper_kernel\.py, not by mlabench "
                                           r"sweep: it cannot be resumed \(run the script again"):
        recorded_config(ResultStore(run))


def test_an_archived_run_of_another_device_is_refused_as_another_devices_first(tmp_path):
    """A fresh user's review: a copy of a committed H100 sweep was to be gunzipped (results, then
    sentinel), then refused as another device's."""
    import gzip

    from mlabench.errors import ResultsError
    from mlabench.sweep.config import resolve_sweep_config

    run_sweep(small_config(batch=[1], context_lens=[16]), tmp_path)
    (run_dir,) = list(tmp_path.iterdir())
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["device"]["name"] = "NVIDIA H100 80GB HBM3"
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    (run_dir / "results.jsonl.gz").write_bytes(gzip.compress((run_dir / "results.jsonl").read_bytes()))
    (run_dir / "results.jsonl").unlink()
    cfg = resolve_sweep_config(None, {}, resume=run_dir)
    with pytest.raises(ResultsError, match=r"another device \(NVIDIA H100 80GB HBM3 there, .* here\)"):
        run_sweep(cfg, tmp_path, resume=run_dir)
