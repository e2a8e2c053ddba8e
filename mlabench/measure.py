"""Measure one point: prepare, check against the reference on its own inputs, time, record.

Shared by ``check``, ``sweep`` and ``compare``.  :class:`ShapeBench` owns the inputs of one shape
(``copies`` independent sets for a cold cache) and their fp32 reference; :meth:`ShapeBench.run`
turns one (backend, params) into a :class:`~mlabench.results.Record`, whatever happens: an
unsupported shape, a wrong output or an exception is a row with its status, never a gap.
"""

from __future__ import annotations

import traceback
from typing import Any

import torch

from mlabench.backends.base import Backend, PreparedCall
from mlabench.backends.common import timed_us
from mlabench.device import DeviceInfo, current_device
from mlabench.errors import MlabenchError, OutOfMemoryError, UnsupportedShapeError
from mlabench.inputs import MLADecodeInputs, check_fits, input_bytes, make_inputs
from mlabench.kernels.reference import mla_decode_reference
from mlabench.observers import gpu_state
from mlabench.results import Record, point_key, utc_now
from mlabench.shapes import MLADecodeShape
from mlabench.timing import TimingConfig, cold_cache_copies, time_calls
from mlabench.verdict import DEFAULT_ATOL, DEFAULT_RTOL, Verdict, compare_outputs


