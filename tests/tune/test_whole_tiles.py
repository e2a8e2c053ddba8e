"""The whole-tile rule in the tuner: the searched dimension where a backend declares its split
tile, the enqueued candidates, the choice and the policy it makes; and the stop rule counting
distinct launches, not distinct Optuna params."""

from __future__ import annotations

import json

import pytest

from mlabench.backends import get_backend
from mlabench.kernels.splitkv_torch import split_starts
from mlabench.policy.rules import whole_tile_splits
from mlabench.records.store import ResultStore
from mlabench.shapes import MLADecodeShape
from mlabench.tune.manifest import run_manifest
from mlabench.tune.run import run_tune
from mlabench.tune.seeded_trials import heuristic_trials, whole_tile_trials
from mlabench.tune.space import (
    RULE_PARAM, TILE_PARAM, TuneConfig, buckets_of, launched, params_at, shape_dims, space_size, study_space,
    tune_shape,
)
from mlabench.tune.studies import distinct_finished, make_sampler, optuna_module
from mlabench.tune.trial_worker import MAX_TRIALS_FACTOR, Objective, StopAtTrials
from mlabench.tune.worker_pool import RecordIndex
from tests.tune.test_tune_run import assert_nothing_lost_or_twice, study_trials

LENGTHS = (65, 128, 256)


def shape(batch: int = 1, length: int = 128) -> MLADecodeShape:
    return MLADecodeShape.uniform(batch, length, 2, page_size=16)


def tiles_config(timing, **kw) -> TuneConfig:
    values = dict(backend="test-tiles", heads=2, batch=[1], buckets=[64, 256], page_size=16, timing=timing,
                  trials=10, sampler="tpe")
    values.update(kw)
    return TuneConfig.model_validate(values)


def test_backends_declare_their_split_tile():
    """triton-splitkv walks splits in its default 32-token tiles (its split lengths, rounded up to
    16 tokens, hold whole tiles); the portable torch split-KV cuts ceil(L / S) tokens, no tiles."""
    s = shape()
    assert get_backend("triton-splitkv").split_tile_tokens(s, {"split_policy": ""}) == 32
    assert get_backend("triton-splitkv").split_tile_tokens(s, {"split_policy": "device"}) is None
    assert get_backend("torch-splitkv").split_tile_tokens(s, {}) is None
    assert split_starts([65], 6)[0] == [0, 11, 22, 33, 44, 55]          # 11 tokens a split: no tile
    pytest.importorskip("triton")
    from mlabench.backends.triton import SPLITKV_TILE_TOKENS
    from mlabench.kernels.common import DEFAULT_BLOCK_N

    assert SPLITKV_TILE_TOKENS == DEFAULT_BLOCK_N


def test_tile_dimension_is_searched_only_with_the_rule_and_a_declared_tile(tiny_timing):
    backend = get_backend("test-tiles")
    dims, _ = study_space(backend, shape(), tiles_config(tiny_timing), LENGTHS, 16)
    assert [d.name for d in dims] == ["num_kv_splits", TILE_PARAM, RULE_PARAM]
    assert dims[1].choices == (0, 4) and (dims[0].low, dims[0].high) == (1, 16)
    assert space_size(dims) == 16 * (4096 + 1)                   # tokens_per_split only with tile 0
    for cfg, lengths in ((tiles_config(tiny_timing, whole_tiles=False), LENGTHS),
                         (tiles_config(tiny_timing, tokens_per_split=None), LENGTHS),
                         (tiles_config(tiny_timing), (128,))):
        assert TILE_PARAM not in [d.name for d in study_space(backend, shape(), cfg, lengths)[0]]
    plain = study_space(get_backend("test-length-scaled"), shape(), tiles_config(tiny_timing), LENGTHS)[0]
    assert [d.name for d in plain] == ["num_kv_splits", RULE_PARAM]       # no tile declared


