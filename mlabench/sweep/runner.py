"""The sweep's measuring loop: points in their order, shape inputs reused, the sentinel, drift.

:class:`SweepRunner` takes the points of a sweep in measuring order (:mod:`mlabench.sweep.order`),
measures each point in one or more visits spread over the run (:mod:`mlabench.sweep.visits`) and
appends one record per point to the run's store, re-measures the sentinel point
(:func:`choose_sentinel`) at the start, after every ``sentinel_every`` points and at the end
(:mod:`mlabench.sweep.sentinel`), flags points measured below the GPU's steady clock
(:mod:`mlabench.measure.steady`), and writes the drift into the manifest when it stops, interrupted or not.
Imported by :mod:`mlabench.sweep.run` only.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence

from mlabench.backends import get_backend
from mlabench.backends.base import param_grid
from mlabench.bench.point import failed_record, speed_fields
from mlabench.bench.shape_bench import ShapeBench
from mlabench.device import current_device, free_memory_bytes
from mlabench.errors import FileAccessError, Interrupted, MlabenchError
from mlabench.inputs import input_bytes
from mlabench.measure.steady import below_steady
from mlabench.records.record import Record
from mlabench.records.side_files import read_sentinels
from mlabench.records.store import ResultStore
from mlabench.shapes import MLADecodeShape
from mlabench.sweep.config import Point, SweepConfig
from mlabench.sweep.sentinel import append_sentinel, drift_dict, drift_of, point_label
from mlabench.sweep.visits import (
    append_visit, measured_in_order, pooled_record, read_visits, settled, visit_order, wants_more,
)

ProgressFn = Callable[["Point", "Record | None", int, int], None]

#: Share of the device's memory that inputs of shapes not being measured may keep.
CACHE_SHARE = 0.25


def choose_sentinel(points: Sequence[Point]) -> Point | None:
    """The sentinel of a sweep: a point of its first backend at its smallest batch, first heads
    count and middle context length, with that backend's default parameters where the sweep has
    them (else the middle of its parameter grid).  None for no points."""
    if not points:
        return None
    mine = [p for p in points if p.backend == points[0].backend]
    heads, batch = mine[0].shape.num_heads, min(p.shape.batch for p in mine)
    at = [p for p in mine if (p.shape.num_heads, p.shape.batch) == (heads, batch)]
    contexts = sorted({p.shape.max_context_len for p in at})
    middle = [p for p in at if p.shape.max_context_len == contexts[len(contexts) // 2]]
    default = param_grid(get_backend(middle[0].backend), middle[0].shape, {})[0]
    return next((p for p in middle if p.params == default), middle[len(middle) // 2])


class BenchCache:
    """Inputs of the shapes still to measure (:class:`ShapeBench`), least recently used dropped
    first once they hold more than ``budget_bytes``; a shape's inputs go when its last point is done."""

    def __init__(self, cfg: SweepConfig, remaining: Counter, budget_bytes: int):
        self.cfg, self.remaining, self.budget_bytes = cfg, remaining, budget_bytes
        self.benches: OrderedDict[MLADecodeShape, ShapeBench] = OrderedDict()

    def get(self, shape: MLADecodeShape) -> ShapeBench:
        """The inputs of ``shape``, made if needed (raises what :class:`ShapeBench` raises)."""
        if shape in self.benches:
            self.benches.move_to_end(shape)
            return self.benches[shape]
        while self.benches and self._held() + input_bytes(shape) > self.budget_bytes:
            self.benches.popitem(last=False)
        self.benches[shape] = ShapeBench(shape, self.cfg.timing, seed=self.cfg.seed)
        return self.benches[shape]

    def done(self, shape: MLADecodeShape) -> None:
        """One point of ``shape`` finished: drop its inputs after its last one."""
        self.remaining[shape] -= 1
        if self.remaining[shape] <= 0:
            self.benches.pop(shape, None)

    def _held(self) -> int:
        return sum(len(b.inputs) * input_bytes(s) for s, b in self.benches.items())


