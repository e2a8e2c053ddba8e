"""The report's "tuned policy and validation" and "graph-check" sections (the line describing a
tuning or validation run's configuration is :mod:`mlabench.report.run_text`'s).

Numbers come from the runs as recorded: a tuning run's choice per study from its trial records and
its exported policy (:mod:`mlabench.report.figures.tuning_data`), a validation run's regret summary from its
``validation.json`` (the same table ``tune --validate`` printed), a graph-check result's rows from
its JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlabench.policy.tuned import TILES_NOTATION
from mlabench.report.document import Block, FigureBlock, Heading, Missing, Para, TableBlock
from mlabench.report.figures import tuning_data as T
from mlabench.report.figures.spec import FigureSpec
from mlabench.report.run_text import tune_config_text, validate_config_text
from mlabench.run_files import POLICY_FILE, VALIDATION_FILE
from mlabench.tables.table import Table


def _figures_of(specs: Sequence[FigureSpec], kinds: Sequence[str], name: str, alone: bool) -> list[Block]:
    """The figures of ``kinds`` that belong to the run ``name`` (every one when it is the only run)."""
    return [FigureBlock(s.stem, s.caption, s.draw) for s in specs
            if s.kind in kinds and (alone or s.stem.endswith(name))]


def params_text(params: dict[str, Any] | None) -> str:
    """``num_kv_splits=23`` (parameters left empty, e.g. no ``split_policy`` file, are not shown)."""
    if params is None:
        return "—"
    return " ".join(f"{k}={v}" for k, v in params.items() if v != "") or "defaults"


def choice_table(run: Any) -> Table:
    """Per study of a tuning run: configurations measured, the policy's choice and its µs, the
    fastest trial, the best public heuristic, and the speedup of the choice over it."""
    t = Table(f"{run.name}: choice per batch and context bucket (µs: median per decode call)",
              ["batch", "bucket", "measured at", "configurations", "correct", "chosen", "chosen µs",
               "fastest", "fastest µs", "best heuristic", "heuristic µs", "speedup"])
    for c in T.study_choices(run):
        t.rows.append([c.study.batch, c.study.bucket, c.study.length, c.configs, c.ok, params_text(c.chosen),
                       c.chosen_us, params_text(c.fastest), c.fastest_us,
                       f"{c.best_heuristic} ({params_text(c.heuristic)})" if c.best_heuristic else "—",
                       c.heuristic_us, c.speedup])
    t.notes += ["chosen: the exported policy's parameters at the bucket's measured length (the tuner keeps "
                "the fewest splits within the noise of the fastest); speedup = best heuristic µs / chosen µs",
                "measured at: of a study measured at several lengths, the one nearest the bucket's middle (the "
                "choice weighed them all: the tune command's own table has each study's worst ratio)",
                "configurations: trials with a record of their own (a configuration suggested again is reused)"]
    return t


def policy_table(policy: Any) -> Table:
    """The exported policy: per batch size, each entry's longest context and parameters."""
    t = Table(f"Policy for {policy.backend} on {policy.device} (adjacent buckets with the same choice merged)",
              ["batch", "max context", "params"])
    t.rows = [[b.batch, e.max_context_len, e.describe()] for b in policy.batches for e in b.entries]
    if any(e.tokens_per_split for b in policy.batches for e in b.entries):
        t.notes.append("min(ceil(L/t),n): the split count scales with the context length L, one split per t "
                       "tokens, at most n")
    if any(e.tile_tokens for b in policy.batches for e in b.entries):
        t.notes.append(TILES_NOTATION)
    return t


def _tune_blocks(run: Any, specs: Sequence[FigureSpec], alone: bool) -> list[Block]:
    ok = sum(r.status == "ok" for r in run.records)
    blocks: list[Block] = [Heading(f"Tuning run {run.name}", 3),
                           Para(f"{tune_config_text(run.config)}. {len(run.records)} configurations measured, "
                                f"{ok} correct ({run.path})."),
                           TableBlock(choice_table(run))]
    if run.policy is None:
        blocks.append(Missing(f"tuning run {run.name} has no {POLICY_FILE}: it did not finish (continue it with "
                              f"`mlabench tune --resume {run.path}`, or write the policy of its studies with "
                              f"`mlabench tune --export {run.path}`)"))
    else:
        blocks.append(TableBlock(policy_table(run.policy)))
    return blocks + _figures_of(specs, ("tuned-policy", "tuning-history"), run.name, alone)


