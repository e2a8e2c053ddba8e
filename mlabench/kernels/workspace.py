"""Bytes of the split partials a split-KV or persistent MLA decode writes and reads back.

Both kinds of kernel cut a request's context into pieces; each piece writes a partial output row of
``v_head_dim`` values (fp32 in every kernel here, the output dtype in some libraries) plus one fp32
log-sum-exp, and a merge step reads them all back.  That traffic comes on top of the latent cache
read, and at short context it can exceed it: at 12 heads, 132 splits write about 6.5 MB of fp32
partials, 5.5x the 1.2 MB of a 1K-token bf16 cache.

No Triton here: the portable backends and the library adapters import this module too.
"""

from __future__ import annotations

LSE_BYTES = 4  #: one fp32 log-sum-exp per partial row


def split_workspace_bytes(rows: int, v_head_dim: int = 512, partial_elem_bytes: int = 4) -> int:
    """Bytes written then read for ``rows`` partial rows: ``2 * rows * (v_head_dim * elem + 4)``.

    Args:
        rows: partial rows, i.e. slots x heads x query tokens (e.g. ``B * S * H`` for S splits).
        v_head_dim: width of one partial output row (kv_lora_rank, 512).
        partial_elem_bytes: bytes per partial output element (4 for fp32 partials).

    Raises ValueError for negative ``rows`` or non-positive widths.
    """
    if rows < 0 or v_head_dim < 1 or partial_elem_bytes < 1:
        raise ValueError(f"need rows >= 0 and positive widths, got {rows}, {v_head_dim}, "
                         f"{partial_elem_bytes}")
    return 2 * rows * (v_head_dim * partial_elem_bytes + LSE_BYTES)


def splitkv_workspace_shapes(batch: int, rows: int, num_kv_splits: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of a split-KV call's fp32 partials: ``([B * S, R, 512], [B * S, R])``, slot
    ``b * S + split``, ``S`` the most splits a request may take (a fixed count, or a split policy's
    largest), ``R`` the rows of a request (``qo_len * H``).  Both split-KV kernels use them."""
    slots = batch * num_kv_splits
    return (slots, rows, 512), (slots, rows)


def check_workspace(partial_out, partial_lse, batch: int, rows: int, num_kv_splits: int) -> None:
    """ValueError unless ``partial_out`` / ``partial_lse`` hold at least the
    :func:`splitkv_workspace_shapes` of a call (more slots are fine, other rows are not)."""
    o_shape, l_shape = splitkv_workspace_shapes(batch, rows, num_kv_splits)
    if (partial_out.shape[0] < o_shape[0] or tuple(partial_out.shape[1:]) != o_shape[1:]
            or partial_lse.shape[0] < l_shape[0] or tuple(partial_lse.shape[1:]) != l_shape[1:]):
        raise ValueError(f"workspace too small for B={batch} rows={rows} splits={num_kv_splits}")
