"""The three library backends are registered, import cheaply and describe their parameters."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mlabench.backends import backend_families, backend_names, get_backend
from mlabench.errors import ConfigError
from mlabench.shapes import MLADecodeShape


def test_backend_families_pair_persistent_with_split_kv():
    """The one ``backend_families`` (issue 36: compare and report each had one): every registered
    backend's family, which compare tables and report figures pair backends by."""
    families = backend_families()
    assert families["triton-persistent"] == "persistent" and families["torch-splitkv"] == "split-kv"
    assert set(families) == set(backend_names()) and families["flashmla"] == get_backend("flashmla").family


def test_registered_with_params():
    names = backend_names()
    for name in ("flashmla", "aiter-asm", "aiter-gluon"):
        assert name in names
        assert get_backend(name).summary
    assert get_backend("flashmla").param_names() == ()
    assert get_backend("aiter-asm").param_names() == ("head_padding",)
    assert get_backend("aiter-gluon").param_names() == ("num_kv_splits", "min_kv_seq_len")


def test_param_defaults_and_validation():
    shape = MLADecodeShape.create(num_heads=12, context_lens=(100, 4000))
    assert get_backend("aiter-asm").resolve_params(shape) == {"head_padding": "zero"}
    # min_kv_seq_len defaults to the shortest context of the lengths the call is prepared at
    # (AITER takes it as the shortest): None here, the number in the effective parameters
    assert get_backend("aiter-gluon").resolve_params(shape) == {"num_kv_splits": None,
                                                                "min_kv_seq_len": None}
    with pytest.raises(ConfigError):
        get_backend("aiter-asm").resolve_params(shape, {"head_padding": "mirror"})
    with pytest.raises(ConfigError):
        get_backend("aiter-gluon").resolve_params(shape, {"num_kv_splits": 257})
    with pytest.raises(ConfigError):
        get_backend("flashmla").resolve_params(shape, {"num_kv_splits": 4})


def test_import_does_not_touch_optional_packages():
    code = ("import sys, mlabench.backends.aiter.asm_backend, mlabench.backends.flashmla; "
            "print([m for m in ('aiter', 'flash_mla') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
