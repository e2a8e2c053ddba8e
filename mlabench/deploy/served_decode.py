"""One server process's ``gluon-splitkv`` decode call with a split policy (no vLLM imported here).

:class:`ServedDecode` is what the vLLM backend (:mod:`mlabench.deploy.vllm_backend`) calls from
every MLA layer's ``forward_mqa``.  Everything a captured CUDA graph must keep is made before the
first capture: the policy's device tables (one per tuned batch size) and one fp32 workspace sized
for the largest step, shared by all layers (they run one after another on one stream).  At each
call only host objects are built (TMA descriptors of a cache, cached per cache tensor), so the call
can be captured and replayed.
"""

from __future__ import annotations

import logging

import torch

from mlabench.policy.device_table import POLICY_MODES, SplitPolicy

#: A child of vLLM's logger, so that the lines reach vLLM's log handlers (and the server's log).
_log = logging.getLogger("vllm.mlabench")


def grid_splits(policy: SplitPolicy, mode: str, batch: int, max_seq_len: int) -> int:
    """The grid's split axis of one step of ``batch`` requests: in ``device`` mode the policy's
    largest count for that batch size (each request runs its own count, at most this); in
    ``host`` mode the count of the longest context, ``max_seq_len`` (what a captured graph
    freezes: vLLM builds the step's metadata on the host).  Raises ValueError for another mode."""
    if mode not in POLICY_MODES:
        raise ValueError(f"mode must be one of {POLICY_MODES}, got {mode!r}")
    if mode == "device":
        return policy.max_splits(batch)
    return policy.lookup(batch, max(1, int(max_seq_len)))


def served_variant():
    """The :class:`~mlabench.kernels.gluon_splitkv.KernelVariant` the plugin runs: the
    ``gluon-splitkv`` backend's defaults (``o_split``, ``lazy_sum``, ``pdl_prologue``), so that a
    sweep of the backend at its defaults times the kernel the server calls (the TPOT prediction's
    reference, docs/vllm-plugin.md), and the wide merge (no ``merge_sync`` workspace; in device
    mode at 16 requests the grid of 16 x 16 programs exceeds the SMs the fused merge needs, so the
    sweep's points there run the wide merge too).

    ``pdl_prologue``: stage 1 is a programmatic dependent of the kernel before it in the step
    (vLLM's), which needs ``seq_lens`` and the device table written before that kernel: vLLM
    writes ``seq_lens`` when it prepares the step, before layer 0, and the tables at start-up."""
    from mlabench.backends.gluon import LAZY_SUM, O_SPLIT, PDL_PROLOGUE
    from mlabench.kernels.gluon_splitkv import KernelVariant

    return KernelVariant(o_split=O_SPLIT.default, lazy_sum=bool(LAZY_SUM.default),
                         pdl_prologue=bool(PDL_PROLOGUE.default), fused_merge=False)


def workspace_slots(policy: SplitPolicy, max_batch: int) -> int:
    """Partial slots (request x split) of the largest step up to ``max_batch`` requests: the
    workspace that every step fits in, whatever its batch size, lengths or mode (a host-mode count
    never exceeds its batch size's largest either)."""
    return max(b * policy.max_splits(b) for b in range(1, max_batch + 1))


def served_pdl(mode: str, batch: int) -> int:
    """The merge launch (``gluon-splitkv``'s ``pdl``) the plugin runs: 0 in ``device`` mode, else
    the backend's default (1 at batch 1, else 0: :func:`mlabench.backends.gluon.default_pdl`).

    Device mode's grid holds the policy's largest count whatever the request's, and there PDL
    costs: at batch 1 on an H200, ``pdl`` 0 took 0-10.4% off ``pdl`` 1 at each of 6 lengths
    (35941 tokens: 19.45 against 21.71 µs), all correct (``results/h200/deploy/qo1-k3/pdl/``)."""
    from mlabench.backends.gluon import default_pdl

    return 0 if mode == "device" else default_pdl(batch)


