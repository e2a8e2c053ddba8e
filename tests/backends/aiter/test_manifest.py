"""The AITER manifest keeps the adapters honest without a GPU: it loads and is consistent, the
fakes built from it carry exactly its signatures and rule evidence, version strings map to
ranges (development builds included), and on a ROCm machine ``available()`` says exactly how an
installed AITER differs from it."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import pytest

from mlabench.backends import get_backend
from mlabench.backends.aiter.manifest import (
    MANIFEST_PATH, Manifest, git_blob_id, load_manifest, parse_version, source_matches, strip_comments,
)
from mlabench.backends.aiter.probe import probe_aiter
from mlabench.errors import ConfigError
from tests.backends.aiter.fakes import install_fake_aiter, pretend_rocm

M = load_manifest()
RANGES = [r.name for r in M.ranges]


def with_signature(m: Manifest, sig_id: str, params: list[str]) -> Manifest:
    """A copy of ``m`` whose signature ``sig_id`` declares ``params`` instead."""
    sigs = dict(m.signatures)
    sigs[sig_id] = sigs[sig_id].model_copy(update={"params": tuple(params)})
    return m.model_copy(update={"signatures": sigs})


def test_manifest_loads_and_a_broken_one_is_one_line(tmp_path):
    assert M.schema_version == 1 and RANGES[0] == "v0.1.16" and RANGES[-1] == "v0.1.20"
    bad = tmp_path / "m.toml"
    bad.write_text(MANIFEST_PATH.read_text().replace('before = "0.1.17"', 'before = "0.1.16.post9"', 1))
    with pytest.raises(ConfigError, match="do not meet"):
        load_manifest(bad)


@pytest.mark.parametrize("rng", RANGES)
def test_fakes_carry_the_manifest_signatures(monkeypatch, tmp_path, rng):
    install_fake_aiter(monkeypatch, tmp_path, rng)
    found = probe_aiter()
    r = M.range_named(rng)
    for call, sig_id in r.functions.items():
        declared = M.signatures[sig_id]
        params = inspect.signature(found.functions[call]).parameters
        assert tuple(params) == declared.param_names, (rng, call)
        assert [p.default is inspect.Parameter.empty for p in params.values()] == \
            [p.default is None for p in declared.parsed]
    assert found.problems == {"asm": [], "gluon": []} and found.behaves_like == rng


@pytest.mark.parametrize("kind", [k for k, vs in M.rules.items()
                                  if all(v.detect == "source" for v in vs.values())])
def test_rule_evidence_matches_only_its_own_variant(kind):
    variants = M.rules[kind]
    for name, v in variants.items():
        code = strip_comments(v.evidence)
        assert [n for n, other in variants.items() if source_matches(other, code)] == [name]


def test_comments_do_not_count_as_source():
    v = M.rules["gluon_bh16_splits"]["budget"]
    assert source_matches(v, strip_comments(v.evidence))
    commented = "\n".join("# " + line for line in v.evidence.splitlines())
    assert not source_matches(v, strip_comments(commented))


@pytest.mark.parametrize("text, rng", [
    ("0.1.19.post3.dev12+gabc", "v0.1.19.post2"), ("0.1.20", "v0.1.20"), ("0.1.20.post1", "v0.1.20"),
    ("0.1.18.post1", "v0.1.18"), ("0.1.19", "v0.1.19"), ("0.1.19.post1", "v0.1.19.post1"), ("0.1.16", "v0.1.16"),
    ("0.1.15", None), ("garbage", None), (None, None),
])
def test_versions_map_to_ranges(text, rng):
    found = M.range_for(parse_version(text))
    assert (found.name if found else None) == rng


def test_available_says_exactly_what_differs(monkeypatch, tmp_path):
    pretend_rocm(monkeypatch)
    params = list(M.signatures["get_mla_metadata_v1@0.1.18"].params)
    i, j = params.index("work_info_set"), params.index("work_indptr")
    params[i], params[j] = params[j], params[i]
    drifted = with_signature(M, "get_mla_metadata_v1@0.1.18", params)
    gluon = [p.replace("min_kv_seq_len", "min_seq_len") for p in M.signatures["mla_gluon@0.1.18"].params]
    drifted = with_signature(drifted, "mla_gluon@0.1.18", gluon)
    install_fake_aiter(monkeypatch, tmp_path, "v0.1.20", manifest=drifted)
    ok, why = get_backend("aiter-asm").available()
    assert not ok and why.startswith("AITER 0.1.20 differs from the manifest: ")
    assert ("metadata: aiter.get_mla_metadata_v1: positional parameter 8 is 'work_indptr', "
            "the adapter passes 'work_info_set'") in why
    ok, why = get_backend("aiter-gluon").available()
    assert not ok and "no parameter 'min_kv_seq_len'" in why


def test_unused_new_parameters_are_noted_not_fatal(monkeypatch, tmp_path):
    pretend_rocm(monkeypatch)
    params = [*M.signatures["mla_decode_fwd@0.1.20"].params, "new_flag=False"]
    install_fake_aiter(monkeypatch, tmp_path, "v0.1.20",
                       manifest=with_signature(M, "mla_decode_fwd@0.1.20", params))
    assert get_backend("aiter-asm").available() == (True, "")
    assert "added ['new_flag']" in get_backend("aiter-asm").details()


def test_kernel_offsets_read_from_the_installed_kernel_file(monkeypatch, tmp_path):
    kernel = b"an ASM kernel built with 64-bit KV offsets"
    rules = dict(M.rules)
    rules["asm_kv_offsets"] = dict(rules["asm_kv_offsets"])
    fixed = rules["asm_kv_offsets"]["int64"]
    rules["asm_kv_offsets"]["int64"] = fixed.model_copy(update={"blobs": (*fixed.blobs, git_blob_id(kernel))})
    m = M.model_copy(update={"rules": rules})
    install_fake_aiter(monkeypatch, tmp_path, "v0.1.20", dist_version=None, asm_kernel=kernel)
    found = probe_aiter(m)
    assert found.rules["asm_kv_offsets"].variant == "int64"
    assert found.rules["asm_kv_offsets"].how == "installed kernel file"


def test_blob_id_is_gits():
    assert git_blob_id(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"


def test_manifest_checker_reads_signatures_from_source():
    path = Path(__file__).resolve().parents[3] / "scripts" / "check_aiter_manifest.py"
    spec = importlib.util.spec_from_file_location("check_aiter_manifest", path)
    checker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checker)
    src = "X = 1\ndef f(a, b=MlaVersion.V32.value, *, c=2):\n    pass\n"
    assert checker.declared_params(src, "f") == ["a", "b=MlaVersion.V32.value", "c=2"]
    assert checker.declared_params(src, "g") is None
    assert checker.defines(src, "X") and checker.defines(src, "f") and not checker.defines(src, "g")


def test_backends_command_shows_the_aiter_version_and_rules(monkeypatch, tmp_path):
    import json

    from typer.testing import CliRunner

    from mlabench import cli

    pretend_rocm(monkeypatch)
    install_fake_aiter(monkeypatch, tmp_path, "v0.1.19", dist_version="0.1.19")
    result = CliRunner().invoke(cli.app, ["backends", "--json"])
    assert result.exit_code == 0, result.output
    (table,) = json.loads(result.stdout)
    notes = {n.split(":", 1)[0]: n for n in table["notes"]}
    assert "AITER 0.1.19 (distribution record, range v0.1.19" in notes["aiter-asm"]
    assert "asm_gate=batch_gate (installed attribute)" in notes["aiter-asm"]
    assert "gluon_bh16_splits=bounded (installed source)" in notes["aiter-gluon"]
    assert "gluon_over_2gib=int32_overflow" in notes["aiter-gluon"]