def test_params_at_applies_the_chosen_rule():
    backend = get_backend("test-tiles")
    tiles = {"num_kv_splits": 8, TILE_PARAM: 4}
    assert [params_at(backend, {}, tiles, n)["num_kv_splits"] for n in LENGTHS] == [6, 8, 8]
    assert [whole_tile_splits(n, 4, 8) for n in LENGTHS] == [6, 8, 8]
    rule = {"num_kv_splits": 8, TILE_PARAM: 0, RULE_PARAM: 16}
    assert [params_at(backend, {}, rule, n)["num_kv_splits"] for n in LENGTHS] == [5, 8, 8]
    assert launched(backend, {}, tiles, (256, 65)) == [[65, {"num_kv_splits": 6}], [256, {"num_kv_splits": 8}]]


def test_enqueued_candidates_are_whole_tiles_at_one_wave_half_and_quarter(tiny_timing):
    backend = get_backend("test-tiles")
    cfg = tiles_config(tiny_timing)
    dims, _ = study_space(backend, shape(), cfg, LENGTHS, 16)
    assert whole_tile_trials(backend, shape(), dims) == [
        ("whole-tiles-16", {"num_kv_splits": 16, TILE_PARAM: 4}), ("whole-tiles-8", {"num_kv_splits": 8, TILE_PARAM: 4}),
        ("whole-tiles-4", {"num_kv_splits": 4, TILE_PARAM: 4})]
    dims4, _ = study_space(backend, shape(4), cfg, LENGTHS, 4)           # 16 / 4 = 4: one wave of 4 splits
    assert [n for n, _ in whole_tile_trials(backend, shape(4), dims4)] == ["whole-tiles-4", "whole-tiles-2",
                                                                           "whole-tiles-1"]
    six = tiles_config(tiny_timing, space={"num_kv_splits": {"low": 1, "high": 6}})
    narrow, _ = study_space(backend, shape(), six, LENGTHS, 16)         # clamped to the range, repeats dropped
    assert [n for n, _ in whole_tile_trials(backend, shape(), narrow)] == ["whole-tiles-6", "whole-tiles-4"]
    assert all(p[TILE_PARAM] == 0 for _, p in heuristic_trials(backend, shape(), dims, 8))
    plain, _ = study_space(backend, shape(), tiles_config(tiny_timing, whole_tiles=False), LENGTHS, 16)
    assert whole_tile_trials(backend, shape(), plain) == []


def test_study_enqueues_and_chooses_the_whole_tile_rule(tmp_path, tiny_timing):
    """Where the whole-tile rule at half a wave is fastest at every length, the run measures it
    first and exports it as a tile_tokens entry (the lookup gives its count at every length).
    More samples than the other tests take: the choice's tolerance is the best configuration's own
    spread, which a loaded CPU blew up to 60% with 15 samples."""
    sturdy = tiny_timing.model_copy(update={"budget_s": 0.1, "min_samples": 9, "max_samples": 41,
                                            "target_rel_ci": 0.02})
    result = run_tune(tiles_config(sturdy), tmp_path)
    trials = assert_nothing_lost_or_twice(result.store.run_dir)
    names = {t.user_attrs.get("enqueued_as") for t in trials}
    assert {"whole-tiles-16", "whole-tiles-8", "whole-tiles-4", "vllm-triton"} <= names
    choice = next(c for c in result.choices if c.max_context_len == 256)
    assert (choice.tile_tokens, choice.tokens_per_split, choice.chosen) == (4, None, {"num_kv_splits": 8})
    assert choice.best_heuristic is not None and not choice.best_heuristic.startswith("whole-tiles")
    entry = next(e for e in result.policy.batches[0].entries if e.max_context_len == 256)
    assert entry.tile_tokens == 4 and entry.describe() == "num_kv_splits=tiles(L,4,8)"
    assert [result.policy.lookup(1, n)["num_kv_splits"] for n in (65, 100, 128, 200, 256)] == [
        whole_tile_splits(n, 4, 8) for n in (65, 100, 128, 200, 256)]
    assert '"tile_tokens": 4' in (result.store.run_dir / "policy.json").read_text()
    assert "tile_tokens" in (result.store.run_dir / "policy.h").read_text()
    for t in trials:                                    # tokens_per_split is not suggested with tiles
        if t.state.name == "COMPLETE" and t.params.get(TILE_PARAM):
            assert RULE_PARAM not in t.params and "launched" in t.user_attrs