class ServedDecode:
    """``gluon-splitkv`` for one process: ``policy`` in ``mode`` (``device`` or ``host``), for
    ``num_heads`` local heads and steps of up to ``max_batch`` one-token requests, on ``device``.

    :meth:`__call__` takes vLLM's decode inputs and returns ``out [B, H, 512]`` in q's dtype.
    Raises ValueError (from the kernel) for a cache that is not ``[pages, 64, 576]`` contiguous.
    """

    def __init__(self, policy: SplitPolicy, mode: str, num_heads: int, max_batch: int,
                 device: torch.device | str):
        from mlabench.kernels.workspace import splitkv_workspace_shapes

        self.policy, self.mode, self.num_heads = policy, mode, num_heads
        self._tables = {b: policy.device_table(b, device) for b in policy.tables}
        o_shape, l_shape = splitkv_workspace_shapes(1, num_heads, workspace_slots(policy, max_batch))
        self._partial_out = torch.empty(o_shape, dtype=torch.float32, device=device)
        self._partial_lse = torch.empty(l_shape, dtype=torch.float32, device=device)
        self._descriptors: dict[tuple[int, tuple[int, ...]], object] = {}
        self._host_counts: set[tuple[int, int]] = set()
        self._variant = served_variant()

    def table_for(self, batch: int) -> torch.Tensor | None:
        """The device table of ``batch`` requests in ``device`` mode (that of the largest tuned
        batch size <= ``batch``, :meth:`SplitPolicy.rows_for`'s rule), else None."""
        if self.mode != "device":
            return None
        sizes = [b for b in sorted(self._tables) if b <= batch] or [min(self._tables)]
        return self._tables[sizes[-1]]

    def __call__(self, q: torch.Tensor | tuple[torch.Tensor, torch.Tensor], kv_cache: torch.Tensor,
                 block_table: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int,
                 softmax_scale: float) -> torch.Tensor:
        """Decode one token per request.

        Args:
            q: ``[B, H, 576]`` (latent then RoPE columns), bf16/fp16; or vLLM's halves ``(latent
                [B, H, 512], rope [B, H, 64])``, passed to the kernel as they lie (any strides with
                a unit column stride: no concatenation, no copy).
            kv_cache: vLLM's MLA cache of one layer, ``[pages, 64, 576]``, contiguous, q's dtype.
            block_table: ``[B, max_pages]`` int32.  seq_lens: ``[B]`` int32 (read on the device).
            max_seq_len: the step's longest context on the host (host mode only).
            softmax_scale: multiplier of ``q . k``.
        """
        from mlabench.kernels.gluon_splitkv import kv_descriptors, mla_decode_gluon_splitkv

        q, q_rope = q if isinstance(q, tuple) else (q.contiguous(), None)
        batch = q.shape[0]
        cache = kv_cache.unsqueeze(2)
        key = (cache.data_ptr(), tuple(cache.shape))
        if key not in self._descriptors:  # host objects only: safe inside a graph capture
            self._descriptors[key] = kv_descriptors(cache)
        out = torch.empty(batch, self.num_heads, 512, dtype=q.dtype, device=q.device)
        splits = grid_splits(self.policy, self.mode, batch, max_seq_len)
        if self.mode == "host" and (batch, splits) not in self._host_counts:
            # once per (batch, count): at graph capture this is the count every replay keeps
            self._host_counts.add((batch, splits))
            _log.info("mlabench: host split count %d for a step of %d requests (longest context %d)",
                      splits, batch, max_seq_len)
        return mla_decode_gluon_splitkv(
            q, cache, block_table, seq_lens, out,
            splits, softmax_scale,
            partial_out=self._partial_out, partial_lse=self._partial_lse,
            descriptors=self._descriptors[key], pdl=served_pdl(self.mode, batch),
            split_policy=self.table_for(batch), qo_len=1,
            variant=self._variant, q_rope=q_rope)
