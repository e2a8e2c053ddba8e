"""The public split-count heuristics of MLA decode kernels, as functions of the shape.

Each :class:`SplitHeuristic` answers "how many KV splits would this library launch for a decode
step of this shape" on a GPU with ``num_sms`` SMs (CUs).  The tuner enqueues their answers as the
first trials of every study, so a tuned policy can only match or beat them, and ``tune --validate``
reports each one's regret.  Every function cites where its rule comes from (see also
``docs/tuning.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from mlabench.policy.rules import MAX_KV_SPLITS
from mlabench.shapes import MLADecodeShape

#: SGLang's largest split count for MLA decode on an H200.
SGLANG_MAX_KV_SPLITS = 256

#: The context buckets of a ROCm vLLM proposal: (largest context length, splits); longer: 128.
ROCM_CONTEXT_BUCKETS = ((64, 1), (4096, 16), (16384, 48), (65536, 64))
ROCM_LONGEST_BUCKET_SPLITS = 128

#: Workgroups one MI350 wave holds; AITER's Gluon split budget fills it.
GLUON_WAVE = 256
#: KV tokens per Gluon block (BLOCK_N of the bf16 regimes).
GLUON_BLOCK_N = 64


def gluon_bh16_cap(batch: int, num_heads: int, qo_len: int = 1) -> int:
    """``max(1, 256 // (B * qlen * ceil(H/16)))``: the bh16 budget (the cap of the bounded rule)."""
    return max(1, GLUON_WAVE // (batch * qo_len * -(-num_heads // 16)))


def vllm_triton_splits(shape: MLADecodeShape, num_sms: int = 132) -> int:
    """vLLM's Triton MLA rule: ``min(next_pow2(max_context_len // 512), 2 * num_SMs)``, at least 1
    and at most :data:`~mlabench.policy.rules.MAX_KV_SPLITS`: the default ``num_kv_splits`` of the
    split-KV backends, a baseline rather than a tuned choice.

    Source: vLLM ``vllm/v1/attention/backends/mla/triton_mla.py`` (the decode split count).
    """
    want = max(1, shape.max_context_len // 512)
    pow2 = 1 << (want - 1).bit_length()
    return max(1, min(pow2, 2 * num_sms, MAX_KV_SPLITS))


def sglang_splits(shape: MLADecodeShape, num_sms: int, max_kv_splits: int = SGLANG_MAX_KV_SPLITS) -> int:
    """SGLang's Triton decode rule for MLA, with its cap of 256 splits on an H200.

    For a batch of equal lengths L: ``cores = int(num_SMs * max(log2(L / 64), 1))``, ``grid =
    B * ceil(H / min(16, H))`` (one program per 16-head tile and request), ``n = min(ceil(cores /
    grid), max_kv_splits)``, and the launched count is ``ceil(L / ceil(L / n))``.  For a ragged
    batch the rule also splits the longest request into ``ceil(max / min)`` chunks (the larger of
    the two counts wins; lengths within 25% of each other count as equal).
    Source: SGLang ``python/sglang/srt/layers/attention/triton_backend.py``
    (``get_num_kv_splits_triton``), whose comment calls the log2 term a way to let the split count
    grow gradually with the length.
    """
    longest, shortest = shape.max_context_len, min(shape.context_lens)
    if longest * 8 < shortest * 10:
        shortest = longest
    by_ratio = min(-(-longest // shortest), max_kv_splits)
    cores = int(num_sms * max(math.log2(longest / 64), 1.0))
    block_h = min(16, shape.num_heads)
    grid = shape.batch * -(-shape.num_heads // block_h)
    by_cores = min(-(-cores // grid), max_kv_splits)
    chunk_ratio, chunk_cores = -(-longest // by_ratio), -(-longest // by_cores)
    return max(1, max(-(-longest // chunk_ratio), -(-longest // chunk_cores)))


def aiter_gluon_v0119_splits(shape: MLADecodeShape, num_sms: int) -> int:
    """AITER <= v0.1.19 Gluon MLA rule: ``max(1, min(256 // (B * qlen * ceil(H/16)),
    cdiv(min_kv_seq_len, 64)))``, with ``min_kv_seq_len`` the shortest request.

    Source: AITER ``aiter/ops/triton/gluon/mla_gluon.py`` of those releases.  ``num_sms`` is unused.
    """
    cap = gluon_bh16_cap(shape.batch, shape.num_heads, shape.qo_len)
    return max(1, min(cap, -(-min(shape.context_lens) // GLUON_BLOCK_N)))


def aiter_gluon_v0119_rule(shape: MLADecodeShape, num_sms: int) -> tuple[int, int]:
    """:func:`aiter_gluon_v0119_splits` as a tokens-per-split rule ``(tokens_per_split,
    max_splits)``: one split per 64 tokens of the shortest request, at most the bh16 budget
    (``clamp(ceil(L / 64), 1, 256 // (B * qlen * ceil(H/16)))`` for equal lengths).

    Source: AITER ``aiter/ops/triton/gluon/mla_gluon.py`` <= v0.1.19.  ``num_sms`` is unused.
    """
    return GLUON_BLOCK_N, gluon_bh16_cap(shape.batch, shape.num_heads, shape.qo_len)


def aiter_gluon_v0120_splits(shape: MLADecodeShape, num_sms: int) -> int:
    """AITER >= v0.1.20 Gluon MLA rule: ``max(1, 256 // (B * qlen * ceil(H/16)))``, whatever the
    length (the per-request partition is then chosen on the device).

    Source: AITER ``aiter/ops/triton/gluon/mla_gluon.py`` since v0.1.20.  ``num_sms`` is unused.
    """
    return gluon_bh16_cap(shape.batch, shape.num_heads, shape.qo_len)


def rocm_bucket_splits(shape: MLADecodeShape, num_sms: int) -> int:
    """A ROCm vLLM proposal's context buckets: <= 64 tokens 1 split, <= 4096 16, <= 16384 48,
    <= 65536 64, longer 128 (by the longest request).

    Source: a vLLM pull request for ROCm MLA decode that chose splits by context bucket.
    ``num_sms`` is unused.
    """
    for longest, splits in ROCM_CONTEXT_BUCKETS:
        if shape.max_context_len <= longest:
            return splits
    return ROCM_LONGEST_BUCKET_SPLITS


@dataclass(frozen=True)
class SplitHeuristic:
    """A named public rule ``(shape, num_sms) -> num_kv_splits`` and where it comes from.

    ``rule``: for a rule that is ``clamp(ceil(L / t), 1, max_splits)`` in the length L, ``(shape,
    num_sms) -> (t, max_splits)``, so that a tuner can try it as such over a whole bucket (the
    policy's tokens-per-split entries); None for the others.
    """

    name: str
    source: str
    splits: Callable[[MLADecodeShape, int], int]
    rule: Callable[[MLADecodeShape, int], tuple[int, int]] | None = None

    def num_kv_splits(self, shape: MLADecodeShape, num_sms: int, low: int = 1, high: int | None = None) -> int:
        """The rule's split count, clamped to a backend's ``[low, high]`` range."""
        n = max(low, int(self.splits(shape, num_sms)))
        return min(n, high) if high is not None else n


HEURISTICS: tuple[SplitHeuristic, ...] = (
    SplitHeuristic("vllm-triton", "vLLM triton_mla.py", vllm_triton_splits),
    SplitHeuristic("sglang", "SGLang triton_backend.py, max 256 splits", sglang_splits),
    SplitHeuristic("aiter-gluon-0.1.19", "AITER mla_gluon.py <= v0.1.19", aiter_gluon_v0119_splits,
                   aiter_gluon_v0119_rule),
    SplitHeuristic("aiter-gluon-0.1.20", "AITER mla_gluon.py >= v0.1.20", aiter_gluon_v0120_splits),
    SplitHeuristic("rocm-buckets", "vLLM ROCm MLA context-bucket proposal", rocm_bucket_splits),
)


def heuristic_splits(shape: MLADecodeShape, num_sms: int, low: int = 1,
                     high: int | None = None) -> dict[str, int]:
    """``{heuristic name: num_kv_splits}`` for ``shape``, each clamped to ``[low, high]``."""
    return {h.name: h.num_kv_splits(shape, num_sms, low, high) for h in HEURISTICS}
