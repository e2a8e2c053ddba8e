"""Run the Triton kernels in Triton's CPU interpreter.

``TRITON_INTERPRET`` must be set before the kernel modules are imported (Triton reads it when
``@triton.jit`` decorates them); the kernel modules are only imported by the tests below.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
