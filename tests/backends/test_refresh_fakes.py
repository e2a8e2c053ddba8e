"""``refresh`` of the library adapters (flashmla, aiter-asm, aiter-gluon) on the CPU, against fake
libraries whose kernels follow their metadata as the real ones do: the fake decode takes each
request's token range from the schedule it is given (FlashMLA's ``num_splits``, AITER's work
metadata, the page-size-1 ``kv_indptr``), not from ``cache_seqlens``.  The AITER fakes are the
ones generated from the AITER manifest (tests/backends/aiter/fakes.py), with the persistent
decode made to follow its work metadata.  Stale metadata then gives a
wrong output, as it does on a GPU (a captured flashmla call went stale: max abs error 0.09).

Each test: prepare at :data:`LENS`, run, write :data:`NEW_LENS` into ``cache_seqlens`` in place;
without ``refresh`` the output is that of the old lengths (the fake is sensitive), after it the
reference of the new ones; graph-safe calls keep their metadata tensors (a graph reads those).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from mlabench.backends import get_backend
from mlabench.checks.verdict import compare_outputs
from mlabench.errors import UnsupportedShapeError
from mlabench.inputs import make_inputs
from mlabench.kernels.reference import mla_decode_reference
from mlabench.shapes import MLADecodeShape
from tests.backends.fakes import csr_attention, install, module

LENS = (100, 64, 3)
NEW_LENS = (20, 99, 90)  # within the block table (100 tokens a row at page size 1)
SM_PARTS = 4


def scheduled_lens(cumulative: torch.Tensor) -> torch.Tensor:
    """Per-request lengths from a ``[B + 1]`` prefix sum (the fakes' schedule)."""
    return (cumulative[1:] - cumulative[:-1]).to(torch.int32)


def schedule_of(seqlens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A fake FlashMLA schedule: ``(tile metadata [SM_PARTS, 8], num_splits [B + 1])`` whose
    ``num_splits`` is the prefix sum of the lengths it was built for."""
    cum = torch.zeros(seqlens.numel() + 1, dtype=torch.int32)
    cum[1:] = torch.cumsum(seqlens.to(torch.int32), 0)
    return torch.zeros((SM_PARTS, 8), dtype=torch.int32), cum


def attention(q4, k_cache, block_table, lens, head_dim_v, scale):
    out, _ = mla_decode_reference(q4[:, 0], k_cache, block_table, lens, scale, head_dim_v)
    return out.to(q4.dtype).unsqueeze(1), None


@dataclasses.dataclass
class SchedMeta:
    have_initialized: bool = False
    tile_scheduler_metadata: torch.Tensor | None = None
    num_splits: torch.Tensor | None = None


def flashmla_sgl(hoist: bool):
    """sgl-flash-mla 1.0.0's surface; with ``hoist`` False, no ``get_mla_decoding_metadata``
    (the first decode call fills the FlashMLASchedMeta, as FlashMLA's newer API does)."""
    def fwd(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
            num_splits=None, softmax_scale=None, causal=False, use_legacy=False):
        sched = tile_scheduler_metadata
        if sched.num_splits is None:  # first call on this sched: schedule the current lengths
            sched.have_initialized = True
            sched.tile_scheduler_metadata, sched.num_splits = schedule_of(cache_seqlens)
        return attention(q, k_cache, block_table, scheduled_lens(sched.num_splits), head_dim_v,
                         softmax_scale)

    attrs = dict(get_mla_metadata=lambda *a, **k: (SchedMeta(), None), flash_mla_with_kvcache=fwd)
    if hoist:
        attrs["get_mla_decoding_metadata"] = lambda seqlens, rows, h_k, use_legacy=False: schedule_of(seqlens)
    return module("flash_mla", __version__="1.0.0", **attrs)


def flashmla_source_build():
    """FlashMLA built from source before its FlashMLASchedMeta API: tensors in, tensors out."""
    def fwd(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits,
            softmax_scale=None, causal=False):
        return attention(q, k_cache, block_table, scheduled_lens(num_splits), head_dim_v, softmax_scale)

    return module("flash_mla", get_mla_metadata=lambda seqlens, rows, h_k: schedule_of(seqlens),
                  flash_mla_with_kvcache=fwd)


def schedule_following(fake) -> None:
    """Make the generated fake AITER's persistent decode take its token ranges from the work
    metadata (``get_mla_metadata_v1`` records ``kv_indptr`` in ``work_info_set``), as the real
    kernel follows its work list; the Gluon decode already reads ``seq_info``, the layout."""
    from tests.backends.aiter import fakes as aiter_fakes

    def metadata(fake, a):
        aiter_fakes.BEHAVIOURS["metadata"](fake, a)
        a["work_info_set"][:, 0] = 0
        a["work_info_set"][: a["seqlens_kv_indptr"].numel(), 0] = a["seqlens_kv_indptr"]

    def decode(fake, a):
        lens_indptr = a["work_info_set"][: a["kv_indptr"].numel(), 0]
        rows = a["kv_buffer"].view(-1, a["kv_buffer"].shape[-1])
        a["o"].copy_(csr_attention(a["q"], rows, lens_indptr, a["kv_indices"], a["sm_scale"]))
        return None, None

    fake.behaviours.update(metadata=metadata, decode=decode)


def metadata_tensors(call) -> list[int]:
    """Storage addresses of every tensor the prepared call's closures hold (what a graph reads)."""
    cells = [c.cell_contents for c in (call.fn.__closure__ or ())]
    found = []
    for value in cells:
        items = vars(value).values() if hasattr(value, "__dict__") else [value]
        found += [v.data_ptr() for v in items if isinstance(v, torch.Tensor)]
    return sorted(found)


def check_refresh(name: str, params: dict, page_size: int = 64) -> SimpleNamespace:
    backend = get_backend(name)
    shape = MLADecodeShape.create(num_heads=12, context_lens=LENS, page_size=page_size)
    inp = make_inputs(shape, device="cpu", seed=7, poison=False)  # the lengths grow below
    call = backend.prepare(inp, backend.resolve_params(shape, params))
    old = call.fn().clone()
    before = metadata_tensors(call)
    inp.cache_seqlens.copy_(torch.tensor(NEW_LENS, dtype=torch.int32))
    ref, _ = mla_decode_reference(inp.q, inp.kv_cache, inp.block_table, NEW_LENS, shape.scale)
    stale = call.fn().clone()
    assert torch.equal(stale, old) and not compare_outputs(stale, ref).passed  # the fake follows its schedule
    call.refresh_for_new_lengths()
    call.out.fill_(float("nan"))
    verdict = compare_outputs(call.fn(), ref)
    assert verdict.passed, verdict
    return SimpleNamespace(call=call, same_tensors=metadata_tensors(call) == before)


@pytest.mark.parametrize("fake", [lambda: flashmla_sgl(hoist=True), flashmla_source_build],
                         ids=["sgl-legacy-hoisted", "source-build-tensors"])
def test_flashmla_refresh_rewrites_the_schedule_in_place(monkeypatch, fake):
    install(monkeypatch, {"flash_mla": fake()})
    res = check_refresh("flashmla", {})
    assert res.call.graph_safe and res.same_tensors
    assert res.call.effective_params["metadata"] == "hoisted scheduler"


def test_flashmla_without_hoisting_refills_eagerly_and_is_not_graph_safe(monkeypatch):
    install(monkeypatch, {"flash_mla": flashmla_sgl(hoist=False)})
    res = check_refresh("flashmla", {})
    assert not res.call.graph_safe  # new tensors each refresh: a captured graph would not see them


@pytest.mark.parametrize("name", ["aiter-asm", "aiter-gluon"])
@pytest.mark.parametrize("page_size", [1, 64])
def test_aiter_refresh_rewrites_layout_and_metadata_in_place(monkeypatch, tmp_path, name, page_size):
    from tests.backends.aiter.fakes import install_fake_aiter

    schedule_following(install_fake_aiter(monkeypatch, tmp_path, "v0.1.20"))
    res = check_refresh(name, {}, page_size)
    assert res.call.graph_safe and res.call.refresh is not None


def test_aiter_gluon_refresh_refuses_lengths_below_its_min_kv_seq_len(monkeypatch, tmp_path):
    """min_kv_seq_len is chosen on the host at prepare (AITER takes it as the shortest context):
    a step with a shorter context breaks AITER's contract, so refresh says so."""
    from tests.backends.aiter.fakes import install_fake_aiter

    install_fake_aiter(monkeypatch, tmp_path, "v0.1.20")
    backend = get_backend("aiter-gluon")
    shape = MLADecodeShape.create(num_heads=12, context_lens=LENS, page_size=64)
    inp = make_inputs(shape, device="cpu", seed=8)
    call = backend.prepare(inp, backend.resolve_params(shape))  # min_kv_seq_len 3
    inp.cache_seqlens.copy_(torch.tensor([2, 50, 50], dtype=torch.int32))
    with pytest.raises(UnsupportedShapeError, match="below the min_kv_seq_len 3"):
        call.refresh_for_new_lengths()
