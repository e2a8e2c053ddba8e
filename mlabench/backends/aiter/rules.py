"""What AITER's MLA decode does with a shape, per rule variant: pure functions, no AITER import.

The variants are named in ``backends/aiter/manifest.toml`` (where each was read in ROCm/aiter); which one an
installed AITER has is decided by :mod:`mlabench.backends.aiter.probe`.  Here:

- Gluon (``mla_gluon`` / ``mla_decode_gluon``, gfx950): the regime a head count falls in, the
  split count AITER launches, the splits each request runs, the inputs AITER refuses
  (:func:`gluon_plan`), and the split-partial bytes (:func:`gluon_workspace_bytes`).
- ASM (``mla_decode_fwd``): the persistent-kernel batch gate (:func:`asm_keeps_persistent`), the
  split count of the non-persistent fallback (:func:`asm_nonpersistent_splits`).
- Known crashes and wrong results by KV-cache size (:func:`gluon_crash_reason`,
  :func:`asm_wrong_result_reason`).
- Several query tokens per request (speculative decoding, MTP): what each path takes
  (:func:`asm_qo_len_reason`, :func:`gluon_qo_len_reason`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from mlabench.errors import UnsupportedShapeError
from mlabench.kernels.workspace import split_workspace_bytes
from mlabench.policy.heuristics import GLUON_BLOCK_N, GLUON_WAVE, gluon_bh16_cap

#: XCDs AITER assumes on gfx942/gfx950 (``get_num_xcds``).
GLUON_NUM_XCDS = 8
#: Head counts of the Gluon "bh64" regime (64-head blocks).
GLUON_BH64_HEADS = (64, 128)
#: Batches AITER's bh64 regime takes before v0.1.18 (later: any multiple of 64).
GLUON_BH64_LISTED_BATCHES = (64, 128, 256)
#: KV-cache size past which 32-bit KV offsets overflow (AITER's ``within_2gb`` bound).
KV_OFFSET_LIMIT_BYTES = 1 << 31
#: Query tokens per request of AITER's bf16 16-head persistent ASM kernels: ``asm_mla.cu`` pads
#: 1-4 to 4 (``config_max_seqlen_q = 4; // padding it``, :282 @ 0730b33fcf (v0.1.16), :877 @
#: fc2e5d57fb (v0.1.20)) and leaves more to a kernel lookup that gfx942 cannot answer
#: (``hsa/gfx942/mla/mla_asm.csv`` lists qSeqLen 4 only: "cannot find suitable kernel").
ASM_MAX_QO_LEN = 4
#: ``get_meta_param``'s per-split overhead term and its split-count search range (bf16).
ASM_SPLIT_OVERHEAD = 84.1
ASM_MAX_SPLITS = 16


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class GluonPlan:
    """What one Gluon call does for a batch.

    - ``regime``: ``"bh16"`` (16-head blocks) or ``"bh64"`` (64/128 heads).
    - ``launched``: AITER's ``NUM_KV_SPLITS`` (the grid's split axis; a budget under ``budget``).
    - ``per_request``: splits each request actually runs, in batch order.
    - ``min_kv_seq_len``: the value passed to AITER.
    - ``steered``: True when ``min_kv_seq_len`` was raised to reach a requested split count.
    - ``on_device``: True under the budget rule: each request's count is computed in the kernel
      from the lengths it reads (:func:`gluon_step_plan` gives it for a step's lengths).
    """

    regime: str
    launched: int
    per_request: tuple[int, ...]
    min_kv_seq_len: int
    steered: bool = False
    on_device: bool = False

    @property
    def splits_run(self) -> int | list[int]:
        """The split count every request runs, or the per-request list where they differ."""
        first = self.per_request[0]
        return first if all(n == first for n in self.per_request) else list(self.per_request)


def gluon_regime(num_heads: int, max_bh16_heads: int) -> str | None:
    """``"bh64"`` for 64/128 heads, ``"bh16"`` for 1..``max_bh16_heads``, else None."""
    if num_heads in GLUON_BH64_HEADS:
        return "bh64"
    return "bh16" if 1 <= num_heads <= max_bh16_heads else None


def gluon_bh64_splits(batch: int, num_heads: int, qo_len: int = 1) -> int:
    """bh64 split count, every AITER version: ``next_pow2(cdiv(256, 8 * ceil(H/64) * qlen * (B // 8)))``.

    Batch 64: 2 for 128 heads, 4 for 64 heads; batch 128 with 128 heads: 1.
    """
    base_grid = GLUON_NUM_XCDS * _cdiv(num_heads, 64) * qo_len * (batch // GLUON_NUM_XCDS)
    return max(1, _next_pow2(_cdiv(GLUON_WAVE, max(base_grid, 1))))


def gluon_bh64_min_kv_required(num_kv_splits: int) -> int:
    """AITER asserts ``min_kv_seq_len`` above this (``N * (3 * 64 + N)``: num_iter >= 3 per split)."""
    return num_kv_splits * (3 * GLUON_BLOCK_N + num_kv_splits)


def gluon_bh16_active(context_len: int, launched: int) -> int:
    """Splits a request of ``context_len`` tokens runs under the budget rule (AITER >= v0.1.20).

    ``min(cdiv(L, max(64, L // N)), N)``: the kernel gives each split ``max(64, L // N)`` tokens
    and the last split the rest.  1024 tokens with N = 256 run 16 splits.
    """
    per_split = max(GLUON_BLOCK_N, context_len // launched)
    return min(_cdiv(context_len, per_split), launched)


def gluon_plan(context_lens: Sequence[int], num_heads: int, rules: dict[str, str | None],
               min_kv_seq_len: int | None = None, num_kv_splits: int | None = None,
               qo_len: int = 1) -> GluonPlan:
    """What AITER's Gluon decode launches and runs for this batch, or why it refuses it.

    ``rules`` maps the manifest's rule kinds (``gluon_bh16_splits``, ``gluon_bh16_max_heads``,
    ``gluon_bh64``) to the installed variants (None: undetermined).  ``min_kv_seq_len`` is AITER's
    "shortest context" argument (default: the real shortest); values above the shortest context
    are refused, since AITER's bh64 assertion guarding ``num_iter >= 3`` would no longer hold.
    ``num_kv_splits`` asks for a split count: only the bounded bh16 rule can be steered (through
    ``min_kv_seq_len = n * 64``, while every request holds at least ``n`` tokens).

    Raises :class:`UnsupportedShapeError` with AITER's own reason for shapes it refuses.
    """
    lens = [int(n) for n in context_lens]
    shortest, batch = min(lens), len(lens)
    min_kv = shortest if min_kv_seq_len is None else int(min_kv_seq_len)
    if min_kv > shortest:
        raise UnsupportedShapeError(
            f"min_kv_seq_len {min_kv} is above the shortest context ({shortest}); AITER takes it "
            "as the shortest and its bh64 num_iter >= 3 check would no longer hold")
    max_heads = rules.get("gluon_bh16_max_heads")
    regime = gluon_regime(num_heads, int(max_heads) if max_heads else 16)
    if regime is None:
        raise UnsupportedShapeError(
            f"{num_heads} heads: this AITER's Gluon MLA decode takes 1-{max_heads or 16} or 64/128 heads")
    if regime == "bh64":
        return _bh64_plan(lens, num_heads, rules.get("gluon_bh64"), min_kv, num_kv_splits, qo_len)
    rule = rules.get("gluon_bh16_splits")
    if rule is None:
        raise UnsupportedShapeError("cannot tell this AITER's Gluon split rule (see mlabench backends)")
    cap = gluon_bh16_cap(batch, num_heads, qo_len)
    if rule == "budget":
        if num_kv_splits is not None:
            raise UnsupportedShapeError(
                f"this AITER fixes the Gluon split budget at {cap} and partitions on the GPU; "
                "num_kv_splits cannot be steered")
        return GluonPlan("bh16", cap, tuple(gluon_bh16_active(n, cap) for n in lens), min_kv, on_device=True)
    steered = num_kv_splits is not None
    if steered:
        if num_kv_splits > shortest:
            raise UnsupportedShapeError(
                f"num_kv_splits {num_kv_splits} needs every request to hold that many tokens "
                f"(shortest: {shortest}); AITER would run empty splits")
        min_kv = num_kv_splits * GLUON_BLOCK_N
    launched = max(1, min(cap, _cdiv(min_kv, GLUON_BLOCK_N)))
    return GluonPlan("bh16", launched, (launched,) * batch, min_kv, steered)


def gluon_step_plan(plan: GluonPlan, context_lens: Sequence[int]) -> GluonPlan:
    """What a call prepared as ``plan`` runs at a later step's ``context_lens``: under the budget
    rule each request's count follows its length (computed in the kernel); otherwise every count
    stays what was chosen on the host when the call was prepared (frozen by a graph too)."""
    if not plan.on_device:
        return plan
    return replace(plan, per_request=tuple(gluon_bh16_active(int(n), plan.launched)
                                                       for n in context_lens))


def _bh64_plan(lens: list[int], num_heads: int, rule: str | None, min_kv: int,
               num_kv_splits: int | None, qo_len: int) -> GluonPlan:
    batch = len(lens)
    if rule is None:
        raise UnsupportedShapeError("cannot tell this AITER's Gluon bh64 (64/128-head) rule")
    if batch < GLUON_NUM_XCDS:  # AITER's split count divides by 8 * ceil(H/64) * qlen * (B // 8)
        raise UnsupportedShapeError(
            f"AITER's Gluon bh64 regime ({num_heads} heads) fails at batch {batch} with "
            f"ZeroDivisionError: its split count divides 256 by {GLUON_NUM_XCDS} * ceil(H/64) * "
            f"qlen * (batch // {GLUON_NUM_XCDS}), 0 below batch {GLUON_NUM_XCDS}, before its "
            "batch-size check")
    if rule == "listed" and batch not in GLUON_BH64_LISTED_BATCHES:
        raise UnsupportedShapeError(
            f"AITER's Gluon bh64 regime ({num_heads} heads) requires batch_size in (64, 128, 256), "
            f"got {batch}")
    if rule == "multiple_of_64" and batch % 64:
        raise UnsupportedShapeError(
            f"AITER's Gluon bh64 regime ({num_heads} heads) requires batch_size divisible by 64, "
            f"got {batch}")
    launched = gluon_bh64_splits(batch, num_heads, qo_len)
    required = gluon_bh64_min_kv_required(launched)
    if min_kv <= required:
        raise UnsupportedShapeError(
            f"AITER's Gluon bh64 regime requires min_kv_seq_len > {required} "
            f"(NUM_KV_SPLITS={launched}), got {min_kv}")
    if num_kv_splits is not None and num_kv_splits != launched:
        raise UnsupportedShapeError(
            f"AITER fixes the bh64 split count at {launched} for batch {batch} and {num_heads} "
            "heads (min_kv_seq_len does not change it); num_kv_splits cannot be steered")
    return GluonPlan("bh64", launched, (launched,) * batch, min_kv)


def gluon_workspace_bytes(plan: GluonPlan, num_heads: int, v_head_dim: int = 512,
                          out_bytes: int = 2, qo_len: int = 1) -> int:
    """Split partials a Gluon call writes and reads back: per running split ``[H, 512]`` in the
    output dtype plus one fp32 lse per head, twice (stage 1 writes, stage 2 reads); none when
    AITER launches one split (stage 1 writes the output directly)."""
    if plan.launched == 1:
        return 0
    return split_workspace_bytes(sum(plan.per_request) * qo_len * num_heads, v_head_dim, out_bytes)


# ---- ASM ------------------------------------------------------------------------------------------
def asm_keeps_persistent(gate_rule: str | None, gfx: str, q_dtype: str, kv_dtype: str,
                         kernel_heads: int, qo_len: int, batch: int, max_batch: int) -> bool:
    """Whether ``mla_decode_fwd`` keeps its persistent kernel (work metadata passed, no
    ``num_kv_splits``).  Under ``batch_gate`` (AITER >= ac90d5c, 2026-07-17) it falls back to the
    non-persistent kernel on gfx950 (as AITER's ``get_gfx`` reports it) for bf16 q and KV, 16
    kernel heads and one query token once ``batch >= max_batch`` (``max_batch <= 0``: never);
    under ``none`` it stays persistent."""
    if gate_rule != "batch_gate":
        return True
    profile = (gfx == "gfx950" and q_dtype == "bfloat16" and kv_dtype == "bfloat16"
               and kernel_heads == 16 and qo_len == 1)
    return not profile or max_batch <= 0 or batch < max_batch


def asm_nonpersistent_splits(batch: int, total_kv_tokens: int, cu_num: int) -> int:
    """Split count of ``mla_decode_fwd``'s non-persistent path for bf16 (AITER's ``get_meta_param``).

    The ``i`` in 1..16 maximising ``B*i / (ceil(B*i / CUs) * CUs) * avg / (avg + 84.1 * i)`` with
    ``avg = total KV tokens / B`` (the first on ties): CU occupancy against per-split overhead.
    AITER takes ``total_kv_tokens`` from ``kv_indices.shape[0]`` (``aiter/mla.py:294`` @ d6de77692f
    (v0.1.18), ``:572`` @ e4048607a5), the rows of the tensor it is given, not the tokens in use:
    pass that.
    """
    avg = total_kv_tokens / batch
    best, best_score = 1, -1.0
    for i in range(1, ASM_MAX_SPLITS + 1):
        work = batch * i
        score = work / (_cdiv(work, cu_num) * cu_num) * avg / (avg + ASM_SPLIT_OVERHEAD * i)
        if score > best_score:
            best, best_score = i, score
    return best


# ---- known crashes and wrong results --------------------------------------------------------------
def gluon_crash_reason(over_2gib_rule: str | None, kv_cache_bytes: int) -> str | None:
    """Why a Gluon call must not launch at this KV-cache size, or None.  Before ROCm/aiter#4474
    (v0.1.19.post1) a cache over 2 GiB takes a global_load path whose 32-bit KV offsets overflow:
    a segfault that would end the whole run.  ``kv_cache_bytes`` is the cache tensor AITER is
    given (it measures ``kv_c.shape[0] * kv_c.stride(0) * kv_c.element_size()``), spare pages
    included (:func:`mlabench.inputs.allocated_kv_cache_bytes`), not the bytes the shape uses."""
    if kv_cache_bytes <= KV_OFFSET_LIMIT_BYTES or over_2gib_rule == "int64":
        return None
    gib = kv_cache_bytes / 2**30
    if over_2gib_rule == "int32_overflow":
        return (f"KV cache {gib:.2f} GiB > 2 GiB: this AITER's Gluon decode overflows 32-bit KV "
                "offsets there and segfaults (fixed by ROCm/aiter#4474, v0.1.19.post1); refused")
    return (f"KV cache {gib:.2f} GiB > 2 GiB and this AITER's Gluon 2 GiB path is unrecognised "
            "(a segfault before ROCm/aiter#4474); refused")


def asm_wrong_result_reason(offsets_rule: str | None, gfx: str, kv_cache_bytes: int) -> str | None:
    """Why an ASM call must not launch at this KV-cache size, or None.  Before ROCm/aiter#4452
    (v0.1.19.post2) the gfx950 ASM MLA decode kernels compute KV byte offsets in 32 bits: wrong
    results once they pass 2 GiB.  ``kv_cache_bytes``: the whole cache tensor, spare pages
    included (a token's row may lie past the pages the shape counts)."""
    if gfx != "gfx950" or kv_cache_bytes <= KV_OFFSET_LIMIT_BYTES or offsets_rule == "int64":
        return None
    gib = kv_cache_bytes / 2**30
    known = "do" if offsets_rule == "int32" else "may (unrecognised kernel build)"
    return (f"KV cache {gib:.2f} GiB > 2 GiB: this AITER's gfx950 ASM decode kernels {known} "
            "compute KV offsets in 32 bits, wrong past 2 GiB (fixed by ROCm/aiter#4452, "
            "v0.1.19.post2); refused")


# ---- several query tokens per request -----------------------------------------------------------
def asm_qo_len_reason(qo_len: int, causal: bool, gfx: str, takes_causal: bool) -> str | None:
    """Why ``mla_decode_fwd`` cannot run ``qo_len`` query tokens per request (bf16, 16 kernel
    heads, persistent) under this mask, or None.

    1-4 tokens run the kernel built for 4 (:data:`ASM_MAX_QO_LEN`); more are refused: gfx942 has no
    kernel for them, and the gfx950 routing of 16 heads to its 32/64-head kernels is not claimed
    here.  Non-causal needs ``mla_decode_fwd``'s ``causal`` argument (``takes_causal``, from
    v0.1.20; before it every decode kernel masks causally) and a non-causal kernel, which gfx950
    has (``msk0`` in ``hsa/gfx950/mla/mla_asm.csv`` @ fc2e5d57fb) and gfx942 has not.
    """
    if qo_len == 1:
        return None
    if qo_len > ASM_MAX_QO_LEN:
        return (f"qo_len {qo_len}: AITER's bf16 16-head persistent ASM MLA decode has kernels for 1-"
                f"{ASM_MAX_QO_LEN} query tokens (padded to {ASM_MAX_QO_LEN}, asm_mla.cu); none for more on "
                "gfx942 ('cannot find suitable kernel'), and gfx950's routing to its 32/64-head kernels "
                "is not claimed here")
    if causal:
        return None
    if not takes_causal:
        return (f"non-causal qo_len {qo_len}: this AITER's mla_decode_fwd has no causal argument "
                "(added in v0.1.20); its decode kernels apply the causal mask")
    if gfx != "gfx950":
        return (f"non-causal qo_len {qo_len}: AITER has no non-causal (msk0) bf16 16-head persistent "
                f"kernel for {gfx or 'this GPU'} (hsa/gfx942/mla/mla_asm.csv); asm_mla.cu finds no kernel")
    return None


def gluon_qo_len_reason(rule: str | None, qo_len: int, causal: bool) -> str | None:
    """Why AITER's Gluon decode cannot run ``qo_len`` query tokens per request under this mask,
    or None.  Under ``mtp_4d`` (v0.1.19 on, ROCm/aiter#3890) 4-D queries ``[B, qlen, H, D]`` take
    any ``qlen``, always under the causal tail mask; under ``one_token`` queries are 3-D."""
    if qo_len == 1:
        return None
    if rule == "mtp_4d":
        return None if causal else (
            f"non-causal qo_len {qo_len}: AITER's Gluon multi-token path always applies the causal "
            "tail mask (query position t sees KV [0, L - qlen + t])")
    if rule == "one_token":
        return (f"qo_len {qo_len}: this AITER's Gluon MLA decode takes one query token per request "
                "(3-D q); its 4-D multi-token entry came with v0.1.19 (ROCm/aiter#3890)")
    return f"qo_len {qo_len}: cannot tell whether this AITER's Gluon entry takes 4-D multi-token queries"
