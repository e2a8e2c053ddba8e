"""Drawing a tuning figure does not start the tuner (issue 36 item 4): the figures' data module,
the validation arithmetic and tables it reads and the search space import, also inside their
functions, neither the trial worker, the worker pool, the tuning run, the validation's measurements,
``serving.lifecycle`` nor Optuna.  Before, ``tuning_data`` -> ``tune.validation`` -> (inside a
function) ``tune.run`` -> trial worker -> worker pool -> ``serving.lifecycle``."""

from __future__ import annotations

import pytest

from tests.imports import modules_loaded_by

#: The tuner's process machinery, which none of the modules below may load.
PROCESSES = {"mlabench.tune.trial_worker", "mlabench.tune.worker_pool", "mlabench.tune.run",
             "mlabench.tune.validation_run", "mlabench.serving.lifecycle", "optuna"}


@pytest.fixture(scope="module")
def graph():
    """mlabench's import graph (grimp: imports inside functions and under TYPE_CHECKING included)."""
    grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter (the test extra)")
    return grimp.build_graph("mlabench", cache_dir=None)


@pytest.mark.parametrize("module", ["mlabench.report.figures.tuning_data", "mlabench.tune.validation",
                                    "mlabench.tune.space", "mlabench.tune.seeded_trials"])
def test_the_arithmetic_of_tuning_loads_no_process_machinery(graph, module):
    """Import ``module`` and every module it imports anywhere, as its functions would, in a fresh
    interpreter: none of :data:`PROCESSES` is loaded."""
    reached = sorted({module} | graph.find_upstream_modules(module))
    loaded = modules_loaded_by("\n".join(f"import {m}" for m in reached))
    assert not PROCESSES & loaded, sorted(PROCESSES & loaded)
