"""The AITER adapters at an AITER development build (issue 35 item 18): a kernel file missing for
the GPU's architecture, a Gluon source that cannot be read, and the split record after ``refresh``
under the split budget."""

from __future__ import annotations

import pytest

from mlabench.backends import get_backend
from mlabench.inputs import make_inputs
from mlabench.kernels.workspace import split_workspace_bytes
from mlabench.shapes import MLADecodeShape
from tests.backends.aiter.fakes import install_fake_aiter
from tests.backends.aiter.test_issue26 import prepare, step_to

OVER_2GIB = MLADecodeShape.uniform(1, 1_900_000, 12, page_size=64)  # 2.04 GiB of cache


@pytest.mark.parametrize("dist_version", ["0.1.21.dev7+g1234abc", "0.1.20"])
def test_asm_without_the_gfx950_kernel_file_is_unsupported(monkeypatch, tmp_path, dist_version):
    fake = install_fake_aiter(monkeypatch, tmp_path, "v0.1.20", dist_version=dist_version, gfx="gfx950")
    kernel = next((fake.root / "hsa" / "gfx950").rglob("*.co"))
    kernel.unlink()
    assert OVER_2GIB.kv_cache_bytes > 2 * 2**30
    backend = get_backend("aiter-asm")
    for shape in (OVER_2GIB, MLADecodeShape.uniform(1, 4096, 12, page_size=64)):
        ok, why = backend.supports(shape)
        assert not ok and "gfx950" in why and kernel.name in why and "not installed" in why, why


def _unreadable_gluon_source(fake) -> None:
    """Remove the fake Gluon module's file after it was loaded: ``inspect.getsource`` fails on it,
    as on an AITER installed without its Python source."""
    gluon = fake.manifest.signatures[fake.range.functions["gluon"]].module
    path = fake.root.joinpath(*gluon.split(".")).with_suffix(".py")
    path.unlink()


@pytest.mark.parametrize("dist_version, guessed_rule", [
    ("0.1.20.dev3+gabc1234", "bounded"),   # sorts before 0.1.20: the bounded rule's range
    ("0.1.21.dev1", "budget")])            # after 0.1.20: the budget rule's range
def test_gluon_split_count_of_a_dev_build_without_readable_source_is_unknown(monkeypatch, tmp_path, dist_version,
                                                                              guessed_rule):
    """The dev build runs v0.1.20's code (per-request counts from a budget); its version alone
    named a rule, and 1 split was recorded where AITER launched 64."""
    fake = install_fake_aiter(monkeypatch, tmp_path, "v0.1.20", dist_version=dist_version)
    _unreadable_gluon_source(fake)
    inp = make_inputs(MLADecodeShape.uniform(1, 4096, 12, page_size=64), device="cpu", seed=1)
    inp.cache_seqlens.fill_(1)
    call = prepare("aiter-gluon", inp)
    eff = call.effective_params
    assert eff["split_rule"] == guessed_rule and eff["split_rule_from"].startswith("version")
    assert eff["num_kv_splits"] is None and eff["num_kv_splits_launched"] is None
    assert "development build" in eff["num_kv_splits_unknown"] and "could not be read" in eff["num_kv_splits_unknown"]
    step_to(call, inp, [4096])
    call.fn()
    assert fake.last["per_request"] == [64]            # what AITER ran
    assert eff["num_kv_splits"] is None                # not overwritten by a refresh under the guessed rule


def test_gluon_split_record_after_refresh_under_the_budget(monkeypatch, tmp_path):
    """Under the budget rule each request's count follows its length at every refresh: the record
    (counts, launched budget, partials) is what the kernel runs at the new lengths, up and down."""
    fake = install_fake_aiter(monkeypatch, tmp_path, "v0.1.20")
    inp = make_inputs(MLADecodeShape.create(num_heads=12, context_lens=(4096, 4096)), device="cpu", seed=5)
    inp.cache_seqlens.fill_(1)
    call = prepare("aiter-gluon", inp)
    eff = call.effective_params
    assert eff["splits_on_device"] is True and eff["num_kv_splits"] == 1
    for lens in ([4096, 4096], [64, 4096], [1, 1]):
        step_to(call, inp, lens)
        call.fn()
        ran = fake.last["per_request"]
        assert eff["num_kv_splits"] == (ran[0] if len(set(ran)) == 1 else ran), lens
        assert eff["num_kv_splits_launched"] == fake.last["launched"]
        partial_rows = 0 if fake.last["launched"] == 1 else sum(ran) * 12  # one launched: no partials
        assert call.workspace_bytes == split_workspace_bytes(partial_rows, 512, 2), lens
