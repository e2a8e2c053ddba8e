"""The decisions behind `mlabench check`, reached without the CLI: default heads, shapes, tolerances."""

import math

import pytest

from mlabench.bench.point import DEFAULT_CHECK_HEADS
from mlabench.checks.verdict import check_config
from mlabench.errors import ConfigError, ShapeError, UnknownModelError
from mlabench.sweep.check import check_failures, check_shapes, default_check_shapes, run_check


def test_without_a_model_check_uses_12_heads_and_the_default_shapes():
    shapes = check_shapes()
    assert DEFAULT_CHECK_HEADS == 12
    assert shapes == default_check_shapes(12, None)
    assert [s.context_lens for s in shapes] == [(4096,), (1, 100, 1024, 4097)]


def test_a_model_sets_heads_scale_and_widths():
    (seed, ragged) = check_shapes(model="kimi-k3", tp=8)
    assert seed.num_heads == ragged.num_heads == 12 and seed.softmax_scale is not None
    with pytest.raises(ConfigError, match="contradicts"):
        check_shapes(model="kimi-k3", tp=8, heads=[16])
    with pytest.raises(UnknownModelError):
        check_shapes(model="kimi-k9")


def test_context_lengths_make_one_ragged_batch_and_batch_repeats_one_length():
    (ragged,) = check_shapes(heads=[12], context_lens=[1, 100, 4097], page_size=16)
    assert ragged.context_lens == (1, 100, 4097) and ragged.page_size == 16
    shapes = check_shapes(heads=[8, 12], context_lens=[64], batch=[1, 3])
    assert [(s.num_heads, s.context_lens) for s in shapes] == [
        (8, (64,)), (8, (64, 64, 64)), (12, (64,)), (12, (64, 64, 64))]


@pytest.mark.parametrize("kw, error, message", [
    ({"context_lens": [100], "batch": [0]}, ConfigError, "--batch takes values > 0, got 0"),
    ({"context_lens": [100, 200], "batch": [2]}, ConfigError, "needs exactly one --context length, got 2"),
    ({"batch": [2]}, ConfigError, "needs exactly one --context length, got 0"),
    ({"heads": [0]}, ShapeError, "heads must be > 0"),
    ({"heads": [12], "context_lens": [0]}, ShapeError, "context"),
])
def test_bad_shapes_raise_one_typed_error(kw, error, message):
    with pytest.raises(error, match=message):
        check_shapes(**kw)


def test_tolerances_are_checked():
    assert check_config(1e-3, 0.0).rtol == 0.0
    for atol, rtol, message in [(math.nan, 0.01, "--atol must be a finite number > 0, got nan"),
                                (0.0, 0.01, "--atol must be a finite number > 0"),
                                (0.01, -1.0, "--rtol must be a finite number >= 0"),
                                (0.01, math.inf, "--rtol must be a finite number >= 0")]:
        with pytest.raises(ConfigError, match=message):
            check_config(atol, rtol)


def test_repeated_splits_run_once_and_failures_are_incorrect_or_error():
    (shape,) = check_shapes(heads=[12], context_lens=[40], page_size=16)
    records, unavailable = run_check([shape], ["torch-splitkv"], [2, 2, 3])
    assert [r.params["num_kv_splits"] for r in records] == [2, 3] and not unavailable
    assert check_failures(records) == []
    bad = [records[0].model_copy(update={"status": s}) for s in ("incorrect", "error", "unsupported")]
    assert [r.status for r in check_failures(bad)] == ["incorrect", "error"]


def test_params_are_axes_of_the_check_beside_the_split_counts():
    """Issue 36: ``check --param`` reaches the check as axes, its values in place of the split counts."""
    (shape,) = check_shapes(heads=[4], context_lens=[40], page_size=16)
    records, _ = run_check([shape], ["torch-splitkv"], [3], params={"num_kv_splits": [2, 5]})
    assert [r.params["num_kv_splits"] for r in records] == [2, 5]


def test_a_library_that_picks_its_split_count_is_checked_on_its_own_pick(monkeypatch):
    import dataclasses

    import mlabench.sweep.check as check
    from mlabench.backends import get_backend

    splitkv = get_backend("torch-splitkv")
    own_choice = dataclasses.replace(splitkv.params[0], default=None)  # like aiter-gluon's
    library = type("Library", (type(splitkv),), {"params": (own_choice,)})()
    picked = []
    real_prepare = type(splitkv).prepare

    def prepare(self, inputs, params):
        picked.append(params["num_kv_splits"])
        return real_prepare(self, inputs, {"num_kv_splits": params["num_kv_splits"] or 4})

    monkeypatch.setattr(type(library), "prepare", prepare)
    monkeypatch.setattr(check, "select_backends", lambda names, strict: [library])
    (shape,) = check_shapes(heads=[12], context_lens=[40], page_size=16)
    records, _ = run_check([shape], ["library"], [2])
    assert [r.params["num_kv_splits"] for r in records] == [None, 2] and picked == [None, 2]
    assert check_failures(records) == []
