"""Serve config validation, overrides, variable expansion, vllm executable resolution."""

from pathlib import Path

import pytest

from mlabench.errors import ConfigError
from mlabench.serving.config import expand, load_config, resolve_vllm_bin
from mlabench.serving.overrides import bench_overrides

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
    assert (b.num_warmups, b.seed, b.request_rate) == (1, 0, "inf")
    # the seed's 3 prompts, but never fewer than the concurrency (3 at c=16 would run 3 at once)
    assert b.num_prompts is None and (b.prompts_at(1), b.prompts_at(16)) == (3, 16)
    assert (b.ignore_eos, b.endpoint, b.backend) == (True, "/v1/completions", "vllm")
    assert c.concurrencies == [1, 16] and c.repeats == 1 and c.check.max_tokens == 64


def test_unknown_key_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"bench\.random_input_length: unknown key \(a typo\?\)"):
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
    for bad in ("-3", "abc", "0"):  # a fresh user's review: every point ran and failed, exit 1
        with pytest.raises(ConfigError, match="request_rate: .*must be requests per second above 0 or 'inf'"):
            load_config(write(tmp_path, text), [f"bench.request_rate={bad}"])
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


def test_input_lengths_take_a_number_or_a_list(tmp_path):
    c = load_config(write(tmp_path, MINIMAL + "[bench]\nrandom_input_len = [4096, 32768, 100000]\n"))
    assert c.bench.input_lens() == [4096, 32768, 100000] and c.input_lens() == [4096, 32768, 100000]
    assert load_config(write(tmp_path, MINIMAL)).input_lens() == [100000]
    per_variant = load_config(write(tmp_path, MINIMAL + "[variants.bench]\nrandom_input_len = [64, 128]\n"))
    assert per_variant.input_lens() == [64, 128] and per_variant.bench.input_lens() == [100000]
    for bad, said in (("[]", "non-empty list"), ("[64, 64]", "distinct"), ("[64, 0]", "> 0"),
                      ('[64, "x"]', r"must be a token count or a list of them .*, not \[64, 'x'\]$")):
        with pytest.raises(ConfigError, match=f"bench.random_input_len: .*{said}"):
            load_config(write(tmp_path, MINIMAL + f"[bench]\nrandom_input_len = {bad}\n"))
    with pytest.raises(ConfigError, match="several input lengths need dataset_name 'random'"):
        load_config(write(tmp_path, MINIMAL + '[bench]\ndataset_name = "sharegpt"\nrandom_input_len = [1, 2]\n'))


def test_prompts_per_concurrency(tmp_path):
    c = load_config(write(tmp_path, MINIMAL + "[bench]\nnum_prompts = { 1 = 3, 16 = 16 }\n"))
    assert c.bench.num_prompts == {1: 3, 16: 16}
    assert c.bench.for_run(None, 16).num_prompts == 16 and c.bench.for_run(None, 1).num_prompts == 3
    assert c.bench.prompts_text([1, 16]) == "3 at c=1, 16 at c=16"
    one = load_config(write(tmp_path, MINIMAL + "[bench]\nnum_prompts = 16\n"))
    assert one.bench.prompts_at(1) == one.bench.prompts_at(16) == 16 and one.bench.prompts_text([1, 16]) == "16"


@pytest.mark.parametrize("text, said", [
    ("[bench]\nnum_prompts = 3\n", "bench.num_prompts: concurrency 16 gets 3 prompts, fewer than 16"),
    ("[bench]\nnum_prompts = { 1 = 3, 16 = 8 }\n", "concurrency 16 gets 8 prompts, fewer than 16"),
    ("[bench]\nnum_prompts = { 1 = 3 }\n", "bench.num_prompts gives no prompt count for concurrency 16"),
    ("[bench]\nnum_prompts = { 1 = 3, 8 = 8, 16 = 16 }\n",
     r"bench.num_prompts has concurrencies \[8\] that no variant runs \(concurrencies run: \[1, 16\]\)"),
    ("[bench]\nnum_prompts = { one = 3, 16 = 16 }\n",
     r"bench.num_prompts: the keys of a num_prompts table are concurrencies \(integers\), not \['one', '16'\]$"),
    ("[bench]\nnum_prompts = { 1 = \"x\", 16 = 16 }\n", "bench.num_prompts: must be a prompt count or a table"),
    ("[bench]\nnum_prompts = { 1 = 0, 16 = 16 }\n", "prompt counts must be > 0"),
    ("[variants.bench]\nnum_prompts = 4\n", r"bench.num_prompts \(variant 'a'\): concurrency 16 gets 4 prompts"),
])
def test_too_few_or_unkeyed_prompts_are_refused(tmp_path, text, said):
    """``vllm bench serve --num-prompts 3 --max-concurrency 16`` silently runs 3 requests at once."""
    with pytest.raises(ConfigError, match=said) as err:
        load_config(write(tmp_path, MINIMAL + text))
    assert "\n" not in str(err.value)


