"""The wave cap (``--max-waves``): num_kv_splits searched only up to the splits whose programs fit in
W waves of what the backend runs at once; public heuristics beyond it are still measured."""

from __future__ import annotations

import pytest
import torch

from mlabench.backends import get_backend
from mlabench.backends.triton import programs_per_sm
from mlabench.shapes import MLADecodeShape
from mlabench.tune.choice import choose, measured_configs
from mlabench.tune.run import run_tune
from mlabench.tune.space import TuneConfig, study_space, wave_cap
from mlabench.tune.studies import optuna_module
from tests.tune.helpers import run_in_process, tiny_config
from tests.tune.test_tune_run import study_trials


def shape(batch: int, heads: int = 2, qo_len: int = 1) -> MLADecodeShape:
    return MLADecodeShape.uniform(batch, 48, heads, page_size=16, qo_len=qo_len)


def splits_dim(cfg: TuneConfig, s: MLADecodeShape, cap: int | None):
    dims, _ = study_space(get_backend(cfg.backend), s, cfg, (48,), cap)
    return next(d for d in dims if d.name == "num_kv_splits")


@pytest.mark.parametrize("batch, heads, qo_len, waves, expected", [
    (1, 2, 1, 1.0, 8), (2, 2, 1, 1.0, 4), (16, 2, 1, 1.0, 1),     # at least one split
    (1, 12, 2, 1.0, 4),                                           # 24 rows: two 16-row tiles a split
    (1, 12, 4, 1.0, 2), (2, 2, 1, 2.5, 10), (3, 2, 1, 1.0, 2)])   # floor(8 / 3)
def test_cap_from_resident_programs(batch, heads, qo_len, waves, expected):
    backend = get_backend("test-wave-trap")
    assert wave_cap(backend, shape(batch, heads, qo_len), waves) == expected


def test_no_cap_without_waves_or_resident_programs(tiny_timing):
    assert wave_cap(get_backend("test-wave-trap"), shape(1), 0.0) is None
    assert wave_cap(get_backend("test-flat"), shape(1), 1.0) is None        # the backend does not say
    if torch.cuda.is_available() and torch.version.hip is None:  # one wave of one-tile programs
        props = torch.cuda.get_device_properties(0)
        want = programs_per_sm(props.shared_memory_per_multiprocessor) * props.multi_processor_count
    else:
        want = None  # not on a CPU (nor on ROCm)
    assert wave_cap(get_backend("triton-splitkv"), shape(1), 1.0) == want
    cfg = tiny_config("test-wave-trap", tiny_timing)
    before = splits_dim(cfg, shape(1), None)
    assert (before.low, before.high, before.log) == (1, 64, True)
    assert splits_dim(cfg, shape(1), wave_cap(get_backend("test-wave-trap"), shape(1), 0.0)) == before
    after = splits_dim(cfg, shape(2), 4)
    assert (after.low, after.high, after.log) == (1, 4, False)
    narrowed = tiny_config("test-wave-trap", tiny_timing, space={"num_kv_splits": {"low": 6, "high": 64}})
    assert (splits_dim(narrowed, shape(2), 4).low, splits_dim(narrowed, shape(2), 4).high) == (6, 6)


def test_triton_splitkv_programs_per_sm():
    assert programs_per_sm(233472) == 2     # H200 / H100: 228 KB per SM
    assert programs_per_sm(167936) == 1     # A100: 164 KB
    assert programs_per_sm(1024) == 1


def test_study_never_chooses_past_the_cap(tmp_path, tiny_timing):
    """More splits look faster at every count here; the cap alone keeps the choice within a wave
    (and without it the same study goes past: the test can fail)."""
    cfg = tiny_config("test-wave-trap", tiny_timing, sampler="brute", batch=[2], max_waves=1.0)
    study, _store = run_in_process(tmp_path / "capped", cfg)
    assert {t.params["num_kv_splits"] for t in study.trials} == {1, 2, 3, 4}
    chosen, _fastest = choose(measured_configs(study.trials), 0.01)
    assert chosen.params["num_kv_splits"] <= 4            # (4 is fastest; a loaded CPU may blur it)
    free = tiny_config("test-wave-trap", tiny_timing, sampler="brute", batch=[2], max_waves=0.0)
    study, _store = run_in_process(tmp_path / "free", free)
    chosen, _fastest = choose(measured_configs(study.trials), 0.01)
    assert chosen.params["num_kv_splits"] > 4


def test_run_records_the_cap_and_measures_heuristics_beyond_it(tmp_path, tiny_timing, monkeypatch):
    """The cap is in each study's attributes and name and the choice table; an enqueued count
    past the cap (as a public heuristic may be) is measured as is and stays eligible."""
    import mlabench.tune.run as tune_run

    monkeypatch.setattr(tune_run, "heuristic_trials", lambda *a: [("wide", {"num_kv_splits": 32})])
    cfg = TuneConfig(backend="test-wave-trap", heads=2, batch=[1, 2], buckets=[48], page_size=16, trials=5,
                     lengths_per_bucket=1, sampler="tpe", timing=tiny_timing)
    result = run_tune(cfg, tmp_path)
    assert [c.max_splits for c in result.choices] == [8, 4]
    optuna = optuna_module()
    storage = tune_run.open_storage(None, result.store.run_dir)
    for spec, cap in zip(tune_run.recorded_config(result.store.run_dir)[1], (8, 4)):
        study = optuna.load_study(study_name=spec.name, storage=storage)
        assert (study.user_attrs["max_splits"], study.user_attrs["max_waves"], spec.max_splits) == (cap, 1.0, cap)
    trials = study_trials(result.store.run_dir)
    wide = [t for t in trials if t.user_attrs.get("enqueued_as") == "wide"]
    assert len(wide) == 2 and all(t.state.name == "COMPLETE" and t.params["num_kv_splits"] == 32 for t in wide)
    assert all(t.params["num_kv_splits"] <= 8 for t in trials if "enqueued_as" not in t.user_attrs)
    assert [c.chosen["num_kv_splits"] for c in result.choices] == [32, 32]   # fastest, and eligible
