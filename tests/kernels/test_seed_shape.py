"""The seed shape in bf16 through ``run_check``: batch 1, 12 heads (Kimi K3 at TP8), 4096 tokens,
page 64, every GPU-kernel backend available here.

On a GPU the kernels are compiled and their bf16 dot products run on the tensor cores.  Without
one, the Triton kernels run in Triton's interpreter, whose ``tl.dot`` on bf16 operands is wrong:
the kernels then convert the bf16 operands to fp32 before each dot (``UPCAST``), so this checks
their paging, split bounds, merge and bf16 rounding of the output, not bf16 dot arithmetic.  The
library kernels (FlashMLA, the Gluon kernel) skip, saying why.
"""

import pytest

from mlabench.backends import get_backend
from mlabench.shapes import MLADecodeShape
from mlabench.sweep.check import run_check


@pytest.mark.parametrize("backend", ["triton-splitkv", "triton-persistent", "flashmla", "gluon-splitkv"])
def test_seed_shape_bf16_matches_fp32(backend):
    ok, why = get_backend(backend).available()
    if not ok:
        pytest.skip(f"{backend} not available here: {why}")
    shape = MLADecodeShape.create(num_heads=12, context_lens=(4096,), page_size=64)
    assert shape.q_dtype == shape.kv_dtype == "bfloat16"
    records, _ = run_check([shape], [backend], splits=(1, 7, 64, 256))
    assert records and all(r.status == "ok" for r in records), [r.message for r in records]
    assert all(r.verdict.output_shape == [1, 12, 512] and r.verdict.all_finite for r in records)
    if "num_kv_splits" in get_backend(backend).param_names():
        assert sorted(r.params["num_kv_splits"] for r in records) == [1, 7, 64, 256]
