"""MLA decode shapes; model presets, tensor-parallel head counts, Hugging Face config reading and the
softmax scale are in :mod:`mlabench.shapes.models` (re-exported here).

Absorbed-MLA decode (DeepSeek-V2/V3, Kimi K2/K3): the query of each head is ``kv_lora_rank +
qk_rope_head_dim`` wide (512 + 64 = 576), there is one latent KV head shared by all query heads,
K is all 576 columns of the latent cache and V its first ``kv_lora_rank`` columns.

Tensor shapes (B = batch, H = local heads, T = qo_len query tokens per request, 1 for plain decode):

- q: ``[B * T, H, 576]``, ``q_dtype``; row ``b * T + t`` is query token ``t`` of request ``b``
  (vLLM's token-major layout; for ``T = 1`` that is ``[B, H, 576]``)
- kv_cache: ``[num_pages, page_size, 1, 576]``, ``kv_dtype``
- block_table: ``[B, max_pages_per_request]`` int32; cache_seqlens: ``[B]`` int32
- out: ``[B * T, H, 512]``, ``q_dtype``

Multi-token decode (speculative-decoding verify, multi-token prediction) scores ``T`` query tokens
of each request against one cache.  Causal (the default): the cache of a request of length ``L``
already holds the block's own ``T`` tokens at its end, and query token ``t`` sees the first
``L - T + t + 1`` of them (the prefix and block tokens ``0..t``), as FlashMLA's ``causal=True``
and AITER's masks do.  Non-causal: a draft block that sees only the prefix, which is then all of
the ``L`` cached tokens, for every query token.
"""

from __future__ import annotations

from functools import cached_property
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mlabench.errors import ShapeError
from mlabench.files import validation_line
from mlabench.shapes.models import (  # the model nouns, imported from here
    ModelSpec, list_models, load_model, model_spec, read_hf_config, resolve_heads, scale_note,
)

__all__ = ["MLADecodeShape", "ModelSpec", "list_models", "load_model", "model_spec", "read_hf_config",
           "resolve_heads", "scale_note"]

SUPPORTED_DTYPES = ("bfloat16", "float16", "float32")
SUPPORTED_PAGE_SIZES = (1, 16, 64)


def check_page_size(page_size: int) -> int:
    """``page_size`` when it is one of :data:`SUPPORTED_PAGE_SIZES`; ValueError otherwise (a
    pydantic field reports it as that field's error)."""
    if page_size not in SUPPORTED_PAGE_SIZES:
        raise ValueError(f"must be one of {SUPPORTED_PAGE_SIZES}, got {page_size}")
    return page_size


#: A KV-cache page size field, checked by :func:`check_page_size`.
PageSize = Annotated[int, AfterValidator(check_page_size)]
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
#: Query tokens per request a shape may have: plain decode (1) to an 8-token speculative block.
MAX_QO_LEN = 8
#: Context lengths (``cache_seqlens``) and page indices (the block table) are int32 on the device.
INT32_MAX = 2**31 - 1
#: The largest latent cache a shape may have: 1 TiB, several times the memory of the largest single
#: GPU (141 GB on an H200, 288 GB on an MI355X), so no shape past it can run anywhere.
MAX_CACHE_BYTES = 2**40


#: Most local query heads a shape may have: twice DeepSeek-V3's 128 (the largest MLA model's count
#: at TP 1), so a typo such as 100000 is refused instead of allocating for it.
MAX_LOCAL_HEADS = 256


