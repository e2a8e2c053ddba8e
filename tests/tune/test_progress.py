"""The live tune table's "best params" column shows what the best trial launched at the study's
lengths, not the sampled parameters: a tokens_per_split rule's sampled num_kv_splits is only a cap
(a fresh user read num_kv_splits=125 where 16 and 32 splits had run)."""

import optuna
from optuna.distributions import IntDistribution

from mlabench.tune.studies import StudySpec, study_progress


def _study(trials):
    """An in-memory study of finished trials given as (value, params, launched or None)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    for value, params, launched in trials:
        attrs = {} if launched is None else {"launched": launched}
        study.add_trial(optuna.trial.create_trial(
            params=params, value=value, user_attrs=attrs,
            distributions={k: IntDistribution(1, 4096) for k in params}))
    return study


def _launch(splits, **others):
    return {"num_kv_splits": splits, "num_stages": 2, **others}


def test_best_params_are_the_counts_the_rule_launched_in_length_order():
    rule = {"num_kv_splits": 125, "tokens_per_split": 512}
    study = _study([(9.0, {"num_kv_splits": 8}, [[4096, _launch(8)], [8192, _launch(8)]]),
                    (7.0, rule, [[8192, _launch(16)], [4096, _launch(8)]])])
    p = study_progress(study, StudySpec(2048, 8192, 8192, name="s", batch=1), 10)
    assert p.best_us == 7.0
    assert p.best_params == {"num_kv_splits": "8/16"}  # the cap 125 never launched; fixed params left out


def test_one_count_at_every_length_is_shown_once_and_an_old_trial_shows_its_params():
    same = _study([(5.0, {"num_kv_splits": 32}, [[4096, _launch(32)], [8192, _launch(32)]])])
    assert study_progress(same, StudySpec(2048, 8192, 8192, name="s", batch=1), 4).best_params == {
        "num_kv_splits": 32}
    old = _study([(5.0, {"num_kv_splits": 24, "tokens_per_split": 256}, None)])
    assert study_progress(old, StudySpec(2048, 8192, 8192, name="s", batch=1), 4).best_params == {
        "num_kv_splits": 24, "tokens_per_split": 256}
