"""Options shared by commands, declared once as ``Annotated`` aliases, and parsing of their text.

A command names its parameter after the option (``model_config: ModelConfig = None`` is
``--model-config``).  Every list takes commas: lists of integers are comma-separated text
(``--context 4096,131072``), parsed by :func:`int_list`, their meaning (a sweep axis, one ragged
batch, a filter) the library's; lists of names are repeatable and take commas too (``--backend
a,b`` or ``--backend a --backend b``), joined by :func:`name_list`.  Every option has a metavar,
so that ``--help`` shows what to write (``L[,L...]``), never a Python type.
"""

from __future__ import annotations

import math

from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Sequence

import typer

from mlabench.errors import BackendUnavailableError, ConfigError

# ---- what to measure ----------------------------------------------------------------------------
Model = Annotated[str | None, typer.Option(metavar="NAME", help="Model preset (configs/models/).")]
Tp = Annotated[int | None, typer.Option(metavar="N", help="Tensor-parallel size (default 1, or the sweep config's).")]
ModelConfig = Annotated[Path | None, typer.Option(metavar="PATH", help="A model's Hugging Face config.json.")]
Heads = Annotated[str | None, typer.Option(
    metavar="H[,H...]", help="Local heads, e.g. 12 or 8,12,16, without a model.")]
CheckHeads = Annotated[str | None, typer.Option(
    "--heads", metavar="H[,H...]", help="Local heads, e.g. 12 or 8,12,16, without a model (default: 12).")]
Batch = Annotated[str | None, typer.Option(metavar="B[,B...]", help="Batch sizes, e.g. 1,16.")]
CheckBatch = Annotated[str | None, typer.Option(
    "--batch", metavar="B[,B...]", help="Batch sizes, e.g. 1,16: requests of --context's one length each.")]
CompareBatch = Annotated[str | None, typer.Option(
    "--batch", metavar="B[,B...]", help="Batch sizes, e.g. 1,16 (with --from: a filter on the records).")]
Context = Annotated[str | None, typer.Option(metavar="L[,L...]", help="Context lengths, e.g. 4096,131072.")]
CheckContext = Annotated[str | None, typer.Option(
    "--context", metavar="L[,L...]", help="Context lengths, e.g. 4096,131072: one request each.")]
CompareContext = Annotated[str | None, typer.Option(
    "--context", metavar="L[,L...]", help="Context lengths, e.g. 4096,131072 (with --from: a filter on the records).")]
PageSize = Annotated[int | None, typer.Option(
    metavar="N", help="KV page size: 1, 16 or 64 (default: the sweep config's; 64, but 16 in the CPU "
                      "default sweep that flags without --config change).")]
#: ``--tp`` and ``--page-size`` of the commands that take no sweep config (check, graph-check).
PlainTp = Annotated[int | None, typer.Option("--tp", metavar="N", help="Tensor-parallel size (default 1).")]
PlainPageSize = Annotated[int | None, typer.Option(
    "--page-size", metavar="N", help="KV page size: 1, 16 or 64 (default 64).")]
Backends = Annotated[list[str] | None, typer.Option(
    "--backend", metavar="NAME[,NAME...]", help="Backends, e.g. a,b (or repeated); default: every available one.")]
Splits = Annotated[str | None, typer.Option(
    metavar="N[,N...]", help="num_kv_splits values, e.g. 1,16,64: the same as --param num_kv_splits=1,16,64.")]
Params = Annotated[list[str] | None, typer.Option(
    "--param", metavar="NAME=V[,V...]",
    help="A backend parameter's values, e.g. head_padding=zero or num_kv_splits=1,16 (repeatable; "
         "`mlabench backends --params` lists them). tune searches parameters with --space instead.")]
QoLens = Annotated[str | None, typer.Option(
    "--qo-len", metavar="T[,T...]",
    help="Query tokens per request, 1-8 (speculative-decoding verify, MTP), e.g. 1,2,4 (default 1).")]
CompareQoLens = Annotated[str | None, typer.Option(
    "--qo-len", metavar="T[,T...]",
    help="Query tokens per request, 1-8 (speculative-decoding verify, MTP), e.g. 1,2,4 (default 1; "
         "with --from: a filter on the records).")]
