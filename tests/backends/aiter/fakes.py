"""Fake AITER packages for CPU tests, generated from the manifest -- never written by hand.

:func:`install_fake_aiter` writes a real ``aiter`` package tree into a temporary folder for one
manifest range: every module the adapters import, every function with exactly the parameters (names,
order, defaults) the manifest records for that range, the Gluon module carrying the AITER source
lines the range's rules are detected from, and ``AITER_ASM_DIR`` with a kernel file.  The modules are
loaded from those files (so ``inspect.signature`` and ``inspect.getsource`` see what they would see
in a real AITER) and put into ``sys.modules`` for one test.

Each generated function hands its bound arguments to :func:`dispatch`; the behaviour behind it
emulates AITER from the manifest's rules (the input checks AITER makes, the split count it launches,
the persistent-kernel gate) and computes real attention, so an adapter that passes arguments in
the wrong order or skips one gets a wrong answer or AITER's own assertion.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

import mlabench.backends.aiter.probe as aiter_probe
from mlabench.backends.aiter import rules
from mlabench.backends.aiter.manifest import Manifest, Range, Signature, load_manifest
from mlabench.extras import optional_import
from mlabench.measure import timing
from mlabench.policy.heuristics import GLUON_BLOCK_N, gluon_bh16_cap
from tests.backends.fakes import csr_attention

PACKAGES = ("aiter", "aiter.jit", "aiter.jit.utils", "aiter.ops", "aiter.ops.triton",
            "aiter.ops.triton.gluon")


@dataclass
class FakeAiter:
    """One installed fake: its range, recorded calls, and the behaviour of each logical call."""

    manifest: Manifest
    range: Range
    root: Path
    gfx_native: str = "gfx950"
    cu_num: int = 256
    #: µs the fake Gluon kernel takes per 64-token block of its longest split, added to
    #: ``clock_ns`` (a virtual clock: :meth:`time_kernels_only` makes the CPU timer read it): a
    #: model of a split-KV kernel's time, so that a count frozen too small is slow on the CPU too.
    block_us: float = 0.0
    clock_ns: int = 0
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    behaviours: dict[str, Callable[[FakeAiter, dict[str, Any]], Any]] = field(default_factory=dict)
    last: dict[str, Any] = field(default_factory=dict)

    def rule(self, kind: str) -> str:
        return self.range.rules[kind]

    def time_kernels_only(self, monkeypatch: pytest.MonkeyPatch, block_us: float) -> None:
        """Make the CPU timer (:func:`mlabench.measure.timing.time_calls`) read :attr:`clock_ns`,
        which only the fake Gluon kernel advances (``block_us`` per block): timings without noise."""
        self.block_us = block_us
        clock = types.SimpleNamespace(perf_counter_ns=lambda: self.clock_ns, perf_counter=time.perf_counter)
        monkeypatch.setattr(timing, "time", clock)

    def calls_to(self, name: str) -> list[dict[str, Any]]:
        return [args for call, args in self.calls if call == name]

    def handle(self, name: str, args: dict[str, Any]) -> Any:
        self.calls.append((name, args))
        return self.behaviours.get(name, BEHAVIOURS[name])(self, args)


_ACTIVE: list[FakeAiter] = []


def dispatch(name: str, args: dict[str, Any]) -> Any:
    """Entry point of every generated function: the active fake's behaviour for ``name``."""
    return _ACTIVE[-1].handle(name, args)


# ---- generating the package ----------------------------------------------------------------------
def _default_text(default: str | None) -> str:
    try:
        return repr(ast.literal_eval(default))  # type: ignore[arg-type]
    except (ValueError, SyntaxError):
        return "None"  # e.g. MlaVersion.V32.value: a name the fake does not have


def function_source(call: str, sig: Signature) -> str:
    """``def name(<manifest parameters>)`` forwarding its bound arguments to :func:`dispatch`."""
    params = ", ".join(p.name if p.default is None else f"{p.name}={_default_text(p.default)}"
                       for p in sig.parsed)
    return f"def {sig.name}({params}):\n    return _fake_dispatch({call!r}, dict(locals()))\n"


