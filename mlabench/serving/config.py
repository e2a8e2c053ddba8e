"""Serving configuration: server variants, bench parameters, greedy-check parameters.

A ``configs/serve/*.toml`` file is validated into :class:`ServeConfig` (pydantic, ``extra="forbid"``,
a description on every field). Bench defaults are the seed's hand-run ``vllm bench serve`` line
(ROCm 12-head MLA PR: random dataset, 100000 in / 1000 out, 3 prompts, 1 warm-up, seed 0,
request rate inf, ignore-eos, ``/v1/completions``, backend ``vllm``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo, field_validator,
    model_validator,
)

from mlabench.errors import ConfigError
from mlabench.files import config_file, read_text, read_toml, validation_line
from mlabench.serving.counts import count_table, counts_text, unrun_count_keys
from mlabench.serving.environment import expand
from mlabench.serving.overrides import apply_overrides

VLLM_BIN_ENV = "MLABENCH_VLLM_BIN"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BenchParams(_Strict):
    """Flags of ``vllm bench serve`` that mlabench sets; each maps to one ``--flag``."""

    backend: str = Field("vllm", description="--backend (vLLM's own default moved to 'openai').")
    endpoint: str = Field("/v1/completions", description="--endpoint, the API path requests go to.")
    dataset_name: str = Field("random", description="--dataset-name.")
    random_input_len: int | list[int] = Field(
        100000, description="--random-input-len, prompt tokens; a list benchmarks each length in turn "
        "against one server start (e.g. [4096, 32768, 100000]).")
    random_output_len: int = Field(1000, gt=1, description="--random-output-len, output tokens.")
    random_range_ratio: float = Field(0.0, ge=0.0, lt=1.0, description="--random-range-ratio.")
    num_prompts: int | dict[int, int] | None = Field(
        None, description="--num-prompts, measured requests per run: one number, or a table keyed by "
        "concurrency ({ 1 = 3, 16 = 16 }); default 3, or the concurrency when it is higher.")
    num_warmups: int | dict[int, int] = Field(
        1, description="--num-warmups, unmeasured requests sent at the run's concurrency before the "
        "measured ones: one number, or a table keyed by concurrency ({ 1 = 1, 16 = 16 }: a full burst at "
        "c=16, so one-time costs such as kernel compiles stay out of the measured run); a concurrency "
        "the table does not name gets 1.")
    seed: int = Field(0, description="--seed of the random dataset.")
    request_rate: Annotated[str, BeforeValidator(lambda v: str(v) if isinstance(v, (int, float))
                                                 else v)] = Field(
        "inf", description="--request-rate, requests/s or 'inf'.")
    ignore_eos: bool = Field(True, description="--ignore-eos: every request yields the full output.")
    trust_remote_code: bool = Field(True, description="--trust-remote-code.")
    disable_tqdm: bool = Field(True, description="--disable-tqdm.")
    percentile_metrics: str = Field(
        "ttft,tpot,itl,e2el", description="--percentile-metrics, metrics given percentiles."
    )
    metric_percentiles: str = Field("50,99", description="--metric-percentiles (99 gives p99_*).")
    extra_args: list[str] = Field(
        default_factory=list, description="Raw flags appended as they are (pass-through)."
    )

    @field_validator("request_rate")
    @classmethod
    def _rate(cls, value: str) -> str:
        try:
            rate = float(value)
        except ValueError:
            rate = math.nan
        if value != "inf" and not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"must be requests per second above 0 or 'inf', not {value!r}")
        return value

    @field_validator("random_input_len", mode="before")
    @classmethod
    def _lengths_shape(cls, value: Any) -> Any:
        if any(isinstance(v, bool) or not isinstance(v, int) for v in (value if isinstance(value, list) else [value])):
            raise ValueError(f"must be a token count or a list of them (e.g. [4096, 32768, 100000]), not {value!r}")
        return value

    @field_validator("num_prompts", "num_warmups", mode="before")
    @classmethod
    def _counts_shape(cls, value: Any, info: ValidationInfo) -> Any:
        return count_table(value, info.field_name or "", *_COUNT_WORDS[info.field_name or ""][:2])

    @field_validator("random_input_len")
    @classmethod
    def _lengths(cls, value: int | list[int], info: ValidationInfo) -> int | list[int]:
        lens = value if isinstance(value, list) else [value]
        if not lens or min(lens) < 1 or len(set(lens)) != len(lens):
            raise ValueError(f"must be a token count > 0 or a non-empty list of distinct ones, not {value}")
        if len(lens) > 1 and info.data.get("dataset_name") != "random":
            raise ValueError(f"several input lengths need dataset_name 'random', not {info.data.get('dataset_name')!r}")
        return value

    @field_validator("num_prompts", "num_warmups")
    @classmethod
    def _counts(cls, value: int | dict[int, int] | None, info: ValidationInfo) -> int | dict[int, int] | None:
        what, _, least = _COUNT_WORDS[info.field_name or ""]
        counts = value.values() if isinstance(value, dict) else [] if value is None else [value]
        if any(n < least for n in counts):
            raise ValueError(f"{what} counts must be {'> 0' if least else '>= 0'}, not {value}")
        return value

    def input_lens(self) -> list[int]:
        """The prompt lengths to benchmark (tokens), in config order: ``random_input_len`` as a list."""
        lens = self.random_input_len
        return list(lens) if isinstance(lens, list) else [lens]

    def prompts_at(self, concurrency: int) -> int | None:
        """``--num-prompts`` at ``concurrency``: the number, the table's entry (None when the table
        has none), or by default 3 (the seed's count) or ``concurrency`` when it is higher, so that
        every slot holds a request."""
        n = self.num_prompts
        if n is None:
            return max(3, concurrency)
        return n.get(concurrency) if isinstance(n, dict) else n

    def prompts_text(self, concurrencies: list[int]) -> str:
        """``--num-prompts`` in words: ``3``, or ``3 at c=1, 16 at c=16`` when it differs by concurrency."""
        return counts_text({c: self.prompts_at(c) for c in concurrencies})

    def warmups_at(self, concurrency: int) -> int:
        """``--num-warmups`` at ``concurrency``: the number, or the table's entry (1, the default,
        when the table names no such concurrency)."""
        n = self.num_warmups
        return n.get(concurrency, 1) if isinstance(n, dict) else n

    def warmups_text(self, concurrencies: list[int]) -> str:
        """``--num-warmups`` in words with its noun: ``1 warm-up``, ``16 warm-ups``, or
        ``1 warm-up at c=1, 16 at c=16`` when it differs by concurrency."""
        counts = {c: self.warmups_at(c) for c in concurrencies}
        return counts_text(counts, " warm-up" if list(counts.values())[:1] == [1] else " warm-ups")

    def for_run(self, input_len: int | None, concurrency: int) -> "BenchParams":
        """These parameters for one ``vllm bench serve`` run: one ``random_input_len`` (kept as it
        is when ``input_len`` is None) and the ``num_prompts`` and ``num_warmups`` of
        ``concurrency``, all scalars."""
        update: dict[str, Any] = {"num_prompts": self.prompts_at(concurrency),
                                  "num_warmups": self.warmups_at(concurrency)}
        if input_len is not None:
            update["random_input_len"] = input_len
        return self.model_copy(update=update)

    def min_output_tokens(self) -> int | None:
        """Fewest output tokens a complete run of these parameters yields, or None when the
        lengths are not fixed (a dataset other than ``random``, EOS honoured, or the lengths or
        prompt count passed through ``extra_args``), or when ``num_prompts`` is not one number
        (call it on :meth:`for_run`'s parameters).

        With ``ignore_eos`` every request of the random dataset produces its drawn output length,
        and vLLM draws it from ``[floor(L * (1 - r)), ceil(L * (1 + r))]`` (``L`` =
        ``random_output_len``, ``r`` = ``random_range_ratio``), so a complete run yields at least
        ``num_prompts * floor(L * (1 - r))`` tokens.
        """
        own = ("--random-output-len", "--random-range-ratio", "--num-prompts", "--dataset-name")
        if not isinstance(self.num_prompts, int) or not self.ignore_eos or self.dataset_name != "random" or \
                any(a.split("=", 1)[0] in own for a in self.extra_args):
            return None
        return self.num_prompts * math.floor(self.random_output_len * (1 - self.random_range_ratio))


# per count field of BenchParams: its noun in messages, an example table, the least count allowed
_COUNT_WORDS = {"num_prompts": ("prompt", "{ 1 = 3, 16 = 16 }", 1),
                "num_warmups": ("warm-up", "{ 1 = 1, 16 = 16 }", 0)}


class LaunchSpec(_Strict):
    """How to start a server: its command line and environment (``$VAR`` and ``~`` expanded)."""

    command: list[str] = Field(
        ..., min_length=1,
        description="argv of the server, e.g. ['{vllm_bin}', 'serve', MODEL, '--port', '8000']; "
        "'{vllm_bin}' becomes the resolved vllm executable.",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Variables added to the inherited environment."
    )
    cwd: str | None = Field(None, description="Working directory of the server (default: here).")
    health_timeout_s: float = Field(
        1800.0, gt=0, description="Seconds to wait for GET /health to answer 200."
    )
    stop_grace_s: float = Field(
        30.0, gt=0, description="Seconds after SIGINT (and again after SIGTERM) before escalating."
    )
    health_poll_s: float = Field(
        1.0, gt=0, description="Seconds between GET /health tries while the server starts."
    )

    def expanded_env(self) -> dict[str, str]:
        """``env`` with ``$VAR`` and ``~`` expanded (:func:`expand`): what the server gets, and what a
        serve-bench run records of it (``launch_env`` in its manifest)."""
        return {k: expand(v) for k, v in self.env.items()}


class Variant(_Strict):
    """One server variant: an existing base URL, or a launch spec that serves at ``base_url``."""

    name: str = Field(..., pattern=r"^[A-Za-z0-9_.-]+$", description="Label in tables/file names.")
    base_url: str = Field(..., description="Where the server answers, e.g. http://127.0.0.1:8000.")
    launch: LaunchSpec | None = Field(None, description="Start the server here when given.")
    start_hint: str | None = Field(
        None, description="Without [launch]: how to start this variant's server, said when base_url does not "
        "answer (e.g. the command that starts it)."
    )
    model: str | None = Field(
        None, description="--model for this variant (default: the config's, else /v1/models)."
    )
    bench: dict[str, Any] = Field(
        default_factory=dict, description="Per-variant overrides of [bench] keys."
    )
    concurrencies: list[int] | None = Field(None, min_length=1, description="Run this variant only at these "
                                            "of the config's concurrencies (default: every one), e.g. [16].")


class CheckParams(_Strict):
    """Greedy output check (``serve-check``): one fixed prompt, temperature 0."""

    prompt: str = Field(
        "The quick brown fox jumps over the lazy dog. " * 8,
        description="Fixed prompt text sent to /v1/completions.",
    )
    prompt_file: str | None = Field(
        None, description="Read the prompt text from this file instead ($VAR and ~ expanded)."
    )
    prompt_repeat: int = Field(
        1, ge=1, description="Send the prompt text this many times over (long-context checks)."
    )
    max_tokens: int = Field(64, gt=0, description="N: output tokens asked for and expected.")
    logprobs: int = Field(5, ge=2, description="Top logprobs per position (2 needed for gaps).")
    tie_threshold: float = Field(
        0.05, ge=0, description="A divergence where top-1 minus top-2 logprob (nats) is below "
        "this is a near tie.",
    )
    timeout_s: float = Field(600.0, gt=0, description="HTTP timeout of the request, seconds.")


def prompt_text(params: CheckParams) -> str:
    """The prompt serve-check sends: ``prompt_file`` or ``prompt``, times ``prompt_repeat``.

    Raises :class:`ConfigError` when the prompt file cannot be read.
    """
    text = params.prompt
    if params.prompt_file:
        text = read_text(expand(params.prompt_file), "check.prompt_file")
    return text * params.prompt_repeat


class ServeConfig(_Strict):
    """A ``configs/serve/*.toml`` file."""

    description: str = Field("", description="Free text shown in the run manifest.")
    model: str | None = Field(None, description="--model (default: first id of /v1/models).")
    tokenizer: str | None = Field(None, description="--tokenizer (default: the model).")
    vllm_bin: str | None = Field(
        None, description=f"vllm executable for 'vllm bench serve' (overridden by ${VLLM_BIN_ENV})."
    )
    baseline: str = Field(..., description="Name of the variant speedups are taken against.")
    concurrencies: list[int] = Field(
        default_factory=lambda: [1, 16], min_length=1, description="--max-concurrency values."
    )
    repeats: int = Field(1, ge=1, description="Runs of vllm bench serve per (variant, input length, concurrency).")
    bench_timeout_s: float = Field(7200.0, gt=0, description="Limit of one bench run, seconds.")
    bench_poll_s: float = Field(
        0.5, gt=0, description="Seconds between checks of a running bench (done? server alive?)."
    )
    variants: list[Variant] = Field(..., min_length=1, description="Server variants, in order.")
    bench: BenchParams = Field(default_factory=BenchParams, description="Bench flags.")
    check: CheckParams = Field(default_factory=CheckParams, description="serve-check settings.")
    prediction: dict[str, Any] | None = Field(
        None, description="[prediction]: layers, reference, short_input_len and per variant the "
        "kernel its server runs, for serve-bench --predict-from (checked by mlabench.deploy.prediction).")

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> "ServeConfig":
        names = [v.name for v in self.variants]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"duplicate variant names: {sorted(dup)}")
        if self.baseline not in names:
            raise ValueError(f"baseline {self.baseline!r} is not a variant (variants: {names})")
        if len(set(self.concurrencies)) != len(self.concurrencies) or min(self.concurrencies) < 1:
            raise ValueError(f"concurrencies must be distinct and >= 1: {self.concurrencies}")
        recorded = (info.context or {}).get("recorded")  # a recorded run is read as it ran
        declared = (info.context or {}).get("declared_concurrencies")  # the file's, before -c
        declared = declared if isinstance(declared, list) else ()
        if not recorded:  # a count table keyed by a concurrency not run (a typo: 61 for 16) is refused
            unrun_count_keys(self.bench.model_dump(), sorted({c for v in self.variants for c in self.concurrencies_for(v)}),
                             "", "no variant runs", declared)
        for v in self.variants:
            if v.concurrencies is not None and not self.concurrencies_for(v):
                raise ValueError(f"variant {v.name!r} runs at concurrencies {v.concurrencies}, none of "
                                 f"which is in concurrencies {self.concurrencies}")
            params = self.bench_for(v)
            if not recorded:
                unrun_count_keys(params.model_dump(include=set(v.bench)), self.concurrencies_for(v),
                                 f" (variant {v.name!r})", "the variant does not run", declared)
                self._check_prompts(v, params)
        return self

    def concurrencies_for(self, variant: Variant) -> list[int]:
        """The config's concurrencies, in order, less those ``variant.concurrencies`` leave out."""
        return [c for c in self.concurrencies if variant.concurrencies is None or c in variant.concurrencies]

    def _check_prompts(self, variant: Variant, params: BenchParams) -> None:
        """Raise ValueError unless every concurrency gets a prompt count, at least the concurrency
        (``vllm bench serve --num-prompts 3 --max-concurrency 16`` runs only 3 requests at once)."""
        where = f" (variant {variant.name!r})" if "num_prompts" in variant.bench else ""
        for conc in self.concurrencies_for(variant):
            n = params.prompts_at(conc)
            if n is None:
                raise ValueError(f"bench.num_prompts{where} gives no prompt count for concurrency {conc}")
            if n < conc:
                raise ValueError(f"bench.num_prompts{where}: concurrency {conc} gets {n} prompts, fewer "
                                 f"than {conc}, so it would run only {n} requests at once (give at least {conc})")

    def variant(self, name: str) -> Variant:
        """The variant called ``name``; raises :class:`ConfigError` listing the known names."""
        for v in self.variants:
            if v.name == name:
                return v
        raise ConfigError(f"unknown variant {name!r}; known: {[v.name for v in self.variants]}")

    def input_lens(self) -> list[int]:
        """Every input length some variant is benchmarked at (tokens), in order of first appearance."""
        return list(dict.fromkeys(n for v in self.variants for n in self.bench_for(v).input_lens()))

    def bench_for(self, variant: Variant) -> BenchParams:
        """Bench params of ``variant``: the config's ``[bench]`` with the variant's overrides."""
        merged = {**self.bench.model_dump(), **variant.bench}
        return BenchParams.model_validate(merged)


def resolve_vllm_bin(config_value: str | None = None, flag: str | None = None) -> str:
    """The vllm executable: ``flag``, else ``$MLABENCH_VLLM_BIN``, else the config's, else 'vllm'."""
    for candidate in (flag, os.environ.get(VLLM_BIN_ENV), config_value):
        if candidate:
            return expand(candidate)
    return "vllm"


def load_config(path: str | Path, overrides: list[str] | None = None) -> ServeConfig:
    """Read and validate a serve config TOML (``path``: a file, or the name of a shipped config,
    ``configs/serve/<name>.toml``) after ``overrides``, ``key.path=value`` strings (e.g.
    ``concurrencies=[1]``); raises :class:`ConfigError` with one clear line."""
    p = config_file(path, "serve", "serve config")
    raw = read_toml(p, "serve config")
    declared = {"declared_concurrencies": raw.get("concurrencies")}  # count tables may key these under -c
    try:
        return ServeConfig.model_validate(apply_overrides(raw, overrides or []), context=declared)
    except ValidationError as exc:
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise ConfigError(f"{p}: {validation_line(exc)}{more}") from None


def config_from_url(base_url: str, model: str | None = None, **kwargs: Any) -> ServeConfig:
    """A one-variant config for a server already running at ``base_url`` (named 'server')."""
    return ServeConfig(
        model=model, baseline="server", variants=[Variant(name="server", base_url=base_url)], **kwargs
    )


#: The serve-check flags that set :class:`CheckParams` fields, for error messages.
CHECK_FLAGS = {"max_tokens": "--tokens", "prompt": "--prompt", "tie_threshold": "--tie-threshold"}


def with_check_options(params: CheckParams, **options: Any) -> CheckParams:
    """``params`` with the options given (None values ignored, e.g. ``max_tokens``, ``prompt``,
    ``tie_threshold``), validated again; :class:`ConfigError` names a bad one by its flag and
    says why (``--tokens: Input should be greater than 0``)."""
    update = {k: v for k, v in options.items() if v is not None}
    try:
        return CheckParams.model_validate({**params.model_dump(), **update})
    except ValidationError as exc:
        field = str(exc.errors()[0]["loc"][0]) if exc.errors()[0]["loc"] else ""
        why = validation_line(exc).removeprefix(f"{field}: ")
        raise ConfigError(f"{CHECK_FLAGS.get(field, field)}: {why}") from None
