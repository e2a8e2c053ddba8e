"""Serve config validation, overrides, variable expansion, vllm executable resolution."""

from pathlib import Path

import pytest

from mlabench.errors import ConfigError
from mlabench.serving.config import expand, load_config, resolve_vllm_bin

REPO = Path(__file__).resolve().parents[2]
MINIMAL = 'baseline = "a"\n[[variants]]\nname = "a"\nbase_url = "http://127.0.0.1:1"\n'


def write(tmp_path, text):
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_defaults_are_the_seed_bench_line(tmp_path):
    c = load_config(write(tmp_path, MINIMAL))
    b = c.bench
    assert (b.dataset_name, b.random_input_len, b.random_output_len, b.random_range_ratio) == \
        ("random", 100000, 1000, 0.0)
    assert (b.num_prompts, b.num_warmups, b.seed, b.request_rate) == (3, 1, 0, "inf")
    assert (b.ignore_eos, b.endpoint, b.backend) == (True, "/v1/completions", "vllm")
    assert c.concurrencies == [1, 16] and c.repeats == 1 and c.check.max_tokens == 64


def test_unknown_key_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"bench\.random_input_length: Extra inputs"):
        load_config(write(tmp_path, MINIMAL + "[bench]\nrandom_input_length = 5\n"))


def test_baseline_must_be_a_variant(tmp_path):
    with pytest.raises(ConfigError, match="baseline 'b' is not a variant"):
        load_config(write(tmp_path, MINIMAL.replace('baseline = "a"', 'baseline = "b"')))


def test_duplicate_variants_and_bad_toml(tmp_path):
    dup = MINIMAL + '[[variants]]\nname = "a"\nbase_url = "http://x"\n'
    with pytest.raises(ConfigError, match="duplicate variant"):
        load_config(write(tmp_path, dup))
    with pytest.raises(ConfigError, match="malformed TOML"):
        load_config(write(tmp_path, "baseline = "))
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml")


def test_overrides_and_per_variant_bench(tmp_path):
    text = MINIMAL + '[variants.bench]\nnum_prompts = 9\n'
    c = load_config(write(tmp_path, text),
                    ["bench.random_input_len=256", "concurrencies=[1, 4]", "bench.request_rate=2"])
    assert c.bench.random_input_len == 256 and c.concurrencies == [1, 4]
    assert c.bench.request_rate == "2"
    assert c.bench_for(c.variants[0]).num_prompts == 9
    assert c.bench_for(c.variants[0]).random_input_len == 256
    with pytest.raises(ConfigError, match="not KEY=VALUE"):
        load_config(write(tmp_path, MINIMAL), ["oops"])
    with pytest.raises(ConfigError, match="num_prompts"):
        load_config(write(tmp_path, MINIMAL + '[variants.bench]\nnum_prompts = 0\n'))


def test_expand_and_vllm_bin_precedence(monkeypatch):
    monkeypatch.setenv("MLB_TEST_DIR", "/x")
    assert expand("$MLB_TEST_DIR/m") == "/x/m"
    monkeypatch.delenv("MLB_TEST_DIR")
    with pytest.raises(ConfigError, match="MLB_TEST_DIR"):
        expand("${MLB_TEST_DIR}/m")
    monkeypatch.delenv("MLABENCH_VLLM_BIN", raising=False)
    assert resolve_vllm_bin(None) == "vllm"
    assert resolve_vllm_bin("/cfg/vllm") == "/cfg/vllm"
    monkeypatch.setenv("MLABENCH_VLLM_BIN", "/env/vllm")
    assert resolve_vllm_bin("/cfg/vllm") == "/env/vllm"
    assert resolve_vllm_bin("/cfg/vllm", "/flag/vllm") == "/flag/vllm"


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "configs/serve").glob("*.toml")))
def test_shipped_configs_validate(name):
    c = load_config(REPO / "configs/serve" / name)
    assert c.baseline in [v.name for v in c.variants]
