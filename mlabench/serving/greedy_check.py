"""Greedy output check (``serve-check``): temperature 0, top-k logprobs, token ids vs a fixture.

The request is one ``POST /v1/completions`` with ``temperature=0``, ``logprobs=K``,
``max_tokens=N``, ``ignore_eos`` and ``return_tokens_as_token_ids`` (vLLM's OpenAI server then
names tokens ``"token_id:<id>"`` in ``logprobs.tokens`` and ``top_logprobs``), the check the
ROCm 12-head PR ran by hand: exactly N tokens, all logprobs finite, the token sequence equal to a
validated fixture. A divergence where the top two logprobs differ by less than a threshold is a
near tie: the same flip also happens between runs of an unchanged server, so it is reported apart
from a real mismatch.
"""

from __future__ import annotations

import hashlib
import json
import math
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mlabench.errors import ConfigError, ServerError
from mlabench.files import read_text, validation_line, write_text
from mlabench.serving.config import CheckParams, prompt_text
from mlabench.tables.table import ColumnStyle, Table

Verdict = Literal["match", "near_tie_divergence", "mismatch", "invalid"]


class GreedyOutput(BaseModel):
    """What the server returned for the fixed prompt (also the fixture file's content)."""

    model_config = ConfigDict(extra="forbid")
    schema_version: int = Field(1, description="Fixture format version.")
    model: str = Field(..., description="Served model id.")
    prompt_sha256: str = Field(..., description="SHA-256 of the prompt text sent (UTF-8).")
    prompt_head: str = Field(..., description="First 200 characters of the prompt, for people.")
    prompt_chars: int = Field(..., description="Prompt length, characters.")
    max_tokens: int = Field(..., description="N, output tokens asked for.")
    token_ids: list[int] = Field(..., description="Generated token ids, in order.")
    logprobs: list[float | None] = Field(..., description="Logprob of each chosen token, nats.")
    top_logprobs: list[dict[int, float | None]] = Field(
        ..., description="Top-K logprobs per position: token id -> logprob (nats)."
    )
    finish_reason: str | None = Field(None, description="finish_reason of the choice.")


class CheckReport(BaseModel):
    """Outcome of comparing a :class:`GreedyOutput` with the fixture."""

    model_config = ConfigDict(extra="forbid")
    verdict: Verdict = Field(..., description="match / near_tie_divergence / mismatch / invalid.")
    n_tokens: int = Field(..., description="Tokens returned.")
    expected_tokens: int = Field(..., description="N asked for.")
    all_finite: bool = Field(..., description="Every chosen and top-K logprob is finite.")
    first_divergence: int | None = Field(None, description="First differing position (0-based).")
    expected_token: int | None = Field(None, description="Fixture token there.")
    got_token: int | None = Field(None, description="Returned token there.")
    top2_gap: float | None = Field(
        None, description="Top-1 minus top-2 logprob at the divergence (nats; smaller of the "
        "fixture's and this run's)."
    )
    tie_threshold: float = Field(..., description="Gap below which a divergence is a near tie.")
    matched_prefix: int = Field(..., description="Tokens equal before the first divergence.")
    problems: list[str] = Field(default_factory=list, description="Why the verdict is not match.")


_MACHINE = ColumnStyle(show="machine")
_REPORT_STYLES = {
    "verdict": ColumnStyle(no_wrap=True), "tokens": ColumnStyle(justify="right", show="human"),
    "n_tokens": _MACHINE, "expected_tokens": _MACHINE, "all_finite": ColumnStyle(header="finite"),
    "matched_prefix": ColumnStyle(header="matched", justify="right"), "first_divergence": _MACHINE,
    "fixture_got": ColumnStyle(header="fixture/got", justify="right", show="human"),
    "expected_token": _MACHINE, "got_token": _MACHINE,
    "top2_gap": ColumnStyle(header="top-2 gap", justify="right"), "tie_threshold": _MACHINE,
}


