"""One point of a measurement: what it is (:class:`Point`), and the fields every record of it
carries (:func:`record_fields`), its speed (:func:`speed_fields`) and the row of a point that could
not start (:func:`failed_record`).

Light on purpose (no torch, no inputs): the tuner's configuration and the readers of runs import it
without the machinery that measures (:mod:`mlabench.bench.shape_bench`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlabench.records.record import Record, point_key, utc_now
from mlabench.shapes import MLADecodeShape

#: Local heads measured when neither a model nor heads are named (``check``, ``tune``): Kimi K3's
#: 96 heads at TP8, the head count the persistent kernels must pad to 16.
DEFAULT_CHECK_HEADS = 12


@dataclass(frozen=True)
class Point:
    """One configuration to measure: a backend by name, its parameters, a shape."""

    backend: str
    params: dict[str, Any]
    shape: MLADecodeShape

    @property
    def key(self) -> str:
        """The point's key (:func:`~mlabench.records.record.point_key`), as its records carry it."""
        return point_key(self.backend, self.params, self.shape.key())


def speed_fields(bytes_moved: int, floor_us: float | None, median_us: float) -> dict[str, float | None]:
    """``achieved_tbps`` (``bytes_moved`` over ``median_us``, TB/s) and ``pct_of_floor``
    (``100 * floor_us / median_us``; None without a floor) of a record."""
    return {"achieved_tbps": bytes_moved / (median_us * 1e-6) / 1e12,
            "pct_of_floor": 100 * floor_us / median_us if floor_us else None}


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
