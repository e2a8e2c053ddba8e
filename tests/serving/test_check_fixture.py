"""serve-check against a fixture recorded for another request: a different prompt or a different
max_tokens makes the run invalid, even where its tokens happen to agree."""

import pytest

from mlabench.serving.greedy_check import GreedyOutput, compare, passes, validate_alone


def greedy(ids, max_tokens=None, prompt_sha256="a" * 64) -> GreedyOutput:
    return GreedyOutput(model="m", prompt_sha256=prompt_sha256, prompt_head="p", prompt_chars=1,
                        max_tokens=len(ids) if max_tokens is None else max_tokens, token_ids=list(ids),
                        logprobs=[-0.5] * len(ids), top_logprobs=[{t: -0.5, t + 1: -2.5} for t in ids])


PROBLEM = "prompt or max_tokens differ from the fixture's"


def test_same_tokens_for_another_prompt_are_invalid():
    report = compare(greedy([4, 5, 6]), greedy([4, 5, 6], prompt_sha256="b" * 64), 0.05)
    assert report.verdict == "invalid" and PROBLEM in report.problems
    assert not passes(report)


def test_a_fixture_of_another_length_is_invalid_not_a_mismatch():
    # the run asked for 3 tokens and got 3; the fixture was recorded with max_tokens=4
    report = compare(greedy([4, 5, 6]), greedy([4, 5, 6, 7]), 0.05)
    assert report.verdict == "invalid" and report.problems == [PROBLEM]
    assert report.first_divergence == 3 and report.matched_prefix == 3


@pytest.mark.parametrize("ids, fixture", [([4, 5, 6], [4, 5, 6]), ([4, 5, 9], [4, 5, 6])])
def test_the_same_request_is_judged_on_its_tokens(ids, fixture):
    report = compare(greedy(ids), greedy(fixture), 0.05)
    assert PROBLEM not in report.problems
    assert report.verdict == ("match" if ids == fixture else "mismatch")


def test_a_run_checked_alone_is_valid_when_complete():
    assert validate_alone(greedy([1, 2])).verdict == "match"
    assert validate_alone(greedy([1, 2], max_tokens=3)).verdict == "invalid"


def test_a_divergence_past_the_end_shows_no_none_tokens():
    """Issue 25 item 14: a run shorter than its fixture printed "None/None" as the tokens there."""
    from mlabench.serving.greedy_check import report_table

    report = compare(greedy([4, 5, 6]), greedy([4, 5, 6, 7]), 0.05)
    _headers, (row,) = report_table(report).texts()
    assert not any("None" in cell for cell in row)


def test_a_fixture_request_another_than_the_runs_is_refused_before_asking():
    """Issue 25 item 14: ``-n 16`` against a 32-token fixture asked the server, then said
    "invalid" with None/None; the request is compared with the fixture's first."""
    from mlabench.errors import ConfigError
    from mlabench.serving.config import CheckParams
    from mlabench.serving.greedy_check import check_request_matches

    fixture = greedy(list(range(32)))
    with pytest.raises(ConfigError, match=r"^-n 16 asks for 16 tokens; the fixture fx.json holds 32 \(run with "
                                          r"-n 32, or record another fixture\)$"):
        check_request_matches(CheckParams(max_tokens=16), fixture, "fx.json")
    with pytest.raises(ConfigError, match="another prompt than the fixture fx.json"):
        check_request_matches(CheckParams(max_tokens=32), fixture, "fx.json")


def test_a_recorded_fixture_is_not_shown_as_a_comparison():
    from mlabench.serving.greedy_check import report_table

    table = report_table(validate_alone(greedy([1, 2])), recorded="fx.json")
    assert table.title == "Greedy fixture recorded: fx.json (nothing compared)"
    assert table.rows[0][0] == "recorded"
