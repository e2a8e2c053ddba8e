"""No run-folder file name is spelled outside :mod:`mlabench.run_files` (issue 36).

A module that writes ``"manifest.json"`` where it should write ``MANIFEST_FILE`` (or
``f"worker-{i}.log"`` where it should call ``worker_log_file(i)``) keeps working until the name
changes, and then writes or looks for the old file.  This scans every module of ``mlabench/`` for
string constants and f-strings naming one.  The names come from ``run_files`` itself
(:data:`~mlabench.run_files.RUN_FILE_NAMES`, :data:`~mlabench.run_files.RUN_FILE_PATTERNS`), so a
name added there is looked for at once.  Docstrings and comments may mention the names.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from mlabench import run_files

PACKAGE = Path(__file__).resolve().parents[2] / "mlabench"
#: The run layer's module that defines the names: the only one allowed to spell them.
RUN_LAYER = {PACKAGE / "run_files.py"}
#: Names that are file names (a dot in them); a folder name such as ``workers`` is an ordinary word
#: too (a payload's key), so it is not looked for.
NAMES = sorted((n for n in run_files.RUN_FILE_NAMES if "." in n), key=len, reverse=True)
#: A pattern's ``*`` matches one path component's text (an f-string's value reads as ``*``).
_PATTERNS = [re.escape(p).replace(r"\*", r"[^\s/]*") for p in run_files.RUN_FILE_PATTERNS]
#: A name as a whole word: ``results.jsonl`` in ``"x/results.jsonl"`` or ``"no results.jsonl here"``, not
#: in ``"my_results.jsonl"``; the gzipped names are found through their plain ones.
NAME_IN_TEXT = re.compile(r"(?<![\w.-])(" + "|".join([*map(re.escape, NAMES), *_PATTERNS]) + r")(?![\w-])")


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def _texts(tree: ast.AST):
    """(line, text) of every string constant and every f-string (its values read as ``*``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node, node.value
        elif isinstance(node, ast.JoinedStr):
            yield node, "".join(v.value if isinstance(v, ast.Constant) else "*" for v in node.values)


def literals_naming_run_files(source: str) -> list[tuple[int, str]]:
    """(line, literal) of every string constant or f-string in ``source`` that names a run folder's
    file: the name alone, in a path, or in a message, or a name made from a pattern (``server-*.log``);
    docstrings left out."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    return sorted({(node.lineno, text) for node, text in _texts(tree)
                   if id(node) not in docs and NAME_IN_TEXT.search(text)})


def test_the_scan_finds_a_literal_and_passes_a_docstring():
    source = ('"""Writes manifest.json."""\nimport x\nP = x / "manifest.json"\nQ = f"{x}/policy.json"\n'
              'R = "no study.journal.gz here"\nS = "my_results.jsonl"\nT = x / f"worker-{i}.log"\n'
              'U = "see server-base.log"\nV = f"server-{v}"\nW = f"{x}.log"\n')
    assert literals_naming_run_files(source) == [
        (3, "manifest.json"), (4, "*/policy.json"), (4, "/policy.json"), (5, "no study.journal.gz here"),
        (7, "worker-*.log"), (8, "see server-base.log")]


def test_every_run_file_name_is_defined_in_run_files_only():
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {text!r}"
             for path in sorted(PACKAGE.rglob("*.py")) if path not in RUN_LAYER
             for line, text in literals_naming_run_files(path.read_text(encoding="utf-8"))]
    assert not found, "use the names of mlabench.run_files:\n" + "\n".join(found)
