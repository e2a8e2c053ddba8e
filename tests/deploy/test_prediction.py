"""TPOT predicted from microbenchmarks: the arithmetic, the choice of records (fastest correct of
the named kernel at the served batch and length), and the rows' gaps."""

from dataclasses import dataclass, field

import pytest

from mlabench.backends import backend_params
from mlabench.deploy.prediction import (
    KernelRef, MeasuredStep, PredictionSpec, attention_us, measured_step, non_attention_ms,
    predicted_step_ms, prediction_rows, prediction_table, served_attention_us, value_matches,
)
from mlabench.errors import ConfigError


@dataclass
class Rec:
    """The fields of a record the prediction reads."""

    backend: str
    median_us: float | None
    batch: int
    context_len: int
    params: dict = field(default_factory=dict)
    status: str = "ok"
    qo_len: int = 1
    num_heads: int = 12
    shape: dict = field(default_factory=lambda: {"page_size": 64, "q_dtype": "bfloat16", "kv_dtype": "bfloat16"})


SPEC = PredictionSpec.of({
    "layers": 10, "reference": "fm", "short_input_len": 4096,
    "kernels": {"fm": {"backend": "flashmla"},
                "ours": {"backend": "gluon-splitkv", "params": {"split_policy": "device:*"}}},
}, ["fm", "ours", "fa3"])

RECORDS = [
    Rec("flashmla", 20.0, 1, 4096), Rec("flashmla", 60.0, 1, 100000),
    Rec("gluon-splitkv", 8.0, 1, 4096, {"split_policy": "device:/x/policy.json"}),
    Rec("gluon-splitkv", 35.0, 1, 100000, {"split_policy": "device:/x/policy.json"}),
    Rec("gluon-splitkv", 30.0, 1, 100000, {"split_policy": "device:/x/policy.json"}, status="incorrect"),
    Rec("gluon-splitkv", 10.0, 1, 100000, {"split_policy": ""}),            # not the served kernel
    Rec("gluon-splitkv", 34.0, 1, 100000, {"split_policy": "device:/y/policy.json", "pdl": 1}),
]


def test_arithmetic():
    assert non_attention_ms(10.0, 61, 20.0) == pytest.approx(10.0 - 1.22)
    assert predicted_step_ms(8.78, 61, 40.0) == pytest.approx(8.78 + 2.44)


def test_the_fastest_correct_record_of_the_named_kernel():
    ours = SPEC.kernels["ours"]
    assert attention_us(RECORDS, ours, 1, 100000) == 34.0      # the incorrect 30 and the fixed-count 10 never count
    assert attention_us(RECORDS, ours, 16, 100000) is None
    assert KernelRef(backend="gluon-splitkv", params={"split_policy": "device:*"}).matches(RECORDS[2], 1)
    frozen = KernelRef(backend="gluon-splitkv", params={"split_policy": ""},
                       by_concurrency={1: {"num_kv_splits": 108}, 16: {"num_kv_splits": 16}})
    recs = [Rec("gluon-splitkv", 9.0, 1, 4096, {"split_policy": "", "num_kv_splits": 16}),
            Rec("gluon-splitkv", 11.0, 1, 4096, {"split_policy": "", "num_kv_splits": 108}),
            Rec("gluon-splitkv", 30.0, 16, 4096, {"split_policy": "", "num_kv_splits": 16})]
    assert attention_us(recs, frozen, 1, 4096) == 11.0 and attention_us(recs, frozen, 16, 4096) == 30.0


