"""`compare --from` without the CLI: which recorded records it reads."""

import pytest

from mlabench.errors import MissingResultError, UnknownBackendError
from mlabench.measure.timing import TimingConfig
from mlabench.sweep.compare import backend_families, recorded_records
from mlabench.sweep.config import SweepConfig
from mlabench.sweep.run import run_sweep


def test_recorded_records_filter_by_batch_context_and_backend(tmp_path):
    cfg = SweepConfig(name="t", heads=[12], batch=[1, 2], context_lens=[16, 32], page_size=16,
                      backends=["torch-splitkv"], params={"num_kv_splits": [1]},
                      timing=TimingConfig(warmup_iters=0, min_samples=3, max_samples=3, budget_s=0.01))
    run_sweep(cfg, tmp_path)
    assert len(recorded_records([tmp_path])) == 4
    kept = recorded_records([tmp_path], batch=[2], context_lens=[32])
    assert [(r.batch, r.context_len) for r in kept] == [(2, 32)]
    with pytest.raises(MissingResultError, match="no recorded point matches --backend triton-splitkv: the runs hold "
                                                 "backends torch-splitkv; batch 1, 2; qo_len 1; context 16, 32"):
        recorded_records([tmp_path], backends=["triton-splitkv"])
    with pytest.raises(UnknownBackendError, match="cutlass"):
        recorded_records([tmp_path], backends=["cutlass"])


def test_backend_families_pair_persistent_with_split_kv():
    families = backend_families()
    assert families["triton-persistent"] == "persistent" and families["torch-splitkv"] == "split-kv"


def test_compare_needs_both_paths_with_a_correct_record():
    """Runs holding only split-KV records (a tuning run, or --backend of one kind) or no correct
    record at all: exit 1 with the reason, not a table of dashes."""
    from pathlib import Path

    from mlabench.sweep.compare import check_comparable

    mtp = next((Path(__file__).resolve().parents[2] / "results/h200/deploy/mtp").glob("kimi-*"))
    families = backend_families()
    records = recorded_records([mtp], None, None, None, None)
    check_comparable(records, families)  # both paths ran: no error
    split_only = [r for r in records if r.backend == "gluon-splitkv"]
    with pytest.raises(MissingResultError, match="a padded persistent backend .* have gluon-splitkv$"):
        check_comparable(split_only, families)
    failed = [r.model_copy(update={"status": "incorrect"}) for r in records[:5]]
    with pytest.raises(MissingResultError, match="no correct record among the 5 read"):
        check_comparable(failed, families)
