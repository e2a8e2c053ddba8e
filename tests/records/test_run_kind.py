"""Every run folder says, or is given, what run it is (issue 36): :func:`run_kind` over every
committed run, a few checked by hand, and new manifests carrying their ``kind``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlabench.records.kinds import manifest_kind, run_kind
from mlabench.records.record import Manifest
from mlabench.run_files import (ARCHIVED_JOURNAL_FILE, MANIFEST_FILE, RUN_KINDS, SERVE_BENCH_KIND, SWEEP_KIND,
                                TUNE_KIND, VALIDATION_FILE, VALIDATION_KIND)

RESULTS = Path(__file__).resolve().parents[2] / "results"
COMMITTED_RUNS = sorted(p.parent for p in RESULTS.rglob(MANIFEST_FILE))


def test_there_are_committed_runs_to_read():
    assert len(COMMITTED_RUNS) >= 20


@pytest.mark.parametrize("run", COMMITTED_RUNS, ids=lambda p: str(p.relative_to(RESULTS)))
def test_every_committed_run_has_a_kind_its_files_agree_with(run):
    """A tuning run holds its journal, a validation run its points, a serve-bench run says so."""
    kind = run_kind(run)
    assert kind in RUN_KINDS
    assert (kind == TUNE_KIND) == (run / ARCHIVED_JOURNAL_FILE).is_file()
    assert (kind == VALIDATION_KIND) == (run / VALIDATION_FILE).is_file()
    assert (kind == SERVE_BENCH_KIND) == (json.loads((run / MANIFEST_FILE).read_text()).get("kind") == SERVE_BENCH_KIND)


@pytest.mark.parametrize(("folder", "kind"), [
    ("cpu-vllm/serve-20261130T105730Z-cpu-tiny", SERVE_BENCH_KIND),
    ("h200/deploy/qo1/tune-kimi-k3-tp8-20261201-152425-462", TUNE_KIND),
    ("h200/deploy/qo1/validate-20261201-152911-787", VALIDATION_KIND),
    ("h200/kimi-k3-tp8/kimi-k3-tp8-20261130-105953-511", SWEEP_KIND),
    ("h200/hopper-kernel/run-72fb349/run", SWEEP_KIND),  # a script's kernel run
])
def test_committed_runs_checked_by_hand(folder, kind):
    assert run_kind(RESULTS / folder) == kind


def test_a_manifest_saying_its_kind_is_taken_at_its_word(tmp_path):
    """``kind`` wins over the configuration; an unknown one, a missing or unreadable manifest read as a sweep."""
    assert manifest_kind({"kind": VALIDATION_KIND, "config": {"tune": {}}}) == VALIDATION_KIND
    assert manifest_kind({"kind": "something-else", "config": {"validate": {}}}) == VALIDATION_KIND
    assert manifest_kind({"kind": None, "config": []}) == SWEEP_KIND
    assert run_kind(tmp_path) == SWEEP_KIND
    (tmp_path / MANIFEST_FILE).write_text("[1, 2]")
    assert run_kind(tmp_path) == SWEEP_KIND


def test_new_sweep_tuning_and_validation_manifests_say_their_kind():
    from mlabench.sweep.run import kernel_run_manifest
    from mlabench.tune.manifest import run_manifest

    assert kernel_run_manifest("r", {}, 1.0).kind == SWEEP_KIND

    assert run_manifest("r", 1.0, {"validate": {}}, kind=VALIDATION_KIND).kind == VALIDATION_KIND
    assert json.loads(run_manifest("r", 1.0, {}, kind=TUNE_KIND).model_dump_json())["kind"] == TUNE_KIND


def test_a_manifest_recorded_before_kinds_still_reads():
    manifest = json.loads((RESULTS / "h200/deploy/qo1/tune-kimi-k3-tp8-20261201-152425-462" / MANIFEST_FILE).read_text())
    assert "kind" not in manifest and Manifest.model_validate(manifest).kind is None


SERVE_RUN = RESULTS / "h200/serving/serve-20261204T182027Z-h200-proxy"


@pytest.mark.parametrize("args", [
    ["compare", "--from", str(SERVE_RUN)],
    ["diff", str(SERVE_RUN), str(RESULTS / "h200/kimi-k3-tp8/kimi-k3-tp8-20261130-105953-511")],
    ["tune", "--export", str(SERVE_RUN)],
    ["tune", "--resume", str(SERVE_RUN)],
    ["sweep", "--resume", str(SERVE_RUN)],
])
def test_a_serve_bench_run_given_to_a_kernel_command_is_named_as_one(args, monkeypatch, capsys):
    """A serve-bench run given to compare, diff or tune --export read "unreadable manifest
    (started_utc: unknown key (a typo?))", as if the file were damaged; to --resume, "archived:
    gunzip it to add to it", which would not have helped.  Now one line says what it is."""
    import sys

    from mlabench import cli

    monkeypatch.setattr(sys, "argv", ["mlabench", *args])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.count("\n") == 1 and "unknown key" not in err and "gunzip" not in err
    if args[0] == "compare":  # compare --from reads the kernel runs under a folder: one named is checked there
        assert err == f"error: compare --from {SERVE_RUN}: a serve-bench run, not a sweep, tune or validation run\n"
    else:
        assert err.startswith(f"error: {SERVE_RUN} is a serve-bench run, not a sweep") and "serve-bench --from-run" in err


