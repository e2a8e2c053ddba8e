#!/usr/bin/env python3
"""Check mlabench's AITER manifest against an AITER git repository, commit by commit.

    python3 scripts/check_aiter_manifest.py PATH_TO_AITER_GIT [--manifest FILE]

PATH may be a clone or a bare mirror (anything ``git --git-dir``/``git -C`` accepts).  For every
range of the manifest and every commit it says was read, this reads the source files at that
commit (no checkout) and checks:

- each signature the range names: the function's parameters, in order, with their defaults,
  as AST text, equal the manifest's;
- each rule the range names: among the variants of that rule, exactly the named one matches
  (source markers on the comment-free module, attribute presence, kernel blob ids).

Prints one line per check and exits 1 when any disagrees.  Run it when AITER moves, before
widening a range or adding one.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlabench.backends.aiter.manifest import Manifest, load_manifest, source_matches, strip_comments


class Repo:
    def __init__(self, path: str) -> None:
        self.path = path

    def git(self, *args: str) -> str | None:
        run = subprocess.run(["git", "-C", self.path, *args], capture_output=True, text=True)
        return run.stdout if run.returncode == 0 else None

    def show(self, commit: str, file: str) -> str | None:
        return self.git("show", f"{commit}:{file}")

    def blob(self, commit: str, file: str) -> str | None:
        out = self.git("rev-parse", f"{commit}:{file}")
        return out.strip() if out else None


def declared_params(source: str, name: str) -> list[str] | None:
    """``name=default`` texts of the last top-level ``def name`` in ``source``; None if absent."""
    found = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name]
    if not found:
        return None
    args = found[-1].args
    pos = args.posonlyargs + args.args
    defaults = [None] * (len(pos) - len(args.defaults)) + list(args.defaults)
    out = [a.arg + ("" if d is None else "=" + ast.unparse(d)) for a, d in zip(pos, defaults)]
    out += [a.arg + ("" if d is None else "=" + ast.unparse(d))
            for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    return out


def defines(source: str, name: str) -> bool:
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return True
    return False


def check_commit(m: Manifest, repo: Repo, range_name: str, commit: str) -> list[tuple[bool, str]]:
    rng = m.range_named(range_name)
    results: list[tuple[bool, str]] = []
    for call, sig_id in rng.functions.items():
        sig = m.signatures[sig_id]
        text = repo.show(commit, sig.file)
        got = declared_params(text, sig.name) if text is not None else None
        ok = got == [p.strip() for p in sig.params]
        detail = "" if ok else f": AITER declares {got}"
        results.append((ok, f"{call} = {sig_id} ({sig.file}){detail}"))
    gluon = m.signatures[rng.functions["gluon"]]
    gluon_code = strip_comments(repo.show(commit, gluon.file) or "")
    for kind, named in rng.rules.items():
        matching = [v for v, var in m.rules[kind].items() if _matches(repo, commit, var, gluon_code)]
        results.append((matching == [named], f"rule {kind} = {named}; matching variants: {matching}"))
    return results


def _matches(repo: Repo, commit: str, var, gluon_code: str) -> bool:
    if var.detect == "source":
        return source_matches(var, gluon_code)
    if var.detect == "attribute":
        module, name = var.attribute.split(":")
        text = repo.show(commit, module.replace(".", "/") + ".py") or ""
        return defines(text, name) == var.present
    return repo.blob(commit, f"hsa/{var.file}") in var.blobs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo", help="AITER git repository (clone or bare mirror)")
    ap.add_argument("--manifest", default=None, help="manifest TOML (default: the shipped one)")
    args = ap.parse_args(argv)
    m = load_manifest(args.manifest)
    repo = Repo(args.repo)
    failures = 0
    for rng in m.ranges:
        for entry in rng.read:
            commit = entry.split()[1]
            if repo.git("rev-parse", "--verify", "-q", f"{commit}^{{commit}}") is None:
                print(f"MISSING {rng.name} {entry}: commit not in {args.repo}")
                failures += 1
                continue
            for ok, line in check_commit(m, repo, rng.name, commit):
                failures += not ok
                print(f"{'ok  ' if ok else 'FAIL'} {rng.name} @ {entry.split()[0]}: {line}")
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
