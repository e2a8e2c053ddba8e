"""Saved `vllm bench serve` results, field by field: which key wins, what per-request lists give,
and what a broken or partial file says.  Each number is worked out by hand in the test."""

import json

import pytest

from mlabench.serving.results import BenchResult, MetricStats, judge, load_result, parse_result


def summary(**extra):
    """The summary keys every vLLM version writes, with one TPOT mean so the result is ok."""
    return {"num_prompts": 4, "completed": 4, "failed": 0, "mean_tpot_ms": 12.5, **extra}


def test_median_key_wins_over_p50_and_dotted_percentiles_are_read():
    r = parse_result(summary(median_tpot_ms=12.0, p50_tpot_ms=11.0, p99_tpot_ms=20.0), "v", 1, 0)
    assert (r.tpot.median_ms, r.tpot.p99_ms) == (12.0, 20.0)
    dotted = parse_result(summary(**{"p50.0_ttft_ms": 90.0, "p99.0_ttft_ms": 150.0}), "v", 1, 0)
    assert (dotted.ttft.median_ms, dotted.ttft.p99_ms) == (90.0, 150.0)


def test_numbers_only_finite_and_not_booleans():
    r = parse_result(summary(output_throughput=True, request_throughput="2.5", duration=None,
                             total_output_tokens=12.5, num_prompts="4"), "v", 1, 0)
    assert r.output_throughput_tok_s is None and r.request_throughput_req_s == 2.5
    assert r.duration_s is None and r.total_output_tokens is None and r.num_prompts is None
    assert parse_result(summary(total_output_tokens=12), "v", 1, 0).total_output_tokens == 12


def test_failed_count_from_the_file_or_from_the_prompts():
    assert parse_result({"completed": 3, "failed": 1, "mean_tpot_ms": 1.0}, "v", 1, 0).failed == 1
    no_count = parse_result({"completed": 3, "mean_tpot_ms": 1.0}, "v", 1, 0)
    assert no_count.failed == 0 and no_count.status == "ok"  # nothing says any failed
    one = parse_result({"completed": 1, "failed": 0, "mean_tpot_ms": 1.0}, "v", 1, 0)
    assert one.status == "ok"


def test_failure_message_names_the_count_and_the_first_error_cut_at_300():
    assert parse_result(summary(completed=3, failed=1), "v", 1, 0).error == "1 failed"
    long = parse_result(summary(completed=3, failed=1, errors=["x" * 400]), "v", 1, 0)
    assert long.error == "1 failed; first error: " + "x" * 300


def test_vllm_version_and_result_file_are_kept():
    r = parse_result(summary(vllm_version="0.32.0"), "v", 1, 0, result_file="c1/r0.json")
    assert r.vllm_version == "0.32.0" and r.result_file == "c1/r0.json"
    assert parse_result(summary(vllm_version=32), "v", 1, 0).vllm_version == "32"
    assert parse_result(summary(), "v", 1, 0).vllm_version is None
    broken = parse_result({"failed": 0}, "v", 1, 0, result_file="c1/r0.json")
    assert broken.status == "error" and broken.result_file == "c1/r0.json"
    assert broken.error == "result has no 'completed' count"


def per_request(**lists):
    return {"completed": 3, "failed": 0, **lists}


def test_itls_skip_single_token_and_malformed_requests():
    # [0.03] over 2 tokens: 30 ms; one token has no ITL; a request without a list is skipped
    data = per_request(output_lens=[2, 1, 3, 4], itls=[[0.03], [], None, [0.01, 0.01, 0.01]])
    r = parse_result(data, "v", 1, 0)
    assert r.tpot.mean_ms == pytest.approx(20.0)  # (30 + 10) / 2
    assert r.tpot.median_ms == pytest.approx(20.0) and r.tpot.std_ms == pytest.approx(10.0)


def test_latency_minus_ttft_skips_missing_values():
    data = per_request(output_lens=[2, 3, 1, 5], latencies=[0.12, None, 0.5, 0.5],
                       ttfts=[0.1, 0.1, 0.1, None])
    r = parse_result(data, "v", 1, 0)
    assert r.tpot.mean_ms == pytest.approx(20.0) and r.tpot.p99_ms == pytest.approx(20.0)


@pytest.mark.parametrize("lists", [{"output_lens": [3]}, {"output_lens": [3], "latencies": [0.1]},
                                   {"output_lens": [3, 4], "itls": [[0.01, 0.01]]}])
def test_incomplete_per_request_lists_give_no_tpot(lists):
    r = parse_result(per_request(**lists), "v", 1, 0)
    assert r.tpot.mean_ms is None and r.status == "error"
    assert r.error == "result has no TPOT (mean_tpot_ms) and no per-request ITLs"


