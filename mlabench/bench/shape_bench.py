"""Measure one point: prepare, check against the reference on its own inputs, time, record.

Shared by ``check``, ``sweep``, ``tune`` (trials and validation) and scripts.  :class:`ShapeBench` owns the inputs of one shape
(``copies`` independent sets for a cold cache; copy 0, the one verdicts are taken on, is poisoned
with NaN wherever no request may read) and their fp32 references; :meth:`ShapeBench.run` turns one
(backend, params) into a :class:`~mlabench.records.record.Record`, whatever happens: an unsupported shape,
a wrong output or an exception is a row with its status, never a gap.
"""

from __future__ import annotations

import traceback
from typing import Any

import torch

from mlabench.backends.base import Backend, PreparedCall
from mlabench.backends.shared import timed_us
from mlabench.bench.point import record_fields, speed_fields
from mlabench.checks.input_sets import VerificationCase, find_missing, make_case, split_starts_for, with_reference
from mlabench.checks.verdict import CheckConfig, Verdict, compare_outputs, worst_verdict
from mlabench.device import DeviceInfo, current_device
from mlabench.errors import MlabenchError, OutOfMemoryError, UnsupportedShapeError
from mlabench.inputs import MLADecodeInputs, check_fits, input_bytes, make_inputs
from mlabench.measure.observers import ClockSampler, gpu_state
from mlabench.measure.timing import TimingConfig, cold_cache_copies, time_calls
from mlabench.records.record import Record
from mlabench.shapes import MLADecodeShape


class ShapeBench:
    """Inputs and reference outputs of one shape.

    ``copies`` input sets are drawn with seeds ``seed, seed+1, ...``; copy 0 is poisoned (NaN in
    every slot no request may read) and every correctness verdict is taken on it, on each input
    set of the check (:mod:`mlabench.checks.input_sets`), against that set's fp32 reference
    ``[B * qo_len, H, 512]``.  Raises :class:`OutOfMemoryError` when even one copy does not fit,
    and RuntimeError when the reference of the random set is not finite.
    """

    def __init__(self, shape: MLADecodeShape, timing: TimingConfig | None = None, seed: int = 0,
                 device: DeviceInfo | None = None, copies: int | None = None):
        self.shape = shape
        self.seed = seed
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
        self.inputs: list[MLADecodeInputs] = [make_inputs(shape, seed=seed + i, poison=i == 0)
                                              for i in range(want)]
        self.cases: dict[Any, VerificationCase] = {
            "random": with_reference(VerificationCase("random"), self.inputs[0])}
        if not bool(torch.isfinite(self.reference).all()):
            raise RuntimeError("the fp32 reference is not finite (a poisoned slot reached it)")

    @property
    def reference(self) -> torch.Tensor:
        """fp32 reference ``[B, H, 512]`` of the random input set (copy 0 as drawn)."""
        return self.cases["random"].reference

    def case(self, name: str, split_starts: list[list[int]]) -> VerificationCase:
        """Input set ``name`` on copy 0, built once (the needles once per split layout)."""
        key = (name, tuple(map(tuple, split_starts))) if name == "needles" else name
        if key not in self.cases:
            self.cases[key] = make_case(name, self.inputs[0], self.cases["random"], split_starts, self.seed)
        return self.cases[key]

    def check(self, backend: Backend, params: dict[str, Any],
              check: CheckConfig | None = None) -> tuple[PreparedCall, Verdict]:
        """Prepare on copy 0, then per input set of ``check``: write it into copy 0, poison the
        output, run once, compare with that set's reference, put copy 0 back.  The verdict is the
        worst set's, naming the needle tokens a failing output lacks where it can."""
        check = check or CheckConfig()
        s = self.shape
        call = backend.prepare(self.inputs[0], params)
        limits = check.limits(s.q_dtype, s.kv_dtype)
        starts = split_starts_for(s.context_lens, call.split_starts)
        verdicts: dict[str, Verdict] = {}
        for name in check.input_sets:
            case = self.case(name, starts)
            with case.applied(self.inputs[0]):
                call.out.fill_(float("nan"))  # what this run does not write must not pass for written
                out = call.fn()
                if self.device.is_gpu:
                    torch.cuda.synchronize()
            verdict = compare_outputs(out, case.reference, limits, check.atol, check.rtol)
            if not verdict.passed:
                verdict = verdict.model_copy(update={"missing": find_missing(out, case)})
            verdicts[name] = verdict
        return call, worst_verdict(verdicts)

    def run(self, backend: Backend, params: dict[str, Any], *, copy_bw_tbps: float | None, run_id: str,
            check: CheckConfig | None = None, time_it: bool = True,
            read_bw_tbps: float | None = None, verify: bool = True) -> Record:
        """Check and time ``backend`` with ``params`` on this shape; always returns a record.

        ``check`` says how outputs are judged (default: every input set, the dtypes' limits).  The
        floor divides the bytes moved by ``read_bw_tbps`` when given, else by ``copy_bw_tbps``;
        the GPU's clocks, power and temperature are read just before and just after the timing,
        and its SM clock and power while each timed sample runs (``gpu_state_during``).
        ``verify=False`` (a sweep's later visits of a point already checked) times only: no
        verdict, no refresh cost, no eager timing, status ``ok``.
        """
        s = self.shape
        base = record_fields(backend.name, params, s, run_id, copy_bw_tbps, read_bw_tbps)
        ok, why = backend.supports(s)
        if not ok:
            return Record(status="unsupported", message=why, **base)
        try:
            if verify:
                call, verdict = self.check(backend, params, check)
                base.update(verdict=verdict, refresh_us=refresh_cost_us(call, self.device))
                status = "ok" if verdict.passed else "incorrect"
                message = "" if verdict.passed else _verdict_message(verdict)
            else:
                call, status, message = backend.prepare(self.inputs[0], params), "ok", ""
            base.update(effective_params=call.effective_params, setup_us=call.setup_us,
                        workspace_bytes=call.workspace_bytes)
            if not time_it:
                return Record(status=status, message=message, **base)
            calls = [call.fn] + [backend.prepare(x, params).fn for x in self.inputs[1:]]
            base["gpu_state_before"] = gpu_state()
            timed = self._time(calls, call.graph_safe, eager=verify)
        except UnsupportedShapeError as exc:
            return Record(status="unsupported", message=str(exc), **base)
        except (MlabenchError, RuntimeError, ValueError, TypeError, AssertionError) as exc:
            if self.device.is_gpu:
                torch.cuda.synchronize()
            msg = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            return Record(status="error", message=msg[:500] + _where(exc), **base)
        stats = timed["stats"]
        return Record(
            status=status, message=(message + timed["note"]).strip(), timing_mode=timed["mode"],
            stats=stats, eager_stats=timed.get("eager"), cold_cache_copies=len(calls),
            **speed_fields(s.min_bytes_moved, base["floor_us"], stats.median_us),
            gpu_state=gpu_state(), gpu_state_during=timed["clocks"], **base,
        )

    def _time(self, calls: list, graph_safe: bool, eager: bool = True) -> dict[str, Any]:
        """``{mode, stats, note, eager?, clocks}``: the recorded timing (graph where it can be
        captured, else eager), the eager one where asked, and ``clocks``, the SM clock read while
        the recorded timing's samples ran (:class:`~mlabench.measure.observers.ClockSampler`)."""
        cfg = self.timing
        if not self.device.is_gpu:
            return {"mode": "wall", "stats": time_calls(calls, cfg, use_graph=False), "note": "", "clocks": {}}
        result: dict[str, Any] = {"note": ""}
        graph_clocks, eager_clocks = ClockSampler(), ClockSampler()

        def eager_time() -> None:
            result["eager"] = time_calls(calls, cfg, use_graph=False, during=eager_clocks)

        if (cfg.eager and eager) or not (cfg.graph and graph_safe):
            eager_time()
        if cfg.graph and graph_safe:
            try:
                result.update(mode="graph", stats=time_calls(calls, cfg, use_graph=True, during=graph_clocks),
                              clocks=graph_clocks.summary())
                return result
            except RuntimeError as exc:  # capture failed: keep the eager time, say why
                torch.cuda.synchronize()
                result["note"] = f" graph capture failed ({str(exc).splitlines()[0][:200]}); eager time"
                if "eager" not in result:
                    eager_time()
        result.update(mode="eager", stats=result.pop("eager"), clocks=eager_clocks.summary())
        return result


