"""What a run records: one :class:`Record` per measured point (its timing :class:`~mlabench.measure.stats.Stats`
and correctness :class:`~mlabench.checks.verdict.Verdict` inside), and the run's :class:`Manifest`.

A record's ``key`` (:func:`point_key`) names its point (backend, params, shape) across runs; the
schema version is written into every record.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mlabench.checks.verdict import Verdict
from mlabench.measure.stats import Stats
from mlabench.run_files import manifest_kind

SCHEMA_VERSION = 1


Status = Literal["ok", "unsupported", "incorrect", "error", "timeout"]


class Record(BaseModel):
    """One measured configuration: backend + params on one shape.  Failures are rows too."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(description="Identity of the point (backend, params, shape); resume skips recorded keys.")
    run_id: str = Field(description="Run folder this record belongs to.")
    backend: str = Field(description="Backend name.")
    params: dict[str, Any] = Field(description="Parameters asked for.")
    effective_params: dict[str, Any] = Field(default_factory=dict, description="What actually ran (e.g. a library's own split count).")
    shape: dict[str, Any] = Field(description="MLADecodeShape fields.")
    batch: int = Field(description="Requests in the batch.")
    num_heads: int = Field(description="Local query heads.")
    context_len: int = Field(description="Longest context length in the batch, tokens.")
    qo_len: int = Field(1, description="Query tokens per request (1: plain decode; records before multi-token "
                                       "decode are 1).")
    causal: bool = Field(True, description="Query token t sees the prefix and block tokens 0..t (False: all "
                                           "cached tokens).")
    status: Status = Field(description="ok / unsupported / incorrect / error / timeout.")
    message: str = Field("", description="Why the status is not ok.")
    verdict: Verdict | None = Field(None, description="Correctness on this point's own inputs.")
    timing_mode: str = Field("", description="graph (replay), eager, or wall (CPU clock).")
    stats: Stats | None = Field(None, description="Per-call time of the primary mode (graph on GPU), µs.")
    eager_stats: Stats | None = Field(None, description="Eager per-call time on a GPU, µs.")
    cold_cache_copies: int = Field(1, description="Input copies rotated per sample.")
    bytes_moved: int = Field(0, description="Fewest bytes the call must move (KV + q + out).")
    workspace_bytes: int = Field(0, description="Intermediate bytes the backend reports (split partials).")
    achieved_tbps: float | None = Field(None, description="bytes_moved / median time, TB/s.")
    copy_bandwidth_tbps: float | None = Field(None, description="Measured device copy bandwidth (read + write), TB/s.")
    read_bandwidth_tbps: float | None = Field(None, description="Measured streaming read bandwidth, TB/s.")
    floor_bandwidth: Literal["read", "copy"] = Field(
        "copy", description="Which measured bandwidth floor_us divides by (copy in runs recorded before read was).")
    floor_us: float | None = Field(None, description="bytes_moved / the floor_bandwidth one, µs.")
    pct_of_floor: float | None = Field(None, description="100 * floor_us / median time.")
    setup_us: dict[str, float] = Field(default_factory=dict, description="Untimed setup steps, µs.")
    refresh_us: float | None = Field(None, description="Untimed per-step rebuild of the call's length-dependent metadata (work list, scheduler), median wall µs; a server pays it once per step for all layers, not per layer. 0 when the call reads the lengths only on the device.")
    visit_medians_us: list[float] | None = Field(
        None, description="Median of each visit when the point was timed in several visits over the run "
                          "(stats pools their samples); None: one visit.")
    gpu_state: dict[str, Any] = Field(default_factory=dict, description="Clocks, temperature, power read after timing.")
    gpu_state_before: dict[str, Any] = Field(default_factory=dict, description="The same, read just before timing.")
    gpu_state_during: dict[str, Any] = Field(default_factory=dict, description=(
        "SM clock (median, lowest, highest, MHz), median power (W) and the number of readings taken while "
        "the timed samples ran, one per sample (mlabench.measure.observers.ClockSampler); {} on the CPU and in "
        "records written before it was read."))
    clock_below_steady: bool | None = Field(
        None, description="SM clock below the run's steady clock: the median read while the timed samples ran, "
                          "or, in records without that reading, the one before or after timing (None: not known).")
    timestamp: str = Field(description="UTC time the record was written, ISO 8601.")

    @property
    def median_us(self) -> float | None:
        return self.stats.median_us if self.stats else None

    def shown_params(self) -> dict[str, Any]:
        """``params`` as a reader sees them: each value asked for that ``effective_params`` holds
        otherwise replaced by the one that ran, the asked one after it (asked ``fused_merge=1`` where
        the grid does not fit, the wide merge ran: ``fused_merge=0 (asked 1)``); a per-request list of
        counts shows as its range (``4-8``).  ``split_policy`` stays as asked (what ran records only
        its mode; the asked value names the policy's file too).  For labels and tables only: a
        record's key, and what pairs it with another run's, stay ``params``."""
        shown = dict(self.params)
        for name, ran in self.effective_params.items():
            ran = _range_text(ran) if isinstance(ran, list) else ran
            if name in shown and name != "split_policy" and str(ran) != str(shown[name]):
                shown[name] = f"{ran} (asked {shown[name]})"
        return shown

    @property
    def qo_label(self) -> int | str:
        """Query tokens per request as tables show them: ``4``, or ``"4 non-causal"``."""
        return self.qo_len if self.causal else f"{self.qo_len} non-causal"