class SweepRunner:
    """Measures the points of one run into ``store`` (see the module's docstring)."""

    def __init__(self, cfg: SweepConfig, store: ResultStore, *, steady_mhz: float | None = None,
                 time_it: bool = True):
        m = store.manifest()
        self.cfg, self.store, self.time_it, self.steady_mhz = cfg, store, time_it, steady_mhz
        self.copy_bw, self.read_bw = m.copy_bandwidth_tbps, m.read_bandwidth_tbps
        self.run_id = m.run_id
        self.recorded = len(store.records())
        self.visits_measured = 0  # visits in visits.jsonl (a run with several visits per point)
        self._finished = 0  # measurements done or skipped, for progress

    def run(self, ordered: Sequence[Point], sentinel: Point | None, progress: ProgressFn | None = None) -> None:
        """Measure every point of ``ordered`` not yet recorded, in order, in :attr:`visits` passes,
        then in further passes over the points not yet :func:`~mlabench.sweep.visits.settled`, up to
        :attr:`max_visits` (:mod:`mlabench.sweep.visits`); Ctrl-C saves what was measured (CSV, drift)
        and raises :class:`Interrupted` naming the folder to resume.  ``progress(point, record,
        done, total)`` counts measurements (a point is at least ``visits`` of them; ``total`` grows
        as further passes are planned): it is called at the start and before each measurement
        (``record`` None), and after each one."""
        n = self.visits
        prior = read_visits(self.store.run_dir) if n > 1 else {}
        done = self.store.finished_keys()
        for p in ordered:  # every visit measured before an interruption, the record not yet written
            have = prior.get(p.key, [])
            if p.key not in done and self._settled(have):
                self._record(have, done)
        todo = [p for p in ordered if p.key not in done]
        self.visits_measured = sum(map(len, prior.values()))
        plan = [(v, p) for v in range(1, n + 1) for p in visit_order(todo, v) if len(prior.get(p.key, ())) < v]
        total = n * len(ordered)
        self._finished = total - len(plan)
        try:
            if progress and plan:  # the bar shows from the start, before the first sentinel
                progress(sentinel or plan[0][1], None, self._finished, total)
            self._sentinel(sentinel)
            for visit in range(n + 1, self.max_visits + 2):  # the planned visits, then one more a pass
                self._measure_pass(plan, prior, done, sentinel, progress, total)
                if visit > self.max_visits or all(p.key in done for p in todo):
                    break
                plan = [(visit, p) for p in visit_order(todo, visit)
                        if p.key not in done and len(prior.get(p.key, ())) < visit]
                total += len(plan)
            self._sentinel(sentinel)
        except KeyboardInterrupt:
            self.finish()
            raise Interrupted(f"interrupted: {self._kept(len(ordered))}; continue with: "
                              f"mlabench sweep --resume {self.store.run_dir}") from None
        except FileAccessError as exc:  # e.g. a full disk: every record on disk is whole (append_text)
            raise type(exc)(f"{exc}; {self._kept(len(ordered))}, none cut short; free space, then "
                            f"continue with: mlabench sweep --resume {self.store.run_dir}") from None
        self.finish()

    def _kept(self, points: int) -> str:
        """What the run folder holds so far, e.g. ``3 of 8 points recorded in results/x``."""
        n = self.visits
        most = f" to {self.max_visits * points}" if self.max_visits > n else ""
        visits = f" ({self._finished} visits measured of {n * points}{most} planned)" if n > 1 else ""
        return f"{self.recorded} of {points} points recorded{visits} in {self.store.run_dir}"

    def _measure_pass(self, plan: list[tuple[int, Point]], prior: dict[str, list[Record]], done: set[str],
                      sentinel: Point | None, progress: ProgressFn | None, total: int) -> None:
        """Measure the (visit, point) pairs of ``plan`` in order, appending each visit and, once a
        point is settled, its record; the sentinel after every ``sentinel_every`` of them."""
        budget = int(CACHE_SHARE * (current_device().total_memory_bytes or free_memory_bytes()))
        cache = BenchCache(self.cfg, Counter(p.shape for _, p in plan), budget)
        every = self.cfg.sentinel_every if sentinel is not None else 0
        for i, (v, p) in enumerate(plan, 1):
            have = prior.setdefault(p.key, [])
            if v > 1 and not wants_more(have):  # failed or untimed at its first visit: recorded then
                cache.done(p.shape)
                self._finished += 1
                continue
            if progress:
                progress(p, None, self._finished, total)
            rec = self._measure(p, cache, verify=v == 1)
            cache.done(p.shape)
            self._finished += 1
            if self.visits > 1:
                append_visit(self.store.run_dir, v, rec)
                have.append(rec)
                self.visits_measured += 1
            if self.visits == 1:
                self.store.append(self._within_ceiling(rec))
                self.recorded += 1
            elif p.key not in done and self._settled(have):
                self._record(have, done)
            if progress:
                progress(p, rec, self._finished, total)
            if every and i % every == 0 and i < len(plan):
                self._sentinel(sentinel)

    def _settled(self, have: list[Record]) -> bool:
        return settled(have, self.visits, self.max_visits, self.cfg.visit_rel_se)

    def _record(self, have: list[Record], done: set[str]) -> None:
        """Append the pooled record of a settled point's visits and count it done."""
        rec = self._within_ceiling(pooled_record(have, self.cfg.timing.target_rel_ci))
        self.store.append(rec)
        self.recorded += 1
        done.add(rec.key)

    def _within_ceiling(self, rec: Record) -> Record:
        """``rec`` with its floor against the run's read ceiling as it stands.  A correct point
        that read faster than the ceiling raises it, for itself and every later point: its
        ``pct_of_floor`` is then 100, never above, and the manifest's ``read_bandwidth_tbps`` and
        ``read_ceiling["raised"]`` say so (issue 27: a ceiling a kernel beats is no ceiling)."""
        if rec.floor_bandwidth != "read" or not self.read_bw or rec.stats is None:
            return rec
        if rec.status == "ok" and rec.achieved_tbps and rec.achieved_tbps > self.read_bw:
            m = self.store.manifest()
            raised = [*(m.read_ceiling or {}).get("raised", []),
                      {"point": point_label(rec), "key": rec.key, "tbps": rec.achieved_tbps,
                       "from_tbps": self.read_bw, "after_points": self.recorded}]
            self.read_bw = rec.achieved_tbps
            self.store.update_manifest(read_bandwidth_tbps=self.read_bw,
                                       read_ceiling={**(m.read_ceiling or {}), "raised": raised})
        floor_us = rec.bytes_moved / (self.read_bw * 1e6)
        return rec.model_copy(update={"read_bandwidth_tbps": self.read_bw, "floor_us": floor_us,
                                      **speed_fields(rec.bytes_moved, floor_us, rec.stats.median_us)})

    @property
    def max_visits(self) -> int:
        """Most visits of a point whose visits disagree: the sweep's ``max_visits`` (resolved by
        :func:`mlabench.sweep.run.run_sweep`), at least :attr:`visits`."""
        return max(self.cfg.max_visits or 1, self.visits)

    @property
    def visits(self) -> int:
        """Visits per point: the sweep's ``visits`` (:func:`mlabench.sweep.run.run_sweep` resolves
        its default), 1 when unset."""
        return self.cfg.visits or 1

    def finish(self) -> None:
        """Regenerate the CSV and write the sentinel's drift into the manifest."""
        self.store.write_csv()
        measured = measured_in_order(self.store.run_dir) if self.visits > 1 else self.store.records()
        drift = drift_of(read_sentinels(self.store.run_dir), measured, self.cfg.drift_target)
        self.store.update_manifest(drift=drift_dict(drift))

    def _measure(self, p: Point, cache: BenchCache | None, verify: bool = True) -> Record:
        try:
            bench = cache.get(p.shape) if cache else ShapeBench(p.shape, self.cfg.timing, seed=self.cfg.seed)
        except (MlabenchError, RuntimeError) as exc:  # e.g. the allocator ran out after all
            return failed_record(p.backend, p.params, p.shape, self.run_id, self.copy_bw,
                                 f"inputs could not be created: {str(exc).splitlines()[0][:300]}", self.read_bw)
        rec = bench.run(get_backend(p.backend), p.params, copy_bw_tbps=self.copy_bw, run_id=self.run_id,
                        check=self.cfg.check, time_it=self.time_it, read_bw_tbps=self.read_bw, verify=verify)
        low = below_steady(rec.gpu_state_before, rec.gpu_state, self.steady_mhz, during=rec.gpu_state_during)
        return rec.model_copy(update={"clock_below_steady": low}) if low is not None else rec

    def _sentinel(self, sentinel: Point | None) -> None:
        """Measure the sentinel on fresh inputs and append it to ``sentinel.jsonl``, with the
        points recorded so far (with several visits per point: the visits measured so far)."""
        if sentinel is None or not self.time_it:
            return
        after = self.visits_measured if self.visits > 1 else self.recorded
        append_sentinel(self.store.run_dir, after, self._measure(sentinel, None))