def package_sources(m: Manifest, rng: Range, root: Path, version_file: str | None) -> dict[str, str]:
    """Module name -> source text of the fake package for ``rng``."""
    header = "from tests.backends.aiter.fakes import dispatch as _fake_dispatch\n\n"
    sources = {name: header for name in PACKAGES}
    for call, sig_id in rng.functions.items():
        sig = m.signatures[sig_id]
        sources.setdefault(sig.module, header)
        sources[sig.module] += "\n" + function_source(call, sig)
    gluon = m.signatures[rng.functions["gluon"]].module
    evidence = "\n".join(m.rules[kind][variant].evidence for kind, variant in rng.rules.items()
                         if m.rules[kind][variant].detect == "source")
    sources[gluon] += f"\n_AITER_SOURCE_EVIDENCE = '''\n{evidence}\n'''\n"
    sources["aiter.jit.core"] = f"AITER_ASM_DIR = {str(root / 'hsa') + '/'!r}\n"
    if version_file is not None:
        sources["aiter._version"] = f"__version__ = {version_file!r}\n"
    return sources


def _path(root: Path, module: str) -> Path:
    parts = module.split(".")
    if module in PACKAGES:
        return root.joinpath(*parts, "__init__.py")
    return root.joinpath(*parts[:-1], parts[-1] + ".py")


def install_fake_aiter(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, range_name: str, *,
                       dist_version: str | None = "range", version_file: str | None = None,
                       gfx: str = "gfx950", cu_num: int = 256, asm_kernel: bytes | None = None,
                       manifest: Manifest | None = None) -> FakeAiter:
    """Build and install the fake AITER of manifest range ``range_name`` for one test.

    ``dist_version``: the distribution record's version ("range": the range's first version;
    None: no record).  ``version_file``: ``aiter/_version.py``'s ``__version__`` (None: no file).
    ``gfx``: the architecture the fake's ``get_gfx`` detects (``GPU_ARCHS`` overrides it, as in
    AITER).  ``asm_kernel``: contents of the gfx950 kernel file the ASM offset rule is read from.
    """
    m = manifest or load_manifest()
    rng = m.range_named(range_name)
    root = tmp_path / f"fake-aiter-{range_name}"
    fake = FakeAiter(m, rng, root, gfx_native=gfx, cu_num=cu_num)
    sources = package_sources(m, rng, root, version_file)
    for module, text in sources.items():
        path = _path(root, module)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    kernel = root / "hsa" / m.rules["asm_kv_offsets"]["int64"].file
    kernel.parent.mkdir(parents=True, exist_ok=True)
    kernel.write_bytes(asm_kernel if asm_kernel is not None else b"fake kernel " + range_name.encode())
    for name in [k for k in sys.modules if k == "aiter" or k.startswith("aiter.")]:
        monkeypatch.delitem(sys.modules, name)
    for module in sorted(sources, key=lambda n: n.count(".")):
        _load(monkeypatch, module, _path(root, module))
    monkeypatch.setattr(sys.modules[__name__], "_ACTIVE", [fake])
    monkeypatch.setattr(aiter_probe, "_CACHE", {})
    version = rng.since if dist_version == "range" else dist_version
    monkeypatch.setattr(aiter_probe, "package_version", lambda names: version)
    optional_import.cache_clear()
    return fake


def _load(monkeypatch: pytest.MonkeyPatch, module: str, path: Path) -> None:
    is_package = module in PACKAGES
    spec = importlib.util.spec_from_file_location(
        module, path, submodule_search_locations=[str(path.parent)] if is_package else None)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, module, mod)
    spec.loader.exec_module(mod)
    parent, _, child = module.rpartition(".")
    if parent:
        monkeypatch.setattr(sys.modules[parent], child, mod, raising=False)


# ---- behaviours: AITER's host-side checks and decisions, from the range's rules -----------------
def _metadata_info(fake: FakeAiter, a: dict[str, Any]) -> Any:
    assert a["num_head_qo"] % 8 == 0  # AITER's own assertion
    batch, cus = a["batch_size"], fake.cu_num
    return (((2), torch.uint64), ((cus + 1), torch.int32), (((batch + cus - 1), 8), torch.int32),
            ((batch + 1), torch.int32), ((batch, 2), torch.int32), (4 * batch + cus, torch.int32))