@pytest.mark.parametrize("kind, run, command", [
    ("tuning", "tune-kimi-k3-tp8-20261130-161711-925", "mlabench tune --resume {run}"),
    ("validation", "validate-20261130-161822-1004", "mlabench tune --validate {policy} --resume {run}"),
])
def test_sweep_resume_of_a_tuning_or_validation_run_names_the_command_that_continues_it(
        tmp_path, monkeypatch, capsys, kind, run, command):
    """A fresh user's review: ``sweep --resume TUNE`` said "the manifest holds no sweep configuration
    (tune: unknown key (a typo?))", blaming the file; ``tune --resume`` of a validation run already
    named its command."""
    import gzip
    import shutil
    import sys

    from mlabench import cli

    src = Path(__file__).resolve().parents[1] / "report/fixtures/h200-tune-first-attempt" / run
    folder = Path(shutil.copytree(src, tmp_path / run))
    for packed in folder.glob("*.gz"):  # an archived run is refused before its kind is read
        packed.with_suffix("").write_bytes(gzip.decompress(packed.read_bytes()))
        packed.unlink()
    policy = json.loads((folder / MANIFEST_FILE).read_text())["config"].get("validate", {}).get("policy")
    for given in (folder, src):  # archived too: it was told to gunzip first, then refused as a tuning run
        monkeypatch.setattr(sys, "argv", ["mlabench", "sweep", "--resume", str(given)])
        with pytest.raises(SystemExit) as exc:
            cli.main()
        assert exc.value.code == 2 and capsys.readouterr().err == (
            f"error: {given} is a {kind} run, not a sweep; continue it with: "
            f"{command.format(run=given, policy=policy or 'POLICY')}\n")  # this older run recorded none


@pytest.mark.parametrize(("kind", "reader", "command"), [
    (SWEEP_KIND, TUNE_KIND, "mlabench sweep --resume {run}"),
    (SWEEP_KIND, VALIDATION_KIND, "mlabench sweep --resume {run}"),
    (TUNE_KIND, SWEEP_KIND, "mlabench tune --resume {run}"),
    (TUNE_KIND, VALIDATION_KIND, "mlabench tune --resume {run}"),
    (VALIDATION_KIND, SWEEP_KIND, "mlabench tune --validate {policy} --resume {run}"),
    (VALIDATION_KIND, TUNE_KIND, "mlabench tune --validate {policy} --resume {run}"),
])
def test_a_run_read_as_another_kind_names_the_command_that_continues_it(tmp_path, kind, reader, command):
    """One wording for every reader (fresh users' reviews: each command said something else)."""
    from mlabench.errors import ResultsError
    from mlabench.records.kinds import _RUN_NOUNS, refuse_search_run_folder

    policy = tmp_path / "policy.json"
    policy.write_text("{}")
    config = {"validate": {"policy": str(policy)}} if kind == VALIDATION_KIND else {}
    (tmp_path / MANIFEST_FILE).write_text(json.dumps({"kind": kind, "config": config}))
    line = (f"{tmp_path} is {_RUN_NOUNS[kind]}, not {_RUN_NOUNS[reader]}; "
            f"continue it with: {command.format(run=tmp_path, policy=policy)}")
    with pytest.raises(ResultsError) as raised:
        refuse_search_run_folder(tmp_path, reader=reader)
    assert str(raised.value) == line
    refuse_search_run_folder(tmp_path, reader=kind)  # its own reader: no refusal


def test_a_folder_without_a_readable_manifest_or_of_another_kind_is_left_to_its_reader(tmp_path):
    from mlabench.records.kinds import refuse_search_run_folder

    refuse_search_run_folder(tmp_path, reader=VALIDATION_KIND)  # no manifest: not taken for a sweep
    (tmp_path / MANIFEST_FILE).write_text("{")
    refuse_search_run_folder(tmp_path, reader=TUNE_KIND)
    (tmp_path / MANIFEST_FILE).write_text(json.dumps({"kind": SERVE_BENCH_KIND}))
    for reader in (SWEEP_KIND, TUNE_KIND, VALIDATION_KIND):
        refuse_search_run_folder(tmp_path, reader=reader)


def test_a_validation_runs_hint_names_its_policy_file_only_where_it_is_here(tmp_path):
    """A fresh user's review: a run copied from another machine was to be continued with the
    recording machine's /tmp/tune/.../policy.json."""
    from mlabench.errors import ResultsError
    from mlabench.records.kinds import refuse_search_run_folder

    policy = tmp_path / "policy.json"
    (tmp_path / MANIFEST_FILE).write_text(json.dumps({"config": {"validate": {"policy": str(policy)}}}))
    with pytest.raises(ResultsError, match=r"continue it with: mlabench tune --validate POLICY --resume "):
        refuse_search_run_folder(tmp_path, reader=SWEEP_KIND)
    policy.write_text("{}")
    with pytest.raises(ResultsError, match=rf"continue it with: mlabench tune --validate {policy} --resume "):
        refuse_search_run_folder(tmp_path, reader=SWEEP_KIND)


def test_a_scripts_kernel_run_read_as_a_tuning_run_is_not_sent_to_sweep_resume(tmp_path):
    """A fresh user's review: `tune --resume` of the h200_hopper_kernel.py run said to continue it
    with `mlabench sweep --resume`, which then refused it (no sweep configuration)."""
    from mlabench.errors import ResultsError
    from mlabench.records.kinds import refuse_search_run_folder

    (tmp_path / MANIFEST_FILE).write_text(json.dumps({"config": {"script": {"path": "scripts/x.py", "args": {}}}}))
    with pytest.raises(ResultsError, match=r"is a kernel run of scripts/x\.py, not a tuning run: it cannot be resumed$"):
        refuse_search_run_folder(tmp_path, reader=TUNE_KIND)
    refuse_search_run_folder(tmp_path, reader=SWEEP_KIND)  # sweep --resume: its reader says it (recorded_config)
