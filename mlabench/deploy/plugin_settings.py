"""What the vLLM plugin runs, and the refusals it makes at start-up (no vLLM imported here).

The plugin (:mod:`mlabench.deploy.vllm_plugin`) runs ``gluon-splitkv`` for every decode step of an
MLA model with a split policy: the file ``mlabench tune --export`` writes (``policy.json``), or,
without one, vLLM's own Triton MLA rule as a table.  Two ways to say which, the first found wins:

1. vLLM's own config: ``vllm serve ... --additional-config '{"mlabench": {"split_policy":
   "policy.json", "split_mode": "device"}}'`` (every vLLM process sees it);
2. the environment: ``MLABENCH_SPLIT_POLICY=policy.json`` and ``MLABENCH_SPLIT_MODE=device``.

``split_mode`` is ``device`` (default: each request's count is looked up in the table in device
memory, so one captured CUDA graph runs the policy's count at every length) or ``host`` (one count
per step, looked up on the host from the longest context, as vLLM's Triton MLA backend chooses its
count: a graph captured at start-up keeps the count of its capture).

``short_extends`` says where the steps' short extends go: the chunked-prefill remainders of 2 to
512 new tokens that vLLM schedules beside decodes.  ``fa3`` (default): the plugin takes them as
decode, as vLLM's FLASH_ATTN_MLA does (``reorder_batch_threshold`` 512, variable query lengths), and
runs such a step's decode rows with vLLM's FA3 kernel (``mlabench.backends.vllm_fa3.fa3_mla_decode``;
a step of one-token decodes only, and every captured graph, still runs ``gluon-splitkv``).
``prefill``: they go through vLLM's prefill path, which gathers and up-projects the request's whole
context for every such remainder (``reorder_batch_threshold`` 1).  Set by ``"short_extends"`` in the
``--additional-config`` entry or ``MLABENCH_SHORT_EXTENDS``.

A policy tuned for another backend, head count, page size or query length is refused in one line
(:class:`PluginConfigError`), so a server never runs counts measured for another kernel or shape.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mlabench.errors import ConfigError
from mlabench.files import read_json
from mlabench.policy.device_table import POLICY_MODES, SplitPolicy, heuristic_policy, load_split_policy
from mlabench.policy.tuned import load_policy

#: The backend whose kernel the plugin runs, and so the only one whose policies it takes.
PLUGIN_BACKEND = "gluon-splitkv"
#: Tokens per KV-cache page the kernel reads (one TMA tile per block-table entry).
PLUGIN_PAGE_SIZE = 64
#: Environment variables (read in every vLLM process, which inherits them from ``vllm serve``).
ENV_POLICY = "MLABENCH_SPLIT_POLICY"
ENV_MODE = "MLABENCH_SPLIT_MODE"
ENV_SHORT_EXTENDS = "MLABENCH_SHORT_EXTENDS"
#: Where short extends go (module docstring), the default first.
SHORT_EXTEND_PATHS = ("fa3", "prefill")
#: The longest extend a step takes as decode with ``short_extends = "fa3"``: vLLM's FLASH_ATTN_MLA
#: ``reorder_batch_threshold`` (vLLM 0.26, ``flashattn_mla.py``).
SHORT_EXTEND_MAX_TOKENS = 512
#: The key of vLLM's ``--additional-config`` dictionary the plugin reads.
ADDITIONAL_CONFIG_KEY = "mlabench"


class PluginConfigError(ConfigError):
    """The plugin's settings or policy file do not fit the served model; raised at start-up, one line."""