QoLen = Annotated[int | None, typer.Option(
    "--qo-len", metavar="T", help="Query tokens per request, 1-8 (speculative-decoding verify, MTP; default 1).")]
NonCausal = Annotated[bool, typer.Option(
    "--non-causal", help="Several query tokens see only the cache (a draft block), not each other; default: "
                         "causal, token t sees the prefix and block tokens 0..t.")]

# ---- sweeps and runs ------------------------------------------------------------------------------
SweepFile = Annotated[str | None, typer.Option(
    "--config", metavar="NAME|PATH", help="Sweep TOML: a path, or a name under configs/sweeps/.")]
def positive_seconds(value: float | None) -> float | None:
    """Typer callback of :data:`BudgetS`: None, or a finite number of seconds > 0 (an infinite or NaN
    budget reached the sweep config and was reported under its internal name)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"must be a finite number of seconds > 0, got {value}")
    return value


BudgetS = Annotated[float | None, typer.Option(metavar="SECONDS", help="Timing budget per point.",
                                               callback=positive_seconds)]
ResultsDir = Annotated[Path, typer.Option(metavar="DIR", help="Parent folder of run folders.")]
Resume = Annotated[Path | None, typer.Option(metavar="RUN", help="Resume this run folder (skips finished points).")]


def refuse_results_dir_on_resume(resume: Path | None, results_dir: Path | None) -> None:
    """:class:`ConfigError` for ``--results-dir`` (other than its default) beside ``--resume``: a
    resumed run continues in its own folder, so the flag would be ignored."""
    if resume is not None and results_dir not in (None, Path("results")):
        raise ConfigError("--results-dir: --resume continues in the run's own folder; leave it out")


class OrderChoice(str, Enum):
    """``--order``: the measuring order of a sweep (:mod:`mlabench.sweep.order`)."""

    grid = "grid"
    shuffled = "shuffled"
    interleaved = "interleaved"


Order = Annotated[OrderChoice | None, typer.Option(
    metavar="grid|shuffled|interleaved",
    help="Measuring order (default interleaved, or the config's; a resumed run keeps its own).")]
OrderSeed = Annotated[int | None, typer.Option(
    metavar="N", help="Seed of the order (default: drawn and recorded).")]
Visits = Annotated[int | None, typer.Option(
    min=1, max=16, metavar="N",
    help="Visits per point, spread over the run, samples pooled (default 4 on a GPU, 1 on the CPU, or the config's).")]
MaxVisits = Annotated[int | None, typer.Option(
    min=1, max=48, metavar="N",
    help="Most visits of a point whose visits disagree: it is visited again while the standard error of the mean of its "
         "visits' medians is above 0.3% (default 3 x --visits, or the config's).")]
GraphCaptures = Annotated[int | None, typer.Option(
    min=1, max=16, metavar="N",
    help="Graphs captured per GPU measurement, samples replayed from each in turn (default 1, or the config's; "
         "no graphs on the CPU).")]
VllmBin = Annotated[str | None, typer.Option(
    metavar="PATH", help="vllm executable (before $MLABENCH_VLLM_BIN and the config's vllm_bin).")]


# ---- output -------------------------------------------------------------------------------------
class OutputFormat(str, Enum):
    """``--format``: a Rich table on the terminal, or JSON, markdown or CSV text."""

    table = "table"
    json = "json"
    markdown = "markdown"
    csv = "csv"


Format = Annotated[OutputFormat | None, typer.Option(
    "--format", metavar="table|json|markdown|csv", help="Output (default: table).")]
Json = Annotated[bool, typer.Option("--json", help="Same as --format json.")]
Markdown = Annotated[bool, typer.Option("--markdown", help="Same as --format markdown.")]


def output_format(format: OutputFormat | None, as_json: bool = False, markdown: bool = False) -> str:
    """The one output format of ``--format`` and its aliases ``--json`` / ``--markdown``.

    Raises :class:`ConfigError` when they ask for different formats.
    """
    if as_json and markdown:
        raise ConfigError("choose one of --json and --markdown")
    alias = "json" if as_json else "markdown" if markdown else None
    chosen = format.value if format is not None else None
    if alias and chosen and alias != chosen:
        raise ConfigError(f"--format {chosen} contradicts --{alias}")
    return alias or chosen or "table"


def name_list(values: list[str] | None) -> list[str] | None:
    """``["a,b", "c"]`` (a repeatable option, commas allowed) -> ``["a", "b", "c"]``; None when the
    option was not given."""
    if not values:
        return None
    return [name for value in values for name in (part.strip() for part in value.split(",")) if name] or None


def int_list(text: str | None, flag: str, positive: str | None = None) -> list[int] | None:
    """``"1,2, 4"`` -> ``[1, 2, 4]``; None when the flag was not given.

    Raises :class:`ConfigError` naming ``flag`` for anything but comma-separated integers (an
    empty item, as in ``"256,,512"``, included), and,
    when ``positive`` names the values (e.g. ``"context length"``), for a value <= 0.
    """
    if text is None:
        return None
    items = text.replace(" ", "").split(",")
    if not any(items):
        raise ConfigError(f"{flag} is empty")
    if not all(items):
        raise ConfigError(f"{flag} has an empty item: {text!r}")
    try:
        values = [int(x) for x in items]
    except ValueError:
        raise ConfigError(f"{flag} takes comma-separated integers, got {text!r}") from None
    for v in values if positive else []:
        if v <= 0:
            raise ConfigError(f"{positive} must be > 0, got {v}")
    return values


def fraction(text: str | None, flag: str, below_one: bool = True) -> float | None:
    """``"0.03"`` or ``"3%"`` -> ``0.03``; None when the flag was not given.  Raises
    :class:`ConfigError` naming ``flag`` for anything else, for a negative value and, with
    ``below_one``, for one of 1 (100%) or more; without it, 100% or more only as a percentage
    (a bare ``5``, meant as 5%, would read as 500%)."""
    if text is None:
        return None
    body = text.strip()
    try:
        value = float(body[:-1]) / 100 if body.endswith("%") else float(body)
    except ValueError:
        raise ConfigError(f"{flag} takes a fraction such as 0.03 or 3%, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or (below_one and value >= 1):
        span = "[0, 1)" if below_one else ">= 0"
        raise ConfigError(f"{flag} is a fraction {span} (0.03 or 3%), got {text!r}")
    if value >= 1 and not body.endswith("%"):
        raise ConfigError(f"{flag} {text} reads as {100 * value:g}%: give 0.05 or 5% for 5%, or a slowdown of "
                          f"100% or more as a percentage ({100 * value:g}%)")
    return value


# ---- flags that would change nothing ----------------------------------------------------------
# Like --from and --resume beside flags they do not take, a flag that cannot apply to what the
# command runs is refused (one error line, exit 2) rather than dropped without a word.
def non_causal_applies(non_causal: bool, qo_lens: list[int]) -> None:
    """Refuse ``--non-causal`` when every query-token count ``qo_lens`` is 1: with one token both
    masks are the same problem, so the flag would change nothing.  Raises :class:`ConfigError`."""
    if non_causal and all(t == 1 for t in qo_lens):
        raise ConfigError("--non-causal changes nothing at one query token (both masks are the same there); "
                          "give --qo-len 2 or more (e.g. --qo-len 2), or leave --non-causal out")


def backend_params(params: list[str] | None, splits: str | None,
                   backends: Sequence[str] | None) -> dict[str, list[Any]] | None:
    """The backend parameters of ``--param NAME=V[,V...]`` (repeatable) and of its alias ``--splits
    N[,N...]`` (``--param num_kv_splits=N[,N...]``), as axes ``{name: [value, ...]}`` with each value
    coerced by its :class:`~mlabench.backends.base.ParamSpec`; None when neither was given.

    The one place the command line's backend parameters are checked against the registry, for
    ``backends`` (the names the command runs; None or empty: every registered backend, whose values
    those available here judge, as a sweep's own points would; a name not registered is left to the
    command, which names it, and the check is then against every backend).  Raises :class:`ConfigError` in one line for text not ``NAME=V[,V...]``, a name given
    twice or by both flags, a name none of those backends takes (listing the parameters they take),
    unnamed, and a value a backend that takes the name refuses (the spec's own error, after the
    flag); then :class:`BackendUnavailableError` (exit 3), unnamed, for a valid value of a name no
    backend available here takes (those that take it cannot run here, so every point would run
    without it).
    """
    from mlabench.backends import backend_names, get_backend

    axes: dict[str, list[Any]] = {}
    flags: dict[str, str] = {}
    for text in params or ():
        name, sep, values = (part.strip() for part in text.partition("="))
        items = [v.strip() for v in values.split(",")]
        if not sep or not name or not all(items):
            raise ConfigError(f"--param takes NAME=V[,V...] (e.g. num_kv_splits=1,16), got {text!r}")
        if name in axes:
            raise ConfigError(f"--param {name} is given twice: give its values once, comma-separated")
        axes[name], flags[name] = items, f"--param {name}"
    split_list = int_list(splits, "--splits", "--splits")
    if split_list:
        if SPLITS_PARAM in axes:
            raise ConfigError(f"--splits is --param {SPLITS_PARAM}=N[,N...]: give one of them")
        axes[SPLITS_PARAM], flags[SPLITS_PARAM] = split_list, "--splits"
    if not axes:
        return None
    known = backend_names()
    names = list(dict.fromkeys(backends)) if backends and set(backends) <= set(known) else known
    specs = [spec for name in names for spec in get_backend(name).params]
    here = specs if names is not known else [  # unnamed: the backends that would run judge the values
        spec for name in names if get_backend(name).available()[0] for spec in get_backend(name).params]
    for name, values in axes.items():
        takers = [spec for spec in specs if spec.name == name]
        if not takers:
            raise ConfigError(_not_taken(flags[name], name, names, specs, everyone=names is known))
        judges = [spec for spec in here if spec.name == name] or takers
        try:
            axes[name] = [[spec.validate(v) for spec in judges][0] for v in values]
        except ConfigError as exc:
            raise ConfigError(f"{flags[name]}: {exc}") from None
        if names is known and not any(spec.name == name for spec in here):
            owners = [b for b in names if any(spec.name == name for spec in get_backend(b).params)]
            raise BackendUnavailableError(
                f"{flags[name]}: no backend available here takes {name!r}, so every point would run "
                f"without it ({', '.join(owners)} {'takes' if len(owners) == 1 else 'take'} it: "
                f"`mlabench backends` says why {'it is' if len(owners) == 1 else 'they are'} not "
                f"available); leave {flags[name]} out, or run where {' or '.join(owners)} runs")
    return axes


#: The parameter ``--splits`` sets.
SPLITS_PARAM = "num_kv_splits"


def _not_taken(flag: str, name: str, backends: list[str], specs: list[Any], everyone: bool) -> str:
    """The one line refusing ``flag``, whose parameter ``name`` none of ``backends`` takes."""
    taken = ", ".join(dict.fromkeys(spec.name for spec in specs)) or "no parameters"
    who = ("no backend takes" if everyone else f"{backends[0]} does not take" if len(backends) == 1
           else f"none of {', '.join(backends)} takes")
    what = f"{flag} sets {name}, which" if flag == "--splits" else f"{flag}: unknown parameter {name!r}, which"
    return (f"{what} {who} ({'it takes' if len(backends) == 1 else 'they take'}: {taken}; "
            "`mlabench backends --params` lists each backend's "
            f"parameters); name a backend that takes it, or leave {flag} out")


def page_size_flag(value: int | None) -> int | None:
    """``--page-size`` as given, refused (naming the flag) unless it is a page size the kernels take."""
    from mlabench.shapes import SUPPORTED_PAGE_SIZES

    if value is not None and value not in SUPPORTED_PAGE_SIZES:
        raise ConfigError(f"--page-size takes {', '.join(map(str, SUPPORTED_PAGE_SIZES))}, got {value}")
    return value
