"""``mlabench check``: every backend's agreement with the fp32 reference on fresh inputs (random,
needles, peaky, flat: :mod:`mlabench.checks.input_sets`), poisoned with NaN wherever no request may read."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mlabench.backends import backend_names, get_backend
from mlabench.backends.base import Backend, param_grid
from mlabench.backends.registry import select_backends
from mlabench.bench.point import DEFAULT_CHECK_HEADS, failed_record
from mlabench.bench.shape_bench import ShapeBench
from mlabench.checks.verdict import CheckConfig
from mlabench.errors import ConfigError, MlabenchError
from mlabench.inputs import check_fits
from mlabench.measure.timing import TimingConfig
from mlabench.records.record import Record
from mlabench.shapes import MLADecodeShape, resolve_heads
from mlabench.tables.table import PARAMS, ColumnStyle, Table, fmt, params_label

#: ``progress(done, total, what)``: how far a run has come, for a progress bar.
Progress = Callable[[int, int, str], None]

#: Split counts checked by default: 1, a non-power of two, typical counts, and more splits than a
#: short request has tokens.
DEFAULT_CHECK_SPLITS = (1, 3, 16, 64, 256)


def default_check_shapes(num_heads: int, softmax_scale: float | None, page_size: int = 64,
                         dtype: str = "bfloat16", qo_len: int = 1, causal: bool = True,
                         **dims: int) -> list[MLADecodeShape]:
    """The seed pull request's case (batch 1, context 4096 -> output ``[1, H, 512]``) and a ragged
    batch with lengths 1 (a causal block: ``qo_len``, the shortest context that holds it), a
    non-multiple of the page size, an exact multiple, and one past it."""
    kw = dict(num_heads=num_heads, softmax_scale=softmax_scale, page_size=page_size, q_dtype=dtype,
              kv_dtype=dtype, qo_len=qo_len, causal=causal, **dims)
    return [MLADecodeShape.create(context_lens=(4096,), **kw),
            MLADecodeShape.create(context_lens=(qo_len if causal else 1, 100, 1024, 4097), **kw)]


def check_shapes(*, model: str | None = None, model_config: str | Path | None = None, tp: int | None = None,
                 heads: Sequence[int] | None = None, context_lens: Sequence[int] | None = None,
                 batch: Sequence[int] | None = None, page_size: int | None = None,
                 dtype: str = "bfloat16", qo_lens: Sequence[int] | None = None,
                 causal: bool = True) -> list[MLADecodeShape]:
    """The shapes ``mlabench check`` runs, per local head count and per query-token count in
    ``qo_lens`` (default 1) under the ``causal`` mask or not.

    Heads come from the model (``model`` or ``model_config`` at ``tp``, default 1), else from
    ``heads``, else :data:`~mlabench.bench.point.DEFAULT_CHECK_HEADS`.  Without ``context_lens``:
    :func:`default_check_shapes`.  With them and no ``batch``: one ragged batch, one request per
    length.  With ``batch``: for each value, that many requests of the one length given.
    ``page_size`` defaults to 64.  Raises :class:`ConfigError` for a batch <= 0 or a batch with
    other than one length, the errors of :func:`resolve_heads` and :class:`MLADecodeShape`
    (unknown model, bad tp, heads or length <= 0, a length past int32), and
    :class:`OutOfMemoryError` for a shape whose inputs cannot fit here, judged from its numbers
    before it is built.
    """
    if not heads and not (model or model_config):
        heads = [DEFAULT_CHECK_HEADS]
    if batch is not None and any(b <= 0 for b in batch):
        raise ConfigError(f"--batch takes values > 0, got {', '.join(map(str, batch))}")
    if batch is not None and (not context_lens or len(context_lens) != 1):
        raise ConfigError(f"--batch needs exactly one --context length, got {len(context_lens or [])} "
                          "(a ragged batch is --context L1,L2,... without --batch)")
    tp = 1 if tp is None else tp
    page_size = 64 if page_size is None else page_size
    shapes: list[MLADecodeShape] = []
    for wanted, qo_len in ((h, t) for h in heads or [None] for t in qo_lens or [1]):
        h, scale, spec = resolve_heads(model=model, model_config=model_config, tp=tp, heads=wanted)
        dims = {"kv_lora_rank": spec.kv_lora_rank, "qk_rope_head_dim": spec.qk_rope_head_dim} if spec else {}
        dims.update(qo_len=qo_len, causal=causal)
        if context_lens is None:
            shapes += default_check_shapes(h, scale, page_size, dtype, **dims)
            continue
        kw = dict(num_heads=h, page_size=page_size, q_dtype=dtype, kv_dtype=dtype, softmax_scale=scale, **dims)
        one = MLADecodeShape.create(context_lens=tuple(context_lens), **kw)
        for b in batch or [1]:
            check_fits(one, repeat=b)  # from the numbers, before b lengths are built
            shapes.append(MLADecodeShape.create(context_lens=tuple(context_lens) * b, **kw))
    return list(dict.fromkeys(shapes))


def run_check(shapes: Sequence[MLADecodeShape], backends: Sequence[str] | None = None,
              splits: Sequence[int] = DEFAULT_CHECK_SPLITS, check: CheckConfig | None = None,
              seed: int = 0, progress: Progress | None = None,
              params: dict[str, list[Any]] | None = None) -> tuple[list[Record], dict[str, str]]:
    """One record per (backend, params, shape), and ``{backend: why}`` for those unavailable here.

    Named backends must exist (:class:`UnknownBackendError`) and be available
    (:class:`BackendUnavailableError`, via :func:`select_backends`), and every shape's inputs must
    fit in free memory (:class:`OutOfMemoryError`), all checked before anything runs; fresh inputs
    per shape (``seed``), outputs poisoned with NaN before each run, judged by ``check`` (default:
    every input set, the dtypes' relative limits).  ``progress(done, total, what)`` is called before
    each check and once at the end.  ``params`` gives other parameters' values (axes, as a sweep
    config's ``[params]``); a string parameter without one is checked at every choice.
    """
    for shape in shapes:
        check_fits(shape)
    if backends:  # named: each must exist and be available
        chosen = select_backends(list(backends), strict=True)
    else:  # every one, so that the table can say why some are not available here
        chosen = [b for b in map(get_backend, backend_names()) if not b.is_reference]
    unavailable = {b.name: why for b in chosen for ok, why in [b.available()] if not ok}
    grid = {"num_kv_splits": list(dict.fromkeys(splits)), **(params or {})}
    plan = [(shape, b, params) for shape in shapes for b in chosen if b.name not in unavailable
            for params in _grid(b, shape, grid)]
    records: list[Record] = []
    bench: tuple[MLADecodeShape | None, ShapeBench | str] = (None, "")
    for done, (shape, b, params) in enumerate(plan):
        if progress:
            progress(done, len(plan), f"{b.name} {shape.label()}")
        if bench[0] != shape:
            bench = (shape, _bench_or_why(shape, seed))
        if isinstance(bench[1], ShapeBench):
            records.append(bench[1].run(b, params, copy_bw_tbps=None, run_id="check", check=check,
                                        time_it=False))
        else:
            records.append(failed_record(b.name, params, shape, "check", None, bench[1]))
    if progress and plan:
        progress(len(plan), len(plan), "checked")
    return records, unavailable


def _grid(backend: Backend, shape: MLADecodeShape, axes: dict[str, list[Any]]) -> list[dict]:
    """Every choice of ``backend``'s parameters on ``shape`` with ``axes``; a library that picks its
    own split count (aiter-gluon) is checked on its pick too."""
    grid = param_grid(backend, shape, axes, all_choices=True)
    own = backend.resolve_params(shape)
    if "num_kv_splits" in own and own["num_kv_splits"] is None and own not in grid:
        grid.insert(0, own)
    return grid


def _bench_or_why(shape: MLADecodeShape, seed: int) -> ShapeBench | str:
    """The inputs and reference of ``shape``, or why they could not be made (the allocator ran out
    after all)."""
    try:
        return ShapeBench(shape, TimingConfig(), seed=seed, copies=1)
    except (MlabenchError, RuntimeError) as exc:
        return f"inputs could not be created: {str(exc).splitlines()[0][:300]}"


def check_failures(records: Sequence[Record]) -> list[Record]:
    """The records that fail the check: a wrong answer (``incorrect``) or a call that raised
    (``error``); ``unsupported`` shapes are not failures."""
    return [r for r in records if r.status in ("incorrect", "error")]


def check_table(records: Sequence[Record], unavailable: dict[str, str] | None = None) -> Table:
    """``backend | params | shape | rel RMSE | rel max err | max abs err | finite | verdict`` (errors
    of each point's worst input set; a failure says why and which needle went missing), with a note
    per backend of ``unavailable`` (``{name: why}``) saying why it is not available here."""
    t = Table("Correctness against the fp32 reference",
              ["backend", "params", "shape", "rel RMSE", "rel max err", "max abs err", "finite", "verdict"],
              styles=CHECK_STYLES)
    for r in records:
        v = r.verdict
        qo = "" if r.qo_len == 1 else f" T={r.qo_label}"
        shape = f"B={r.batch} H={r.num_heads} L={_ctx(r)}{qo} p{r.shape.get('page_size')}"
        if v:
            shape += f" → [{','.join(map(str, v.output_shape))}]"
        verdict = {"ok": "pass", "incorrect": "FAIL"}.get(r.status, r.status)
        if r.status != "ok" and r.message:
            verdict += f": {r.message}"
        t.rows.append([r.backend, params_label(r.shown_params()), shape, v.rel_rmse if v else None,
                       v.rel_max_err if v else None, v.max_abs_err if v else None,
                       v.all_finite if v else None, verdict])
    v0 = next((r.verdict for r in records if r.verdict and r.verdict.rel_rmse_limit), None)
    if v0:
        sets = ", ".join(v0.by_input_set) or v0.input_set or "random"
        t.notes.append(f"rel RMSE = RMSE / RMS of the reference (limit {v0.rel_rmse_limit:.3g}), rel max err = "
                       f"max |error| / RMS of the reference (limit {v0.rel_max_err_limit:.3g}), on the worst of "
                       f"the input sets {sets}; unread cache slots and outputs poisoned with NaN")
    t.notes += [f"not available here: {n} ({why})" for n, why in (unavailable or {}).items()]
    return t


#: At a narrow terminal the check table leaves out the max abs error, then finite (the verdict
#: says what failed); the relative errors, which the verdict is on, stay, to 3 significant digits
#: (their limits are 2^-n: 0.00781, 0.0625).
_SIG3 = ColumnStyle(text=lambda v: fmt(v) if v is None else f"{v:.3g}")


CHECK_STYLES = {"params": PARAMS, "rel RMSE": _SIG3, "rel max err": _SIG3, "max abs err": ColumnStyle(drop=2),
                "finite": ColumnStyle(drop=1)}


def _ctx(r: Record) -> str:
    lens = r.shape.get("context_lens", [r.context_len])
    return str(lens[0]) if len(set(lens)) == 1 else ",".join(map(str, lens))
