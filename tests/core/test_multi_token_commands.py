"""qo_len through the commands: check, the sweep axis and its records, compare's per-qo_len answer,
tune's shapes and graph-check's configuration."""

from __future__ import annotations

import json

import pytest

from mlabench.backends import get_backend
from mlabench.errors import ConfigError
from mlabench.measure.timing import TimingConfig
from mlabench.records.record import point_key
from mlabench.sweep.compare import path_winner, recorded_records, winners_table
from mlabench.sweep.config import SweepConfig, expand, load_sweep_config
from mlabench.sweep.run import run_sweep
from mlabench.sweep.summary import compare_table, sweep_summary
from tests.cli.test_cli import run

FAST = TimingConfig(warmup_iters=0, min_samples=3, max_samples=3, budget_s=0.01)


def small(**kw):
    base = dict(name="t", heads=[4], batch=[1], context_lens=[16, 40], page_size=16, qo_len=[1, 2],
                backends=["reference", "torch-splitkv"], params={"num_kv_splits": [1, 3]}, timing=FAST)
    return SweepConfig(**{**base, **kw})


# ---- --non-causal at one query token ---------------------------------------------------------------
ONE_TOKEN_NON_CAUSAL = [
    ["check", "--heads", "4", "--context", "64", "--non-causal"],
    ["sweep", "--heads", "4", "--context", "64", "--non-causal"],
    ["compare", "--heads", "4", "--context", "64", "--qo-len", "1", "--non-causal"],
    ["tune", "--backend", "torch-splitkv", "--heads", "4", "--buckets", "64", "--non-causal"],
    ["graph-check", "--context", "64", "--non-causal"],
]


@pytest.mark.parametrize("args", ONE_TOKEN_NON_CAUSAL, ids=[a[0] for a in ONE_TOKEN_NON_CAUSAL])
def test_non_causal_at_one_token_is_refused_in_one_line(tmp_path, monkeypatch, capsys, args):
    """A fresh user's nit: ``--non-causal`` at qo_len 1 ran the causal problem without a word (one
    token: both masks are the same).  Every command that takes it refuses it there, as it refuses
    flags that go with nothing else (``compare --from``), before measuring or writing anything."""
    where = ["--results-dir", str(tmp_path)] if args[0] in ("sweep", "compare", "tune") else []
    code, out, err = run([*args, *where], monkeypatch, capsys)
    assert code == 2 and not out and not list(tmp_path.iterdir()), err
    (line,) = err.strip().splitlines()
    assert line.startswith("error: --non-causal changes nothing at one query token") and "--qo-len 2" in line


def test_non_causal_with_several_token_counts_still_runs(monkeypatch, capsys):
    code, out, err = run(["check", "--heads", "4", "--backend", "torch-splitkv", "--splits", "2", "--qo-len", "1,2",
                          "--non-causal", "--context", "40", "--page-size", "16", "--inputs", "random", "--json"],
                         monkeypatch, capsys)
    assert code == 0, err
    assert {r["shape"].split(" p16")[0] for r in json.loads(out)[0]["rows"]} == {"B=1 H=4 L=40",
                                                                              "B=1 H=4 L=40 T=2 non-causal"}


# ---- check -----------------------------------------------------------------------------------------
def test_check_takes_qo_len(monkeypatch, capsys):
    code, out, err = run(["check", "--heads", "4", "--backend", "torch-splitkv", "--splits", "1,3",
                          "--qo-len", "2,4", "--page-size", "16", "--json"], monkeypatch, capsys)
    assert code == 0, err
    rows = json.loads(out)[0]["rows"]
    assert {r["shape"].split(" p16")[0].rsplit(" ", 1)[-1] for r in rows} == {"T=2", "T=4"}
    assert any("L=4,100,1024,4097 T=4" in r["shape"] and "[16,4,512]" in r["shape"] for r in rows)
    assert all(r["verdict"] == "pass" for r in rows)
    code, out, _ = run(["check", "--heads", "4", "--backend", "torch-splitkv", "--splits", "2",
                        "--qo-len", "4", "--non-causal", "--context", "2,40", "--page-size", "16",
                        "--json"], monkeypatch, capsys)
    assert code == 0 and "T=4 non-causal" in json.loads(out)[0]["rows"][0]["shape"]


