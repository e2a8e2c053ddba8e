"""Fake AITER / FlashMLA modules for CPU tests: they record calls and compute real attention."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch

from mlabench.extras import optional_import
from mlabench.kernels.reference import visible_keys


def csr_attention(q: torch.Tensor, rows: torch.Tensor, kv_indptr: torch.Tensor,
                  kv_indices: torch.Tensor, scale: float, v_dim: int = 512, qo_len: int = 1,
                  causal: bool = True) -> torch.Tensor:
    """fp32 attention of ``q [B * qo_len, H, 576]`` over ``rows[kv_indices[kv_indptr[b]:kv_indptr[b+1]]]``;
    query token ``t`` of request ``b`` sees the keys :func:`visible_keys` gives it (none: zeros)."""
    out = torch.zeros(q.shape[0], q.shape[1], v_dim)
    for b in range(q.shape[0] // qo_len):
        idx = kv_indices[int(kv_indptr[b]):int(kv_indptr[b + 1])].long()
        k = rows[idx].float()
        for t, seen in enumerate(visible_keys(len(idx), qo_len, causal)):
            if seen:
                p = torch.softmax(q[b * qo_len + t].float() @ k[:seen].T * scale, dim=-1)
                out[b * qo_len + t] = p @ k[:seen, :v_dim]
    return out


class Recorder:
    """A callable that records ``(args, kwargs)`` and delegates to ``impl``.

    Being an instance (not a function), ``inspect.getsource`` cannot read it, while
    ``inspect.signature`` reads ``impl``'s signature through ``__signature__``.
    """

    def __init__(self, impl):
        import inspect

        self.impl = impl
        self.calls: list[tuple[tuple, dict]] = []
        self.__signature__ = inspect.signature(impl)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((args, kwargs))
        return self.impl(*args, **kwargs)


def install(monkeypatch: pytest.MonkeyPatch, modules: dict[str, types.ModuleType]) -> None:
    """Put ``modules`` into ``sys.modules`` for one test; clears the optional-import cache."""
    optional_import.cache_clear()
    for name, mod in modules.items():
        monkeypatch.setitem(sys.modules, name, mod)


def module(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(mod, key, value)
    return mod