def test_warmups_per_concurrency(tmp_path):
    """`num_warmups = { 1 = 1, 16 = 16 }`: a full burst of warm-ups at c=16, so one-time costs (kernel
    compiles of the first mixed prefill+decode steps) fall before the measured run, not in it."""
    c = load_config(write(tmp_path, MINIMAL + "[bench]\nnum_warmups = { 1 = 1, 16 = 16 }\n"))
    assert c.bench.num_warmups == {1: 1, 16: 16}
    assert c.bench.for_run(None, 16).num_warmups == 16 and c.bench.for_run(4096, 1).num_warmups == 1
    assert c.bench.warmups_at(4) == 1  # a concurrency the table does not name: the default, 1
    assert c.bench.warmups_text([1, 16]) == "1 warm-up at c=1, 16 at c=16"
    zero = load_config(write(tmp_path, MINIMAL + "[bench]\nnum_warmups = { 1 = 0, 16 = 16 }\n"))
    assert zero.bench.warmups_text([1, 16]) == "0 warm-ups at c=1, 16 at c=16"
    one = load_config(write(tmp_path, MINIMAL + "[bench]\nnum_warmups = 16\n"))
    assert one.bench.for_run(None, 1).num_warmups == 16 and one.bench.warmups_text([1, 16]) == "16 warm-ups"
    assert load_config(write(tmp_path, MINIMAL)).bench.warmups_text([1, 16]) == "1 warm-up"


@pytest.mark.parametrize("text, said", [
    ("num_warmups = { one = 1, 16 = 16 }",
     r"bench.num_warmups: the keys of a num_warmups table are concurrencies \(integers\), not \['one', '16'\]$"),
    ("num_warmups = { 1 = \"x\", 16 = 16 }", r"bench.num_warmups: must be a warm-up count or a table of them keyed "
     r"by concurrency \(e.g. \{ 1 = 1, 16 = 16 \}\)"),
    ("num_warmups = true", "bench.num_warmups: must be a warm-up count"),
    ("num_warmups = { 1 = -1, 16 = 16 }", r"bench.num_warmups: warm-up counts must be >= 0, not \{1: -1, 16: 16\}"),
    ("num_warmups = -1", "bench.num_warmups: warm-up counts must be >= 0, not -1"),
])
def test_bad_warmups_are_refused(tmp_path, text, said):
    with pytest.raises(ConfigError, match=said) as err:
        load_config(write(tmp_path, MINIMAL + f"[bench]\n{text}\n"))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("rest, said", [
    ("[bench]\nnum_warmups = { 1 = 1, 61 = 16 }\n",
     r"bench.num_warmups has concurrencies \[61\] that no variant runs \(concurrencies run: \[1, 16\]\)"),
    ("concurrencies = [16]\n[bench]\nnum_warmups = { 1 = 1, 16 = 16 }\n",
     r"bench.num_warmups has concurrencies \[1\] that no variant runs \(concurrencies run: \[16\]\)"),
    ("concurrencies = [16]\n[bench]\nnum_prompts = { 1 = 3, 16 = 16 }\n",
     r"bench.num_prompts has concurrencies \[1\] that no variant runs"),
    ("[[variants]]\nname = 'b'\nbase_url = 'http://x'\nconcurrencies = [16]\n"
     "bench = { num_warmups = { 1 = 0, 16 = 4 } }\n",
     r"bench.num_warmups \(variant 'b'\) has concurrencies \[1\] that the variant does not run \(concurrencies "
     r"run: \[16\]\)"),
])
def test_a_count_for_a_concurrency_not_run_is_refused(tmp_path, rest, said):
    """Issue 33: a num_warmups table keyed by a concurrency not run (a typo: 61 for 16) was ignored,
    and c=16 got the default 1 warm-up; num_prompts checked only the config's concurrencies, not
    which of them a variant runs."""
    with pytest.raises(ConfigError, match=said) as err:
        load_config(write(tmp_path, MINIMAL + rest))
    assert "\n" not in str(err.value)


