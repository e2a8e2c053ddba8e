"""Fixtures of the backend tests.

Where the Triton kernels run is decided once, in tests/conftest.py: compiled on a GPU, in Triton's
CPU interpreter (``TRITON_INTERPRET=1``) only where torch sees none.
"""

import pytest

from mlabench.extras import optional_import


@pytest.fixture(autouse=True)
def _fresh_optional_imports():
    """Fake modules must not leak through optional_import's cache into other tests."""
    optional_import.cache_clear()
    yield
    optional_import.cache_clear()
