"""Backends: one module per provider, each registering itself with ``@register``.

Modules here must import cheaply: optional libraries (AITER, FlashMLA) are probed lazily through
:mod:`mlabench.extras` when a backend is asked whether it is available.
"""

from mlabench.backends.aiter import asm_backend as _aiter  # noqa: F401
from mlabench.backends.aiter import gluon_backend as _aiter_gluon  # noqa: F401
from mlabench.backends import flashmla as _flashmla  # noqa: F401
# triton before gluon: backend_names() is registration order (listings, a sweep's default backends)
from mlabench.backends import triton as _triton  # noqa: F401
from mlabench.backends import gluon as _gluon  # noqa: F401
from mlabench.backends import torch_reference as _reference  # noqa: F401
from mlabench.backends import vllm_fa3 as _vllm_fa3  # noqa: F401
from mlabench.backends import vllm_flashmla as _vllm_flashmla  # noqa: F401
from mlabench.backends import vllm_triton as _vllm_triton  # noqa: F401
from mlabench.backends.registry import (
    available_backends, backend_families, backend_names, backend_params, get_backend, register,
)

__all__ = ["available_backends", "backend_families", "backend_names", "backend_params", "get_backend", "register"]