def test_running_fewer_concurrencies_than_the_file_names_leaves_their_counts_unused(tmp_path):
    """`serve-bench CONFIG -c 16` (as the H200 repeats of 4K at 16 ran) on a config whose count
    tables are keyed 1 and 16 was refused: key 1 "no variant runs".  The file names it, so it is
    not a typo; a key the file does not name still is, with -c too."""
    text = "concurrencies = [1, 16]\n" + MINIMAL + "[bench]\nnum_prompts = { 1 = 3, 16 = 16 }\nnum_warmups = { 1 = 1, %s = 4 }\n"
    conf = load_config(write(tmp_path, text % 16), bench_overrides([], [16]))
    assert conf.concurrencies == [16] and conf.bench.warmups_at(16) == 4
    with pytest.raises(ConfigError, match=r"bench.num_warmups has concurrencies \[61\] that no variant runs"):
        load_config(write(tmp_path, text % 61), bench_overrides([], [16]))


def test_as_many_prompts_as_the_concurrency_is_enough(tmp_path):
    assert load_config(write(tmp_path, MINIMAL + "[bench]\nnum_prompts = 3\n"), ["concurrencies=[1, 3]"])
    assert load_config(write(tmp_path, MINIMAL + "[bench]\nnum_prompts = { 1 = 1, 16 = 16 }\n"))


def test_the_tiny_model_folder_has_one_variable_name_and_the_old_one_still_works(tmp_path, monkeypatch):
    """cpu-tiny and scripts/cpu_vllm_server.sh called the tiny model's folder MLABENCH_TINY_MODEL_DIR,
    h200-tiny-proxy and scripts/h200_serving.sh MLABENCH_TINY_PROXY_DIR: a user who set one got
    "not set" from the other config.  Now MLABENCH_TINY_PROXY_DIR everywhere; the documented old
    name is taken with a deprecation line, and a run recorded with it resumes under the new one."""
    import subprocess

    from mlabench.serving.environment import renamed_env_notes

    monkeypatch.delenv("MLABENCH_TINY_MODEL_DIR", raising=False)
    monkeypatch.setenv("MLABENCH_TINY_PROXY_DIR", "/models/tiny")
    for name in ("cpu-tiny", "h200-tiny-proxy"):
        conf = load_config(name)
        assert expand(conf.tokenizer) == "/models/tiny"
    assert expand("$MLABENCH_TINY_MODEL_DIR") == "/models/tiny" and renamed_env_notes() == []  # a recorded run
    monkeypatch.delenv("MLABENCH_TINY_PROXY_DIR")
    monkeypatch.setenv("MLABENCH_TINY_MODEL_DIR", "/models/old")
    assert expand(load_config("cpu-tiny").tokenizer) == "/models/old"
    assert renamed_env_notes() == ["MLABENCH_TINY_MODEL_DIR is the old name of MLABENCH_TINY_PROXY_DIR: "
                                   "set MLABENCH_TINY_PROXY_DIR instead (the old name will stop working)"]
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "MLABENCH_TINY_MODEL_DIR": "/models/old"}
    out = subprocess.run(["bash", str(REPO / "scripts/cpu_vllm_server.sh"), "env"], env=env, capture_output=True,
                         text=True, check=True)
    assert "MLABENCH_TINY_PROXY_DIR=/models/old" in out.stdout.split() and "MLABENCH_TINY_MODEL_DIR" not in out.stdout
    assert "old name of MLABENCH_TINY_PROXY_DIR" in out.stderr