class ShapeBench:
    """Inputs and reference output of one shape.

    ``copies`` input sets are drawn with seeds ``seed, seed+1, ...``; the reference ``[B * qo_len, H, 512]``
    fp32 is computed for copy 0, on which every correctness verdict is taken.  Raises
    :class:`OutOfMemoryError` when even one copy does not fit.
    """

    def __init__(self, shape: MLADecodeShape, timing: TimingConfig | None = None, seed: int = 0,
                 device: DeviceInfo | None = None, copies: int | None = None):
        self.shape = shape
        self.device = device or current_device()
        self.timing = timing or TimingConfig()
        want = copies or cold_cache_copies(input_bytes(shape), self.device, self.timing)
        while True:  # fewer copies when memory is short; one copy must fit
            try:
                check_fits(shape, copies=want + 1, device=self.device)  # +1: reference scratch
                break
            except OutOfMemoryError:
                if want == 1:
                    check_fits(shape, copies=1, device=self.device)
                    break
                want = max(1, want // 2)
        self.inputs: list[MLADecodeInputs] = [make_inputs(shape, seed=seed + i) for i in range(want)]
        x = self.inputs[0]
        self.reference, _ = mla_decode_reference(x.q, x.kv_cache, x.block_table, list(shape.context_lens),
                                                 shape.scale, shape.kv_lora_rank, qo_len=shape.qo_len,
                                                 causal=shape.causal)

    def check(self, backend: Backend, params: dict[str, Any], atol: float = DEFAULT_ATOL,
              rtol: float = DEFAULT_RTOL) -> tuple[PreparedCall, Verdict]:
        """Prepare on copy 0, run once (output poisoned by prepare) and compare with the reference."""
        call = backend.prepare(self.inputs[0], params)
        out = call.fn()
        if self.device.is_gpu:
            torch.cuda.synchronize()
        return call, compare_outputs(out, self.reference, atol, rtol)

    def run(self, backend: Backend, params: dict[str, Any], *, copy_bw_tbps: float | None, run_id: str,
            atol: float = DEFAULT_ATOL, rtol: float = DEFAULT_RTOL, time_it: bool = True,
            read_bw_tbps: float | None = None) -> Record:
        """Check and time ``backend`` with ``params`` on this shape; always returns a record.

        The floor divides the bytes moved by ``read_bw_tbps`` when given, else by ``copy_bw_tbps``;
        the GPU's clocks, power and temperature are read just before and just after the timing.
        """
        s = self.shape
        base = record_fields(backend.name, params, s, run_id, copy_bw_tbps, read_bw_tbps)
        ok, why = backend.supports(s)
        if not ok:
            return Record(status="unsupported", message=why, **base)
        try:
            call, verdict = self.check(backend, params, atol, rtol)
            base.update(verdict=verdict, effective_params=call.effective_params, setup_us=call.setup_us,
                        workspace_bytes=call.workspace_bytes, refresh_us=refresh_cost_us(call, self.device))
            status = "ok" if verdict.passed else "incorrect"
            message = "" if verdict.passed else _verdict_message(verdict)
            if not time_it:
                return Record(status=status, message=message, **base)
            calls = [call.fn] + [backend.prepare(x, params).fn for x in self.inputs[1:]]
            base["gpu_state_before"] = gpu_state()
            timed = self._time(calls, call.graph_safe)
        except UnsupportedShapeError as exc:
            return Record(status="unsupported", message=str(exc), **base)
        except (MlabenchError, RuntimeError, ValueError, TypeError, AssertionError) as exc:
            if self.device.is_gpu:
                torch.cuda.synchronize()
            msg = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            return Record(status="error", message=msg[:500] + _where(exc), **base)
        stats = timed["stats"]
        achieved = s.min_bytes_moved / (stats.median_us * 1e-6) / 1e12
        return Record(
            status=status, message=(message + timed["note"]).strip(), timing_mode=timed["mode"],
            stats=stats, eager_stats=timed.get("eager"), cold_cache_copies=len(calls),
            achieved_tbps=achieved,
            pct_of_floor=100 * base["floor_us"] / stats.median_us if base["floor_us"] else None,
            gpu_state=gpu_state(), **base,
        )

    def _time(self, calls: list, graph_safe: bool) -> dict[str, Any]:
        cfg = self.timing
        if not self.device.is_gpu:
            return {"mode": "wall", "stats": time_calls(calls, cfg, use_graph=False), "note": ""}
        result: dict[str, Any] = {"note": ""}
        if cfg.eager or not (cfg.graph and graph_safe):
            result["eager"] = time_calls(calls, cfg, use_graph=False)
        if cfg.graph and graph_safe:
            try:
                result.update(mode="graph", stats=time_calls(calls, cfg, use_graph=True))
                return result
            except RuntimeError as exc:  # capture failed: keep the eager time, say why
                torch.cuda.synchronize()
                result["note"] = f" graph capture failed ({str(exc).splitlines()[0][:200]}); eager time"
                if "eager" not in result:
                    result["eager"] = time_calls(calls, cfg, use_graph=False)
        result.update(mode="eager", stats=result.pop("eager"))
        return result


def refresh_cost_us(call: PreparedCall, device: DeviceInfo, reps: int = 5) -> float:
    """Median wall time of ``call.refresh`` (µs, between device synchronisations) over ``reps``
    runs at unchanged lengths; 0.0 when the call has nothing to refresh."""
    if call.refresh is None:
        return 0.0
    dev = torch.device(device.torch_device)
    samples = sorted(timed_us(dev, call.refresh)[1] for _ in range(reps))
    return samples[len(samples) // 2]


def record_fields(backend: str, params: dict[str, Any], shape: MLADecodeShape, run_id: str,
                  copy_bw_tbps: float | None, read_bw_tbps: float | None = None) -> dict[str, Any]:
    """The fields every :class:`Record` of a point carries, whatever its status.

    The floor is ``shape.min_bytes_moved`` over the read bandwidth when given (the ceiling of a
    read-only stream), else over the copy bandwidth.
    """
    floor_bw = read_bw_tbps or copy_bw_tbps
    return dict(
        key=point_key(backend, params, shape.key()), run_id=run_id, backend=backend, params=params,
        shape=shape.key(), batch=shape.batch, num_heads=shape.num_heads,
        context_len=shape.max_context_len, qo_len=shape.qo_len, causal=shape.causal,
        bytes_moved=shape.min_bytes_moved, timestamp=utc_now(),
        copy_bandwidth_tbps=copy_bw_tbps, read_bandwidth_tbps=read_bw_tbps,
        floor_bandwidth="read" if read_bw_tbps else "copy",
        floor_us=shape.floor_us(floor_bw) if floor_bw else None,
    )


def failed_record(backend: str, params: dict[str, Any], shape: MLADecodeShape, run_id: str,
                  copy_bw_tbps: float | None, message: str, read_bw_tbps: float | None = None) -> Record:
    """An ``error`` row for a point that could not even start (e.g. its inputs did not fit)."""
    return Record(status="error", message=message,
                  **record_fields(backend, params, shape, run_id, copy_bw_tbps, read_bw_tbps))


def _verdict_message(v: Verdict) -> str:
    if not v.shape_ok:
        return f"wrong output shape {v.output_shape}"
    if not v.all_finite:
        return "non-finite output (NaN/Inf: unwritten or overflowed elements)"
    return f"max abs err {v.max_abs_err:.3g} over atol={v.atol:g} rtol={v.rtol:g}"


def _where(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    return f" [{tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}]" if tb else ""