def _metadata(fake: FakeAiter, a: dict[str, Any]) -> None:
    """Fills the work list; tile ``b`` gets ``min(4, cdiv(L_b, 64))`` splits (partials only if > 1)."""
    a["work_info_set"].fill_(7)
    lens = (a["seqlens_kv_indptr"][1:] - a["seqlens_kv_indptr"][:-1]).tolist()
    splits = [min(4, -(-n // 64)) for n in lens]
    indptr = a["reduce_indptr"]
    indptr[0] = 0
    for b, s in enumerate(splits):
        indptr[b + 1] = indptr[b] + (s if s > 1 else 0)
    fake.last["partials"] = int(indptr[len(lens)])


def _decode(fake: FakeAiter, a: dict[str, Any]) -> tuple[None, None]:
    assert a["logit_cap"] <= 0
    persistent = a["work_meta_data"] is not None
    if persistent and a["num_kv_splits"] is None and "gate" in fake.range.functions:
        q, kv = a["q"], a["kv_buffer"]
        persistent = sys.modules["aiter.mla"]._use_persistent_mla_decode(
            a["qo_indptr"].shape[0] - 1, a["o"].shape[1], a["max_seqlen_q"], q.dtype, kv.dtype)
    fake.last["persistent"] = persistent
    if not persistent and a["num_kv_splits"] is None:  # AITER: total_kv = kv_indices.shape[0]
        fake.last["splits"] = rules.asm_nonpersistent_splits(
            a["qo_indptr"].shape[0] - 1, a["kv_indices"].shape[0], fake.cu_num)
    if not _within_2gib(a["kv_buffer"]) and fake.rule("asm_kv_offsets") == "int32" and gfx_of() == "gfx950":
        a["o"].zero_()  # 32-bit KV byte offsets wrap past 2 GiB: wrong rows read
        return None, None
    qo_len, causal = a["max_seqlen_q"], a.get("causal", True)  # before v0.1.20 kernels mask causally
    step = (a["qo_indptr"][1:] - a["qo_indptr"][:-1]).unique().tolist()
    assert step == [qo_len] and a["q"].shape[0] == qo_len * (a["qo_indptr"].shape[0] - 1)
    assert rules.asm_qo_len_reason(qo_len, causal, gfx_of(), "causal" in a) is None, \
        "mla_decode_stage1_asm_fwd: cannot find suitable kernel"  # asm_mla.cu's kernel lookup
    rows = a["kv_buffer"].view(-1, a["kv_buffer"].shape[-1])
    a["o"].copy_(csr_attention(a["q"], rows, a["kv_indptr"], a["kv_indices"], a["sm_scale"],
                               qo_len=qo_len, causal=causal))
    return None, None


def _gluon(fake: FakeAiter, a: dict[str, Any]) -> tuple[torch.Tensor, None]:
    """AITER's wrapper checks (3-D or, from #3890, 4-D queries; regime by heads, bh64 batch and
    min_kv_seq_len), then attention (a 4-D query under the causal tail mask)."""
    q_nope = a["q_nope"]
    if fake.rule("gluon_qo_len") == "one_token":
        batch, nhead, _ = q_nope.shape  # ValueError for 4-D, as AITER's unpacking raises
        qlen = 1
    else:
        assert q_nope.dim() in (3, 4), f"q_nope must be 3-D or 4-D, got {q_nope.dim()}-D"
        batch, qlen, nhead = q_nope.shape[:3] if q_nope.dim() == 4 else (q_nope.shape[0], 1, q_nope.shape[1])
    max_heads, min_kv = int(fake.rule("gluon_bh16_max_heads")), a["min_kv_seq_len"]
    regime = rules.gluon_regime(nhead, max_heads)
    assert regime is not None, f"mla_gluon requires nhead <= {max_heads} or 64/128, got {nhead}"
    if regime == "bh64":
        base_grid = 8 * -(-nhead // 64) * qlen * (batch // 8)  # AITER divides by it before its batch check
        n = 1 << max(0, (-(-256 // base_grid) - 1).bit_length())  # ZeroDivisionError below batch 8
        listed = fake.rule("gluon_bh64") == "listed"
        ok = batch in rules.GLUON_BH64_LISTED_BATCHES if listed else batch % 64 == 0
        assert ok, f"mla_gluon[bh64] batch_size {batch}"
        need = rules.gluon_bh64_min_kv_required(n)
        assert min_kv > need, f"mla_gluon[bh64] requires min_kv_seq_len > {need}, got {min_kv}"
    else:
        cap = gluon_bh16_cap(batch, nhead, qlen)
        n = cap if fake.rule("gluon_bh16_splits") == "budget" else max(
            1, min(cap, -(-min_kv // GLUON_BLOCK_N)))
    assert a["use_2d_view"] is False and a["k_pe"] is None and a["kv_pe_offset"] == 512
    if not _within_2gib(a["kv_c"]) and fake.rule("gluon_over_2gib") == "int32_overflow":
        raise RuntimeError("Segmentation fault: global_load path with 32-bit KV offsets (WITHIN_2GB=False)")
    lens = (a["seq_info"][1:] - a["seq_info"][:-1]).tolist()
    budget = regime == "bh16" and fake.rule("gluon_bh16_splits") == "budget"
    runs = [_kernel_splits(length, n, budget) for length in lens]
    fake.last.update(launched=n, min_kv_seq_len=min_kv, per_request=[k for k, _ in runs])
    fake.clock_ns += round(fake.block_us * max(blocks for _, blocks in runs) * 1e3)
    q = torch.cat([q_nope, a["q_pe"]], dim=-1).reshape(batch * qlen, nhead, -1)
    out = csr_attention(q, a["kv_c"], a["seq_info"], a["page_table"], a["sm_scale"], qo_len=qlen)
    a["o"].copy_(out.view(a["o"].shape))
    return a["o"], None


def _within_2gib(kv: torch.Tensor) -> bool:
    """AITER's test: the KV tensor's whole extent (rows x row stride x element size, the spare
    page included) within :data:`~mlabench.backends.aiter.rules.KV_OFFSET_LIMIT_BYTES`."""
    return kv.shape[0] * kv.stride(0) * kv.element_size() <= rules.KV_OFFSET_LIMIT_BYTES


def _kernel_splits(length: int, launched: int, budget: bool) -> tuple[int, int]:
    """``(splits run, 64-token blocks of the longest split)`` of a request of ``length`` tokens, as
    AITER's bh16 kernel cuts it: ``L // N`` tokens a split (``max(64, L // N)`` under the budget
    rule, splits past the end returning at once), the last split taking the rest."""
    per_split = max(GLUON_BLOCK_N, length // launched) if budget else length // launched
    active = min(-(-length // per_split), launched) if per_split else launched
    longest = max(per_split, length - (active - 1) * per_split)
    return active, -(-longest // GLUON_BLOCK_N)


def gfx_of() -> str:
    """The architecture the installed fake's ``get_gfx`` reports."""
    return sys.modules["aiter.jit.utils.chip_info"].get_gfx()


def _get_gfx(fake: FakeAiter, a: dict[str, Any]) -> str:
    archs = os.environ.get("GPU_ARCHS", "native")  # AITER: the last entry of a ';' list
    return fake.gfx_native if archs == "native" else archs.split(";")[-1]


def _gate(fake: FakeAiter, a: dict[str, Any]) -> bool:
    chip = sys.modules["aiter.jit.utils.chip_info"]
    name = {torch.bfloat16: "bfloat16"}
    return rules.asm_keeps_persistent(
        "batch_gate", chip.get_gfx(), name.get(a["q_dtype"], str(a["q_dtype"])),
        name.get(a["kv_dtype"], str(a["kv_dtype"])), a["nhead"], a["max_seqlen_q"], a["bs"],
        sys.modules["aiter.mla"]._persistent_mla_decode_max_batch())


def _gate_max_batch(fake: FakeAiter, a: dict[str, Any]) -> int:
    try:
        return int(os.environ.get("AITER_MLA_DECODE_PERSISTENT_MAX_BATCH", 32))
    except ValueError:
        return 32


BEHAVIOURS: dict[str, Callable[[FakeAiter, dict[str, Any]], Any]] = {
    "metadata_info": _metadata_info, "metadata": _metadata, "decode": _decode, "gluon": _gluon,
    "get_gfx": _get_gfx, "get_cu_num": lambda fake, a: fake.cu_num, "gate": _gate,
    "gate_max_batch": _gate_max_batch,
}


def aiter_available_on_cpu(monkeypatch: pytest.MonkeyPatch, device_arch: str = "gfx950") -> None:
    """Make the AITER backends see a ROCm build with a ``device_arch`` GPU while every other module
    (inputs, timing, graph-check) keeps the CPU: the adapters' own availability checks only."""
    from mlabench.backends.aiter import asm_backend, gluon_backend
    from mlabench.device import DeviceInfo

    for mod in (asm_backend, gluon_backend):
        monkeypatch.setattr(mod, "rocm_reason", lambda archs: "")
    info = DeviceInfo("cpu", "cpu", "CPU standing in for an AMD GPU", 1, 0, device_arch, 0)
    monkeypatch.setattr(gluon_backend, "current_device", lambda: info)


def pretend_rocm(monkeypatch: pytest.MonkeyPatch, device_arch: str = "gfx950") -> None:
    """Make torch look like a ROCm build with a GPU whose device 0 is ``device_arch``."""
    from mlabench.device import DeviceInfo

    importlib.import_module("mlabench.backends")  # every backend module loaded, so all are patched
    monkeypatch.setattr(torch.version, "hip", "7.0.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    info = DeviceInfo("rocm", "cuda", "AMD Instinct", 256, 0, device_arch, 0)
    for name, mod in list(sys.modules.items()):
        if name.startswith("mlabench") and hasattr(mod, "current_device"):
            monkeypatch.setattr(mod, "current_device", lambda: info)