def test_attention_is_read_at_the_middle_of_the_served_decode():
    """A policy's bucket edge at the input length: the server decodes at input + 1 and on, so the
    record at input + output / 2 wins over the one at the input length; older sweeps (input length
    only) still predict; the row says which context it read."""
    fm = SPEC.kernels["fm"]
    recs = [Rec("flashmla", 20.0, 1, 4096), Rec("flashmla", 26.0, 1, 4160)]
    assert served_attention_us(recs, fm, 1, 4096, 128) == (26.0, 4160)
    assert served_attention_us(recs[:1], fm, 1, 4096, 128) == (20.0, 4096)
    assert served_attention_us(recs, fm, 16, 4096, 128) == (None, 4160)
    assert served_attention_us(recs, fm, 1, 4096, 0) == (20.0, 4096)
    rows = prediction_rows(SPEC, _at_c1({("fm", 4096, 1): 5.0}), recs, output_len=128)
    assert rows[0]["attention_context"] == 4160 and rows[0]["attention_us"] == 26.0
    missing = prediction_rows(SPEC, _at_c1({("fm", 4096, 1): 5.0, ("ours", 4096, 1): 4.0}), recs, output_len=128)
    assert "context 4160 or 4096" in missing[1]["why"]
    assert missing[1]["attention_context"] is None  # no record read: the column shows none, not 4160


def _at_c1(tpot: dict) -> dict:
    return {k: measured_step(k[2], v, None) for k, v in tpot.items()}


def test_rows_predict_every_variant_from_the_references_short_step():
    measured = _at_c1({("fm", 4096, 1): 5.0, ("fm", 100000, 1): 5.5, ("ours", 4096, 1): 4.9,
                       ("ours", 100000, 1): 5.0, ("fa3", 100000, 1): 5.2})
    rows = {(r["variant"], r["input_len"]): r for r in prediction_rows(SPEC, measured, RECORDS)}
    rest = 5.0 - 10 * 20.0 / 1000                                 # 4.8 ms outside attention
    assert rows[("fm", 4096)]["predicted_ms"] == pytest.approx(5.0)  # by construction
    assert rows[("fm", 100000)]["predicted_ms"] == pytest.approx(rest + 0.6)
    assert rows[("ours", 100000)]["predicted_ms"] == pytest.approx(rest + 0.34)
    assert rows[("ours", 100000)]["error_pct"] == pytest.approx(100 * (5.14 - 5.0) / 5.0)
    assert rows[("ours", 100000)]["attention_share_pct"] == pytest.approx(100 * 0.34 / 5.14)
    assert rows[("fa3", 100000)]["predicted_ms"] is None and "no kernel named" in rows[("fa3", 100000)]["why"]
    table = prediction_table(SPEC, list(rows.values()))
    assert any("fa3: no kernel named" in n for n in table.notes)


def test_without_the_reference_measurement_nothing_is_predicted():
    rows = prediction_rows(SPEC, _at_c1({("ours", 100000, 16): 9.0}), RECORDS)
    assert rows[0]["predicted_ms"] is None
    assert "no correct gluon-splitkv record with split_policy=device:* at batch 16" in rows[0]["why"]


def test_a_note_omits_empty_params_and_error_pct_has_two_decimals():
    """A new user read "split_policy= num_kv_splits=108" (a parameter held empty) and `error %` with
    three decimals beside columns of two."""
    from mlabench.tables.render import to_markdown

    spec = PredictionSpec.of({"layers": 10, "reference": "fm", "short_input_len": 4096, "kernels": {
        "fm": {"backend": "flashmla"},
        "host": {"backend": "gluon-splitkv", "params": {"split_policy": ""}, "by_concurrency": {1: {"num_kv_splits": 108}}}}},
        ["fm", "host"])
    rows = prediction_rows(spec, _at_c1({("fm", 4096, 1): 5.0, ("fm", 100000, 1): 5.123, ("host", 4096, 1): 4.0}),
                           RECORDS)
    table = prediction_table(spec, rows)
    assert "host: no correct gluon-splitkv record with num_kv_splits=108 at batch 1, context 4096" in table.notes
    errors = [line.split(" | ")[6] for line in to_markdown(table).splitlines() if "| fm |" in line]
    assert errors == ["0.00", f"{100 * (5.4 - 5.123) / 5.123:.2f}"]


_ONE = {"layers": 1, "reference": "fm", "short_input_len": 4096}


