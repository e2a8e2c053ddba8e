"""The backend contract, checked for every registered backend: the registry is the list.

A backend added with ``@register`` is picked up here without editing this file.
"""

from __future__ import annotations

from typing import Any, get_args

import pytest
import torch

from mlabench.backends import backend_names, get_backend
from mlabench.backends.base import Backend, Family
from mlabench.bench.shape_bench import ShapeBench
from mlabench.checks.verdict import compare_outputs
from mlabench.errors import ConfigError
from mlabench.inputs import make_inputs
from mlabench.kernels.reference import mla_decode_reference
from mlabench.shapes import MLADecodeShape

NAMES = backend_names()
#: bf16, page size 64, 12 heads: a shape every built-in backend takes (FlashMLA needs page 64 and
#: bf16/fp16, AITER bf16); lengths 1, a non-multiple and one past a multiple of the page size.
TINY = MLADecodeShape.create(num_heads=12, context_lens=(1, 70, 129), page_size=64)
#: TINY as a causal 2-token step (speculative verify, MTP): the shortest context holds just the block.
TINY_MTP = MLADecodeShape.create(num_heads=12, context_lens=(2, 70, 129), page_size=64, qo_len=2)
SHAPES = {"qo1": TINY, "qo2": TINY_MTP}
#: Lengths written into TINY's ``cache_seqlens`` in place after prepare: each fits the block table
#: (3 pages of 64 per request), the longest request becomes the shortest and every work split moves.
NEW_LENS = (150, 3, 90)
#: Shapes some backends refuse: each refusal must say why.
ODD_SHAPES = [
    MLADecodeShape.create(num_heads=12, context_lens=(8,), page_size=16, q_dtype="float32",
                          kv_dtype="float32"),
    MLADecodeShape.create(num_heads=12, context_lens=(8,), kv_lora_rank=256),
    MLADecodeShape.create(num_heads=256, context_lens=(8,), page_size=64),
]


def runnable(name: str, shape: MLADecodeShape = TINY) -> Backend:
    """The backend, or a skip naming why it cannot run here or does not take ``shape``."""
    backend = get_backend(name)
    ok, why = backend.available()
    if not ok:
        pytest.skip(f"{name} not available here: {why}")
    ok, why = backend.supports(shape)
    if not ok:
        pytest.skip(f"{name} does not take {shape.label()}: {why}")
    return backend


def reference(inputs, lens=None):
    s = inputs.shape
    out, _ = mla_decode_reference(inputs.q, inputs.kv_cache, inputs.block_table,
                                  inputs.cache_seqlens if lens is None else lens, s.scale,
                                  qo_len=s.qo_len, causal=s.causal)
    return out


def param_variants(backend: Backend, shape: MLADecodeShape) -> list[dict[str, Any]]:
    """The defaults, then one parameter at a time moved: every choice of a string parameter, the
    lowest and a higher value of an integer one."""
    defaults = backend.resolve_params(shape)
    variants = [defaults]
    for spec in backend.params:
        if spec.kind is int:
            values = [1 if spec.low is None else spec.low, min(spec.high or 7, 7)]
        else:
            values = list(spec.choices)
        variants += [{**defaults, spec.name: v} for v in values
                     if v != spec.value_in(defaults, shape)]  # a left-out parameter runs its own
    return variants


@pytest.mark.parametrize("name", NAMES)
def test_describes_itself(name):
    backend = get_backend(name)
    assert backend.name == name and backend.summary.strip()
    assert backend.family in get_args(Family)
    assert len(set(backend.param_names())) == len(backend.params)
    for key, dists in backend.packages.items():
        assert key and dists and all(isinstance(d, str) and d for d in dists)


@pytest.mark.parametrize("name", NAMES)
def test_available_gives_a_reason_when_false(name):
    ok, why = get_backend(name).available()
    assert isinstance(ok, bool) and isinstance(why, str)
    assert why == "" if ok else why.strip(), why


@pytest.mark.parametrize("name", NAMES)
def test_supports_gives_a_reason_when_false(name):
    backend = get_backend(name)
    assert backend.supports(TINY) == (True, "")
    for shape in ODD_SHAPES + [TINY_MTP]:
        ok, why = backend.supports(shape)
        assert isinstance(ok, bool) and (why == "" if ok else why.strip())


