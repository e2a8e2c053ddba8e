"""The search space comes from the backend's declared parameters; the objective, pruning and the
noise-aware choice, on real Optuna studies run in this process."""

from __future__ import annotations

import pytest

from mlabench.backends import get_backend
from mlabench.errors import ConfigError, ResultsError
from mlabench.shapes import MLADecodeShape
from mlabench.tune.choice import Measured, choose, measured_configs
from mlabench.tune.seeded_trials import heuristic_trials
from mlabench.tune.space import SpaceRange, TuneConfig, buckets_of, resolve_sampler, search_space
from mlabench.tune.studies import optuna_module
from tests.tune.helpers import run_in_process, tiny_config

SHAPE = MLADecodeShape.uniform(1, 48, 2, page_size=16)


def test_space_is_every_declared_searchable_parameter():
    dims, fixed = search_space(get_backend("test-launch"), SHAPE)
    assert [d.name for d in dims] == ["num_kv_splits", "block_n", "num_warps", "num_stages"]
    assert (dims[0].low, dims[0].high, dims[1].choices) == (1, 64, ("16", "32", "64"))
    assert fixed == {"tile_rows": 16}                      # an unbounded integer is not searched
    dims, fixed = search_space(get_backend("test-launch"), SHAPE,
                               {"num_warps": SpaceRange(low=4, high=4), "block_n": SpaceRange(choices=["16", "64"])})
    assert fixed == {"num_warps": 4, "tile_rows": 16}
    assert next(d for d in dims if d.name == "block_n").choices == ("16", "64")


@pytest.mark.parametrize("narrow, match", [({"bogus": SpaceRange(low=1)}, "no parameter 'bogus'"),
                                           ({"num_kv_splits": SpaceRange(low=0, high=4)}, ">= 1"),
                                           ({"block_n": SpaceRange(choices=["48"])}, "one of")])
def test_bad_space_is_one_clear_error(narrow, match):
    with pytest.raises(ConfigError, match=match):
        search_space(get_backend("test-launch"), SHAPE, narrow)


def test_sampler_auto_is_exhaustive_only_when_small(tiny_timing):
    dims, _ = search_space(get_backend("test-fast-wrong"), SHAPE)
    assert resolve_sampler(tiny_config("test-fast-wrong", tiny_timing, trials=16), dims) == "brute"
    assert resolve_sampler(tiny_config("test-fast-wrong", tiny_timing, trials=15), dims) == "tpe"
    assert resolve_sampler(tiny_config("test-fast-wrong", tiny_timing, sampler="gp"), dims) == "gp"


def test_heuristics_enqueue_defaults_for_launch_params():
    backend = get_backend("test-launch")
    dims, _ = search_space(backend, SHAPE)
    trials = heuristic_trials(backend, MLADecodeShape.uniform(1, 131072, 12), dims, num_sms=132)
    assert {name for name, _ in trials} >= {"vllm-triton", "sglang", "rocm-buckets"}
    for _name, params in trials:
        assert params["block_n"] == "32" and params["num_warps"] == 4 and params["num_stages"] == 2
        assert 1 <= params["num_kv_splits"] <= 64


def test_buckets_and_representative_lengths():
    assert [(b.lo, b.hi, b.length) for b in buckets_of([1024, 4096, 131072])] == [
        (0, 1024, 724), (1024, 4096, 2048), (4096, 131072, 23170)]
    assert [b.length for b in buckets_of([1024, 4096], "upper")] == [1024, 4096]
    assert [b.measured() for b in buckets_of([1024, 4096])] == [(724,), (2048,)]
    assert [b.measured() for b in buckets_of([1024, 4096, 131072], per_bucket=3)] == [
        (512, 724, 1024), (1025, 2048, 4096), (4097, 23170, 131072)]    # lower edge + 1, middle, upper edge
    assert buckets_of([4096], per_bucket=5)[0].measured() == (2048, 2435, 2896, 3444, 4096)
    assert buckets_of([10, 11], per_bucket=3)[1].measured() == (11,)       # repeats dropped


def test_objective_searches_all_launch_parameters(tmp_path, tiny_timing):
    """A backend declaring launch parameters is tuned over all of them with no change to the tuner."""
    cfg = tiny_config("test-launch", tiny_timing, sampler="brute", trials=100,
                      space={"num_kv_splits": {"low": 11, "high": 13}, "num_warps": {"low": 3, "high": 5},
                             "num_stages": {"low": 1, "high": 2}})
    study, store = run_in_process(tmp_path, cfg)
    assert len(study.trials) == 3 * 3 * 3 * 2               # brute force covers the whole space once
    assert all(set(t.params) == {"num_kv_splits", "block_n", "num_warps", "num_stages"} for t in study.trials)
    records = store.records()
    assert len(records) == len(study.trials) and len({r.key for r in records}) == len(records)
    assert all(r.params["tile_rows"] == 16 for r in records)
    chosen, _ = choose(measured_configs(study.trials), 0.01)
    # every parameter at its optimum: each step away costs >= 20%, more than a loaded CPU's noise
    assert chosen.params == {"num_kv_splits": 12, "block_n": "32", "num_warps": 4, "num_stages": 2}