def _validation_blocks(runs: Any, run: Any, specs: Sequence[FigureSpec], alone: bool) -> list[Block]:
    from mlabench.records.store import ResultStore
    from mlabench.tune.validation import Validation, validation_tables

    tune = next((t for t in runs.tune_runs if t.name == run.policy_run_id), None)
    blocks: list[Block] = [Heading(f"Validation run {run.name}", 3),
                           Para(f"{validate_config_text(run.manifest.config['validate'])}; the tuning run "
                                + ("is in this report" if tune else "is not among the folders given") + ".")]
    if run.points is None:
        return blocks + [Missing(f"{run.path} has no {VALIDATION_FILE} (an interrupted validation): no regret "
                                 "to show; run `mlabench tune --validate POLICY` again")]
    if tune is not None and tune.policy is not None and (note := _another_policy_note(tune, run.points)):
        blocks.append(Para(note))
    names = sorted({h for p in run.points for h in p.heuristics})
    given = tuple(run.manifest.config["validate"].get("context") or ())
    summary = validation_tables(Validation(ResultStore(run.path), run.points, names, given=given))[0]
    summary.title = f"{run.name}: {summary.title.lower()} (regret in %)"
    return blocks + [TableBlock(summary)] + _figures_of(specs, ("tuning-regret",), run.name, alone)


def _another_policy_note(tune: Any, points: Sequence[Any]) -> str | None:
    """A warning when the tuning run's ``policy.json`` is not the policy a validation measured: it
    launches other parameters at some held-out points (``tune --export`` rewrites the file, e.g.
    with another ``--combine``, after the validation); None when it launches what was measured at
    every point.  The table beside the report's regret would otherwise be another policy's."""
    other = [p for p in points if tune.policy.lookup(p.batch, p.context_len) != p.policy_params]
    if not other:
        return None
    p = other[0]
    return (f"Another policy: {tune.path}/{POLICY_FILE} is not the policy this run validated: it launches "
            f"other parameters at {len(other)} of its {len(points)} held-out points (batch {p.batch}, "
            f"{p.context_len} tokens: {params_text(tune.policy.lookup(p.batch, p.context_len))}, validated "
            f"{params_text(p.policy_params)}), exported again since (`tune --export`). The regret below is "
            f"the validated policy's; validate {POLICY_FILE} again for its own.")


def tuning_section(runs: Any, specs: Sequence[FigureSpec]) -> list[Block]:
    """Each tuning run's choices, policy and figures; each validation run's regret and figure."""
    blocks: list[Block] = [Heading("Tuned policy and validation")]
    if not runs.tune_runs and not runs.validation_runs:
        return blocks + [Missing("no tuning run among the folders given: `mlabench tune` writes the chosen split "
                                 "count per batch and context bucket, and `mlabench tune --validate` its regret "
                                 "on a held-out grid; pass their run folders to --from")]
    for run in runs.tune_runs:
        blocks += _tune_blocks(run, specs, len(runs.tune_runs) == 1)
    if not runs.validation_runs:
        blocks.append(Missing("no validation run among the folders given (`mlabench tune --validate "
                              f"<tuning run>/{POLICY_FILE}`): the policy's regret on held-out lengths is not shown"))
    for run in runs.validation_runs:
        blocks += _validation_blocks(runs, run, specs, len(runs.validation_runs) == 1)
    return blocks


def graph_check_table(check: Any) -> Table:
    """The rows of a graph-check result as its command printed them (slowdown as a signed %)."""
    t = Table(f"{check.path}: {check.title}",
              ["subject", "batch", "context", "graph µs", "tuned µs", "tuned splits", "splits in graph",
               "slower %", "refresh µs/step", "correct", "flagged", "note"])
    for r in check.rows:
        slow = r.get("slowdown_pct")
        t.rows.append([r["subject"], r["batch"], r["context"], r.get("graph_us"), r.get("tuned_us"),
                       r.get("tuned_splits"), r.get("captured_splits"), None if slow is None else f"{slow:+.1f}",
                       r.get("refresh_us"), r.get("correct"), r.get("flagged"), r.get("note") or ""])
    t.notes = list(check.notes)
    return t


def graph_check_section(runs: Any, specs: Sequence[FigureSpec]) -> list[Block]:
    """Each graph-check result's table and the slowdown figure."""
    blocks: list[Block] = [Heading("Graph capture: frozen choices (graph-check)")]
    if not runs.graph_checks:
        return blocks + [Missing("no graph-check result among the paths given (`mlabench graph-check --save "
                                 "FILE`, then pass FILE or its folder to --from)")]
    blocks += [TableBlock(graph_check_table(c)) for c in runs.graph_checks]
    return blocks + [FigureBlock(s.stem, s.caption, s.draw) for s in specs if s.kind == "graph-check"]