def objective_study(tmp_path, cfg: TuneConfig, lengths: tuple[int, ...]):
    """A study of ``cfg``'s first batch size at ``lengths``, in memory, and its objective."""
    optuna = optuna_module()
    store = ResultStore.create(tmp_path / "run", run_manifest("run", 1.0, {}))
    backend = get_backend(cfg.backend)
    shapes = {n: tune_shape(shape_dims(cfg), cfg.batch[0], n) for n in lengths}
    dims, fixed = study_space(backend, shapes[lengths[-1]], cfg, lengths)
    study = optuna.create_study(sampler=make_sampler(cfg.sampler, dims, 0))
    return study, Objective(backend, shapes, dims, fixed, store, RecordIndex(store), cfg, None), store


def test_repeats_by_launch_are_reused_and_not_counted(tmp_path, tiny_timing):
    """Two tokens_per_split values that launch the same counts at every length are one
    configuration: the second reuses the first's measurements and does not count towards --trials."""
    cfg = tiles_config(tiny_timing, backend="test-length-scaled", buckets=[64], whole_tiles=False)
    study, objective, store = objective_study(tmp_path, cfg, (32, 64))
    for t in (1, 2, 3):                       # ceil(L / t) >= 4 at 32 and 64 tokens: 4 splits each
        study.enqueue_trial({"num_kv_splits": 4, RULE_PARAM: t})
    study.enqueue_trial({"num_kv_splits": 4, RULE_PARAM: 16})           # 2 and 4 splits
    stop = StopAtTrials(2)
    study.optimize(objective, n_trials=4, callbacks=[stop])
    first, *repeats, other = study.trials
    assert [t.user_attrs.get("repeat_of") for t in repeats] == [first.number, first.number]
    assert all(t.user_attrs["record_keys"] == first.user_attrs["record_keys"] for t in repeats)
    assert len(store.records()) == 3                                    # 4 splits at 32 and 64; 2 at 32
    assert distinct_finished(study.trials) == 2 and stop.reached(study)
    assert len({json.dumps(t.params, sort_keys=True) for t in study.trials}) == 4


def test_stop_rule_ends_a_study_with_fewer_launches_than_trials(tmp_path, tiny_timing):
    """Two distinct launches in all and --trials 5: TPE would suggest repeats for ever; the study
    stops after MAX_TRIALS_FACTOR x 5 finished trials."""
    cfg = tiles_config(tiny_timing, backend="test-flat", buckets=[48], lengths_per_bucket=1,
                       space={"num_kv_splits": {"low": 1, "high": 2}}, trials=5)
    study, objective, store = objective_study(tmp_path, cfg, (48,))
    study.optimize(objective, n_trials=1000, callbacks=[StopAtTrials(cfg.trials)])
    assert len(study.trials) == MAX_TRIALS_FACTOR * cfg.trials
    assert distinct_finished(study.trials) == 2 and len(store.records()) == 2


def test_old_runs_search_no_tiles():
    """A run recorded before whole tiles (no whole_tiles in its manifest) resumes and exports with
    the space it searched."""
    from mlabench.tune.space import LEGACY_FIELDS

    assert LEGACY_FIELDS["whole_tiles"] is False
    assert buckets_of([64, 256], per_bucket=3)[1].measured() == LENGTHS


def test_cli_flag_turns_whole_tiles_off(tmp_path):
    """``--no-whole-tiles``: recorded in the manifest, no tile dimension searched, no candidate enqueued."""
    from typer.testing import CliRunner

    from mlabench.cli import app

    args = ["tune", "--backend", "test-tiles", "--heads", "2", "--buckets", "256", "--page-size", "16", "--trials", "3",
            "--budget-s", "0.02", "--no-whole-tiles", "--no-heuristics", "--results-dir", str(tmp_path), "--json"]
    res = CliRunner().invoke(app, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    run = next(tmp_path.glob("tune-*"))
    assert json.loads((run / "manifest.json").read_text())["config"]["tune"]["whole_tiles"] is False
    trials = study_trials(run)
    assert len(trials) >= 3 and not any(TILE_PARAM in t.params or "enqueued_as" in t.user_attrs for t in trials)