@pytest.mark.parametrize("args, msg", [
    (["--qo-len", "9"], "error: qo_len: must be 1-8 query tokens per request, got 9"),
    (["--qo-len", "4", "--context", "2"], "must hold >= 4 tokens, got 2"),
    (["--qo-len", "two"], "--qo-len takes comma-separated integers"),
])
def test_check_refuses_bad_qo_len(monkeypatch, capsys, args, msg):
    code, out, err = run(["check", "--heads", "4", "--backend", "torch-splitkv", *args], monkeypatch, capsys)
    assert code != 0 and msg in err and err.startswith("error:") and not out


# ---- the sweep axis --------------------------------------------------------------------------------
def test_qo_len_axis_in_sweep_files(tmp_path):
    path = tmp_path / "mtp.toml"
    path.write_text('name = "m"\nheads = [12]\ncontext_lens = [64]\nqo_len = [1, 2, 4]\ncausal = false\n')
    cfg = load_sweep_config(path)
    points = expand(cfg, [get_backend("torch-splitkv")])
    assert sorted({(p.shape.qo_len, p.shape.causal) for p in points}) == [(1, True), (2, False), (4, False)]
    with pytest.raises(ConfigError, match="qo_len"):
        load_sweep_config(None, {"qo_len": []}, base=cfg.model_dump(by_alias=True))


def test_one_token_points_keep_their_keys():
    """A config without the axis and one with qo_len = [1] (and a mask flag) give the same keys."""
    plain = expand(small(qo_len=[1]), [get_backend("torch-splitkv")])
    draft = expand(small(qo_len=[1], causal=False), [get_backend("torch-splitkv")])
    assert [p.key for p in plain] == [p.key for p in draft]
    p = plain[0]
    shape = {k: v for k, v in p.shape.key().items() if k != "qo_len"}  # a key recorded before qo_len
    assert "causal" not in p.shape.key()
    assert point_key(p.backend, p.params, {**shape, "qo_len": 1}) == p.key


def test_sweep_records_and_tables_report_qo_len(tmp_path):
    store, records = run_sweep(small(), tmp_path)
    assert {(r.qo_len, r.causal) for r in records} == {(1, True), (2, True)}
    assert all(r.status == "ok" for r in records)
    by_qo = {r.qo_len: r for r in records if r.backend == "reference" and r.context_len == 16}
    q_out = 4 * (576 + 512) * 2  # one more token: its q row and output row, 4 heads, bf16
    assert by_qo[2].bytes_moved - by_qo[1].bytes_moved == q_out
    header = store.run_dir.joinpath("results.csv").read_text().splitlines()[0].split(",")
    assert "qo_len" in header and "causal" in header
    summary = sweep_summary(records)
    assert "qo_len" in summary.columns
    assert sorted({row[summary.columns.index("qo_len")] for row in summary.rows}) == [1, 2]
    assert "qo_len" not in sweep_summary([r for r in records if r.qo_len == 1]).columns
    assert len(recorded_records([tmp_path], qo_lens=[2])) == len(records) // 2


# ---- compare ---------------------------------------------------------------------------------------
def test_winners_per_context_bucket_and_qo_len(tmp_path):
    """Two paths on real records: the oracle stands in for the persistent path here (a family map
    given to the table), torch-splitkv is the split-KV path."""
    _store, records = run_sweep(small(), tmp_path)
    families = {"reference": "persistent", "torch-splitkv": "split-kv"}
    table = winners_table(records, families)
    assert table.columns == ["batch", "context", "qo=1", "qo=2"]
    assert [row[:2] for row in table.rows] == [[1, 16], [1, 40]]
    for row in table.rows:
        for cell in row[2:]:
            assert cell["path"] in ("padded persistent", "split-KV") and cell["margin"] >= 1
    at = [r for r in records if r.qo_len == 2 and r.context_len == 40]
    cell = path_winner(at, families)
    assert cell["us"] == min(r.stats.median_us for r in at)
    other = min(r.stats.median_us for r in at if families[r.backend] != families[cell["backend"]])
    assert cell["margin"] == pytest.approx(other / cell["us"])
    assert "qo_len" in compare_table(records, families).columns
    only = path_winner([r for r in records if r.backend == "torch-splitkv"], families)
    assert only["path"] == "split-KV" and only["margin"] is None