def report_table(report: CheckReport, recorded: str | Path | None = None) -> Table:
    """The report as a one-row :class:`~mlabench.tables.table.Table`: JSON and CSV carry every field but
    ``problems`` under its own name; people see the verdict, tokens returned of N, finite logprobs,
    the matched prefix, fixture and returned token at the divergence (none where one run ended
    first) and the top-2 gap (nats).  The problems are notes; the row is green (match), yellow
    (near tie) or red.  ``recorded``: the fixture this run was saved to (``--save-fixture``), where
    nothing was compared: the verdict reads ``recorded`` when the run was complete."""
    values = report.model_dump(exclude={"problems"})
    values["tokens"] = f"{report.n_tokens}/{report.expected_tokens}"
    known = report.expected_token is not None or report.got_token is not None
    values["fixture_got"] = (f"{_token_text(report.expected_token)}/{_token_text(report.got_token)}"
                             if report.first_divergence is not None and known else None)
    title = "Greedy output check"
    if recorded is not None:
        title = f"Greedy fixture recorded: {recorded} (nothing compared)"
        values["verdict"] = "recorded" if report.verdict == "match" else report.verdict
    t = Table(title, list(_REPORT_STYLES), notes=list(report.problems), styles=_REPORT_STYLES)
    t.add_row([values[c] for c in t.columns],
              style={"match": "green", "near_tie_divergence": "yellow"}.get(report.verdict, "red"))
    return t

def _token_text(token: int | None) -> str:
    return "—" if token is None else str(token)


def check_request_matches(params: CheckParams, fixture: GreedyOutput, path: str | Path) -> None:
    """Raise :class:`ConfigError` when ``params`` ask for another number of tokens or another prompt
    than ``fixture`` (recorded at ``path``) was: the comparison could only say "invalid"."""
    if params.max_tokens != fixture.max_tokens:
        raise ConfigError(f"-n {params.max_tokens} asks for {params.max_tokens} tokens; the fixture {path} holds "
                          f"{fixture.max_tokens} (run with -n {fixture.max_tokens}, or record another fixture)")
    if _sha256(prompt_text(params)) != fixture.prompt_sha256:
        raise ConfigError(f"this check sends another prompt than the fixture {path} was recorded with "
                          f"(it begins {fixture.prompt_head!r}); use that prompt, or record another fixture")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _token_id(name: str) -> int:
    if not name.startswith("token_id:"):
        raise ServerError(f"server returned token {name!r}, not 'token_id:<id>' "
                          "(it ignored return_tokens_as_token_ids; is it vLLM?)")
    return int(name.split(":", 1)[1])


def parse_completion(body: dict[str, Any], prompt: str, max_tokens: int) -> GreedyOutput:
    """Turn a /v1/completions answer into a :class:`GreedyOutput`; raises :class:`ServerError`."""
    try:
        choice = body["choices"][0]
        lp = choice["logprobs"]
        ids = [_token_id(t) for t in lp["tokens"]]
        top = [{_token_id(k): v for k, v in (d or {}).items()} for d in lp["top_logprobs"]]
        return GreedyOutput(model=body.get("model", ""), prompt_sha256=_sha256(prompt),
                            prompt_head=prompt[:200], prompt_chars=len(prompt), max_tokens=max_tokens,
                            token_ids=ids, logprobs=list(lp["token_logprobs"]), top_logprobs=top,
                            finish_reason=choice.get("finish_reason"))
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ServerError(f"unexpected /v1/completions answer ({exc!r}): {str(body)[:300]}") from None


def request_greedy(base_url: str, model: str, params: CheckParams) -> GreedyOutput:
    """Send the fixed greedy request; raises :class:`ServerError` on HTTP or format errors."""
    prompt = prompt_text(params)
    payload = {
        "model": model, "prompt": prompt, "max_tokens": params.max_tokens,
        "temperature": 0.0, "logprobs": params.logprobs, "ignore_eos": True,
        "return_tokens_as_token_ids": True, "seed": 0,
    }
    req = urllib.request.Request(
        base_url.rstrip("/") + "/v1/completions", data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"}, method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=params.timeout_s) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise ServerError(f"{base_url}/v1/completions: HTTP {exc.code}: "
                          f"{exc.read()[:300].decode(errors='replace')}") from None
    except (OSError, ValueError) as exc:
        raise ServerError(f"{base_url}/v1/completions failed: {exc}") from None
    return parse_completion(body, prompt, params.max_tokens)