def test_fast_wrong_configuration_is_pruned_and_never_chosen(tmp_path, tiny_timing):
    cfg = tiny_config("test-fast-wrong", tiny_timing, sampler="brute", trials=16)
    study, store = run_in_process(tmp_path, cfg)
    pruned = [t for t in study.trials if t.state.name == "PRUNED"]
    assert sorted(t.params["num_kv_splits"] for t in pruned) == [12, 13, 14, 15, 16]
    assert all(t.user_attrs["status"] == "incorrect" and t.user_attrs["points"][-1]["verdict_passed"] is False
               for t in pruned)
    assert all(t.user_attrs["points"][-1]["median_us"] < 100 for t in pruned)  # they were the fastest
    chosen, fastest = choose(measured_configs(study.trials), 0.01)
    assert chosen.params["num_kv_splits"] == fastest.params["num_kv_splits"] == 6
    assert {r.status for r in store.records() if r.params["num_kv_splits"] >= 12} == {"incorrect"}


def test_flat_landscape_takes_the_fewest_splits(tmp_path, tiny_timing):
    cfg = tiny_config("test-flat", tiny_timing, sampler="brute", trials=8, noise=0.25,
                      space={"num_kv_splits": {"low": 3, "high": 10}})
    study, _store = run_in_process(tmp_path, cfg)
    chosen, _ = choose(measured_configs(study.trials), cfg.noise)
    assert chosen.params["num_kv_splits"] == 3


def test_noise_aware_choice():
    m = [Measured({"num_kv_splits": 64}, 100.0, 0.002, 1), Measured({"num_kv_splits": 32}, 100.8, 0.002, 1),
         Measured({"num_kv_splits": 16}, 101.5, 0.002, 1)]
    assert choose(m, 0.01)[0].params["num_kv_splits"] == 32          # within 1% of the best
    assert choose(m, 0.02)[0].params["num_kv_splits"] == 16
    assert choose(m, 0.0)[0].params["num_kv_splits"] == 64
    wide = [Measured({"num_kv_splits": 64}, 100.0, 0.03, 1), m[2]]
    assert choose(wide, 0.01)[0].params["num_kv_splits"] == 16       # the best's own spread is wider
    with pytest.raises(ResultsError):
        choose([], 0.01)


def test_measured_configs_pool_repeats_and_drop_pruned_and_failed():
    optuna = optuna_module()
    dist = {"num_kv_splits": optuna.distributions.IntDistribution(1, 64)}

    def trial(n, state, value=None, status="ok"):
        return optuna.trial.create_trial(params={"num_kv_splits": n}, distributions=dist, state=state,
                                         value=value, user_attrs={"status": status, "median_us": value,
                                                                  "median_rel_ci": 0.01})

    S = optuna.trial.TrialState
    got = measured_configs([trial(8, S.COMPLETE, 10.0), trial(8, S.COMPLETE, 12.0), trial(4, S.PRUNED, status="incorrect"),
                            trial(2, S.FAIL), trial(16, S.COMPLETE, 5.0, status="noisy?")])
    assert [(m.params, m.median_us, m.trials) for m in got] == [({"num_kv_splits": 8}, 11.0, 2)]


def test_config_validation_is_one_line():
    with pytest.raises(ValueError, match="increasing"):
        TuneConfig(backend="x", buckets=[4096, 1024])


def test_kernel_variants_stay_at_their_defaults_unless_named():
    """gluon-splitkv's layout and launch variants (ParamSpec.searched False) are not tuned per
    bucket: left out of the space (and, omitted at their defaults, of the fixed params) unless
    the space names them."""
    from mlabench.backends import gluon as _gluon  # noqa: F401  (registers gluon-splitkv)

    backend = get_backend("gluon-splitkv")
    dims, fixed = search_space(backend, SHAPE)
    names = {d.name for d in dims} | set(fixed)
    assert "num_kv_splits" in names
    assert not names & {"o_split", "lazy_sum", "pdl_prologue"}
    dims, _ = search_space(backend, SHAPE, {"lazy_sum": SpaceRange(low=0, high=1)})
    assert "lazy_sum" in {d.name for d in dims}


def test_tune_takes_12_heads_without_a_model_as_sweep_and_check_do():
    """Issue 25 item 14: tune wanted --heads where sweep and check default to 12 heads."""
    from mlabench.tune.space import TuneConfig, shape_dims

    cfg = TuneConfig(backend="torch-splitkv", buckets=[128])
    assert cfg.heads == 12 and shape_dims(cfg)["num_heads"] == 12
    assert TuneConfig(backend="torch-splitkv", buckets=[128], model="kimi-k3", tp=8).heads is None
    assert TuneConfig(backend="torch-splitkv", buckets=[128], heads=4).heads == 4