@pytest.mark.parametrize("table, words", [
    (None, "no [prediction] table"),
    ({"layers": 0, "reference": "fm", "short_input_len": 1, "kernels": {}}, "layers"),
    ({**_ONE, "reference": "zz", "kernels": {"fm": {"backend": "flashmla"}}}, "reference 'zz' is no variant"),
    ({**_ONE, "reference": "fa3", "kernels": {"fm": {"backend": "flashmla"}}}, "needs an entry"),
    # a fresh user's typos, each of which found no record and printed empty predictions with exit 0
    ({**_ONE, "kernels": {"fm": {"backend": "vllm-flashml"}}}, "kernels.fm: unknown backend 'vllm-flashml'"),
    ({**_ONE, "kernels": {"fm": {"backend": "vllm-fa3-mla", "params": {"max_num_split": 32}}}},
     "kernels.fm: vllm-fa3-mla has no parameter 'max_num_split' (it has max_num_splits"),
    ({**_ONE, "kernels": {"fm": {"backend": "gluon-splitkv", "by_concurrency": {1: {"num_kv_split": 8}}}}},
     "gluon-splitkv has no parameter 'num_kv_split'"),
    ({**_ONE, "kernels": {"fm": {"backend": "gluon-splitkv", "params": {"split_policy": "device:{env:}"}}}},
     "kernels.fm split_policy = 'device:{env:}': a launch env value is written {env:NAME}"),
    ({**_ONE, "kernels": {"fm": {"backend": "gluon-splitkv", "params": {"split_policy": "device:{Env:P}"}}}},
     "is written {env:NAME}"),
    ({**_ONE, "kernels": {"fm": {"backend": "gluon-splitkv", "params": {"split_policy": "device:{env:P"}}}},
     "is written {env:NAME}"),
    ({**_ONE, "kernels": {"fm": {"backend": "gluon-splitkv", "params": {"split_policy": "$POLICY"}}}},
     "is written {env:NAME}"),
    ({**_ONE, "short_input_len": 4000, "kernels": {"fm": {"backend": "flashmla"}}},
     "short_input_len 4000 is no input length of the run or config it is read with (4096, 32768)"),
])
def test_a_bad_spec_is_one_line(table, words):
    with pytest.raises(ConfigError) as err:
        PredictionSpec.of(table, ["fm", "ours", "fa3"], {}, [32768, 4096], [1, 16], backend_params())
    assert words in str(err.value) and "\n" not in str(err.value)


def test_kernels_of_absent_variants_and_unused_concurrency_keys_are_named_in_notes():
    spec = PredictionSpec.of({**_ONE, "kernels": {"fm": {"backend": "flashmla"}, "flashmal": {"backend": "flashmla"},
                                                  "ours": {"backend": "gluon-splitkv",
                                                           "by_concurrency": {11: {"num_kv_splits": 8}}}}},
                             ["fm", "ours"], {}, [4096], [1, 16])
    assert set(spec.kernels) == {"fm", "ours"}
    assert spec._notes == ["[prediction] kernels.ours.by_concurrency 11: no concurrency 11 runs here (unused)",
                           "[prediction] kernels.flashmal: no variant flashmal here (left out)"]


@pytest.mark.parametrize("have, want, same", [
    ("device:/work/main/results/h200/q/policy.json", "device:results/h200/q/policy.json", True),
    ("device:results/h200/q/policy.json", "device:/srv/co/results/h200/q/policy.json", True),  # the other way
    ("device:./results/h200/q/policy.json", "device:results/h200/q/policy.json", True),
    ("device:/work/main/results/h200/q/policy.json", "device:results/h200/*/policy.json", True),
    ("device:/work/main/results/h200/q/policy.json", "device:results/h200/r/policy.json", False),
    ("device:/a/results/h200/q/policy.json", "device:/b/results/h200/q/policy.json", False),  # both absolute
    ("device:/work/main/results/h200/q/policy.json", "results/h200/q/policy.json", False),  # not a device policy
    ("device:/work/main/xresults/h200/q/policy.json", "device:results/h200/q/policy.json", False),  # whole parts
    ("8", "8", True), ("16", "8", False), ("device:x", "device:*", True),
])
def test_a_path_value_matches_the_same_path_written_from_another_folder(have, want, same):
    assert value_matches(have, want) is same