def top2_gap(top: dict[int, float | None]) -> float | None:
    """Top-1 minus top-2 logprob of one position, nats (None with fewer than 2 finite values)."""
    vals = sorted((v for v in top.values() if v is not None and math.isfinite(v)), reverse=True)
    return vals[0] - vals[1] if len(vals) >= 2 else None


def compare(out: GreedyOutput, fixture: GreedyOutput, tie_threshold: float) -> CheckReport:
    """Compare a run with the fixture (count, finiteness, ids, near tie at the first divergence).

    A divergence is a near tie when the top two logprobs of both the run and the fixture lie within
    ``tie_threshold`` nats there (the larger of the two gaps is reported) and the two tokens are
    each other's runner-up (each in the other's top logprobs): two unsure servers flipping between
    the same pair.  A fixture that was sure, or a token the fixture did not consider, is a mismatch."""
    problems = []
    finite = all(v is not None and math.isfinite(v) for v in out.logprobs) and all(
        v is not None and math.isfinite(v) for d in out.top_logprobs for v in d.values())
    if not finite:
        problems.append("non-finite logprob returned")
    if len(out.token_ids) != out.max_tokens:
        problems.append(f"{len(out.token_ids)} tokens returned, {out.max_tokens} asked for")
    if out.prompt_sha256 != fixture.prompt_sha256 or out.max_tokens != fixture.max_tokens:
        problems.append("prompt or max_tokens differ from the fixture's")
    first = next((i for i, (a, b) in enumerate(zip(out.token_ids, fixture.token_ids)) if a != b),
                 None)
    if first is None and len(out.token_ids) != len(fixture.token_ids):
        first = min(len(out.token_ids), len(fixture.token_ids))
    report = dict(n_tokens=len(out.token_ids), expected_tokens=out.max_tokens, all_finite=finite,
                  tie_threshold=tie_threshold, matched_prefix=first if first is not None
                  else len(out.token_ids))
    gap, swapped = None, False
    if first is not None and first < len(out.token_ids) and first < len(fixture.token_ids):
        gaps = [top2_gap(out.top_logprobs[first]), top2_gap(fixture.top_logprobs[first])]
        gap = None if None in gaps else max(gaps)  # both servers unsure, not just one
        want, got = fixture.token_ids[first], out.token_ids[first]
        swapped = want in out.top_logprobs[first] and got in fixture.top_logprobs[first]  # the same two tokens
        report.update(first_divergence=first, expected_token=want, got_token=got, top2_gap=gap)
    elif first is not None:
        report.update(first_divergence=first)
    if problems:
        verdict: Verdict = "invalid"
    elif first is None:
        verdict = "match"
    elif gap is not None and gap < tie_threshold and swapped:
        verdict = "near_tie_divergence"
        problems.append(f"token {first} differs at a near tie (gap {gap:.3g} < {tie_threshold})")
    else:
        verdict = "mismatch"
        problems.append(f"token {first} differs: expected {report.get('expected_token')}, got "
                        f"{report.get('got_token')} (top-2 gap {gap if gap is None else f'{gap:.3g}'})")
    return CheckReport(verdict=verdict, problems=problems, **report)


def validate_alone(out: GreedyOutput) -> CheckReport:
    """Checks that need no fixture (count, finiteness), used when saving a fixture."""
    report = compare(out, out, 0.0)
    return report


def save_fixture(out: GreedyOutput, path: Path) -> None:
    """Write ``out`` as a fixture; refuses to overwrite an existing file (ConfigError)."""
    path = Path(path)
    if path.exists():
        raise ConfigError(f"fixture {path} exists; remove it first to record a new one")
    write_text(path, out.model_dump_json(indent=1) + "\n", "fixture")


def load_fixture(path: Path) -> GreedyOutput:
    """Read a fixture written by :func:`save_fixture`; raises :class:`ConfigError`."""
    if not Path(path).exists():
        raise ConfigError(f"fixture not found: {path} (record one with --save-fixture)")
    text = read_text(path, "fixture")
    try:
        return GreedyOutput.model_validate_json(text)
    except ValidationError as exc:
        raise ConfigError(f"bad fixture {path}: {validation_line(exc)}") from None


def passes(report: CheckReport, strict: bool = False) -> bool:
    """Whether the check passed: a match, or a near-tie divergence unless ``strict``."""
    return report.verdict == "match" or (report.verdict == "near_tie_divergence" and not strict)
