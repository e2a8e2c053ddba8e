import json
import math

import pytest

from mlabench.errors import ConfigError, ShapeError, UnknownModelError
from mlabench.shapes import MLADecodeShape, list_models, load_model, read_hf_config, resolve_heads


def test_presets_local_heads():
    assert {"deepseek-v3", "kimi-k2", "kimi-k3", "deepseek-v2-lite"} <= set(list_models())
    assert load_model("kimi-k3").local_heads(8) == 12
    assert load_model("deepseek-v3").local_heads(8) == 16
    assert load_model("kimi-k2").local_heads(8) == 8
    assert load_model("deepseek-v2-lite").local_heads(1) == 16


def test_heads_not_divisible_by_tp():
    with pytest.raises(ShapeError, match="not divisible by tp=5"):
        load_model("kimi-k3").local_heads(5)


def test_heads_not_divisible_names_the_config_file(tmp_path):
    """A fresh user's review: a config.json without model_type in the working folder gave
    'error: : 128 heads are not divisible by tp=3'."""
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"num_attention_heads": 128, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                                "qk_nope_head_dim": 128}))
    with pytest.raises(ShapeError, match=f"^{path}: 128 heads are not divisible by tp=3$"):
        read_hf_config(path).local_heads(3)


def test_unknown_model_lists_known():
    with pytest.raises(UnknownModelError, match="kimi-k3"):
        load_model("kimi-k9")


def test_deepseek_v3_scale_has_yarn_mscale():
    # (128 + 64)^-0.5 * (0.1 * 1.0 * ln 40 + 1)^2
    want = 192**-0.5 * (0.1 * math.log(40) + 1) ** 2
    assert load_model("deepseek-v3").softmax_scale() == pytest.approx(want, rel=1e-12)
    # no rope scaling: plain (nope + rope)^-0.5
    assert load_model("kimi-k3").softmax_scale() == pytest.approx(192**-0.5)


