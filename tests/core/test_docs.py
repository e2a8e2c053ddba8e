"""The documentation against the repository: every relative link resolves, no document cites a file
outside the repository, the README and each manual page stay short (12 KB and 15 KB), and the
README's H200 table is what scripts/h200_readme_tables.py prints from the committed records (so a
number in the README is a number in results/, formatted by mlabench's own tables).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", REPO / "results" / "README.md", *sorted((REPO / "docs").glob("*.md")),
        *sorted((REPO / "results").rglob("*/README.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def relative_links(doc: Path) -> list[str]:
    """The link targets of a markdown file that are paths in the repository (no URL, no anchor)."""
    return [t.split("#")[0] for t in LINK.findall(doc.read_text()) if not re.match(r"[a-z]+:|#", t)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(doc):
    missing = [t for t in relative_links(doc) if not (doc.parent / t).exists()]
    assert not missing, f"{doc.relative_to(REPO)} links to missing paths: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_document_cites_a_file_outside_the_repository(doc):
    text = doc.read_text()
    assert not re.search(r"facts file|/work/|shared/reference", text, re.IGNORECASE)


README_MAX_BYTES = 12 * 1024
PAGE_MAX_BYTES = 15 * 1024


def test_the_readme_is_at_most_12_kb():
    size = len((REPO / "README.md").read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes, over {README_MAX_BYTES}"


@pytest.mark.parametrize("page", sorted((REPO / "docs").glob("*.md")), ids=lambda p: p.name)
def test_each_docs_page_is_at_most_15_kb(page):
    size = len(page.read_bytes())
    assert size <= PAGE_MAX_BYTES, f"docs/{page.name} is {size} bytes, over {PAGE_MAX_BYTES}"


def test_the_link_pattern_finds_links_and_a_missing_target_is_caught(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("[a](docs/none.md) [b](https://example.org) [c](#top) [d](x.md#part)")
    assert relative_links(doc) == ["docs/none.md", "x.md"]
    assert not (doc.parent / "docs/none.md").exists()


def test_readme_h200_tables_are_the_scripts_output():
    # The checkout goes before the inherited path, not instead of it: the GPU image finds pydantic on
    # PYTHONPATH (/tmp/site), and without it the script dies importing mlabench.records.store.
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "h200_readme_tables.py")], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path})
    assert done.returncode == 0, done.stderr
    out = done.stdout
    tables = [t.strip() for t in out.split("\n\n") if t.startswith("|")]
    assert len(tables) == 1
    assert tables[0] in (REPO / "README.md").read_text()
    assert "178 records read, 0 not ok" in out


def test_configs_that_speak_of_the_prediction_cite_its_manual():
    """The H200 serve and sweep configs sent a reader of their `--predict-from` comment to
    docs/serving.md, which only points on to docs/vllm-plugin.md, where the prediction is described."""
    configs = [p for p in sorted((REPO / "configs").rglob("*.toml")) if "--predict-from" in p.read_text()]
    assert configs
    wrong = [str(p.relative_to(REPO)) for p in configs
             if "docs/serving.md" in p.read_text() or "docs/vllm-plugin.md" not in p.read_text()]
    assert not wrong, f"cite docs/vllm-plugin.md for the prediction: {wrong}"



def test_the_serve_bench_synopsis_names_every_option():
    """docs/serving.md's synopsis had no --predict-from (nor a CONFIG beside --from-run): a user
    reading the page could not find how the README's prediction table is made."""
    import typer.main

    from mlabench import cli

    command = typer.main.get_command(cli.app).commands["serve-bench"]  # type: ignore[attr-defined]
    # each option by its shortest name (-c for --concurrency); --json and --markdown are --format's
    options = {min(p.opts, key=len) for p in command.params if p.opts[0].startswith("-")} - {"--json", "--markdown"}
    text = (REPO / "docs" / "serving.md").read_text()
    synopsis = text[text.index("## serve-bench"):text.index("`--resume` continues")]
    assert "--predict-from" in options
    assert not [o for o in sorted(options) if f"[{o} " not in synopsis and f" {o} " not in synopsis], synopsis
    assert "[CONFIG] --from-run" in synopsis


@pytest.mark.parametrize("page", ["README.md", "docs/backends.md"])
def test_the_backend_tables_name_every_backend(page):
    """The README's backend table left out ``vllm-fa3-mla``, which ``mlabench backends`` lists: a
    new user reading it would not know vLLM's FA3 call can be swept (the serving sweeps time it)."""
    from mlabench.backends.registry import backend_names

    rows = re.findall(r"^\| `([a-z0-9-]+)`(?:, `([a-z0-9-]+)`)? \|", (REPO / page).read_text(), re.MULTILINE)
    named = {name for row in rows for name in row if name}
    assert set(backend_names()) <= named, f"{page} has no row for {sorted(set(backend_names()) - named)}"
