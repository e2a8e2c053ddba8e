"""Test-wide set-up: without a GPU, Triton kernels run in Triton's CPU interpreter.

``TRITON_INTERPRET`` is read when ``@triton.jit`` decorates a kernel, so it is set here, before any
test module imports a kernel.  Where torch sees a GPU it is left alone, so that the kernel tests
(tests/kernels, tests/backends) run the compiled kernels; no other conftest sets it.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
