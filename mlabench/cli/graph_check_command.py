"""``graph-check``: capture a backend's decode as a server does and replay it at long contexts.

Parses flags, calls :func:`mlabench.checks.graph_check.run_graph_check` and renders its table; exits 1
when a captured graph is flagged (wrong after refresh, or slower than the call tuned for a length
by more than the tolerance).  Needs a CUDA/ROCm GPU: without one it says so in one line.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from mlabench.cli.options import (
    Batch, BudgetS, Context, Format, Json, Markdown, NonCausal, Params, PlainPageSize, QoLen, Splits, backend_params,
    fraction, int_list, name_list, non_causal_applies, output_format, page_size_flag,
)
from mlabench.cli.output import emit, fail, notice
from mlabench.errors import ConfigError
from mlabench.files import check_writable, write_text
from mlabench.run_files import POLICY_FILE


def graph_check(
    backend: Annotated[list[str] | None, typer.Option(
        "--backend", metavar="NAME[,NAME...]", help="Backends to capture; default: triton-splitkv.")] = None,
    split_policy: Annotated[list[str] | None, typer.Option(
        metavar="host|device[,...]", help="Policy modes to capture for backends with a split_policy: host (one count chosen on "
             "the host, frozen by capture) and/or device (each request's count looked up in device "
             "memory). Default: both.")] = None,
    policy: Annotated[Path | None, typer.Option(
        metavar="PATH", help="Split policy JSON: the tune command's, or (max_len, splits) rows per batch size "
             "(docs/graphs.md). Default: the counts tuned by this run.")] = None,
    policy_out: Annotated[Path | None, typer.Option(
        metavar="PATH", help="Write the policy used here to this file.")] = None,
    save: Annotated[Path | None, typer.Option(metavar="PATH", help="Also write the table as JSON to this file.")] = None,
    heads: Annotated[str | None, typer.Option(metavar="H", help="Local heads (one value; default 12).")] = None,
    batch: Batch = None, context: Context = None, page_size: PlainPageSize = None,
    qo_len: QoLen = None, non_causal: NonCausal = False,
    dtype: Annotated[str, typer.Option(metavar="DTYPE", help="q and KV dtype.")] = "bfloat16",
    capture_len: Annotated[int | None, typer.Option(
        metavar="L", help="Tokens per request when the graph is captured (default: --qo-len, 1).")] = None,
    splits: Splits = None, param: Params = None,
    tolerance: Annotated[str, typer.Option(metavar="FRACTION", help="Flag a graph slower than tuned by more "
                                           "than this fraction (0.05 or 5%).")] = "0.05",
    budget_s: BudgetS = None, seed: Annotated[int, typer.Option(metavar="N", help="Input seed.")] = 0,
    format: Format = None, as_json: Json = False, markdown: Markdown = False,
) -> None:
    """Capture decode at small lengths, replay at long ones after refresh; flag frozen choices.

    Default: triton-splitkv in both policy modes, batch 1, contexts 4K-128K, 12 heads, page 64.
    """
    from mlabench.checks.graph_check import run_graph_check, subjects_for
    from mlabench.checks.graph_check_table import graph_check_table
    from mlabench.policy.device_table import load_split_policy
    from mlabench.tables.render import render

    fmt = output_format(format, as_json, markdown)
    for path, flag in ((save, "--save"), (policy_out, "--policy-out")):
        if path is not None:
            check_writable(path, flag)
    backends = name_list(backend) or ["triton-splitkv"]
    axes = backend_params(param, splits, backends) or {}
    split_list = axes.pop("num_kv_splits", None)
    cfg = _config(heads, batch, context, page_size, dtype, capture_len, qo_len, non_causal, split_list,
                  fraction(tolerance, "--tolerance", below_one=False), budget_s, seed)
    subjects = subjects_for(backends, name_list(split_policy) or ["host", "device"], _one_value_each(axes))
    given = load_split_policy(policy) if policy else None
    with tempfile.TemporaryDirectory(prefix="mlabench-graph-check-") as tmp:
        path = policy_out or Path(tmp) / POLICY_FILE
        result = run_graph_check(cfg, subjects, policy=given, policy_path=path,
                                 progress=lambda msg: notice(msg, style="dim"))
    table = graph_check_table(result, cfg)
    emit([table], fmt)  # printed first: a file that cannot be written (it was checked) loses no run
    if save is not None:
        write_text(save, render([table], "json"), "table file")
    flagged = sorted({r.subject for r in result.rows if r.flagged})
    if flagged:
        fail(f"flagged: {', '.join(flagged)}")


def _config(heads: str | None, batch: str | None, context: str | None, page_size: int | None, dtype: str,
            capture_len: int | None, qo_len: int | None, non_causal: bool, splits: list[int] | None, tolerance: float,
            budget_s: float | None, seed: int) -> Any:
    """The :class:`~mlabench.checks.graph_check.GraphCheckConfig` of the flags (their defaults where
    not given); :class:`ConfigError` for more than one ``--heads`` value."""
    from mlabench.checks.graph_check import DEFAULT_CONTEXTS, DEFAULT_SPLITS, GraphCheckConfig
    from mlabench.measure.timing import TimingConfig

    head_list = int_list(heads, "--heads", "heads") or [12]
    qo_len = 1 if qo_len is None else qo_len  # 0 is refused by validate(), not read as the default
    non_causal_applies(non_causal, [qo_len])
    if len(head_list) != 1:
        raise ConfigError("graph-check takes one --heads value")
    return GraphCheckConfig(
        num_heads=head_list[0], batches=tuple(int_list(batch, "--batch", "batch") or (1,)),
        contexts=tuple(int_list(context, "--context", "context length") or DEFAULT_CONTEXTS),
        page_size=page_size_flag(page_size) or 64, dtype=dtype,
        capture_len=capture_len if capture_len is not None else max(qo_len, 1), qo_len=qo_len,
        causal=not non_causal,
        splits=tuple(splits or DEFAULT_SPLITS), tolerance=tolerance,
        timing=TimingConfig(budget_s=0.5 if budget_s is None else budget_s), seed=seed)


def _one_value_each(axes: dict[str, list[Any]]) -> dict[str, Any]:
    """``--param`` values other than the split counts (searched per length) as the one value each
    captured graph runs; :class:`ConfigError` for several values, or for ``split_policy`` (set by
    ``--split-policy`` and ``--policy``)."""
    from mlabench.checks.graph_check import POLICY_PARAM

    if POLICY_PARAM in axes:
        raise ConfigError(f"--param {POLICY_PARAM}: graph-check sets it from --split-policy and --policy")
    several = [name for name, values in axes.items() if len(set(values)) > 1]
    if several:
        raise ConfigError(f"--param {several[0]}: graph-check captures one value of it, got "
                          f"{','.join(map(str, axes[several[0]]))}")
    return {name: values[0] for name, values in axes.items()}


#: The commands of this group, registered by :mod:`mlabench.cli.app`.
COMMANDS = {"graph-check": graph_check}
