"""The failure modes the relative verdict and the needle inputs exist for, each caught.

A split-KV decode in PyTorch (:mod:`tests.checks.mutant_kernels`) broken one way at a time, checked
by :class:`~mlabench.bench.shape_bench.ShapeBench` as ``check`` and ``sweep`` check a backend: ``check``'s
default shape (12 heads, softmax scale 576^-0.5, bf16, page size 64) with one request of 4096 or
32768 tokens, 16 splits.  Under the old rule (``|out - ref| <= 1e-2 + 1e-2 |ref|`` on random
inputs, as the CPU draws them) the faults the issue lists passed, as asserted here; each now
fails, on the input sets the design says.
"""

from __future__ import annotations

import pytest
import torch

from mlabench.bench.point import DEFAULT_CHECK_HEADS
from mlabench.bench.shape_bench import ShapeBench
from mlabench.checks.verdict import ErrorLimits, compare_outputs
from mlabench.shapes import MLADecodeShape
from tests.checks.mutant_kernels import Fault, MutantBackend

SPLITS = 16
#: fault -> input sets that must fail on it, at (4096, 32768) tokens.
CAUGHT = {
    "scale 5%": (Fault(scale=1.05), {"random", "needles"}, {"random", "needles"}),
    "averaging merge": (Fault(average_merge=True), {"random", "needles", "peaky"}, {"needles", "peaky"}),
    "dropped page": (Fault(drop_page=5), {"random", "flat"}, {"flat"}),
    "dropped 1/16": (Fault(drop_tail_fraction=1 / 16), {"random", "needles", "flat"}, {"needles", "flat"}),
    "first token of each split dropped": (Fault(drop_split_firsts=True), {"needles", "flat"}, {"needles", "flat"}),
    "last split tokens counted twice": (Fault(double_split_lasts=True), {"needles", "flat"}, {"needles", "flat"}),
    "last valid token dropped": (Fault(drop_last_token=True), {"needles"}, {"needles"}),
}
#: The faults the issue measured passing the old absolute rule, per length.
PASSED_THE_OLD_RULE = {4096: {"scale 5%", "averaging merge"},
                       32768: {"dropped page", "dropped 1/16", "averaging merge"}}


@pytest.fixture(scope="module", params=[4096, 32768])
def bench(request) -> ShapeBench:
    shape = MLADecodeShape.create(num_heads=DEFAULT_CHECK_HEADS, context_lens=(request.param,), page_size=64)
    return ShapeBench(shape, seed=0, copies=1)


def old_rule_passes(bench: ShapeBench, fault: Fault) -> bool:
    """Whether the old absolute rule passes ``fault`` on the random inputs of ``bench``."""
    call = MutantBackend(fault).prepare(bench.inputs[0], {"num_kv_splits": SPLITS})
    loose = ErrorLimits(rel_rmse=1e9, rel_max_err=1e9)
    return compare_outputs(call.fn(), bench.reference, loose, atol=1e-2, rtol=1e-2).passed


@pytest.mark.parametrize("splits", [1, SPLITS])
def test_a_correct_split_kv_passes_every_input_set(bench, splits):
    _, v = bench.check(MutantBackend(), {"num_kv_splits": splits})
    assert v.passed and set(v.by_input_set) == {"random", "needles", "peaky", "flat"}, v
    assert all(s.rel_rmse < s.rel_rmse_limit / 3 and s.rel_max_err < s.rel_max_err_limit / 3
               for s in v.by_input_set.values())


@pytest.mark.parametrize("name", list(CAUGHT))
def test_each_fault_fails_on_the_input_sets_meant_to_catch_it(bench, name):
    fault, at_4k, at_32k = CAUGHT[name]
    length = bench.shape.max_context_len
    _, v = bench.check(MutantBackend(fault), {"num_kv_splits": SPLITS})
    failed = {s for s, sv in v.by_input_set.items() if not sv.passed}
    assert not v.passed and failed >= (at_4k if length == 4096 else at_32k), (failed, v.by_input_set)


def test_the_old_rule_passed_the_faults_the_issue_measured(bench):
    """The issue measured these faults passing the old rule on a CPU without a GPU.  Several sit
    near that rule's edge (a few 1e-4 inside it), so another generator's draw (a GPU's) or another
    CPU's bf16 arithmetic (the GPU host's ran in the mutant's CPU path) can land them either side:
    the claim is checked where it was made, and skipped on a machine with a GPU."""
    if torch.cuda.is_available():
        pytest.skip("the old rule's verdict on these faults is a fact of the CPU-only machine the issue measured on")
    for name in sorted(PASSED_THE_OLD_RULE[bench.shape.max_context_len]):
        assert old_rule_passes(bench, CAUGHT[name][0]), name


def test_the_verdict_names_the_needles_lost(bench):
    _, v = bench.check(MutantBackend(Fault(drop_last_token=True)), {"num_kv_splits": SPLITS})
    length = bench.shape.max_context_len
    assert v.input_set == "needles"
    assert f"request 0 token {length - 1} (" in v.missing and "last valid token) for head" in v.missing
    assert v.missing.endswith("missing")
    _, v = bench.check(MutantBackend(Fault(drop_split_firsts=True)), {"num_kv_splits": SPLITS})
    assert "first token of split" in v.by_input_set["needles"].missing
    _, v = bench.check(MutantBackend(Fault(double_split_lasts=True)), {"num_kv_splits": SPLITS})
    assert "last token of split" in v.by_input_set["needles"].missing and "counted twice" in v.missing