def test_read_hf_config(tmp_path):
    cfg = {"model_type": "deepseek_v3", "num_attention_heads": 96, "kv_lora_rank": 512,
           "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "hidden_size": 7168,
           "rope_scaling": {"type": "yarn", "factor": 32.0, "mscale_all_dim": 0.707}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = read_hf_config(tmp_path)
    assert spec.local_heads(8) == 12
    assert spec.softmax_scale() == pytest.approx(192**-0.5 * (0.1 * 0.707 * math.log(32) + 1) ** 2)
    heads, scale, _ = resolve_heads(model_config=tmp_path / "config.json", tp=8)
    assert heads == 12 and scale == pytest.approx(spec.softmax_scale())


def test_read_hf_config_errors(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        read_hf_config(tmp_path / "bad.json")
    (tmp_path / "llama.json").write_text(json.dumps({"num_attention_heads": 32}))
    with pytest.raises(ConfigError, match="missing kv_lora_rank"):
        read_hf_config(tmp_path / "llama.json")
    with pytest.raises(ConfigError, match="not found"):
        read_hf_config(tmp_path / "nope.json")


def test_shape_defaults_and_sizes():
    s = MLADecodeShape.uniform(16, 4096, 12)
    assert (s.batch, s.head_dim_qk, s.v_head_dim) == (16, 576, 512)
    assert s.scale == pytest.approx(576**-0.5)
    assert s.kv_read_bytes == 16 * 4096 * 576 * 2
    assert s.flops == 2 * 16 * 12 * 4096 * (576 + 512)
    # B=16, 4K, 12 heads: 75.5 MB (KV) + q + out over 4.3 TB/s is 17.7 µs
    assert s.floor_us(4.3) == pytest.approx(17.7, abs=0.1)


def test_ragged_pages():
    s = MLADecodeShape.create(num_heads=12, context_lens=(1, 64, 65), page_size=64)
    assert s.pages_per_request == (1, 1, 2) and s.num_pages == 4 and s.max_context_len == 65


@pytest.mark.parametrize("kwargs, msg", [
    ({"context_lens": (0,)}, "context length must be > 0"),
    ({"context_lens": (-5,)}, "context length must be > 0"),
    ({"num_heads": 0, "context_lens": (4,)}, r"^num_heads: must be 1\.\.256 \(MLA models have at most 128 query heads: DeepSeek-V3\), got 0$"),
    ({"context_lens": (4,), "page_size": 32}, r"^page_size: must be one of \(1, 16, 64\), got 32$"),
    ({"context_lens": (4,), "q_dtype": "int8"}, "dtype must be one of"),
    ({"context_lens": (4,), "qo_len": 9}, "^qo_len: must be 1-8 query tokens per request, got 9$"),
    ({"context_lens": ()}, "^context_lens: must name at least one request$"),
    ({"context_lens": (2,), "qo_len": 4}, "must hold >= 4 tokens"),
])
def test_bad_shapes(kwargs, msg):
    kwargs.setdefault("num_heads", 12)
    with pytest.raises(ShapeError, match=msg):
        MLADecodeShape.create(**kwargs)


def test_resolve_heads_conflicts():
    with pytest.raises(ConfigError, match="not both"):
        resolve_heads(model="kimi-k3", model_config="x", tp=8)
    with pytest.raises(ConfigError, match="contradicts"):
        resolve_heads(model="kimi-k3", tp=8, heads=16)
    assert resolve_heads(heads=12) == (12, None, None) == resolve_heads(heads=12, tp=1)
    # a fresh user's review: `check --tp 8 --heads 96` ran 96 heads, `tune --tp 8 --heads 16` recorded 16
    with pytest.raises(ConfigError, match=r"^--tp 8 divides a model's heads: give --model or --model-config"):
        resolve_heads(heads=96, tp=8)


V3_ATTENTION = {"model_type": "deepseek_v3", "num_attention_heads": 128, "kv_lora_rank": 512,
                "qk_rope_head_dim": 64, "qk_nope_head_dim": 128}
YARN_40 = {"rope_type": "yarn", "factor": 40, "mscale_all_dim": 1.0}


@pytest.mark.parametrize("layout", [
    {"rope_scaling": YARN_40},                                      # older transformers
    {"rope_scaling": {**YARN_40, "type": "yarn"}},                  # original DeepSeek-V3 file
    {"rope_parameters": {**YARN_40, "rope_theta": 10000.0}},        # transformers 5
    {"rope_scaling": None, "rope_parameters": {**YARN_40, "rope_theta": 10000.0}},
])
def test_yarn_mscale_from_either_rope_layout(tmp_path, layout):
    (tmp_path / "config.json").write_text(json.dumps({**V3_ATTENTION, **layout}))
    # 192^-0.5 * (0.1 * ln 40 + 1)^2 = 0.135234, not the plain 192^-0.5 = 0.072169
    assert read_hf_config(tmp_path).softmax_scale() == pytest.approx(0.135234, abs=5e-7)


@pytest.mark.parametrize("rope", [{"rope_type": "default", "rope_theta": 10000.0}, {"rope_theta": 5e4}])
def test_default_rope_keeps_the_plain_scale(tmp_path, rope):
    (tmp_path / "config.json").write_text(json.dumps({**V3_ATTENTION, "rope_parameters": rope}))
    assert read_hf_config(tmp_path).softmax_scale() == pytest.approx(192**-0.5)


@pytest.mark.parametrize("rope, named", [
    ({"rope_type": "longrope", "factor": 40}, "'longrope'"),
    ({"type": "llama3", "factor": 8}, "'llama3'"),
    ({"factor": 40, "mscale_all_dim": 1.0}, "no rope_type"),
])
def test_a_rope_type_not_understood_is_an_error_naming_it(tmp_path, rope, named):
    for key in ("rope_scaling", "rope_parameters"):
        (tmp_path / "config.json").write_text(json.dumps({**V3_ATTENTION, key: rope}))
        with pytest.raises(ConfigError, match=named):
            read_hf_config(tmp_path)


def test_model_config_that_cannot_be_read_is_one_line(tmp_path):
    (tmp_path / "binary").write_bytes(bytes(range(256)))
    with pytest.raises(ConfigError, match="not a text file"):
        read_hf_config(tmp_path / "binary")
    (tmp_path / "folder").mkdir()
    with pytest.raises(ConfigError, match="not found: .*folder/config.json"):
        read_hf_config(tmp_path / "folder")


def test_sizes_past_int32_are_shape_errors():
    with pytest.raises(ShapeError, match="int32 lengths"):
        MLADecodeShape.create(num_heads=12, context_lens=(2**31,))
    with pytest.raises(ShapeError, match="int32 block table"):  # 2 x 2^30 pages of one token
        MLADecodeShape.create(num_heads=12, context_lens=(2**30, 2**30), page_size=1)
    assert MLADecodeShape.create(num_heads=12, context_lens=(2**31 - 1,)).max_context_len == 2**31 - 1


@pytest.mark.timeout(30)
@pytest.mark.parametrize("batch, context, why", [
    (10**9, 4096, "64,000,000,000 KV pages"),          # past the int32 block table
    (10**8, 45, "6.7 TiB of latent cache"),            # pages fit int32, the cache fits no GPU
])
def test_a_batch_too_large_for_any_device_is_refused_before_it_is_built(batch, context, why):
    with pytest.raises(ShapeError, match=why):
        MLADecodeShape.uniform(batch, context, 12)
    assert MLADecodeShape.uniform(4, context, 12).batch == 4


KIMI_YARN = {"rope_type": "yarn", "factor": 128.0, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32,
             "beta_slow": 1, "original_max_position_embeddings": 4096}


@pytest.mark.parametrize("layout", [
    {"rope_scaling": {**KIMI_YARN, "apply_yarn_scaling": False}},             # as vLLM reads it
    {"rope_parameters": {**KIMI_YARN, "apply_yarn_scaling": False}},
    {"rope_scaling": KIMI_YARN, "apply_yarn_scaling": False},                 # beside rope_scaling
])
def test_apply_yarn_scaling_false_keeps_the_plain_scale(tmp_path, layout):
    """Issue 25 item 7 (SGLang PR 26203, vLLM PR 41569): YaRN's mscale is not applied to the
    softmax scale when the config says ``apply_yarn_scaling: false``; 0.159192 was used instead."""
    (tmp_path / "config.json").write_text(json.dumps({**V3_ATTENTION, **layout}))
    spec = read_hf_config(tmp_path)
    assert spec.softmax_scale() == pytest.approx(0.072169, abs=5e-7)
    assert "apply_yarn_scaling false" in spec.scale_source()
    (tmp_path / "config.json").write_text(json.dumps({**V3_ATTENTION, "rope_scaling": KIMI_YARN}))
    assert read_hf_config(tmp_path).softmax_scale() == pytest.approx(0.159192, abs=5e-7)


def test_the_scale_says_where_it_came_from(tmp_path):
    from mlabench.shapes import scale_note

    (tmp_path / "config.json").write_text(json.dumps({**V3_ATTENTION, "rope_scaling": KIMI_YARN}))
    spec = read_hf_config(tmp_path)
    assert scale_note(spec) == (f"softmax scale 0.159192 = (128 + 64) ** -0.5 x 1.4852 ** 2 (YaRN mscale of factor "
                                f"128, mscale_all_dim 1) from {tmp_path / 'config.json'}")
    assert scale_note(load_model("kimi-k3")).startswith("softmax scale 0.072169 = (128 + 64) ** -0.5 (no rope "
                                                        "scaling) from the vLLM ROCm 12-head MLA pull request (96 heads)")
    assert scale_note(None) == "softmax scale 0.041667 = 576 ** -0.5 (no model given: 1 / sqrt of the query width)"


@pytest.mark.parametrize("config, named", [
    ({"rope_scaling": {**KIMI_YARN, "attention_factor": 1.2}}, "rope_scaling field 'attention_factor'"),
    ({"rope_parameters": {**KIMI_YARN, "llama_4_scaling_beta": 0.1}}, "rope_parameters field 'llama_4_scaling_beta'"),
    ({"rope_scaling": {**KIMI_YARN, "apply_yarn_scaling": "no"}}, "apply_yarn_scaling"),
    ({"rope_scaling": {**KIMI_YARN, "apply_yarn_scaling": False}, "apply_yarn_scaling": True}, "apply_yarn_scaling"),
    ({"rope_scaling": KIMI_YARN, "softmax_scale": 0.1}, "'softmax_scale'"),
    ({"query_pre_attn_scalar": 144}, "'query_pre_attn_scalar'"),
    ({"attention_multiplier": 0.5}, "'attention_multiplier'"),
])
def test_a_field_that_may_change_the_scale_and_is_not_understood_is_refused(tmp_path, config, named):
    (tmp_path / "config.json").write_text(json.dumps({**V3_ATTENTION, **config}))
    with pytest.raises(ConfigError, match=named) as info:
        read_hf_config(tmp_path)
    assert "\n" not in str(info.value)


def test_fields_of_real_configs_that_do_not_touch_the_scale_are_read(tmp_path):
    """DeepSeek-V3's own config.json fields (MoE routing scale, rope theta, quantisation) pass."""
    config = {**V3_ATTENTION, "routed_scaling_factor": 2.5, "rope_theta": 10000, "scoring_func": "sigmoid",
              "quantization_config": {"weight_block_size": [128, 128]}, "rope_scaling": KIMI_YARN}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert read_hf_config(tmp_path).softmax_scale() == pytest.approx(0.159192, abs=5e-7)


V32_INDEXER = {"model_type": "deepseek_v32", "index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128}


@pytest.mark.parametrize("command", [["check"], ["sweep", "--results-dir", "runs"],
                                     ["tune", "--backend", "torch-splitkv", "--buckets", "1024", "--results-dir", "runs"]])
def test_a_sparse_attention_model_is_refused_naming_the_field(tmp_path, command):
    """Issue 35 A4: a DeepSeek-V3.2 config.json (index_topk 2048) passed check, sweep and tune as a
    dense model, though past 2048 tokens it reads only the tokens its indexer selects."""
    import subprocess
    import sys

    (tmp_path / "config.json").write_text(json.dumps({**V3_ATTENTION, "rope_scaling": YARN_40, **V32_INDEXER}))
    res = subprocess.run([sys.executable, "-m", "mlabench", *command, "--model-config", str(tmp_path), "--tp", "8"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.strip() == (
        f"error: {tmp_path / 'config.json'}: field 'index_topk' (2048) marks a sparse-attention model: past 2048 "
        "tokens each query reads only the tokens its indexer selects; mlabench times dense MLA decode over the "
        "whole cache, so its numbers would not be this model's"), res.stderr
    assert not (tmp_path / "runs").exists()
    (tmp_path / "config.json").write_text(json.dumps({**V3_ATTENTION, "index_n_heads": 64}))
    with pytest.raises(ConfigError, match="field 'index_n_heads' \\(64\\) marks a sparse-attention model: past "
                                          "index_topk tokens"):
        read_hf_config(tmp_path)
