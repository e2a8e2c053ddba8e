"""``--param NAME=V[,V...]``, the one way backend parameters enter check, sweep, compare and
graph-check, with ``--splits`` its alias, checked against the registry in one place."""

import json

import pytest

from mlabench.cli.options import backend_params
from mlabench.errors import ConfigError
from tests.cli.test_cli import run


def test_param_values_are_coerced_by_the_backends_own_spec():
    assert backend_params(["num_kv_splits=1, 16"], None, ["torch-splitkv"]) == {"num_kv_splits": [1, 16]}
    assert backend_params(None, "4,8", ["torch-splitkv"]) == {"num_kv_splits": [4, 8]}
    assert backend_params(["head_padding=repeat"], None, None) == {"head_padding": ["repeat"]}
    assert backend_params(None, None, ["torch-splitkv"]) is None


@pytest.mark.parametrize("params, splits, backends, message", [
    (["foo=1"], None, ["torch-splitkv"],
     "--param foo: unknown parameter 'foo', which torch-splitkv does not take (it takes: num_kv_splits;"),
    (["foo=1"], None, None, "--param foo: unknown parameter 'foo', which no backend takes (they take: "),
    (["head_padding=zero"], None, ["torch-splitkv", "reference"], "none of torch-splitkv, reference takes"),
    (["num_kv_splits=0"], None, ["torch-splitkv"], "--param num_kv_splits: num_kv_splits must be >= 1, got 0"),
    (["head_padding=odd"], None, None, "head_padding must be one of zero, repeat, got 'odd'"),
    (["num_kv_splits=2"], "3", None, "--splits is --param num_kv_splits=N[,N...]: give one of them"),
    (["num_kv_splits=2", "num_kv_splits=3"], None, None, "--param num_kv_splits is given twice"),
    (["num_kv_splits"], None, None, "--param takes NAME=V[,V...]"),
    (["num_kv_splits=2,,4"], None, None, "--param takes NAME=V[,V...]"),
    (None, "4", ["reference"], "--splits sets num_kv_splits, which reference does not take (it takes: no parameters"),
])
def test_bad_params_are_refused_in_one_line(params, splits, backends, message):
    with pytest.raises(ConfigError, match=None) as exc:
        backend_params(params, splits, backends)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_check_param_is_the_same_as_splits(monkeypatch, capsys):
    """``check --param num_kv_splits=2,3`` checks what ``check --splits 2,3`` checks."""
    tables = []
    for flag in (["--param", "num_kv_splits=2,3"], ["--splits", "2,3"]):
        code, out, err = run(["check", "--heads", "4", "--context", "64", "--backend", "torch-splitkv", *flag,
                              "--json"], monkeypatch, capsys)
        assert code == 0, err
        tables.append([(r["backend"], r["params"]) for r in json.loads(out)[0]["rows"]])
    assert tables[0] == tables[1] == [("torch-splitkv", "num_kv_splits=2"), ("torch-splitkv", "num_kv_splits=3")]


@pytest.mark.parametrize("args, message", [
    (["check", "--heads", "4", "--param", "num_kv_splits=2", "--splits", "2"], "give one of them"),
    (["check", "--heads", "4", "--backend", "torch-splitkv", "--param", "head_padding=zero"],
     "unknown parameter 'head_padding', which torch-splitkv does not take (it takes: num_kv_splits;"),
    (["sweep", "--heads", "4", "--param", "num_kv_splits=513"], "num_kv_splits must be <= 512"),
    (["sweep", "--heads", "4", "--backend", "reference", "--param", "num_kv_splits=2"],
     "which reference does not take"),
    (["compare", "--heads", "4", "--param", "bogus=1"], "which no backend takes"),
    (["compare", "--from", "results", "--param", "num_kv_splits=2"], "--from only reads recorded runs"),
    (["compare", "--from", "results", "--results-dir", "elsewhere"], "--from only reads recorded runs"),
    (["graph-check", "--param", "rows_per_tile=16,32"], "--param rows_per_tile: graph-check captures one value"),
    (["graph-check", "--param", "split_policy=host"], "graph-check sets it from --split-policy"),
    (["graph-check", "--param", "head_padding=zero"], "which triton-splitkv does not take"),
])
def test_commands_refuse_bad_params_before_running(tmp_path, monkeypatch, capsys, args, message):
    where = ["--results-dir", str(tmp_path)] if args[0] in ("sweep", "compare") and "--from" not in args else []
    code, out, err = run([*args, *where], monkeypatch, capsys)
    assert code == 2 and not out and not list(tmp_path.iterdir()), err
    (line,) = err.strip().splitlines()
    assert line.startswith("error: ") and message in line


def test_sweep_records_param_values_as_its_splits_axis(tmp_path, monkeypatch, capsys):
    """A sweep's ``--param num_kv_splits=1,2`` is the ``num_kv_splits`` axis ``--splits 1,2`` gives,
    recorded as integers in the manifest."""
    code, out, err = run(["sweep", "--heads", "4", "--batch", "1", "--context", "32", "--backend", "torch-splitkv",
                          "--param", "num_kv_splits=1,2", "--page-size", "16", "--budget-s", "0.05",
                          "--results-dir", str(tmp_path), "--json"], monkeypatch, capsys)
    assert code == 0, err
    (run_dir,) = tmp_path.iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["config"]["params"] == {"num_kv_splits": [1, 2]}


def test_a_param_no_backend_available_here_takes_is_refused(monkeypatch, capsys):
    """A new user's `check --param num_stages=2` on a machine without gluon-splitkv checked the other
    backends without it, silently: refused in one line naming the parameter and who takes it,
    exit 3 (cannot run here), once the value is one its backend takes (a bad value: exit 2)."""
    from mlabench.backends import backend_names, get_backend

    owners = [n for n in backend_names() if any(s.name == "num_stages" for s in get_backend(n).params)]
    assert owners == ["gluon-splitkv"]
    monkeypatch.setattr(get_backend("gluon-splitkv"), "available", lambda: (False, "needs an NVIDIA Hopper GPU"))
    code, out, err = run(["check", "--heads", "4", "--context", "64", "--param", "num_stages=9"], monkeypatch, capsys)
    assert code == 2 and not out and "num_stages must be <= 2, got 9" in err
    code, out, err = run(["check", "--heads", "4", "--context", "64", "--param", "num_stages=2"], monkeypatch, capsys)
    assert code == 3 and not out
    assert err.strip().splitlines() == [
        "error: --param num_stages: no backend available here takes 'num_stages', so every point would run without "
        "it (gluon-splitkv takes it: `mlabench backends` says why it is not available); leave --param num_stages "
        "out, or run where gluon-splitkv runs"]
    monkeypatch.setattr(get_backend("gluon-splitkv"), "available", lambda: (True, ""))
    assert backend_params(["num_stages=2"], None, None) == {"num_stages": [2]}  # where it runs, it is taken
