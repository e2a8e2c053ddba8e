"""A record as one row of a run's ``results.csv`` (regenerated from ``results.jsonl``; the JSONL is the
record of truth, the CSV is for spreadsheets)."""

from __future__ import annotations

import json
from typing import Any

from mlabench.records.record import Record

CSV_FIELDS = [
    "backend", "params", "effective_params", "batch", "num_heads", "context_len", "qo_len", "causal", "page_size",
    "kv_dtype", "status", "verdict_passed", "max_abs_err", "timing_mode", "median_us", "iqr_us",
    "min_us", "n_samples", "median_rel_ci", "noisy", "eager_median_us", "refresh_us",
    "achieved_tbps", "floor_us", "pct_of_floor", "cold_cache_copies", "bytes_moved", "workspace_bytes",
    "message", "key", "calls_per_sample", "floor_bandwidth", "clock_below_steady", "rel_rmse", "rel_max_err",
]


def csv_row(r: Record) -> dict[str, Any]:
    s, e, v = r.stats, r.eager_stats, r.verdict
    return {
        "backend": r.backend, "params": json.dumps(r.params, sort_keys=True),
        "effective_params": json.dumps(r.effective_params, sort_keys=True), "batch": r.batch,
        "num_heads": r.num_heads, "context_len": r.context_len, "qo_len": r.qo_len, "causal": r.causal,
        "page_size": r.shape.get("page_size"),
        "kv_dtype": r.shape.get("kv_dtype"), "status": r.status,
        "verdict_passed": v.passed if v else "", "max_abs_err": v.max_abs_err if v else "",
        "rel_rmse": _blank(v.rel_rmse if v else None), "rel_max_err": _blank(v.rel_max_err if v else None),
        "timing_mode": r.timing_mode, "median_us": s.median_us if s else "",
        "iqr_us": s.iqr_us if s else "", "min_us": s.min_us if s else "", "n_samples": s.n if s else "",
        "median_rel_ci": s.median_rel_ci if s else "", "noisy": s.noisy if s else "",
        "eager_median_us": e.median_us if e else "",
        "refresh_us": "" if r.refresh_us is None else r.refresh_us, "achieved_tbps": r.achieved_tbps or "",
        "floor_us": r.floor_us or "", "pct_of_floor": r.pct_of_floor or "",
        "cold_cache_copies": r.cold_cache_copies, "bytes_moved": r.bytes_moved,
        "workspace_bytes": r.workspace_bytes, "message": r.message, "key": r.key,
        "calls_per_sample": s.calls_per_sample if s and s.calls_per_sample else "",
        "floor_bandwidth": r.floor_bandwidth,
        "clock_below_steady": "" if r.clock_below_steady is None else r.clock_below_steady,
    }


def _blank(value: Any) -> Any:
    return "" if value is None else value