class MLADecodeShape(BaseModel):
    """One MLA decode step: the problem every backend solves.

    Attributes are validated on construction; bad values raise :class:`ShapeError`.
    ``context_lens`` holds one KV length per request (ragged batches allowed), so
    ``batch == len(context_lens)``.  ``softmax_scale`` defaults to ``576 ** -0.5``
    (``1 / sqrt`` of the 576-wide query: the kernels' default when no model is named).
    ``qo_len`` query tokens per request (1-8); ``causal`` says which mask they take (module
    docstring).  With one token both masks are the same, so ``causal`` is always True there and
    the shape's key is the one it had before multi-token shapes existed.  A causal block needs
    every context to hold its ``qo_len`` tokens.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_heads: int = Field(description="Local query heads on one GPU (model heads / TP).")
    context_lens: tuple[int, ...] = Field(description="KV length of each request, tokens.")
    qo_len: int = Field(1, description="Query tokens per request; 1 for plain decode, up to 8.")
    causal: bool = Field(True, description="Query token t sees the prefix and block tokens 0..t "
                                           "(False: every token sees all cached tokens).")
    kv_lora_rank: int = Field(512, description="Latent width; also the value (output) dim.")
    qk_rope_head_dim: int = Field(64, description="Decoupled RoPE width appended to the latent.")
    page_size: PageSize = Field(64, description="Tokens per KV-cache page.")
    q_dtype: str = Field("bfloat16", description="Query and output dtype.")
    kv_dtype: str = Field("bfloat16", description="Latent cache dtype.")
    softmax_scale: float | None = Field(None, description="Score scale; None means 576**-0.5.")

    @field_validator("num_heads")
    @classmethod
    def _heads_positive(cls, v: int) -> int:
        if not 0 < v <= MAX_LOCAL_HEADS:
            raise ValueError(f"must be 1..{MAX_LOCAL_HEADS} (MLA models have at most 128 query "
                             f"heads: DeepSeek-V3), got {v}")
        return v

    @field_validator("context_lens")
    @classmethod
    def _contexts_positive(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v:
            raise ValueError("must name at least one request")
        bad = [c for c in v if not 0 < c <= INT32_MAX]
        if bad:
            raise ValueError(f"context length must be > 0, got {bad[0]}" if bad[0] <= 0 else
                             f"context length must be <= {INT32_MAX:,} (int32 lengths), got {bad[0]:,}")
        return v

    @field_validator("qo_len")
    @classmethod
    def _qo_len(cls, v: int) -> int:
        if not 1 <= v <= MAX_QO_LEN:
            raise ValueError(f"must be 1-{MAX_QO_LEN} query tokens per request, got {v}")
        return v

    @model_validator(mode="before")
    @classmethod
    def _one_token_is_causal(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("qo_len", 1) == 1 and "causal" in data:
            data = {**data, "causal": True}  # one token: both masks are the same problem
        return data

    @field_validator("q_dtype", "kv_dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        if v not in SUPPORTED_DTYPES:
            raise ValueError(f"dtype must be one of {SUPPORTED_DTYPES}, got {v!r}")
        return v

    @model_validator(mode="after")
    def _dims(self) -> MLADecodeShape:
        if self.kv_lora_rank <= 0 or self.qk_rope_head_dim < 0:
            raise ValueError("kv_lora_rank must be > 0 and qk_rope_head_dim >= 0")
        if self.num_pages > INT32_MAX:
            raise ValueError(f"{self.num_pages:,} KV pages are more than an int32 block table can "
                             f"index ({INT32_MAX:,})")
        if self.causal and min(self.context_lens) < self.qo_len:
            raise ValueError(f"a causal block of {self.qo_len} query tokens is in the cache: every "
                             f"context must hold >= {self.qo_len} tokens, got {min(self.context_lens)} "
                             "(non-causal: a draft block that sees only the cache)")
        return self

    @classmethod
    def create(cls, **kwargs: Any) -> MLADecodeShape:
        """Build a shape, turning validation failures into one-line :class:`ShapeError`."""
        try:
            return cls(**kwargs)
        except ValidationError as exc:
            raise ShapeError(validation_line(exc)) from None

    @classmethod
    def uniform(cls, batch: int, context_len: int, num_heads: int, **kwargs: Any) -> MLADecodeShape:
        """``batch`` requests of the same ``context_len``; raises :class:`ShapeError` on bad values.

        The batch's size is judged on one request's numbers before its ``batch`` lengths are built:
        more pages than an int32 block table indexes, or a latent cache over
        :data:`MAX_CACHE_BYTES`, is a :class:`ShapeError` (a billion requests is refused, not built).
        """
        if batch <= 0:
            raise ShapeError(f"batch must be > 0, got {batch}")
        one = cls.create(num_heads=num_heads, context_lens=(context_len,), **kwargs)
        if batch * one.num_pages > INT32_MAX or batch * one.kv_cache_bytes > MAX_CACHE_BYTES:
            raise ShapeError(f"{one.label(batch)}: {batch * one.num_pages:,} KV pages "
                             f"({batch * one.kv_cache_bytes / 2**40:,.1f} TiB of latent cache) cannot be one "
                             f"decode step (at most {INT32_MAX:,} pages and {MAX_CACHE_BYTES / 2**40:g} TiB)")
        return cls.create(num_heads=num_heads, context_lens=(context_len,) * batch, **kwargs)

    # ---- derived sizes -------------------------------------------------------------------------
    @property
    def batch(self) -> int:
        return len(self.context_lens)

    @property
    def head_dim_qk(self) -> int:
        """Query/key width: kv_lora_rank + qk_rope_head_dim (576 for DeepSeek-V3)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def v_head_dim(self) -> int:
        """Value/output width: the latent, kv_lora_rank (512)."""
        return self.kv_lora_rank

    @property
    def scale(self) -> float:
        """Softmax scale in use: ``softmax_scale`` or ``head_dim_qk ** -0.5``."""
        return self.softmax_scale if self.softmax_scale is not None else self.head_dim_qk**-0.5

    @property
    def max_context_len(self) -> int:
        return max(self.context_lens)

    @property
    def total_tokens(self) -> int:
        return sum(self.context_lens)

    @property
    def pages_per_request(self) -> tuple[int, ...]:
        return tuple(-(-c // self.page_size) for c in self.context_lens)

    @property
    def num_pages(self) -> int:
        return sum(self.pages_per_request)

    @cached_property
    def kv_cache_bytes(self) -> int:
        """Bytes of the allocated latent cache (whole pages)."""
        return self.num_pages * self.page_size * self.head_dim_qk * _DTYPE_BYTES[self.kv_dtype]

    @property
    def kv_read_bytes(self) -> int:
        """Bytes of latent cache one decode step must read: ``sum(L) * 576 * dtype`` (each row once)."""
        return self.total_tokens * self.head_dim_qk * _DTYPE_BYTES[self.kv_dtype]

    @property
    def num_query_tokens(self) -> int:
        """Rows of q and out: ``batch * qo_len``."""
        return self.batch * self.qo_len

    @property
    def q_bytes(self) -> int:
        """Bytes of q, ``B * qo_len * H * 576 * dtype``: it scales with qo_len, the KV read does not."""
        return self.batch * self.qo_len * self.num_heads * self.head_dim_qk * _DTYPE_BYTES[self.q_dtype]

    @property
    def out_bytes(self) -> int:
        """Bytes of the output, ``B * qo_len * H * 512 * dtype``."""
        return self.batch * self.qo_len * self.num_heads * self.v_head_dim * _DTYPE_BYTES[self.q_dtype]

    @property
    def min_bytes_moved(self) -> int:
        """The fewest bytes any kernel must move: KV read once (whatever qo_len), q read once,
        output written once."""
        return self.kv_read_bytes + self.q_bytes + self.out_bytes

    @property
    def flops(self) -> int:
        """``2 * B * qo_len * H * L * (576 + 512)`` summed over requests (QK^T over 576 columns plus PV
        over 512); a causal block's masked scores are counted too (at most ``qo_len - 1`` per row)."""
        per_token = 2 * self.num_heads * self.qo_len * (self.head_dim_qk + self.v_head_dim)
        return per_token * self.total_tokens

    def floor_us(self, bandwidth_tbps: float) -> float:
        """Memory-bandwidth floor in µs: ``min_bytes_moved / bandwidth`` (bandwidth in TB/s)."""
        return self.min_bytes_moved / (bandwidth_tbps * 1e12) * 1e6

    def label(self, repeat: int = 1) -> str:
        """Short human label, e.g. ``B=1 H=12 L=4096 page=64 bf16``, with ``qo=4`` (and
        ``non-causal``) for multi-token shapes; ``repeat`` multiplies the batch (a batch of
        ``repeat`` times these requests)."""
        lens = self.context_lens
        ctx = str(lens[0]) if len(set(lens)) == 1 else f"{min(lens)}..{max(lens)}"
        qo = "" if self.qo_len == 1 else f" qo={self.qo_len}" + ("" if self.causal else " non-causal")
        return f"B={self.batch * repeat} H={self.num_heads} L={ctx}{qo} page={self.page_size} {self.kv_dtype}"

    def key(self) -> dict[str, Any]:
        """JSON-able identity of the shape (used in result keys).  One-token shapes leave
        ``causal`` out, so their keys are those recorded before multi-token shapes existed."""
        data = self.model_dump()
        if self.qo_len == 1:
            del data["causal"]
        return data
