"""The measuring order (issue 13 item 3): grid, shuffled and interleaved, seeded and kept on resume."""

from collections import namedtuple

import pytest

from mlabench.sweep.order import order_points

P = namedtuple("P", "backend shape i")


def grid():
    """Two shapes; per shape 12 points of split, 4 of persist, 1 of flash (the kimi grid's mix)."""
    pts = []
    for shape in ("B1 L32K", "B16 L32K"):
        pts += [P("split", shape, i) for i in range(12)] + [P("persist", shape, i) for i in range(4)]
        pts.append(P("flash", shape, 0))
    return pts


def test_grid_is_the_configured_order():
    assert order_points(grid(), "grid", seed=1) == grid()


def test_shuffled_is_a_seeded_permutation_mixing_shapes():
    a, b, c = (order_points(grid(), "shuffled", seed=s) for s in (7, 7, 8))
    assert a == b != c and sorted(a) == sorted(grid()) and a != grid()
    first_half_shapes = {p.shape for p in a[:17]}
    assert first_half_shapes == {"B1 L32K", "B16 L32K"}


def test_interleaved_keeps_shapes_together_and_spreads_each_backend_over_them():
    out = order_points(grid(), "interleaved", seed=3)
    assert sorted(out) == sorted(grid()) and out == order_points(grid(), "interleaved", seed=3)
    assert [p.shape for p in out] == [p.shape for p in grid()]  # a shape's points stay together
    for k, shape in enumerate(("B1 L32K", "B16 L32K")):
        turn = out[17 * k:17 * (k + 1)]
        where = {b: [i for i, p in enumerate(turn) if p.backend == b] for b in ("split", "persist", "flash")}
        assert where["flash"] == [8]  # the one point sits in the middle of the turn
        # persist's 4 points at about (i + 1/2) / 4 of the turn: never two in a row, one per quarter
        assert [pos * 4 // 17 for pos in where["persist"]] == [0, 1, 2, 3]
        # split's params come in a random order, not the grid's
        assert [turn[i].i for i in where["split"]] != list(range(12))
    assert order_points(grid(), "interleaved", seed=4) != out


def test_unknown_order():
    with pytest.raises(ValueError, match="unknown order"):
        order_points(grid(), "random", seed=0)


def test_a_resumed_shuffled_run_keeps_its_order(tmp_path, monkeypatch):
    from mlabench.backends import get_backend
    from mlabench.errors import Interrupted
    from mlabench.measure.timing import TimingConfig
    from mlabench.records.store import ResultStore
    from mlabench.bench import shape_bench as point
    from mlabench.sweep.config import SweepConfig, expand
    from mlabench.sweep.run import run_sweep

    cfg = SweepConfig(name="t", heads=[12], batch=[1, 2], context_lens=[16, 40], page_size=16,
                      backends=["torch-splitkv"], params={"num_kv_splits": [1, 2, 3]}, order="shuffled",
                      sentinel_every=0,
                      timing=TimingConfig(warmup_iters=0, min_samples=3, max_samples=3, budget_s=0.01))
    real, calls = point.ShapeBench.run, {"n": 0}

    def stop_after_five_points(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 7:  # the sentinel, 5 points, then Ctrl-C
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(point.ShapeBench, "run", stop_after_five_points)
    with pytest.raises(Interrupted):
        run_sweep(cfg, tmp_path)
    (run_dir,) = tmp_path.iterdir()
    monkeypatch.setattr(point.ShapeBench, "run", real)
    store, recs = run_sweep(SweepConfig.model_validate(ResultStore(run_dir).manifest().config), resume=run_dir)
    seed = store.manifest().config["order_seed"]
    expected = order_points(expand(cfg, [get_backend("torch-splitkv")]), "shuffled", seed)
    assert [r.key for r in recs] == [p.key for p in expected] and len(recs) == 12
