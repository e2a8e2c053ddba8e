import os

# The contract tests run the Triton kernels too, in Triton's CPU interpreter where there is no GPU;
# TRITON_INTERPRET must be set before the kernel modules are imported (as in tests/kernels).
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from mlabench.extras import optional_import  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_optional_imports():
    """Fake modules must not leak through optional_import's cache into other tests."""
    optional_import.cache_clear()
    yield
    optional_import.cache_clear()
