"""Every file name of a run folder is spelled once, in :mod:`mlabench.run_files` (issue 36).

A module that writes ``"manifest.json"`` where it should write ``MANIFEST_FILE`` would keep working
until the name changes, and then write or look for the old file; this scans every module of
``mlabench/`` for such code literals.  Docstrings and comments may mention the names.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from mlabench import run_files

PACKAGE = Path(__file__).resolve().parents[2] / "mlabench"
#: Names that are file names (a dot in them); a folder name such as ``workers`` is an ordinary word
#: too (a payload's key), so it is not looked for.
NAMES = {n for n in run_files.RUN_FILE_NAMES if "." in n}
#: A name as a whole word: ``results.jsonl`` in ``"x/results.jsonl"`` or ``"no results.jsonl here"``, not in
#: ``"my_results.jsonl"``; the gzipped names are found through their plain ones.
NAME_IN_TEXT = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, sorted(NAMES, key=len, reverse=True))) + r")(?![\w-])")


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def literals_naming_run_files(source: str) -> list[tuple[int, str]]:
    """(line, literal) of every string constant in ``source`` (an f-string's parts too) that names a
    run folder's file: the name alone, in a path, or in a message; docstrings left out."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    return sorted((node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
            and NAME_IN_TEXT.search(node.value))


def test_the_scan_finds_a_literal_and_passes_a_docstring():
    source = ('"""Writes manifest.json."""\nimport x\nP = x / "manifest.json"\nQ = f"{x}/policy.json"\n'
              'R = "no study.journal.gz here"\nS = "my_results.jsonl"\n')
    assert literals_naming_run_files(source) == [(3, "manifest.json"), (4, "/policy.json"),
                                                 (5, "no study.journal.gz here")]


def test_every_run_file_name_is_defined_in_run_files_only():
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {text!r}"
             for path in sorted(PACKAGE.rglob("*.py")) if path.name != "run_files.py"
             for line, text in literals_naming_run_files(path.read_text(encoding="utf-8"))]
    assert not found, "use the names of mlabench.run_files:\n" + "\n".join(found)


def test_the_names_are_distinct_and_the_archives_are_gzipped():
    assert len(set(run_files.RUN_FILE_NAMES)) == len(run_files.RUN_FILE_NAMES)
    assert run_files.ARCHIVED_RESULTS_FILE == "results.jsonl.gz"
    assert run_files.ARCHIVED_JOURNAL_FILE == "study.journal.gz"
