"""The line that describes a tuning or a validation run's configuration, in the report's environment
table (:func:`config_row`) and atop its tuning sections.

Apart from :mod:`mlabench.report.tuning_sections` so that the kernel sections name a run's
configuration without importing the tuning figures' data (and the tuner's search space it reads).
"""

from __future__ import annotations

from typing import Any

from mlabench.report.figures import style


def tune_config_text(cfg: dict[str, Any]) -> str:
    """One line of a tuning run's configuration: backend, model, batch sizes, buckets, trials, noise."""
    buckets = cfg.get("buckets") or []
    model = f"model {cfg.get('model')}, TP {cfg.get('tp')}" if cfg.get("model") else f"{cfg.get('heads')} heads"
    qo = "" if cfg.get("qo_len", 1) == 1 else f"; qo_len {cfg.get('qo_len')}"
    return (f"tune {cfg.get('backend')}; {model}{qo}; batch {', '.join(map(str, cfg.get('batch') or []))}; "
            f"{len(buckets)} context buckets up to {style.context_text(buckets[-1]) if buckets else '—'}, each "
            f"measured at {_lengths_text(cfg)}; page {cfg.get('page_size')}; "
            f"{cfg.get('trials')} trials per study, sampler {cfg.get('sampler')}"
            + (", the public heuristics first" if cfg.get("heuristics") else "")
            + f"; ties within {100 * (cfg.get('noise') or 0):g}%")


def _lengths_text(cfg: dict[str, Any]) -> str:
    """Where a tuning run measured each bucket: its representative length (runs before several
    lengths per bucket), or K lengths scored by the worst or geometric-mean ratio to the best."""
    k = int(cfg.get("lengths_per_bucket") or 1)
    if k == 1:
        return f"its {cfg.get('representative')} length"
    rule = cfg.get("tokens_per_split")
    return (f"{k} lengths from its lower to its upper edge, scored by the {cfg.get('combine')} ratio to the best "
            f"at each" + (", split counts scaling with the length searched too" if rule else "")
            + (" (whole tiles per split too, where the backend declares its tile)" if rule and cfg.get("whole_tiles") else ""))


def validate_config_text(cfg: dict[str, Any]) -> str:
    """One line of a validation run's configuration: the policy's run, the held-out lengths (and
    how many were given with ``--context`` instead of drawn), the ladder."""
    lengths = cfg.get("lengths") or []
    span = f"{style.context_text(min(lengths))}-{style.context_text(max(lengths))}" if lengths else "—"
    ladder = ", ".join(map(str, cfg["ladder"])) if cfg.get("ladder") else "the default ladder"
    source = (cfg.get("policy_source") or {}).get("run_id") or "a policy without a recorded run"
    given = cfg.get("context") or []  # --context: not drawn, so held out only by chance
    which = (f"lengths per batch size ({span} tokens: {len(set(lengths) - set(given))} held out, drawn; "
             f"{len(given)} given with --context)" if given else f"held-out lengths per batch size ({span} tokens)")
    return (f"validate the {cfg.get('backend')} policy of {source} at {len(lengths)} {which} against {ladder} of "
            "split counts and every public heuristic")


def config_row(config: dict[str, Any]) -> tuple[str, str] | None:
    """``("tuning", text)`` or ``("validation", text)`` for a tuning or validation run's manifest
    configuration; None for a sweep's."""
    if "tune" in config:
        return "tuning", tune_config_text(config["tune"])
    if "validate" in config:
        return "validation", validate_config_text(config["validate"])
    return None
