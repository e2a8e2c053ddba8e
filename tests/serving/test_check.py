"""Greedy check: parsing the completions answer, comparison, near ties, fixtures."""

import math

import pytest

from mlabench.errors import ConfigError, ServerError
from mlabench.serving.greedy_check import GreedyOutput, compare, load_fixture, parse_completion, save_fixture, top2_gap


def out(ids, gaps=None, n=None, lp=-1.0):
    gaps = gaps or [1.0] * len(ids)
    tops = [{t: lp, t + 1000: lp - g} for t, g in zip(ids, gaps)]
    return GreedyOutput(model="m", prompt_sha256="0" * 64, prompt_head="p", prompt_chars=1,
                        max_tokens=n or len(ids), token_ids=list(ids),
                        logprobs=[lp] * len(ids), top_logprobs=tops, finish_reason="length")


def test_parse_vllm_completion_with_token_ids():
    body = {"model": "m", "choices": [{"finish_reason": "length", "logprobs": {
        "tokens": ["token_id:99", "token_id:359"], "token_logprobs": [-0.5, -0.25],
        "top_logprobs": [{"token_id:99": -0.5, "token_id:7": -1.5},
                         {"token_id:359": -0.25, "token_id:8": -3.0}]}}]}
    g = parse_completion(body, "p", 2)
    assert g.token_ids == [99, 359] and g.top_logprobs[1] == {359: -0.25, 8: -3.0}
    assert top2_gap(g.top_logprobs[0]) == pytest.approx(1.0)
    body["choices"][0]["logprobs"]["tokens"][0] = "hello"
    with pytest.raises(ServerError, match="return_tokens_as_token_ids"):
        parse_completion(body, "p", 2)
    with pytest.raises(ServerError, match="unexpected"):
        parse_completion({"error": "x"}, "p", 2)


def test_match():
    r = compare(out([1, 2, 3]), out([1, 2, 3]), 0.05)
    assert r.verdict == "match" and r.first_divergence is None and r.matched_prefix == 3


def test_mismatch_reports_first_divergent_position():
    r = compare(out([1, 2, 9, 4]), out([1, 2, 3, 4]), 0.05)
    assert r.verdict == "mismatch"
    assert (r.first_divergence, r.expected_token, r.got_token) == (2, 3, 9)
    assert r.top2_gap == pytest.approx(1.0) and r.matched_prefix == 2


def test_near_tie_divergence():
    """Two unsure servers flipping between the same two tokens; a fresh user's review: a server with
    flat logits (a broken kernel) was excused where the fixture had been sure, or had not even
    considered the token it chose (the smaller of the two gaps was read)."""
    fixture, got = out([1, 2], gaps=[1.0, 0.03]), out([1, 9], gaps=[1.0, 0.01])
    fixture.top_logprobs[1] = {2: -1.0, 9: -1.03}
    got.top_logprobs[1] = {9: -1.0, 2: -1.01}
    r = compare(got, fixture, 0.05)
    assert r.verdict == "near_tie_divergence" and r.first_divergence == 1
    assert r.top2_gap == pytest.approx(0.03)                       # the larger of the two gaps
    fixture.top_logprobs[1] = {2: -1.0, 9: -2.9}                   # the fixture was sure
    assert compare(got, fixture, 0.05).verdict == "mismatch"
    fixture.top_logprobs[1] = {2: -1.0, 7: -1.03}                  # unsure, between 2 and 7, not 9
    assert compare(got, fixture, 0.05).verdict == "mismatch"


def test_wrong_count_and_non_finite_are_invalid():
    short = out([1, 2], n=3)
    assert compare(short, out([1, 2, 3]), 0.05).verdict == "invalid"
    bad = out([1, 2, 3])
    bad.logprobs[1] = -math.inf
    r = compare(bad, out([1, 2, 3]), 0.05)
    assert r.verdict == "invalid" and not r.all_finite
    nan_top = out([1, 2, 3])
    nan_top.top_logprobs[2][5] = float("nan")
    assert not compare(nan_top, out([1, 2, 3]), 0.05).all_finite


def test_fixture_round_trip_and_no_overwrite(tmp_path):
    f = tmp_path / "fx.json"
    save_fixture(out([5, 6]), f)
    assert load_fixture(f).token_ids == [5, 6]
    with pytest.raises(ConfigError, match="exists"):
        save_fixture(out([7]), f)
    with pytest.raises(ConfigError, match="not found"):
        load_fixture(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text('{"model": 1}')
    with pytest.raises(ConfigError, match="bad fixture"):
        load_fixture(tmp_path / "bad.json")
