"""The AITER adapters against AITER's behaviour at every version the manifest covers: one test per
way they were found wrong, with the numbers AITER's source gives (fakes generated from the
manifest, real attention computed on the CPU)."""

from __future__ import annotations

import time

import pytest
import torch

from mlabench.backends import get_backend
from mlabench.backends.aiter.rules import asm_nonpersistent_splits, gluon_bh16_active, gluon_bh64_splits, gluon_plan
from mlabench.errors import UnsupportedShapeError
from mlabench.inputs import make_inputs
from mlabench.kernels.reference import mla_decode_reference
from mlabench.kernels.workspace import split_workspace_bytes
from mlabench.shapes import MLADecodeShape
from tests.backends.aiter.fakes import install_fake_aiter, pretend_rocm

NEWEST = {"gluon_bh16_splits": "budget", "gluon_bh16_max_heads": "96", "gluon_bh64": "multiple_of_64"}
BOUNDED = {**NEWEST, "gluon_bh16_splits": "bounded", "gluon_bh16_max_heads": "16"}


def run(name, shape, check=True, **params):
    """Prepare ``name`` on CPU inputs for ``shape``, run it once; returns the PreparedCall."""
    backend = get_backend(name)
    inp = make_inputs(shape, device="cpu", seed=3)
    call = backend.prepare(inp, backend.resolve_params(shape, params))
    out = call.fn()
    if check:
        ref, _ = mla_decode_reference(inp.q, inp.kv_cache, inp.block_table, inp.cache_seqlens,
                                      shape.scale)
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    return call


# 1 ------------------------------------------------------------------------------------------------
def test_old_gluon_entry_point_runs_12_and_128_heads(monkeypatch, tmp_path):
    fake = install_fake_aiter(monkeypatch, tmp_path, "v0.1.17")  # mla_decode_gluon
    gluon = get_backend("aiter-gluon")
    twelve = MLADecodeShape.uniform(1, 4096, 12)
    assert gluon.supports(twelve) == (True, "")
    call = run("aiter-gluon", twelve)
    assert call.effective_params["api"] == "mla_decode_gluon"
    assert call.effective_params["num_kv_splits"] == 64  # min(256, cdiv(4096, 64)), not "1 only"
    steered = run("aiter-gluon", twelve, check=False, num_kv_splits=8)
    assert fake.calls_to("gluon")[-1]["min_kv_seq_len"] == 8 * 64
    assert steered.effective_params["num_kv_splits"] == 8
    # 128 heads at batch 64: min_kv_seq_len (400) reaches AITER, which asserts it is > 388.
    call = run("aiter-gluon", MLADecodeShape.uniform(64, 400, 128))
    assert fake.calls_to("gluon")[-1]["min_kv_seq_len"] == 400
    assert call.effective_params["num_kv_splits"] == fake.last["launched"] == 2


# 2 ------------------------------------------------------------------------------------------------
def test_split_counts_recorded_as_they_run(monkeypatch, tmp_path):
    # (a) bh64, every version: 2 splits for 128 heads and 4 for 64 heads at batch 64.
    assert gluon_bh64_splits(64, 128) == 2 and gluon_bh64_splits(64, 64) == 4
    assert gluon_bh64_splits(128, 128) == 1
    with pytest.raises(UnsupportedShapeError, match="min_kv_seq_len does not change it"):
        gluon_plan([1024] * 64, 128, BOUNDED, num_kv_splits=8)
    # (b) from v0.1.20 the launched count is a budget; each request runs what its length needs.
    assert gluon_bh16_active(1024, 256) == 16
    plan = gluon_plan([70, 5, 129], 12, NEWEST)
    assert plan.launched == 85 and plan.per_request == (2, 1, 3)
    install_fake_aiter(monkeypatch, tmp_path, "v0.1.20")
    call = run("aiter-gluon", MLADecodeShape.uniform(1, 1024, 12))
    eff = call.effective_params
    assert eff["num_kv_splits"] == 16 and eff["num_kv_splits_launched"] == 256
    assert call.workspace_bytes == split_workspace_bytes(16 * 12, 512, 2)  # not 256 * 12 rows
    call = run("aiter-gluon", MLADecodeShape.create(num_heads=12, context_lens=(70, 5, 129)))
    assert call.effective_params["num_kv_splits"] == [2, 1, 3]
    assert call.effective_params["num_kv_splits_launched"] == 85
    assert call.workspace_bytes == split_workspace_bytes(6 * 12, 512, 2)
    bh64 = run("aiter-gluon", MLADecodeShape.uniform(64, 800, 64), check=False)
    assert bh64.effective_params["num_kv_splits"] == 4


