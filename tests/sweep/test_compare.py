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
