"""AITER's Gluon MLA decode on gfx950 (``aiter-gluon``): a split-KV kernel whose split count AITER picks.

The entry point is ``mla_gluon`` (AITER v0.1.18 on) or ``mla_decode_gluon`` (v0.1.16-v0.1.17):
one argument list, called alike.  How many splits run depends on the installed AITER's rule
(:mod:`mlabench.backends.aiter.rules`, detected by :mod:`mlabench.backends.aiter.probe`): every
result records the splits each request actually runs, the count AITER launched, the rule and how
it was decided.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from mlabench.backends.aiter.args import page1_layout_for_steps
from mlabench.backends.aiter.common import (
    AiterBackend, bf16_mla, installed_aiter, require_aiter, rocm_reason, rules_in_force,
)
from mlabench.backends.aiter.probe import AiterInstall
from mlabench.backends.aiter.rules import (
    GluonPlan, gluon_crash_reason, gluon_plan, gluon_qo_len_reason, gluon_step_plan, gluon_workspace_bytes,
)
from mlabench.backends.base import SPLITS_ON_DEVICE, ParamSpec, PreparedCall
from mlabench.backends.registry import register
from mlabench.backends.shared import NUM_KV_SPLITS, likely_split_starts
from mlabench.device import current_device
from mlabench.errors import UnsupportedShapeError
from mlabench.inputs import MLADecodeInputs, allocated_kv_cache_bytes
from mlabench.shapes import MLADecodeShape

GLUON_ARCHS = ("gfx950",)
GLUON_RULES = ("gluon_bh16_splits", "gluon_bh16_max_heads", "gluon_bh64", "gluon_over_2gib", "gluon_qo_len")

NUM_KV_SPLITS_GLUON = dataclasses.replace(
    NUM_KV_SPLITS, default=None, high=256,
    help="KV splits; None = AITER's choice.  Steerable only under AITER's bounded rule (before "
         "v0.1.20, 1-96 heads), through min_kv_seq_len = n * 64",
)
MIN_KV_SEQ_LEN = ParamSpec(
    "min_kv_seq_len", int, default=None, low=1,
    help="min_kv_seq_len passed to AITER; None (the default): the shortest context when the call "
         "is prepared, as a server passes it (1 when it captures its graphs at 1 token: vLLM's "
         "graph-capture hazard, 1 split, on AITER before v0.1.20)",
)


@register
class AiterGluonBackend(AiterBackend):
    """AITER's Gluon MLA decode (gfx950).

    q is passed as two views, ``q_nope = q[..., :512]`` and ``q_pe = q[..., 512:]``; the cache as
    rows ``[P * page, 576]`` with ``page_table = kv_indices`` and ``seq_info = kv_indptr``
    (``use_2d_view=False``, AITER's flattened varlen form).  The call is built for the lengths in
    ``inputs.cache_seqlens`` when it is prepared (a server's at capture time; the shape's lengths
    only size the block table), ``min_kv_seq_len`` the shortest of them unless a parameter says
    otherwise.  The output is written in place into the poisoned ``out``;
    AITER allocates its split partials inside the call (from the caching allocator).  Several query
    tokens per request go through AITER's 4-D multi-token entry where the installed AITER has it
    (rule ``gluon_qo_len``: q and out viewed ``[B, qo_len, H, D]``, causal only).

    ``effective_params``: ``num_kv_splits`` -- the splits every request runs, or the per-request
    list where they differ; ``num_kv_splits_launched`` -- AITER's ``NUM_KV_SPLITS`` (a budget from
    v0.1.20); ``splits_on_device`` -- True under the budget rule, where ``refresh`` keeps
    ``num_kv_splits`` and ``workspace_bytes`` at what runs at the new lengths (otherwise the count
    stays what ``prepare`` chose; ``split_starts`` are those of the lengths at prepare);
    ``workspace_bytes`` counts only the splits that run.  Where the split rule is a guess (a
    development build whose source shows none, :attr:`AiterInstall.rule_guesses`) both counts are
    None and ``num_kv_splits_unknown`` says why, rather than a count AITER may not launch.  Shapes AITER refuses (its head, batch
    and ``min_kv_seq_len`` checks, citing the failure AITER hits first) and KV caches that would
    crash it (the allocated tensor, spare page included) are ``unsupported`` before anything
    launches, with the reason.
    """

    name = "aiter-gluon"
    family = "split-kv"
    rule_kinds = GLUON_RULES
    summary = "AITER Gluon MLA decode (ROCm gfx950), split-KV with AITER's split rule"
    params = (NUM_KV_SPLITS_GLUON, MIN_KV_SEQ_LEN)

    def available(self) -> tuple[bool, str]:
        why = rocm_reason(GLUON_ARCHS)
        found, reason = (None, why) if why else installed_aiter("gluon")
        if found is None or reason:
            return False, reason
        arch = current_device().arch  # Gluon compiles for the current device's target
        if arch not in GLUON_ARCHS:
            return False, f"needs an AMD gfx950 GPU; found {arch}"
        return True, ""

    def supports(self, shape: MLADecodeShape) -> tuple[bool, str]:
        ok, reason = bf16_mla(shape)
        if not ok:
            return ok, reason
        rules = rules_in_force()
        refusal = (gluon_qo_len_reason(rules["gluon_qo_len"], shape.qo_len, shape.causal)
                   or gluon_crash_reason(rules["gluon_over_2gib"], allocated_kv_cache_bytes(shape)))
        if refusal:
            return False, refusal
        try:
            gluon_plan(shape.context_lens, shape.num_heads, rules, qo_len=shape.qo_len)
        except UnsupportedShapeError as exc:
            return False, str(exc)
        return True, ""

    def prepare(self, inputs: MLADecodeInputs, params: dict[str, Any]) -> PreparedCall:
        found = require_aiter("gluon")
        s = inputs.shape
        ok, why = self.supports(s)
        rows = inputs.kv_cache.view(-1, inputs.kv_cache.shape[-1])  # [P * page, 576]
        why = why or gluon_crash_reason(found.rule("gluon_over_2gib"), rows.numel() * rows.element_size())
        if why:
            raise UnsupportedShapeError(why)
        lens = inputs.cache_seqlens.tolist()  # the lengths now: a server's at capture time
        plan = gluon_plan(lens, s.num_heads, found.rule_variants(), params["min_kv_seq_len"],
                          params["num_kv_splits"], qo_len=s.qo_len)
        gluon = found.functions["gluon"]
        layout, refill = page1_layout_for_steps(inputs.block_table, lens, s.page_size, s.qo_len)
        lora = s.kv_lora_rank
        out = inputs.new_output()
        q, o = inputs.q, out  # [B, H, D] for one token; AITER's 4-D [B, qo_len, H, D] for more
        if s.qo_len > 1:
            q, o = q.view(s.batch, s.qo_len, *q.shape[1:]), out.view(s.batch, s.qo_len, *out.shape[1:])
        q_nope, q_pe = q[..., :lora], q[..., lora:]

        def fn() -> torch.Tensor:
            gluon(q_nope, q_pe, rows, o=o, page_table=layout.kv_indices, seq_info=layout.kv_indptr,
                  sm_scale=s.scale, kv_pe_offset=lora, use_2d_view=False,
                  min_kv_seq_len=plan.min_kv_seq_len)
            return out

        call = PreparedCall(fn=fn, out=out, effective_params=self._effective(found, plan))

        def refresh() -> None:
            """The page-size-1 indices for the new lengths, and the record of what runs at them:
            under the budget rule each request's count follows its length; otherwise the split
            count and min_kv_seq_len stay what prepare chose on the host (frozen in a graph too)."""
            lens = inputs.cache_seqlens.tolist()
            if min(lens) < plan.min_kv_seq_len:
                raise UnsupportedShapeError(
                    f"a context of {min(lens)} tokens is below the min_kv_seq_len "
                    f"{plan.min_kv_seq_len} this call was prepared with (AITER takes it as the "
                    "shortest context): prepare it with a smaller min_kv_seq_len")
            refill(lens)
            if plan.on_device:
                self._record(call, gluon_step_plan(plan, lens), s)

        call.refresh = refresh
        self._record(call, plan, s)
        call.split_starts = likely_split_starts(lens, plan.splits_run)
        return call

    @staticmethod
    def _record(call: PreparedCall, plan: GluonPlan, s: MLADecodeShape) -> None:
        """Set what ``call`` runs under ``plan``: its split counts and the partials they write; the
        counts stay None where the split rule is a guess (``num_kv_splits_unknown`` says why)."""
        known = "num_kv_splits_unknown" not in call.effective_params
        call.effective_params["num_kv_splits"] = plan.splits_run if known else None
        call.workspace_bytes = gluon_workspace_bytes(plan, s.num_heads, s.v_head_dim,
                                                     call.out.element_size(), s.qo_len)

    @staticmethod
    def _effective(found: AiterInstall, plan: GluonPlan) -> dict[str, Any]:
        kind = "gluon_bh16_splits" if plan.regime == "bh16" else "gluon_bh64"
        rule, guess = found.rules[kind], found.rule_guesses.get(kind)
        return {
            "num_kv_splits": None if guess else plan.splits_run,
            "num_kv_splits_launched": None if guess else plan.launched,
            **({"num_kv_splits_unknown": guess} if guess else {}),
            "min_kv_seq_len": plan.min_kv_seq_len,
            "split_source": "min_kv_seq_len steering" if plan.steered else "AITER's rule",
            SPLITS_ON_DEVICE: plan.on_device,
            "regime": plan.regime,
            "split_rule": rule.variant,
            "split_rule_from": rule.how,
            "api": found.gluon_api,
            "aiter_version": found.version,
            "aiter_behaves_like": found.behaves_like,
            "page_size_view": 1,
            "allocates_per_call": True,
        }