@dataclass(frozen=True)
class PluginSettings:
    """The plugin's choices: ``policy_path`` (None: vLLM's rule as a table), ``mode`` (``device``
    or ``host``), ``origin``, where they came from (for the start-up line), and ``short_extends``
    (``fa3`` or ``prefill``, module docstring)."""

    policy_path: str | None
    mode: str
    origin: str
    short_extends: str = SHORT_EXTEND_PATHS[0]

    @classmethod
    def resolve(cls, additional_config: Mapping[str, Any] | None = None,
                env: Mapping[str, str] | None = None) -> PluginSettings:
        """The settings from vLLM's ``additional_config`` (its ``"mlabench"`` entry) if it has
        one, else from ``env`` (default ``os.environ``).  Raises :class:`PluginConfigError` for an
        unknown key, a mode other than ``device``/``host`` or a ``short_extends`` other than
        ``fa3``/``prefill``."""
        entry = (additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
        if entry is not None:
            if not isinstance(entry, Mapping):
                raise PluginConfigError(f"--additional-config {ADDITIONAL_CONFIG_KEY!r} must be an object "
                                        '{"split_policy": FILE, "split_mode": "device"|"host"}, '
                                        f"got {entry!r}")
            unknown = sorted(set(entry) - {"split_policy", "split_mode", "short_extends"})
            if unknown:
                raise PluginConfigError(f"--additional-config {ADDITIONAL_CONFIG_KEY!r}: unknown key(s) "
                                        f"{', '.join(unknown)} (known: split_policy, split_mode, short_extends)")
            return cls._checked(entry.get("split_policy"), entry.get("split_mode"),
                                entry.get("short_extends"), "--additional-config")
        env = os.environ if env is None else env
        if env.get(ENV_POLICY) or env.get(ENV_MODE) or env.get(ENV_SHORT_EXTENDS):
            return cls._checked(env.get(ENV_POLICY), env.get(ENV_MODE), env.get(ENV_SHORT_EXTENDS),
                                "environment")
        return cls(None, "device", "default")

    @classmethod
    def _checked(cls, path: Any, mode: Any, short_extends: Any, origin: str) -> PluginSettings:
        mode = str(mode or "device")
        if mode not in POLICY_MODES:
            raise PluginConfigError(f"mlabench split_mode must be one of {', '.join(POLICY_MODES)} "
                                    f"({origin}), got {mode!r}")
        extends = str(short_extends or SHORT_EXTEND_PATHS[0])
        if extends not in SHORT_EXTEND_PATHS:
            raise PluginConfigError(f"mlabench short_extends must be one of {', '.join(SHORT_EXTEND_PATHS)} "
                                    f"({origin}), got {extends!r}")
        return cls(str(path) if path else None, mode, origin, extends)


def reorder_batch_threshold(settings: PluginSettings) -> int:
    """The longest extend vLLM's scheduler hands the plugin as decode: 512 tokens when short
    extends go to FA3, 1 (every extend a prefill) when they go to vLLM's prefill path."""
    return SHORT_EXTEND_MAX_TOKENS if settings.short_extends == "fa3" else 1


def load_plugin_policy(settings: PluginSettings, num_heads: int, page_size: int,
                       num_sms: int) -> SplitPolicy:
    """The split policy the plugin runs for ``num_heads`` local heads and pages of ``page_size``.

    Without a file: vLLM's Triton MLA rule (:func:`mlabench.policy.device_table.heuristic_policy`
    for ``num_sms`` SMs).  A ``tune`` policy file must be for ``gluon-splitkv``, ``num_heads``
    heads, page size ``page_size`` and one query token; a bare table (``{"num_kv_splits": ...}``
    or a list) records none of these and is taken as it is.  Raises :class:`PluginConfigError`
    (or the file's own :class:`ConfigError`) in one line otherwise.
    """
    if settings.policy_path is None:
        return heuristic_policy(num_sms)
    path = settings.policy_path
    tuned = _tuned_policy_or_none(path)
    if tuned is not None:
        shape = tuned.shape
        wrong = []
        if tuned.backend != PLUGIN_BACKEND:
            wrong.append(f"backend {tuned.backend} (the plugin runs {PLUGIN_BACKEND})")
        if int(shape.get("num_heads", num_heads)) != num_heads:
            wrong.append(f"{shape['num_heads']} heads (this server has {num_heads} per GPU)")
        if int(shape.get("page_size", page_size)) != page_size:
            wrong.append(f"page size {shape['page_size']} (this server's is {page_size})")
        if int(shape.get("qo_len", 1)) != 1:
            wrong.append(f"{shape['qo_len']} query tokens (the plugin decodes one token a step)")
        if wrong:
            raise PluginConfigError(f"{path}: a split policy for {'; '.join(wrong)}: refused; "
                                    f"tune {PLUGIN_BACKEND} for this shape (mlabench tune --export)")
    return load_split_policy(path)


def _tuned_policy_or_none(path: str):
    """The ``tune`` policy in ``path``, or None when the file is a bare table (read, then, by
    :func:`load_split_policy`, which reports a bad file in one line)."""
    data = read_json(path, "split policy")
    if isinstance(data, dict) and "batches" in data:
        return load_policy(path)
    return None


def describe_policy(settings: PluginSettings, policy: SplitPolicy, num_heads: int) -> str:
    """The plugin's start-up line: kernel, heads, policy source and mode, and per tuned batch
    size the counts it runs, e.g. ``mlabench: gluon-splitkv MLA decode, 12 heads, page 64; split
    policy results/.../policy.json (environment), device lookup; batch 1: 1-128 splits over 58
    length buckets; batch 16: 1-16 splits over 15 length buckets; short extends: vLLM's FA3
    kernel (...)``."""
    source = settings.policy_path or "vLLM's Triton MLA rule (no policy file)"
    lookup = ("looked up per request in device memory (one graph, every length)"
              if settings.mode == "device" else
              "looked up on the host from the longest context (frozen by a captured graph)")
    batches = "; ".join(
        f"batch {b}: {min(s for _, s in rows)}-{max(s for _, s in rows)} splits over "
        f"{len(rows)} length buckets" for b, rows in sorted(policy.tables.items()))
    extends = (f"vLLM's FA3 kernel (steps with extends of 2-{SHORT_EXTEND_MAX_TOKENS} tokens)"
               if settings.short_extends == "fa3" else "vLLM's prefill path")
    return (f"mlabench: {PLUGIN_BACKEND} MLA decode, {num_heads} heads, page {PLUGIN_PAGE_SIZE}; "
            f"split policy {source} ({settings.origin}), {lookup}; {batches}; short extends: {extends}")
