"""Fixtures of the plot and report tests: runs cut from the committed H200 sweep and CPU serve run, an
H200 tuning run and its validation (fixtures/README.md), and the committed graph-check and multi-token
results read in place."""

import json
from pathlib import Path

import pytest

from mlabench.files import read_text
from mlabench.records.store import stored_file

FIXTURES = Path(__file__).parent / "fixtures"
H200 = FIXTURES / "h200-kimi-k3-tp8"
H200_RUN = H200 / "kimi-k3-tp8-20261130-105953-511"
SERVE = FIXTURES / "cpu-serve"
SERVE_RUN = SERVE / "serve-20261130T105730Z-cpu-tiny"
REPO = Path(__file__).resolve().parents[2]
TUNE = FIXTURES / "h200-tune-first-attempt"
TUNE_RUN = TUNE / "tune-kimi-k3-tp8-20261130-161711-925"
VALIDATE_RUN = TUNE / "validate-20261130-161822-1004"
GRAPH_CHECK = REPO / "results/h200/graph-check"
QO_LEN_RUN = REPO / "results/h200/qo-len/kimi-k3-tp8-mtp-20261130-181848-687"
#: Two committed runs in one folder: plain split counts, and the same kernel under split policies.
EMPTY_PROGRAMS = REPO / "results/h200/deploy/empty-programs"
#: Three committed runs in one folder, FlashMLA in two of them.
FUSED_MERGE = REPO / "results/h200/deploy/fused-merge"


def raw_records(run: Path = H200_RUN) -> list[dict]:
    """A run's records as plain JSON (``results.jsonl``, or ``results.jsonl.gz`` as committed runs
    keep them), for checks that do not go through mlabench's reader."""
    text = read_text(stored_file(run / "results.jsonl"), "run records")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="session")
def h200_runs():
    from mlabench.report.runs import load_runs

    return load_runs([H200])


@pytest.fixture(scope="session")
def serve_runs():
    from mlabench.report.runs import load_runs

    return load_runs([SERVE])


@pytest.fixture(scope="session")
def both_runs():
    from mlabench.report.runs import load_runs

    return load_runs([H200, SERVE])


@pytest.fixture(scope="session")
def families():
    from mlabench.backends import backend_families

    return backend_families()


@pytest.fixture(scope="session")
def tune_runs():
    """The committed tuning run and its validation run (one folder holds both)."""
    from mlabench.report.runs import load_runs

    return load_runs([TUNE])


@pytest.fixture(scope="session")
def graph_check_runs():
    from mlabench.report.runs import load_runs

    return load_runs([GRAPH_CHECK])


@pytest.fixture(scope="session")
def all_runs():
    """Every kind of run: the sweep, the serve run, the tuning and validation runs, the graph-check results."""
    from mlabench.report.runs import load_runs

    return load_runs([H200, SERVE, TUNE, GRAPH_CHECK])