@pytest.mark.parametrize("name", NAMES)
def test_resolve_params_rejects_unknown_names(name):
    backend = get_backend(name)
    with pytest.raises(ConfigError, match="unknown parameter 'no_such_param'"):
        backend.resolve_params(TINY, {"no_such_param": 1})
    resolved = backend.resolve_params(TINY)
    # every parameter, in order, but one added later (omit_default) at its default
    assert tuple(resolved) == tuple(p.name for p in backend.params if not p.omit_default)
    for spec in backend.params:  # a default given is a valid value (None: the library chooses)
        if resolved.get(spec.name, spec.default_for(TINY)) is not None:
            value = resolved.get(spec.name, spec.default_for(TINY))
            assert spec.validate(value) == value


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", NAMES)
def test_prepare_poisons_the_output(name, shape):
    shape = SHAPES[shape]
    backend = runnable(name, shape)
    inputs = make_inputs(shape, seed=1)
    call = backend.prepare(inputs, backend.resolve_params(shape))
    assert call.out.shape == (shape.batch * shape.qo_len, shape.num_heads, shape.v_head_dim)
    assert torch.isnan(call.out).all()  # nothing ran yet: a row the call forgets stays NaN
    assert call.fn() is call.out
    assert torch.isfinite(call.out).all()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", NAMES)
def test_matches_the_reference_on_this_machine(name, shape):
    """Every parameter moved once.  On the CPU: the portable backends, and the Triton kernels in
    Triton's interpreter; on a GPU, every backend available there."""
    shape = SHAPES[shape]
    backend = runnable(name, shape)
    inputs = make_inputs(shape, seed=2)
    ref = reference(inputs)
    for params in param_variants(backend, shape):
        out = backend.prepare(inputs, backend.resolve_params(shape, params)).fn()
        verdict = compare_outputs(out, ref)
        assert verdict.passed, (params, verdict)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", NAMES)
def test_passes_every_input_set_with_its_defaults(name, shape):
    """On poisoned inputs (NaN in every slot no request may read), with needles at its splits'
    edges, the peaky and the flat sets: what ``check`` and ``sweep`` verify on."""
    shape = SHAPES[shape]
    backend = runnable(name, shape)
    _call, verdict = ShapeBench(shape, seed=3, copies=1).check(backend, backend.resolve_params(shape))
    assert verdict.passed and set(verdict.by_input_set) == {"random", "needles", "peaky", "flat"}, verdict


@pytest.mark.parametrize("shape", [0, 1])  # not the 256 heads: a minute in Triton's interpreter
@pytest.mark.parametrize("name", NAMES)
def test_a_shape_it_says_it_takes_it_computes(name, shape):
    """Issue 35 item 11: torch-splitkv said it took kv_lora_rank 256 and crashed with a reshape
    error.  A backend either refuses a shape in ``supports`` or passes its check."""
    shape = ODD_SHAPES[shape]
    backend = runnable(name, shape)
    _call, verdict = ShapeBench(shape, seed=3, copies=1).check(backend, backend.resolve_params(shape))
    assert verdict.passed, verdict


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", NAMES)
def test_refresh_follows_new_lengths(name, shape):
    """What ``graph_safe`` promises, as far as this machine can check it: prepared and run at TINY's
    lengths, lengths changed in place, ``refresh``, run again: the reference of the new lengths.
    (A captured graph replayed after the refresh: tests/gpu/test_graph_refresh.py.)"""
    shape = SHAPES[shape]
    backend = runnable(name, shape)
    for params in param_variants(backend, shape):
        inputs = make_inputs(shape, seed=4, poison=False)  # the lengths grow into page tails and padding
        call = backend.prepare(inputs, backend.resolve_params(shape, params))
        call.fn()
        inputs.cache_seqlens.copy_(torch.tensor(NEW_LENS, dtype=torch.int32))
        call.refresh_for_new_lengths()
        call.out.fill_(float("nan"))
        verdict = compare_outputs(call.fn(), reference(inputs, NEW_LENS))
        assert verdict.passed, (params, verdict)