# 3 ------------------------------------------------------------------------------------------------
def test_shortest_context_reaches_the_bh64_assertion(monkeypatch, tmp_path):
    install_fake_aiter(monkeypatch, tmp_path, "v0.1.20")
    gluon = get_backend("aiter-gluon")
    mixed = MLADecodeShape.create(num_heads=128, context_lens=(200,) + (2048,) * 63)
    ok, why = gluon.supports(mixed)
    assert not ok and "requires min_kv_seq_len > 388 (NUM_KV_SPLITS=2), got 200" in why
    inp = make_inputs(mixed, device="cpu")
    with pytest.raises(UnsupportedShapeError, match="> 388"):
        gluon.prepare(inp, gluon.resolve_params(mixed))
    # A min_kv_seq_len above the shortest context is refused too, never passed on.
    runs = MLADecodeShape.create(num_heads=128, context_lens=(390,) + (2048,) * 63)
    assert gluon.supports(runs) == (True, "")
    with pytest.raises(UnsupportedShapeError, match="above the shortest context"):
        gluon.prepare(make_inputs(runs, device="cpu"), gluon.resolve_params(runs, {"min_kv_seq_len": 2048}))


# 4 ------------------------------------------------------------------------------------------------
OVER_2GIB = MLADecodeShape.uniform(1, 1_900_000, 12)  # 2.04 GiB of bf16 latent cache


@pytest.mark.parametrize("rng, refused", [("v0.1.17", True), ("v0.1.18", True),
                                          ("v0.1.19.post1", False), ("v0.1.20", False)])
def test_gluon_refuses_the_2gib_segfault(monkeypatch, tmp_path, rng, refused):
    install_fake_aiter(monkeypatch, tmp_path, rng)
    ok, why = get_backend("aiter-gluon").supports(OVER_2GIB)
    assert ok is not refused
    assert ("segfaults" in why and "#4474" in why) if refused else why == ""
    assert get_backend("aiter-gluon").supports(MLADecodeShape.uniform(1, 1_800_000, 12))[0]


@pytest.mark.parametrize("rng, gfx, refused", [
    ("v0.1.19.post1", "gfx950", True), ("v0.1.19.post1", "gfx942", False),
    ("v0.1.19.post2", "gfx950", False), ("v0.1.16", "gfx950", True)])
def test_asm_refuses_32bit_kv_offsets(monkeypatch, tmp_path, rng, gfx, refused):
    install_fake_aiter(monkeypatch, tmp_path, rng, gfx=gfx)
    ok, why = get_backend("aiter-asm").supports(OVER_2GIB)
    assert ok is not refused and (("#4452" in why) if refused else why == "")


# 5 ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rng, persistent", [("v0.1.17", True), ("v0.1.18", False)])
def test_persistent_gate_by_version(monkeypatch, tmp_path, rng, persistent):
    fake = install_fake_aiter(monkeypatch, tmp_path, rng, gfx="gfx950", cu_num=256)
    shape = MLADecodeShape.uniform(32, 64, 12)
    call = run("aiter-asm", shape)
    eff = call.effective_params
    assert eff["persistent"] is persistent is fake.last["persistent"]
    if persistent:
        assert eff["persistent_gate"] == "none" and eff["persistent_max_batch"] is None
        assert call.workspace_bytes == split_workspace_bytes(fake.last["partials"] * 16)
    else:
        splits = asm_nonpersistent_splits(32, 32 * 64, 256)
        assert eff["persistent_max_batch"] == 32 and eff["num_kv_splits"] == splits == 8
        assert call.workspace_bytes == split_workspace_bytes(32 * splits * 16)


