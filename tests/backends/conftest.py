import pytest

from mlabench.extras import optional_import


@pytest.fixture(autouse=True)
def _fresh_optional_imports():
    """Fake modules must not leak through optional_import's cache into other tests."""
    optional_import.cache_clear()
    yield
    optional_import.cache_clear()
