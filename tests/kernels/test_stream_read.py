"""The Triton streaming read behind the read-bandwidth ceiling sums what it reads (interpreter on
the CPU, compiled on a GPU)."""

import pytest
import torch

from mlabench.device import current_device
from mlabench.kernels.stream_read import STREAM_BLOCK, stream_sum


def test_stream_sum_partials_add_up_to_the_sum_of_whole_blocks():
    dev = current_device().torch_device
    x = torch.rand(3 * STREAM_BLOCK + 100, dtype=torch.float32, device=dev)  # a ragged tail is left out
    partial = torch.full((2,), float("nan"), dtype=torch.float32, device=dev)
    stream_sum(x, partial)
    assert torch.isfinite(partial).all()
    torch.testing.assert_close(partial.sum(), x[: 3 * STREAM_BLOCK].sum(), rtol=1e-5, atol=1e-3)
    # program 0 takes blocks 0 and 2, program 1 block 1: the grid stride covers each block once
    torch.testing.assert_close(partial[1], x[STREAM_BLOCK:2 * STREAM_BLOCK].sum(), rtol=1e-5, atol=1e-3)


def test_stream_sum_refuses_other_dtypes_and_short_buffers():
    with pytest.raises(ValueError):
        stream_sum(torch.zeros(STREAM_BLOCK, dtype=torch.float16), torch.zeros(1))
    with pytest.raises(ValueError):
        stream_sum(torch.zeros(STREAM_BLOCK - 1), torch.zeros(1))