def test_gate_uses_aiters_gpu_archs_not_device_0(monkeypatch, tmp_path):
    pretend_rocm(monkeypatch, device_arch="gfx942")
    install_fake_aiter(monkeypatch, tmp_path, "v0.1.20", gfx="gfx942")
    monkeypatch.setenv("GPU_ARCHS", "gfx942;gfx950")  # AITER's get_gfx takes the last entry
    assert get_backend("aiter-asm").available() == (True, "")
    eff = run("aiter-asm", MLADecodeShape.uniform(32, 64, 12)).effective_params
    assert eff["aiter_gfx"] == "gfx950" and eff["persistent"] is False


# 6 ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dist, version_file", [("0.1.19.post3.dev12+gabc", None), (None, None),
                                                (None, "0.1.19.post3.dev12+gabc")])
def test_rule_detected_from_the_installed_aiter(monkeypatch, tmp_path, dist, version_file):
    # A build between ROCm/aiter#4555 and v0.1.20: version says 0.1.19.post2's range, source says budget.
    install_fake_aiter(monkeypatch, tmp_path, "v0.1.20", dist_version=dist, version_file=version_file)
    call = run("aiter-gluon", MLADecodeShape.create(num_heads=12, context_lens=(70, 5, 129)))
    eff = call.effective_params
    assert eff["split_rule"] == "budget" and eff["split_rule_from"] == "installed source"
    assert eff["num_kv_splits"] == [2, 1, 3]
    # With no version at all the ASM kernel-offset rule stays open, so no range is claimed.
    assert eff["aiter_behaves_like"] == ("v0.1.20" if dist or version_file else None)
    assert eff["aiter_version"] == (dist or version_file)
    details = get_backend("aiter-gluon").details()
    assert "budget (installed source)" in details
    assert ("range v0.1.19.post2" in details) if (dist or version_file) else "version unknown" in details


# 7 ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rng, ok96", [("v0.1.19", False), ("v0.1.19.post1", True)])
def test_gluon_takes_17_to_96_heads_since_4412(monkeypatch, tmp_path, rng, ok96):
    install_fake_aiter(monkeypatch, tmp_path, rng)
    gluon = get_backend("aiter-gluon")
    for heads in (32, 96):
        ok, why = gluon.supports(MLADecodeShape.uniform(2, 256, heads))
        assert ok is ok96 and (why == "" if ok96 else "takes 1-16 or 64/128 heads" in why)
    if ok96:
        call = run("aiter-gluon", MLADecodeShape.uniform(1, 256, 96))
        assert call.effective_params["num_kv_splits"] == 4  # min(256 // 6, cdiv(256, 64))


def test_metadata_warmed_up_untimed_and_workspace_from_partials(monkeypatch, tmp_path):
    fake = install_fake_aiter(monkeypatch, tmp_path, "v0.1.20")
    first = fake.behaviours.get("metadata")

    def slow_first_call(f, a):  # AITER loading or building its metadata module
        if len(f.calls_to("metadata")) == 1:
            time.sleep(0.3)
        from tests.backends.aiter.fakes import BEHAVIOURS
        return (first or BEHAVIOURS["metadata"])(f, a)

    fake.behaviours["metadata"] = slow_first_call
    call = run("aiter-asm", MLADecodeShape.create(num_heads=12, context_lens=(70, 5, 129)))
    assert len(fake.calls_to("metadata")) == 2 and call.setup_us["metadata_us"] < 0.3e6
    assert fake.last["partials"] == 2 + 0 + 3  # tiles of 70 and 129 tokens split, 5 does not
    assert call.workspace_bytes == split_workspace_bytes(5 * 16)  # not reduce_partial_map's size
    assert call.effective_params["allocates_per_call"] is True and call.graph_safe is True
