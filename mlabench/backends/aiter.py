"""AITER MLA decode on ROCm: the persistent ASM path (``aiter-asm``) and the Gluon path (``aiter-gluon``).

Both run AITER's page-size-1 kernels on our paged cache viewed as ``[P * page, 1, 1, 576]`` with
``kv_indices`` that map every token to its row (:func:`mlabench.backends.aiter_args.page1_kv_layout`),
which is exact for every page size; ``refresh`` rewrites them (and aiter-asm's work metadata) in
place for new lengths.  AITER is imported only when a backend is probed or prepared.

Sources (read, not copied): AITER ``aiter/mla.py`` (``mla_decode_fwd``, persistent batch gate),
``aiter/ops/attention.py`` (``get_mla_metadata_info_v1`` / ``get_mla_metadata_v1``),
``aiter/ops/triton/gluon/mla_gluon.py`` and ``mla_decode_gluon.py``.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from types import ModuleType
from typing import Any

import torch

from mlabench.backends.aiter_args import (
    aiter_asm_persistent,
    aiter_gluon_effective_splits,
    aiter_version_is_exact,
    gluon_splits_bounded_by_min_kv,
    min_kv_seq_len_for_splits,
    page1_cache_view,
    page1_layout_for_steps,
    parse_aiter_version,
    persistent_max_batch,
)
from mlabench.backends.base import Backend, ParamSpec, PreparedCall
from mlabench.backends.common import (
    HEAD_PADDING, NUM_KV_SPLITS, accepts_kwarg, check_mla_dims, require, timed_us,
)
from mlabench.backends.registry import register
from mlabench.device import current_device
from mlabench.errors import BackendUnavailableError, UnsupportedShapeError
from mlabench.extras import optional_import, package_version
from mlabench.inputs import MLADecodeInputs
from mlabench.kernels.padding import HeadPadder, padded_heads, slice_heads
from mlabench.kernels.workspace import split_workspace_bytes
from mlabench.shapes import MLADecodeShape

ASM_ARCHS = ("gfx942", "gfx950")
GLUON_ARCHS = ("gfx950",)
GLUON_MODULES = (("aiter.ops.triton.gluon.mla_gluon", "mla_gluon"),
                 ("aiter.ops.triton.gluon.mla_decode_gluon", "mla_decode_gluon"))
#: Distributions that install the ``aiter`` module (ROCm images and source builds name it either way).
AITER_PACKAGES = {"aiter": ("amd-aiter", "aiter")}


def rocm_reason(archs: tuple[str, ...], modules: tuple[str, ...]) -> tuple[bool, str]:
    """``(ok, reason)`` for an AITER backend: ROCm GPU, then the package, then the architecture."""
    want = "/".join(archs)
    if torch.version.hip is None:
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only"
        return False, f"needs ROCm (AMD GPU, {want}); this torch is a {build} build"
    if not torch.cuda.is_available():
        return False, f"needs ROCm (AMD GPU, {want}); torch sees no GPU"
    for name in modules:
        mod, reason = optional_import(name)
        if mod is None:
            return False, reason
    arch = current_device().arch
    if arch not in archs:
        return False, f"needs an AMD {want} GPU; found {arch}"
    return True, ""


def aiter_version_text(aiter_mod: ModuleType | None = None) -> str | None:
    """Installed AITER version: distribution ``amd-aiter``/``aiter``, else ``aiter.__version__``."""
    text = package_version(AITER_PACKAGES["aiter"])
    if text is None and aiter_mod is not None:
        text = getattr(aiter_mod, "__version__", None)
    return str(text) if text else None


def _bf16_only(shape: MLADecodeShape) -> tuple[bool, str]:
    if shape.q_dtype != "bfloat16" or shape.kv_dtype != "bfloat16":
        got = f"{shape.q_dtype}/{shape.kv_dtype}"
        return False, f"AITER MLA decode here runs bf16 q and KV only (got {got})"
    return check_mla_dims(shape, "AITER's MLA decode")


@register
class AiterAsmBackend(Backend):
    """AITER's persistent ASM MLA decode (``aiter.mla.mla_decode_fwd`` with v1 work metadata).

    ``prepare`` builds the persistent metadata for ``T = padded_heads(H)`` heads (12 -> 16) and the
    page-size-1 addressing, untimed (``setup_us["metadata_us"]``).  ``fn`` pads q into a
    preallocated contiguous ``[B, T, 576]`` buffer (:class:`~mlabench.kernels.padding.HeadPadder`),
    runs ``mla_decode_fwd`` into a preallocated ``[B, T, 512]`` buffer and copies the first ``H``
    heads into ``out``.  AITER allocates its split partials inside ``mla_decode_fwd``.
    """

    name = "aiter-asm"
    family = "persistent"
    gpu_kernel = True
    packages = AITER_PACKAGES
    summary = "AITER persistent ASM MLA decode (ROCm gfx942/gfx950), heads padded to 16"
    params = (HEAD_PADDING,)

    def available(self) -> tuple[bool, str]:
        return rocm_reason(ASM_ARCHS, ("aiter", "aiter.mla"))

    def supports(self, shape: MLADecodeShape) -> tuple[bool, str]:
        ok, reason = _bf16_only(shape)
        if not ok:
            return ok, reason
        if padded_heads(shape.num_heads) > 128:
            return False, f"{shape.num_heads} heads: AITER's ASM decode takes at most 128"
        return True, ""

    def prepare(self, inputs: MLADecodeInputs, params: dict[str, Any]) -> PreparedCall:
        aiter = require("aiter")
        mla = require("aiter.mla")
        s = inputs.shape
        dev = inputs.device
        mode = params["head_padding"]
        kernel_heads = padded_heads(s.num_heads)
        layout, refill = page1_layout_for_steps(inputs.block_table, s.context_lens, s.page_size,
                                                s.qo_len)
        kv_view = page1_cache_view(inputs.kv_cache)
        q_dt, kv_dt = inputs.q.dtype, inputs.kv_cache.dtype

        info = aiter.get_mla_metadata_info_v1(s.batch, s.qo_len, kernel_heads, q_dt, kv_dt,
                                              is_sparse=False, fast_mode=True)
        bufs = tuple(torch.empty(size, dtype=dtype, device=dev) for size, dtype in info)
        meta, indptr, info_set, r_indptr, r_final, r_partial = bufs
        extra = ({"dtype_q": q_dt, "dtype_kv": kv_dt}
                 if accepts_kwarg(aiter.get_mla_metadata_v1, "dtype_q") is not False else {})

        def build_metadata() -> None:
            # AITER's positional order puts work_info_set before work_indptr.
            aiter.get_mla_metadata_v1(
                layout.qo_indptr, layout.kv_indptr, layout.kv_last_page_lens, kernel_heads, 1, True,
                meta, info_set, indptr, r_indptr, r_final, r_partial,
                page_size=1, kv_granularity=16, max_seqlen_qo=s.qo_len, uni_seqlen_qo=s.qo_len,
                fast_mode=True, **extra)

        _, metadata_us = timed_us(dev, build_metadata)  # the buffers are allocated outside

        def refresh() -> None:  # page-size-1 indices, then the work metadata, in place
            refill(inputs.cache_seqlens.tolist())
            build_metadata()
        out = inputs.new_output()
        padded = kernel_heads != s.num_heads
        o_pad = inputs.new_output(kernel_heads) if padded else out
        q, H = inputs.q, s.num_heads
        # The kernel takes a contiguous [B, T, 576] q: pad it (or copy a strided q) on every call.
        padder = HeadPadder(q, kernel_heads, mode) if padded or not q.is_contiguous() else None

        def fn() -> torch.Tensor:
            q_pad = padder() if padder is not None else q
            mla.mla_decode_fwd(
                q_pad, kv_view, o_pad, layout.qo_indptr, layout.kv_indptr, layout.kv_indices,
                layout.kv_last_page_lens, s.qo_len, page_size=1, nhead_kv=1, sm_scale=s.scale,
                logit_cap=0.0, work_meta_data=meta, work_indptr=indptr, work_info_set=info_set,
                reduce_indptr=r_indptr, reduce_final_map=r_final, reduce_partial_map=r_partial)
            if padded:
                out.copy_(slice_heads(o_pad, H))
            return out

        gate = persistent_max_batch()
        arch = current_device().arch
        version = aiter_version_text(aiter)
        effective = {
            "head_padding": mode if padded else "none",
            "kernel_heads": kernel_heads,
            "page_size_view": 1,
            "persistent": aiter_asm_persistent(arch, s.q_dtype, s.kv_dtype, kernel_heads, s.qo_len,
                                               s.batch, gate),
            "persistent_max_batch": gate,
            "num_work_items_max": int(info_set.shape[0]),
            "aiter_version": version,
        }
        # AITER's partials: reduce_partial_map.size(0) rows of [T, 512] fp32 plus one fp32 lse each.
        workspace = split_workspace_bytes(int(r_partial.shape[0]) * s.qo_len * kernel_heads,
                                          s.v_head_dim)
        return PreparedCall(fn=fn, out=out, effective_params=effective,
                            setup_us={"metadata_us": metadata_us}, workspace_bytes=workspace,
                            refresh=refresh)


def resolve_gluon() -> tuple[Any, str]:
    """The installed Gluon MLA decode entry: ``(function, name)``; newest API first.

    Raises :class:`BackendUnavailableError` naming what is missing.
    """
    reasons = []
    for module, attr in GLUON_MODULES:
        mod, reason = optional_import(module)
        fn = getattr(mod, attr, None) if mod is not None else None
        if callable(fn):
            return fn, attr
        reasons.append(reason or f"{module} has no {attr}")
    raise BackendUnavailableError("AITER Gluon MLA decode not found: " + "; ".join(reasons))


NUM_KV_SPLITS_GLUON = dataclasses.replace(
    NUM_KV_SPLITS, default=None, high=256,
    help="KV splits; None = AITER's choice. Steerable only where AITER allows (num_kv_splits "
         "argument, or min_kv_seq_len on AITER <= 0.1.19)",
)
MIN_KV_SEQ_LEN = ParamSpec(
    "min_kv_seq_len", int, default=lambda s: s.max_context_len, low=1,
    help="min_kv_seq_len passed to mla_gluon (default: the real max context length; 1 reproduces "
         "vLLM's graph-capture hazard on AITER <= 0.1.19)",
)


@register
class AiterGluonBackend(Backend):
    """AITER's Gluon MLA decode (gfx950): ``mla_gluon`` (or the older ``mla_decode_gluon``).

    q is passed as two views, ``q_nope = q[..., :512]`` and ``q_pe = q[..., 512:]``; the cache as
    rows ``[P * page, 576]`` with ``page_table = kv_indices`` and ``seq_info = kv_indptr``
    (``use_2d_view=False``, AITER's flattened varlen form).  The output is written in place into
    the poisoned ``out``; AITER allocates its split partials inside the call.
    ``effective_params["num_kv_splits"]`` is the split count the installed AITER launches
    (:func:`aiter_gluon_effective_splits`), recorded in every result.
    """

    name = "aiter-gluon"
    family = "split-kv"
    gpu_kernel = True
    packages = AITER_PACKAGES
    summary = "AITER Gluon MLA decode (ROCm gfx950), split-KV with AITER's split heuristic"
    params = (NUM_KV_SPLITS_GLUON, MIN_KV_SEQ_LEN)

    def available(self) -> tuple[bool, str]:
        ok, reason = rocm_reason(GLUON_ARCHS, ("aiter",))
        if not ok:
            return ok, reason
        try:
            resolve_gluon()
        except BackendUnavailableError as exc:
            return False, str(exc)
        return True, ""

    def supports(self, shape: MLADecodeShape) -> tuple[bool, str]:
        ok, reason = _bf16_only(shape)
        if not ok:
            return ok, reason
        h = shape.num_heads
        if h <= 16 or (h in (64, 128) and shape.batch % 64 == 0):
            return True, ""
        return False, (f"{h} heads at batch {shape.batch}: Gluon takes <= 16 heads, "
                       "or 64/128 at batch % 64 == 0")

    def prepare(self, inputs: MLADecodeInputs, params: dict[str, Any]) -> PreparedCall:
        s = inputs.shape
        gluon, api = resolve_gluon()
        aiter_mod, _ = optional_import("aiter")
        version_text = aiter_version_text(aiter_mod)
        version = parse_aiter_version(version_text)
        bounded = gluon_rule_from_source(gluon)
        plan = gluon_split_plan(api, accepts_kwarg(gluon, "num_kv_splits") is True, version,
                                s.batch, s.qo_len, s.num_heads, params["min_kv_seq_len"],
                                params.get("num_kv_splits"), bounded=bounded)
        if api == "mla_decode_gluon" and s.num_heads % 64:
            raise UnsupportedShapeError(
                f"{s.num_heads} heads: the older mla_decode_gluon needs a multiple of 64")
        layout, refill = page1_layout_for_steps(inputs.block_table, s.context_lens, s.page_size,
                                                s.qo_len)
        rows = inputs.kv_cache.view(-1, inputs.kv_cache.shape[-1])  # [P * page, 576]
        lora = s.kv_lora_rank
        q_nope, q_pe = inputs.q[..., :lora], inputs.q[..., lora:]
        out = inputs.new_output()
        kwargs: dict[str, Any] = {"sm_scale": s.scale, "kv_pe_offset": lora, "use_2d_view": False}
        if api == "mla_gluon":
            kwargs["min_kv_seq_len"] = plan["min_kv_seq_len"]
            if plan["pass_num_kv_splits"]:
                kwargs["num_kv_splits"] = plan["num_kv_splits"]
        else:
            kwargs["k_pe"] = rows  # positional in the old API, and its kv_pe_offset defaults to 0

        def fn() -> torch.Tensor:
            gluon(q_nope, q_pe, rows, o=out, page_table=layout.kv_indices,
                  seq_info=layout.kv_indptr, **kwargs)
            return out

        splits = plan["num_kv_splits"]
        effective = {
            "num_kv_splits": splits,
            "min_kv_seq_len": plan["min_kv_seq_len"],
            "split_source": plan["split_source"],
            "split_rule": plan["split_rule"],
            "split_rule_from": "installed source" if bounded is not None else "version",
            "api": api,
            "aiter_version": version_text,
            "aiter_version_exact": aiter_version_is_exact(version_text),
            "page_size_view": 1,
        }
        # Split partials (output dtype) plus fp32 lse, written then read back; none with 1 split.
        partial_rows = s.batch * s.qo_len * s.num_heads * splits
        workspace = 0 if splits == 1 else split_workspace_bytes(partial_rows, lora, out.element_size())
        # The split count (and min_kv_seq_len) stay what prepare chose: a host-side choice.
        return PreparedCall(fn=fn, out=out, effective_params=effective, workspace_bytes=workspace,
                            refresh=lambda: refill(inputs.cache_seqlens.tolist()))


def gluon_split_plan(api: str, takes_num_kv_splits: bool, version: tuple[int, int, int] | None,
                     batch: int, qo_len: int, heads: int, min_kv_seq_len: int,
                     num_kv_splits: int | None, bounded: bool | None = None) -> dict[str, Any]:
    """What to pass to the Gluon entry and which split count results from it.

    Returns ``{"num_kv_splits": effective, "min_kv_seq_len": passed, "pass_num_kv_splits": bool,
    "split_source": str, "split_rule": str}``.  ``bounded`` overrides the version test of
    :func:`aiter_gluon_effective_splits` (see :func:`gluon_rule_from_source`).  A requested
    ``num_kv_splits`` goes to AITER as its own argument where the function takes one, else through
    ``min_kv_seq_len = n * 64`` where the split count is bounded by it (AITER <= 0.1.19).
    Raises :class:`UnsupportedShapeError` when the installed AITER cannot be steered.
    """
    if api == "mla_decode_gluon":
        if num_kv_splits not in (None, 1):
            raise UnsupportedShapeError("the older mla_decode_gluon runs 1 split only")
        return {"num_kv_splits": 1, "min_kv_seq_len": min_kv_seq_len, "pass_num_kv_splits": False,
                "split_source": "fixed (mla_decode_gluon)", "split_rule": "one split"}
    if bounded is None:
        bounded = gluon_splits_bounded_by_min_kv(version)
    rule = "bounded by min_kv_seq_len" if bounded else "fixed by batch and heads"
    if num_kv_splits is not None and takes_num_kv_splits:
        return {"num_kv_splits": num_kv_splits, "min_kv_seq_len": min_kv_seq_len,
                "pass_num_kv_splits": True, "split_source": "num_kv_splits argument",
                "split_rule": rule}
    if num_kv_splits is not None:
        if not bounded:
            shown = ".".join(map(str, version)) if version else "unknown"
            raise UnsupportedShapeError(
                f"AITER {shown} fixes the Gluon split count; num_kv_splits cannot be steered")
        min_kv_seq_len = min_kv_seq_len_for_splits(num_kv_splits)
        source = "min_kv_seq_len steering"
    else:
        source = "library heuristic"
    effective = aiter_gluon_effective_splits(version, batch, qo_len, heads, min_kv_seq_len,
                                             bounded=bounded)
    return {"num_kv_splits": effective, "min_kv_seq_len": min_kv_seq_len,
            "pass_num_kv_splits": False, "split_source": source, "split_rule": rule}


_BOUNDED_RULE = re.compile(r"cdiv\(\s*min_kv_seq_len")


def gluon_rule_from_source(fn: Any) -> bool | None:
    """Read the installed Gluon wrapper: True when its split count uses ``cdiv(min_kv_seq_len, ...)``.

    AITER's history does not follow release numbers cleanly (commits read on GitHub after the
    v0.1.20 change still bound the bh16 split count by ``min_kv_seq_len``), so the installed
    source, when readable, decides; None when it cannot be read (then the version decides).
    """
    try:
        text = inspect.getsource(fn)
    except (OSError, TypeError):
        return None
    return bool(_BOUNDED_RULE.search(text))
