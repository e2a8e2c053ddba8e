"""Random paged MLA decode inputs: q, latent cache with a permuted block table, context lengths.

The cache is never zeros (random normal, scaled so scores are O(1)), and pages are assigned to
requests through a random permutation so that kernels which ignore the block table fail the check.
The cache holds :data:`SPARE_PAGES` pages more than the requests use, at a random place in the
permutation; block-table entries past a request's pages point at one of them.  Every slot no
request may read (the tail of each request's last page, the spare pages) holds NaN in a poisoned
input set (the ones every correctness verdict is taken on), random values otherwise: a kernel that
lets such a slot reach its arithmetic, even multiplied by a zero softmax weight, returns NaN
(0 x NaN = NaN) and fails the check.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mlabench.device import DeviceInfo, current_device, free_memory_bytes
from mlabench.errors import OutOfMemoryError
from mlabench.shapes import MLADecodeShape

_TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def torch_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16`` (and float16, float32)."""
    return _TORCH_DTYPES[name]


@dataclass
class MLADecodeInputs:
    """Tensors of one decode step on one device.

    - ``q``: ``[B * qo_len, H, 576]`` in ``shape.q_dtype`` (row ``b * qo_len + t``: query token
      ``t`` of request ``b``)
    - ``kv_cache``: ``[num_pages, page_size, 1, 576]`` in ``shape.kv_dtype``
    - ``block_table``: ``[B, max_pages]`` int32; entries past a request's pages point at a spare
      page no request uses
    - ``cache_seqlens``: ``[B]`` int32, the context lengths
    - ``poisoned``: whether every unread slot holds NaN (see the module docstring)
    """

    shape: MLADecodeShape
    q: torch.Tensor
    kv_cache: torch.Tensor
    block_table: torch.Tensor
    cache_seqlens: torch.Tensor
    poisoned: bool = False

    @property
    def device(self) -> torch.device:
        return self.q.device

    def new_output(self, num_heads: int | None = None, poison: bool = True) -> torch.Tensor:
        """An output buffer ``[B * qo_len, H, 512]`` in ``q_dtype``, filled with NaN when ``poison``."""
        s = self.shape
        out = torch.empty((s.num_query_tokens, num_heads or s.num_heads, s.v_head_dim),
                          dtype=self.q.dtype, device=self.device)
        if poison:
            out.fill_(float("nan"))
        return out


#: Pages the cache holds beyond the ones the requests use; block-table padding points at them.
SPARE_PAGES = 1


def allocated_kv_cache_bytes(shape: MLADecodeShape) -> int:
    """Bytes of the cache tensor :func:`make_inputs` allocates for ``shape``: its pages and the
    :data:`SPARE_PAGES` more (what a kernel that measures the tensor sees)."""
    return shape.kv_cache_bytes * (shape.num_pages + SPARE_PAGES) // shape.num_pages


def input_bytes(shape: MLADecodeShape) -> int:
    """Bytes :func:`make_inputs` allocates for ``shape`` (cache with its spare pages, q, block
    table, lengths)."""
    max_pages = max(shape.pages_per_request)
    return allocated_kv_cache_bytes(shape) + shape.q_bytes + 4 * shape.batch * (max_pages + 1)


def check_fits(shape: MLADecodeShape, copies: int = 1, device: DeviceInfo | None = None,
               extra_bytes: int = 0, headroom: float = 0.9, repeat: int = 1) -> None:
    """Raise :class:`OutOfMemoryError` unless ``copies`` input sets fit in free memory.

    Checked before any allocation; ``headroom`` keeps 10% free for workspaces and outputs.
    ``repeat`` checks a batch of ``repeat`` times the requests of ``shape`` instead (the inputs
    grow linearly with the requests), so that a batch too large to build is refused from the
    numbers of one copy, before its per-request lengths exist.
    """
    device = device or current_device()
    need = copies * repeat * input_bytes(shape) + extra_bytes
    free = free_memory_bytes(device)
    if need > headroom * free:
        raise OutOfMemoryError(
            f"{shape.label(repeat)}: needs {need / 2**30:,.1f} GiB ({copies} input "
            f"cop{'y' if copies == 1 else 'ies'}), {free / 2**30:,.1f} GiB free on {device.name}"
        )


def make_inputs(shape: MLADecodeShape, device: str | torch.device | None = None,
                seed: int = 0, poison: bool = True) -> MLADecodeInputs:
    """Random inputs for ``shape`` on ``device`` (default: the current device).

    The cache is ``[shape.num_pages + SPARE_PAGES, page_size, 1, 576]``.  With ``poison`` (inputs a
    verdict is taken on) every slot no request may read is NaN; without (timing copies) it holds
    random values like the rest.  Raises :class:`OutOfMemoryError` before allocating when the cache
    would not fit.
    """
    info = current_device()
    dev = torch.device(device or info.torch_device)
    check_fits(shape, device=info if dev.type != "cpu" else _cpu_info())
    gen = torch.Generator(device=dev).manual_seed(seed)
    s = shape
    # Scores q.k ~ N(0, 576) * scale: unit-variance q and k give O(1) logits after the 576**-0.5
    # scale, so softmax is neither one-hot nor flat.  Drawn on the device, in the target dtype,
    # so a multi-GB cache needs no fp32 or host copy.
    q = torch.randn((s.num_query_tokens, s.num_heads, s.head_dim_qk), generator=gen, device=dev,
                    dtype=torch_dtype(s.q_dtype))
    total_pages = s.num_pages + SPARE_PAGES
    kv = torch.randn((total_pages, s.page_size, 1, s.head_dim_qk), generator=gen, device=dev,
                     dtype=torch_dtype(s.kv_dtype))
    perm = torch.randperm(total_pages, generator=gen, device=dev).to(torch.int32)
    spare = perm[s.num_pages:]  # pages no request uses
    max_pages = max(s.pages_per_request)
    block_table = spare[0].repeat(s.batch, max_pages)
    start = 0
    for i, n in enumerate(s.pages_per_request):
        block_table[i, :n] = perm[start:start + n]
        start += n
    if poison:
        kv[spare.long()] = float("nan")
        for i, length in enumerate(s.context_lens):
            last = block_table[i, (length - 1) // s.page_size].long()
            kv[last, (length - 1) % s.page_size + 1:] = float("nan")  # the last page's unused tail
    return MLADecodeInputs(
        shape=s,
        q=q,
        kv_cache=kv,
        block_table=block_table,
        cache_seqlens=torch.tensor(s.context_lens, dtype=torch.int32, device=dev),
        poisoned=poison,
    )


def _cpu_info() -> DeviceInfo:
    return DeviceInfo("cpu", "cpu", "cpu", 1, 0, "cpu", 0)