def test_above_concurrency_1_the_step_is_the_median_itl_and_the_rest_of_the_tpot_is_shown():
    assert measured_step(1, 6.0, 6.3) == MeasuredStep(6.0, 6.0, "TPOT")      # one request: every step decodes it
    assert measured_step(16, 340.0, 31.0) == MeasuredStep(340.0, 31.0, "p50 ITL")
    assert measured_step(16, 12.0, None) == MeasuredStep(12.0, 12.0, "TPOT")  # no ITL recorded
    spec = PredictionSpec.of({"layers": 10, "reference": "ours", "short_input_len": 4096,
                              "kernels": {"ours": {"backend": "flashmla"}}}, ["ours"])
    recs = [Rec("flashmla", 100.0, 16, 4096), Rec("flashmla", 400.0, 16, 100000)]
    measured = {("ours", 4096, 16): measured_step(16, 9.0, 8.0),
                ("ours", 100000, 16): measured_step(16, 340.0, 12.5)}
    rows = {r["input_len"]: r for r in prediction_rows(spec, measured, recs)}
    rest = 8.0 - 10 * 0.1                                    # R from the reference's median ITL, not its TPOT
    assert rows[100000]["predicted_ms"] == pytest.approx(rest + 4.0)
    assert rows[100000]["error_pct"] == pytest.approx(100 * (11.0 - 12.5) / 12.5)
    assert rows[100000]["outside_step_pct"] == pytest.approx(100 * (340.0 - 12.5) / 340.0)
    assert rows[100000]["step_from"] == "p50 ITL"


def test_rows_keep_the_order_of_the_measured_variants():
    measured = _at_c1({("ours", 4096, 1): 4.9, ("fm", 4096, 1): 5.0, ("fa3", 4096, 1): 5.1})
    assert [r["variant"] for r in prediction_rows(SPEC, measured, RECORDS)] == ["ours", "fm", "fa3"]


def test_the_notes_say_what_each_step_from_value_means():
    """A new user read "p50 ITL" in the step column; no note said that it is the median ITL."""
    measured = {("ours", 4096, 1): measured_step(1, 9.0, 9.1), ("ours", 4096, 16): measured_step(16, 12.0, 8.0)}
    table = prediction_table(SPEC, prediction_rows(SPEC, measured, RECORDS))
    notes = " ".join(table.notes)
    for step_from in {row[table.columns.index("step_from")] for row in table.rows}:
        assert f"{step_from} at concurrency 1" in notes or f"{step_from} above it, the median" in notes


@pytest.mark.parametrize("config", ["configs/serve/h200-kimi-k3-tp8-proxy.toml",
                                    "configs/serve/h200-kimi-k3-tp8-proxy-c16.toml"])
def test_the_h200_configs_name_registered_backends_for_each_variant(config, monkeypatch):
    """Every kernel a shipped [prediction] names is a registered backend (a typo predicts nothing);
    the H200 configs predict the FLASHMLA server from vLLM's own call (vllm-flashmla), not from
    the flashmla backend's sgl-flash-mla kernel, which under-predicted that server by 6-11.5%."""
    from pathlib import Path

    from mlabench.backends import backend_names
    from mlabench.serving.bench import launch_env
    from mlabench.serving.config import load_config
    from mlabench.serving.run_folder import recorded_launch_env

    conf = load_config(Path(__file__).resolve().parents[2] / config)
    monkeypatch.setenv("MLABENCH_SERVE_POLICY", "/served/policy.json")  # what mlabench's server gets
    spec = PredictionSpec.of(conf.prediction, [v.name for v in conf.variants],
                             recorded_launch_env({"launch_env": launch_env(conf.variants)}))
    assert {k.backend for k in spec.kernels.values()} <= set(backend_names())
    assert spec.kernels["flashmla"].backend == "vllm-flashmla"
    assert spec.kernels["mlabench"].params == {"split_policy": "device:/served/policy.json"}