def _range_text(values: list[Any]) -> Any:
    """A list of per-request values as a label shows it: ``4-8``, or ``8`` when all are 8."""
    if not values or not all(isinstance(v, (int, float)) for v in values):
        return values
    low, high = min(values), max(values)
    return low if low == high else f"{low}-{high}"


#: The note under every table of a run measured on a CPU (sweep, tune, tune --validate).
CPU_RUN_NOTE = ("CPU run: a smoke test of the pipeline, not a measurement (wall-clock times on a CPU, of "
                "PyTorch code or of Triton kernels under its interpreter; compare nothing from them)")


class Manifest(BaseModel):
    """Identity and provenance of a run."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    run_id: str
    kind: str | None = Field(
        None, description="What run this is: sweep, tune or validation (mlabench.run_files.RUN_KINDS).  None in runs "
                          "recorded before manifests said it: mlabench.records.kinds.run_kind derives it.")
    created: str
    command: list[str]
    git_revision: str
    git_dirty: bool
    host: str
    device: dict[str, Any]
    gpu_state: dict[str, Any] = Field(default_factory=dict, description="Clocks, temperature, power at the start.")
    driver: str
    versions: dict[str, str | None]
    copy_bandwidth_tbps: float
    read_bandwidth_tbps: float | None = Field(None, description="Streaming read bandwidth (the floor's), TB/s.")
    read_ceiling: dict[str, Any] | None = Field(
        None, description="How the read bandwidth was found (every reading in TB/s, the one taken, the buffers; "
                          "mlabench.measure.bandwidth.ReadCeiling) and ``raised``: points that read faster, each "
                          "raising read_bandwidth_tbps for the rest of the run.  None in runs recorded before.")
    datasheet_bandwidth_tbps: float | None = Field(None, description="The vendor's memory bandwidth figure, TB/s.")
    config: dict[str, Any] = Field(default_factory=dict, description="The sweep configuration as run.")
    softmax_scale: str | None = Field(
        None, description="The softmax scale the run used and where it came from, e.g. 'softmax scale 0.072169 = "
        "(128 + 64) ** -0.5 (no rope scaling) from config.json' (mlabench.shapes.scale_note).")
    warmups: list[dict[str, Any]] = Field(
        default_factory=list, description="GPU warm-up to steady clocks, one per session (start, each resume).")
    drift: dict[str, Any] | None = Field(None, description="Sentinel re-measurements and the drift they show.")
    planned_points: int | None = Field(
        None, description="Points the sweep set out to record (its grid, less backends left out as unavailable); "
                          "fewer records mean it was interrupted.  None in runs recorded before, and in scripts' runs.")

    def on_cpu(self) -> bool:
        """Whether the run measured on a CPU (wall-clock times of PyTorch code or interpreted
        Triton: a smoke test, :data:`CPU_RUN_NOTE`)."""
        return self.device.get("kind") == "cpu"

    def run_kind(self) -> str:
        """What run this is (one of :data:`~mlabench.run_files.RUN_KINDS`): its ``kind``, or for a run
        recorded before manifests said it, derived from its ``config``
        (:func:`~mlabench.run_files.manifest_kind`)."""
        return manifest_kind({"kind": self.kind, "config": self.config})

    def visit_settings(self) -> dict[str, Any]:
        """The sweep's ``visits``, ``max_visits`` and ``visit_rel_se`` as ``config`` recorded them
        (:mod:`mlabench.sweep.visits`); a run recorded before a setting existed measured each point once
        (``visits`` 1) and no more than its ``visits`` (``max_visits``), with no ``visit_rel_se``."""
        visits = self.config.get("visits") or 1
        return {"visits": visits, "max_visits": self.config.get("max_visits") or visits,
                "visit_rel_se": self.config.get("visit_rel_se")}

    def identity(self) -> dict[str, Any]:
        """What must match to append to this run: device, driver, versions, git revision and whether
        the code had uncommitted changes (a run recorded clean is not resumed by edited code, nor the
        other way round; two edited trees are not told apart), schema."""
        return {"schema_version": self.schema_version, "device": self.device.get("name"),
                "driver": self.driver, "versions": self.versions, "git_revision": self.git_revision,
                "git_dirty": self.git_dirty}


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def new_run_id(prefix: str = "run") -> str:
    """``<prefix>-YYYYmmdd-HHMMSS-<pid>``: unique per process and second."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{prefix}-{stamp}-{os.getpid()}"


def point_key(backend: str, params: dict[str, Any], shape: dict[str, Any]) -> str:
    """Stable 16-hex-digit key of a point."""
    blob = json.dumps({"b": backend, "p": params, "s": shape}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
