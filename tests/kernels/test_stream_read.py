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


def test_paged_sum_reads_each_page_of_the_table_once_in_table_order():
    from mlabench.kernels.stream_read import PAGED_BLOCK, paged_sum

    dev = current_device().torch_device
    page = 2 * PAGED_BLOCK
    x = torch.rand(5 * page, dtype=torch.float32, device=dev)
    table = torch.tensor([3, 0, 4], dtype=torch.int32, device=dev)  # pages 1 and 2 are not read
    partial = torch.full((3,), float("nan"), dtype=torch.float32, device=dev)
    paged_sum(x, table, page, partial)
    pages = x.view(5, page)
    torch.testing.assert_close(partial.sum(), pages[[3, 0, 4]].sum(), rtol=1e-5, atol=1e-3)
    # 6 blocks over 3 programs: program 0 takes blocks 0 and 3 (page 3's first, page 0's second half)
    torch.testing.assert_close(partial[0], pages[3, :PAGED_BLOCK].sum() + pages[0, PAGED_BLOCK:].sum(),
                               rtol=1e-5, atol=1e-3)


def test_paged_sum_refuses_ragged_pages_and_indices_outside_the_buffer():
    from mlabench.kernels.stream_read import PAGED_BLOCK, paged_sum

    x, out = torch.zeros(4 * PAGED_BLOCK), torch.zeros(1)
    with pytest.raises(ValueError, match="whole number"):
        paged_sum(x, torch.zeros(1, dtype=torch.int32), PAGED_BLOCK + 1, out)
    with pytest.raises(ValueError, match="block table"):
        paged_sum(x, torch.tensor([4], dtype=torch.int32), PAGED_BLOCK, out)