def refresh_cost_us(call: PreparedCall, device: DeviceInfo, reps: int = 5) -> float:
    """Median wall time of ``call.refresh`` (µs, between device synchronisations) over ``reps``
    runs at unchanged lengths; 0.0 when the call has nothing to refresh."""
    if call.refresh is None:
        return 0.0
    dev = torch.device(device.torch_device)
    samples = sorted(timed_us(dev, call.refresh)[1] for _ in range(reps))
    return samples[len(samples) // 2]


def _verdict_message(v: Verdict) -> str:
    """Why ``v`` failed, in one line: shape, non-finite output, or the relative errors of the worst
    input set and the needles it lacks."""
    where = f"{v.input_set} inputs: " if v.input_set else ""
    if not v.shape_ok:
        return f"wrong output shape {v.output_shape}"
    if not v.all_finite:
        return f"{where}non-finite output (NaN/Inf: unwritten or overflowed elements, or a poisoned slot read)"
    within = v.rel_rmse is not None and v.rel_rmse <= (v.rel_rmse_limit or 0) \
        and (v.rel_max_err or 0) <= (v.rel_max_err_limit or 0)
    if v.rel_rmse is None or within:
        return f"{where}max abs err {v.max_abs_err:.3g} over atol={v.atol:g} rtol={v.rtol or 0:g}"
    text = (f"{where}relative RMSE {v.rel_rmse:.3g} (limit {v.rel_rmse_limit:.3g}), "
            f"normalised max error {v.rel_max_err:.3g} (limit {v.rel_max_err_limit:.3g})")
    return f"{text}; {v.missing}" if v.missing else text


def _where(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    return f" [{tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}]" if tb else ""
