"""Where one split-KV call's split count comes from: a fixed ``num_kv_splits``, or a split policy
looked up per request in device memory or once per step on the host (the ``split_policy``
parameter of ``triton-splitkv`` and ``gluon-splitkv``; :func:`parse_split_policy`)."""

from __future__ import annotations

from typing import Any

import torch

from mlabench.device import current_device
from mlabench.policy.device_table import parse_split_policy
from mlabench.shapes import MLADecodeShape


class SplitChoice:
    """Where a split-KV call's split count comes from, from its ``split_policy`` parameter
    (:data:`SPLIT_POLICY`), for the backends that take one (``triton-splitkv``, ``gluon-splitkv``).

    ``grid_splits`` is the grid's split axis and the workspace's slots per request:
    ``num_kv_splits``, or the policy's largest count for this batch size.  ``table`` is the
    policy's int32 device table in ``device`` mode (None otherwise).  ``splits`` is the count the
    next launch passes: fixed, or in ``host`` mode the count :meth:`refresh_fn` looks up from the
    longest context at each refresh.  ``effective`` is the call's ``effective_params`` part, kept
    current by that refresh.  Raises :class:`ConfigError` for a bad ``split_policy``.
    """

    def __init__(self, params: dict[str, Any], shape: MLADecodeShape, device: torch.device | str):
        self.mode, self.policy = parse_split_policy(str(params.get("split_policy") or ""),
                                                    current_device().num_sms)
        self.batch = shape.batch
        self.grid_splits = (int(params["num_kv_splits"]) if self.policy is None
                            else self.policy.max_splits(shape.batch))
        self.table = self.policy.device_table(shape.batch, device) if self.mode == "device" else None
        self.splits = self.grid_splits
        self.effective: dict[str, Any] = {"num_kv_splits": self.grid_splits}
        if self.policy is not None:
            self.effective.update(split_policy=self.mode, policy_source=self.policy.source)

    def refresh_fn(self, cache_seqlens: torch.Tensor):
        """In ``host`` mode the per-step refresh (run once now): one count for the step, looked up
        from the longest of ``cache_seqlens``, as a server choosing it on the host does; else
        None (the lengths are read on the device)."""
        if self.mode != "host":
            return None

        def refresh() -> None:
            self.splits = self.policy.lookup(self.batch, int(cache_seqlens.max()))
            self.effective["num_kv_splits"] = self.splits

        refresh()
        return refresh

    def counts(self, context_lens) -> list[int]:
        """Splits each request of ``context_lens`` runs: its own policy count in ``device`` mode,
        else the one count of the step."""
        if self.mode == "device":
            return [self.policy.lookup(self.batch, int(n)) for n in context_lens]
        return [self.splits] * len(context_lens)

    def split_starts(self, context_lens, align: int) -> list[list[int]]:
        """First token of each non-empty split per request (splits rounded up to ``align``
        tokens), what the correctness check places its needles at."""
        from mlabench.kernels.splitkv_torch import split_starts

        return [split_starts([n], c, align)[0] for n, c in zip(context_lens, self.counts(context_lens))]
