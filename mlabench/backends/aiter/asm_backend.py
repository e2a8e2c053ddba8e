"""AITER MLA decode on ROCm: the persistent ASM path (``aiter-asm``); what both AITER backends share
is in :mod:`mlabench.backends.aiter.common`.

Both backends run AITER's page-size-1 kernels on our paged cache viewed as ``[P * page, 1, 1, 576]``
with ``kv_indices`` that map every token to its row (:func:`~mlabench.backends.aiter.args.page1_kv_layout`),
exact for every page size; ``refresh`` rewrites them (and aiter-asm's work metadata) in place for
new lengths.  Which AITER is installed -- its version, whether its functions still
take what we pass, which behaviour rules it has -- comes from :mod:`mlabench.backends.aiter.probe`,
checked against the manifest written from AITER's source (``backends/aiter/manifest.toml``); what AITER does
with a shape under those rules is in :mod:`mlabench.backends.aiter.rules`.  The Gluon backend is in
:mod:`mlabench.backends.aiter.gluon_backend`.  AITER is imported only when a backend is probed or prepared.
Every index AITER is given is a valid token's row: no page tail or block-table padding is
reachable through its arguments, so cache slots no request may read (NaN in the correctness
check) stay unread unless a kernel reads past its ``kv_indptr`` range, which the check on a GPU
would show.  Where AITER's splits start AITER does not say: both backends report the likely cuts of the count
they run (:func:`mlabench.backends.shared.likely_split_starts`), where the check puts its needles.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from mlabench.backends.aiter.args import page1_cache_view, page1_layout_for_steps
from mlabench.backends.aiter.common import (
    AiterBackend, bf16_mla, installed_aiter, require_aiter, rocm_reason,
)
from mlabench.backends.aiter.probe import AiterInstall, probe_aiter
from mlabench.backends.aiter.rules import asm_nonpersistent_splits, asm_qo_len_reason, asm_wrong_result_reason
from mlabench.backends.base import PreparedCall
from mlabench.backends.registry import register
from mlabench.backends.shared import HEAD_PADDING, likely_split_starts, timed_us
from mlabench.errors import UnsupportedShapeError
from mlabench.inputs import MLADecodeInputs, allocated_kv_cache_bytes
from mlabench.kernels.padding import HeadPadder, padded_heads, slice_heads
from mlabench.kernels.workspace import split_workspace_bytes
from mlabench.shapes import MLADecodeShape

ASM_ARCHS = ("gfx942", "gfx950")
ASM_RULES = ("asm_gate", "asm_kv_offsets")


def aiter_gfx(found: AiterInstall) -> tuple[str | None, str]:
    """The architecture AITER's own ``get_gfx()`` reports (it honours ``GPU_ARCHS``, last entry),
    or ``(None, reason)`` when it fails."""
    try:
        return str(found.functions["get_gfx"]()), ""
    except Exception as exc:  # noqa: BLE001 - AITER raises RuntimeError/KeyError for a bad setup
        return None, f"AITER's get_gfx() failed: {exc}"


def takes_causal(found: AiterInstall) -> bool:
    """Whether the installed ``mla_decode_fwd`` has a ``causal`` argument (v0.1.20 on); an
    uninspectable one is taken not to."""
    return "causal" in found.param_names.get("decode", ())


@register
class AiterAsmBackend(AiterBackend):
    """AITER's persistent ASM MLA decode (``aiter.mla.mla_decode_fwd`` with v1 work metadata).

    ``prepare`` builds the persistent metadata for ``T = padded_heads(H)`` heads (12 -> 16) and the
    page-size-1 addressing for the lengths in ``inputs.cache_seqlens`` (a server's at capture
    time; the shape's lengths only size the block table), untimed: one warm-up call (AITER may
    load or build its metadata module the first time), then the timed one,
    ``setup_us["metadata_us"]``.  ``fn`` pads q into a
    preallocated contiguous ``[B, T, 576]`` buffer, runs ``mla_decode_fwd`` into a preallocated
    ``[B, T, 512]`` buffer and copies the first ``H`` heads into ``out``.  AITER allocates its split
    partials inside ``mla_decode_fwd`` (from the caching allocator; a graph captures them).

    Whether AITER keeps the persistent kernel is AITER's own answer (``_use_persistent_mla_decode``,
    on its ``get_gfx()``) where it has the batch gate; ``workspace_bytes`` counts the partials that
    path writes: the metadata's reduce rows when persistent, ``B * splits`` rows of the
    non-persistent fallback otherwise, ``splits`` being the count AITER takes from the rows of
    ``kv_indices`` (sized for the whole block table).  KV caches whose tensor (spare page
    included) passes 2 GiB are refused on gfx950 where the installed kernels use 32-bit KV offsets.

    Several query tokens per request: q ``[B * qo_len, H, 576]`` is padded per token (12 -> 16
    heads of each), ``qo_indptr`` steps by ``qo_len`` and ``max_seqlen_q = qo_len``; AITER's
    kernels take 1-4 tokens (padded to 4) and mask causally, non-causal only where AITER has the
    argument and a kernel for it (:func:`~mlabench.backends.aiter.rules.asm_qo_len_reason`).
    """

    name = "aiter-asm"
    family = "persistent"
    rule_kinds = ASM_RULES
    summary = "AITER persistent ASM MLA decode (ROCm gfx942/gfx950), heads padded to 16"
    params = (HEAD_PADDING,)

    def available(self) -> tuple[bool, str]:
        why = rocm_reason(ASM_ARCHS)
        found, reason = (None, why) if why else installed_aiter("asm")
        if found is None or reason:
            return False, reason
        gfx, why = aiter_gfx(found)
        if gfx not in ASM_ARCHS:
            archs = os.environ.get("GPU_ARCHS")
            return False, why or (f"needs an AMD {'/'.join(ASM_ARCHS)} GPU; AITER's get_gfx() reports "
                                  f"{gfx}" + (f" (GPU_ARCHS={archs})" if archs else ""))
        return True, ""

    def supports(self, shape: MLADecodeShape) -> tuple[bool, str]:
        ok, reason = bf16_mla(shape)
        if not ok:
            return ok, reason
        if padded_heads(shape.num_heads) > 128:
            return False, f"{shape.num_heads} heads: AITER's ASM decode takes at most 128"
        found = probe_aiter()
        if found is None or "get_gfx" not in found.functions:  # no AITER: nothing to refuse by version
            refusal = asm_qo_len_reason(shape.qo_len, True, "", True)  # nor by GPU: the token count only
            return (False, refusal) if refusal else (True, "")
        gfx = aiter_gfx(found)[0] or ""
        if gfx in found.missing_kernels:  # e.g. a development build without its gfx950 kernels
            return False, (f"this AITER has no {gfx} MLA decode kernel file {found.missing_kernels[gfx]} (not "
                           "installed; the bf16 persistent path for 16-64 heads runs it): unsupported")
        refusal = (asm_qo_len_reason(shape.qo_len, shape.causal, gfx, takes_causal(found))
                   or asm_wrong_result_reason(found.rule("asm_kv_offsets"), gfx, allocated_kv_cache_bytes(shape)))
        return (False, refusal) if refusal else (True, "")

    def prepare(self, inputs: MLADecodeInputs, params: dict[str, Any]) -> PreparedCall:
        found = require_aiter("asm")
        why = self.supports(inputs.shape)[1] or asm_wrong_result_reason(
            found.rule("asm_kv_offsets"), aiter_gfx(found)[0] or "",
            inputs.kv_cache.numel() * inputs.kv_cache.element_size())
        if why:
            raise UnsupportedShapeError(why)
        f = found.functions
        s, dev = inputs.shape, inputs.device
        mode, kernel_heads = params["head_padding"], padded_heads(s.num_heads)
        lens = inputs.cache_seqlens.tolist()  # the lengths now: a server's at capture time
        layout, refill = page1_layout_for_steps(inputs.block_table, lens, s.page_size, s.qo_len)
        kv_view = page1_cache_view(inputs.kv_cache)
        q_dt, kv_dt = inputs.q.dtype, inputs.kv_cache.dtype
        info = f["metadata_info"](s.batch, s.qo_len, kernel_heads, q_dt, kv_dt,
                                  is_sparse=False, fast_mode=True)
        meta, indptr, info_set, r_indptr, r_final, r_partial = (
            torch.empty(size, dtype=dtype, device=dev) for size, dtype in info)

        def build_metadata() -> None:
            # AITER's positional order puts work_info_set before work_indptr.
            f["metadata"](layout.qo_indptr, layout.kv_indptr, layout.kv_last_page_lens, kernel_heads,
                          1, s.causal, meta, info_set, indptr, r_indptr, r_final, r_partial,
                          page_size=1, kv_granularity=16, max_seqlen_qo=s.qo_len,
                          uni_seqlen_qo=s.qo_len, fast_mode=True, dtype_q=q_dt, dtype_kv=kv_dt)

        build_metadata()  # warm-up: AITER loads (or JIT-builds) its metadata module on first use
        _, metadata_us = timed_us(dev, build_metadata)

        def refresh() -> None:  # page-size-1 indices, then the work metadata, in place
            refill(inputs.cache_seqlens.tolist())
            build_metadata()
        out = inputs.new_output()
        padded = kernel_heads != s.num_heads
        o_pad = inputs.new_output(kernel_heads) if padded else out
        q, heads = inputs.q, s.num_heads
        padder = HeadPadder(q, kernel_heads, mode) if padded or not q.is_contiguous() else None
        mask = {"causal": s.causal} if s.qo_len > 1 and takes_causal(found) else {}

        def fn() -> torch.Tensor:
            q_pad = padder() if padder is not None else q
            f["decode"](q_pad, kv_view, o_pad, layout.qo_indptr, layout.kv_indptr, layout.kv_indices,
                        layout.kv_last_page_lens, s.qo_len, page_size=1, nhead_kv=1,
                        sm_scale=s.scale, logit_cap=0.0, work_meta_data=meta, work_indptr=indptr,
                        work_info_set=info_set, reduce_indptr=r_indptr, reduce_final_map=r_final,
                        reduce_partial_map=r_partial, **mask)
            if padded:
                out.copy_(slice_heads(o_pad, heads))
            return out

        effective, partial_rows = self._path(found, s, kernel_heads, q_dt, kv_dt, int(r_indptr[-1]),
                                             layout.kv_indices.shape[0])
        effective.update(head_padding=mode if padded else "none", kernel_heads=kernel_heads,
                         page_size_view=1, num_work_items_max=int(info_set.shape[0]),
                         allocates_per_call=True)
        splits = effective.get("num_kv_splits", params.get("num_kv_splits"))
        return PreparedCall(fn=fn, out=out, effective_params=effective,
                            setup_us={"metadata_us": metadata_us}, refresh=refresh,
                            split_starts=likely_split_starts(lens, splits),
                            workspace_bytes=split_workspace_bytes(partial_rows, s.v_head_dim))

    @staticmethod
    def _path(found: AiterInstall, s: MLADecodeShape, kernel_heads: int, q_dt: torch.dtype,
              kv_dt: torch.dtype, reduce_rows: int, kv_index_rows: int) -> tuple[dict[str, Any], int]:
        """Which kernel AITER runs and the partial rows it writes: ``(effective params, rows)``.
        The fallback's split count is AITER's from the ``kv_index_rows`` rows of ``kv_indices``
        (sized for every token the block table addresses, so a refresh never changes it)."""
        f, gate = found.functions, found.rule("asm_gate")
        gfx = aiter_gfx(found)[0]
        if gate == "batch_gate":
            max_batch = int(f["gate_max_batch"]())
            keep = bool(f["gate"](s.batch, kernel_heads, s.qo_len, q_dt, kv_dt))
        else:  # no gate in this AITER: it stays persistent whatever the batch
            max_batch, keep = None, True
        effective: dict[str, Any] = {
            "persistent": keep, "persistent_gate": gate, "persistent_max_batch": max_batch,
            "aiter_gfx": gfx, "aiter_version": found.version, "aiter_behaves_like": found.behaves_like,
        }
        if keep:
            effective["reduce_partial_rows"] = reduce_rows
            return effective, reduce_rows * s.qo_len * kernel_heads
        splits = asm_nonpersistent_splits(s.batch, kv_index_rows, int(f["get_cu_num"]()))
        effective["num_kv_splits"] = splits
        return effective, s.batch * s.qo_len * splits * kernel_heads