def test_compare_from_filters_by_qo_len(tmp_path, monkeypatch, capsys):
    run_sweep(small(), tmp_path)
    code, out, err = run(["compare", "--from", str(tmp_path), "--json"], monkeypatch, capsys)
    assert code == 1 and not out and "padded persistent" in err, err  # split-KV only: the error alone
    # the reference stands in for a persistent kernel, so that the records compare
    families = {"reference": "persistent", "torch-splitkv": "split-kv"}
    monkeypatch.setattr("mlabench.backends.backend_families", lambda: families)
    code, out, err = run(["compare", "--from", str(tmp_path), "--json"], monkeypatch, capsys)
    assert code == 0, err
    tables = json.loads(out)
    assert [t["title"] for t in tables][1] == "Which path wins at each qo_len (query tokens per request)"
    code, out, err = run(["compare", "--from", str(tmp_path), "--qo-len", "2", "--json"], monkeypatch, capsys)
    assert code == 0, err
    (table,) = json.loads(out)
    assert {row["qo_len"] for row in table["rows"]} == {2}
    code, _out, err = run(["compare", "--from", str(tmp_path), "--non-causal"], monkeypatch, capsys)
    assert code != 0 and "--from only reads recorded runs" in err


# ---- tune and graph-check --------------------------------------------------------------------------
def test_tune_shapes_carry_qo_len(tmp_path):
    from mlabench.tune.space import Bucket, load_tune_config, shape_dims, tune_shape
    from mlabench.tune.studies import study_name

    sweep = tmp_path / "s.toml"
    sweep.write_text('heads = [12]\ncontext_lens = [1024, 4096]\nqo_len = [2]\ncausal = false\n')
    cfg = load_tune_config(str(sweep), {"backend": "triton-splitkv"})
    shape = tune_shape(shape_dims(cfg), 4, 2048)
    assert (shape.qo_len, shape.causal) == (2, False)
    assert " qo2 non-causal " in study_name("b", shape, Bucket(1024, 4096, 2048))
    one = load_tune_config(None, {"backend": "triton-splitkv", "heads": 12, "buckets": [1024]})
    assert "qo_len" not in shape_dims(one)  # a one-token policy's shape is written as before
    assert " qo" not in study_name("b", tune_shape(shape_dims(one), 1, 512), Bucket(0, 1024, 512))
    sweep.write_text('heads = [12]\ncontext_lens = [1024]\nqo_len = [1, 2]\n')
    with pytest.raises(ConfigError, match="one qo_len value"):
        load_tune_config(str(sweep), {"backend": "triton-splitkv"})


def test_graph_check_capture_length_holds_a_causal_block():
    from mlabench.checks.graph_check import GraphCheckConfig

    GraphCheckConfig(qo_len=4, capture_len=4).validate()
    GraphCheckConfig(qo_len=4, capture_len=1, causal=False).validate()
    with pytest.raises(ConfigError, match="shorter than a causal block"):
        GraphCheckConfig(qo_len=4, capture_len=1).validate()


@pytest.mark.parametrize("qo_len", [0, 9])
def test_graph_check_refuses_a_qo_len_outside_1_to_8_before_it_needs_a_gpu(qo_len, monkeypatch, capsys):
    """``graph-check --qo-len 9`` (or 0; its help says 1-8) was bad input that passed: on a CPU it
    read "needs a CUDA or ROCm GPU", exit 3, and only a GPU would then refuse it."""
    import sys

    from mlabench import cli

    monkeypatch.setattr(sys, "argv", ["mlabench", "graph-check", "--qo-len", str(qo_len), "--capture-len", "9"])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 2
    assert capsys.readouterr().err == f"error: --qo-len takes 1-8 query tokens per request, got {qo_len}\n"


def test_graph_check_refuses_a_bad_dtype_before_it_needs_a_gpu(monkeypatch, capsys):
    """``graph-check --dtype foo`` said "needs a CUDA or ROCm GPU", exit 3, on a CPU (a fresh
    user's run), where ``check --dtype int8`` names the dtypes, exit 2."""
    import sys

    from mlabench import cli

    monkeypatch.setattr(sys, "argv", ["mlabench", "graph-check", "--dtype", "foo"])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 2
    assert capsys.readouterr().err == ("error: --dtype must be one of bfloat16, float16, float32, "
                                       "got 'foo'\n")