def test_per_request_median_p99_and_std_to_the_value():
    # five requests of two tokens (one ITL each) at 10 ... 50 ms, unordered: median 30, std sqrt(200)
    lens = [2, 2, 2, 2, 2]
    itls = [[0.05], [0.01], [0.04], [0.02], [0.03]]
    r = parse_result(per_request(output_lens=lens, itls=itls), "v", 1, 0)
    assert r.tpot.median_ms == pytest.approx(30.0) and r.tpot.p99_ms == pytest.approx(50.0)
    assert r.tpot.std_ms == pytest.approx(200 ** 0.5)
    # 200 requests of 1..200 ms: p99 is the 198th smallest (ceil(0.99 * 200) = 198)
    many = [[v / 1000] for v in range(200, 0, -1)]
    r = parse_result(per_request(output_lens=[2] * 200, itls=many), "v", 1, 0)
    assert r.tpot.p99_ms == pytest.approx(198.0) and r.tpot.median_ms == pytest.approx(100.5)


def test_missing_unreadable_and_non_object_files_say_which(tmp_path):
    missing = load_result(tmp_path / "run" / "c1.json", "v", 1, 0, run_dir=tmp_path / "run")
    assert missing.status == "missing" and missing.error == "no result file c1.json"
    alone = load_result(tmp_path / "nope.json", "v", 1, 0)
    assert alone.error == f"no result file {tmp_path / 'nope.json'}"
    (tmp_path / "bad.json").write_text("{truncated")
    bad = load_result(tmp_path / "bad.json", "v", 1, 0)
    assert bad.status == "missing" and bad.error.startswith(f"unreadable result {tmp_path / 'bad.json'}: ")
    (tmp_path / "list.json").write_text(json.dumps([1]))
    listed = load_result(tmp_path / "list.json", "v", 1, 0)
    assert listed.status == "error" and listed.error == f"{tmp_path / 'list.json'} is not a JSON object"


NOTHING = "vLLM writes 0 when no request produced more than one output token"


def test_judge_names_every_reason_and_the_most_severe_status_wins():
    # a zero TPOT (error), 3 of 4 completed (failed_requests) and 10 of 256 tokens (truncated):
    # error outranks the others, though "truncated" comes last in the alphabet
    r = BenchResult(variant="v", concurrency=1, repeat=0, status="ok", num_prompts=4, completed=3,
                    total_output_tokens=10, tpot=MetricStats(mean_ms=0.0, median_ms=0.0, p99_ms=5.0))
    judged = judge(r, min_output_tokens=256)
    assert judged.status == "error"
    assert judged.error == (f"TPOT measured nothing (mean 0 ms, median 0 ms; {NOTHING}); "
                            "only 3 of 4 requests completed; "
                            "cut short: 10 output tokens of the 256 the fixed lengths ask for")
    assert (judged.tpot.mean_ms, judged.tpot.median_ms, judged.tpot.p99_ms) == (None, None, 5.0)
    # failed_requests and truncated: truncated outranks failed_requests
    cut = judge(r.model_copy(update={"tpot": MetricStats(mean_ms=5.0)}), min_output_tokens=256)
    assert cut.status == "truncated"


def test_judge_of_an_ok_result_without_a_tpot_mean():
    r = judge(BenchResult(variant="v", concurrency=1, repeat=0, status="ok"))
    assert r.status == "error" and r.error == f"TPOT measured nothing (no mean; {NOTHING})"


def test_itls_that_hold_the_ttft_give_the_tpot_of_latency_minus_ttft():
    # 16 output tokens, TTFT 0.5 s, then 15 gaps of 20 ms; the ITL list also holds the TTFT first
    itls = [[0.5] + [0.02] * 15] * 2
    r = parse_result(per_request(output_lens=[16, 16], itls=itls, latencies=[0.8, 0.8],
                                 ttfts=[0.5, 0.5]), "v", 1, 0)
    assert r.status == "ok" and r.tpot.mean_ms == pytest.approx(20.0)  # not 0.8 s / 15 = 53.3 ms


def test_itls_of_multi_token_chunks_are_consistent():
    # 16 tokens in 8 chunks after the first: 7 gaps of 40 ms and one of 20 ms sum to latency - TTFT
    r = parse_result(per_request(output_lens=[16], itls=[[0.04] * 7 + [0.02]], latencies=[0.8],
                                 ttfts=[0.5]), "v", 1, 0)
    assert r.status == "ok" and r.tpot.mean_ms == pytest.approx(20.0)


@pytest.mark.parametrize("lists, why", [
    ({"itls": [[0.5] + [0.02] * 15]}, "request 0: 16 ITLs for 16 output tokens (at most 15)"),
    ({"itls": [[0.5] + [0.02] * 14], "latencies": [0.8], "ttfts": [0.5]},
     "request 0: 15 ITLs for 16 output tokens sum to 780.000 ms, but latency - TTFT is 300.000 ms"),
    ({"latencies": [0.4], "ttfts": [0.5]}, "request 0: latency 0.4 s below TTFT 0.5 s"),
])
def test_per_request_lists_that_disagree_are_refused_with_the_reason(lists, why):
    r = parse_result(per_request(output_lens=[16], **lists), "v", 1, 0)
    assert r.status == "error" and r.tpot.mean_ms is None
    assert r.error.startswith("per-request lists disagree") and why in r.error
    failed = parse_result({**per_request(output_lens=[16], **lists), "failed": 1}, "v", 1, 0)
    assert failed.status == "failed_requests" and why in failed.error
