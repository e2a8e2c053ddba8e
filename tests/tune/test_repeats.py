"""A study that stops at MAX_TRIALS_FACTOR x --trials finished trials, most of them repeats, is
named in a note: a fresh user's review saw `--trials 30` end at 22-27 distinct configurations with
exit 0 and nothing said but a column an 80-column terminal leaves out."""

import optuna
from optuna.distributions import IntDistribution

from mlabench.tune.studies import StudySpec, repeats_note


def _study(counts):
    """An in-memory study with one finished trial per split count in ``counts`` (repeats allowed)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    for n in counts:
        study.add_trial(optuna.trial.create_trial(params={"num_kv_splits": n}, value=1.0,
                                                  distributions={"num_kv_splits": IntDistribution(1, 64)}))
    return study


def test_a_study_stopped_on_repeats_is_named_and_one_that_reached_its_target_is_not():
    specs = [StudySpec(0, 64, 64, name="a", batch=1), StudySpec(64, 256, 256, name="b", batch=2)]
    repeated, whole = _study([1, 2, 3] * 8), _study(range(1, 7))  # 24 = 4 x 6 finished, 3 distinct; 6 of 6
    note = repeats_note([repeated, whole], specs, [6, 6], 4)
    assert note.startswith("1 of 2 studies stopped short of --trials distinct configurations "
                           "(batch 1 context 1-64: 3/6): their sampler kept suggesting launches already measured "
                           "until 4x --trials had run"), note
    # below the cap a study is unfinished, which export refuses (run._incomplete), not this note
    assert repeats_note([_study([1, 2, 3] * 7)], specs[:1], [6], 4) == ""
    assert repeats_note([whole], specs[1:], [6], 4) == ""
