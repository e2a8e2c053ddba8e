"""Compile the portable Triton kernels' stage 1 for a GPU that is not here, and read its resources.

Triton compiles for a target without a device: for NVIDIA it bundles ``ptxas`` (sm_90 here), for
AMD its own code generator (gfx942, MI300).  :func:`stage1_resources` builds the signature a launch
would specialise (pointers and the 16-divisible strides of the kimi-k3 layout marked 16-byte
aligned), compiles one launch and returns registers, spills and shared memory (LDS on AMD): the
numbers behind the launch defaults of :mod:`mlabench.kernels.triton_launch`.  Run it in a process where
Triton's interpreter has not run (``TRITON_INTERPRET`` unset): the interpreter patches the language
module the compiler uses.

``python -m mlabench.kernels.offline_compile`` prints the table of every row tile's default launch
for both kernels and both targets (about 30 s on two CPU cores, uncached).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import triton

from mlabench.kernels.row_tiling import RowTiling
from mlabench.kernels.triton_launch import ROW_TILES, default_launch_for

#: Kernel arguments that are never a multiple of 16 in the kimi-k3 layout (12 heads): Triton's
#: launcher would not mark them divisible; every other pointer and stride it would.
_NOT_DIVISIBLE = {"stride_btb", "stride_ls"}
_POINTER_TYPES = {"po_ptr": "*fp32", "plse_ptr": "*fp32"}
#: qo_len of the shape each row tile is compiled at by default: the fewest tokens of 12 heads that
#: fill it past the next smaller tile.
TILE_QO_LEN = {16: 1, 32: 2, 64: 4}


@dataclass(frozen=True)
class StageResources:
    """One compiled stage-1 launch: ``registers`` per thread (VGPRs on AMD), ``spill_bytes``
    (spill stores in bytes on NVIDIA, spilled VGPRs on AMD), ``shared_bytes`` (shared memory / LDS
    per program, from Triton's metadata)."""

    kernel: str
    target: str
    rows_per_tile: int
    launch: tuple[int, int, int]
    registers: int
    spill_bytes: int
    shared_bytes: int
    #: Local-memory loads and stores (``LDL``/``STL``) inside the token loop, the innermost SASS loop
    #: that holds the tensor-core products (sm_90 only; None on AMD): spills outside it are paid
    #: once per split or segment, spills inside it once per KV tile.
    token_loop_spills: int | None = None


def _signature(fn, dtype: str, constexprs: dict) -> tuple[dict, dict]:
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
            continue
        if name.endswith("_ptr"):
            sig[name] = _POINTER_TYPES.get(name, f"*{dtype}" if name in ("q_ptr", "kv_ptr", "out_ptr")
                                           else "*i32")
        else:
            sig[name] = "fp32" if name == "qk_scale_log2" else "i32"
        if sig[name].startswith("*") or (name.startswith("stride") and name not in _NOT_DIVISIBLE):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def _ptxas_usage(ptx: str) -> tuple[int, int]:
    """``(registers, spill store bytes)`` from ``ptxas -v`` of Triton's bundled ptxas for sm_90a."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as src:
        src.write(ptx)
        src.flush()
        log = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name=sm_90a", src.name, "-o", "/dev/null"],
                             capture_output=True, text=True, check=True).stderr
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores", log)
    if regs is None or spills is None:
        raise RuntimeError(f"unexpected ptxas -v output: {log[-500:]}")
    return int(regs.group(1)), int(spills.group(1))


def sass_instructions(cubin: bytes) -> list[tuple[int, str]]:
    """``(address, instruction)`` of every SASS instruction of ``cubin``, in address order, as
    Triton's bundled ``cuobjdump -sass`` prints them (predicate included, no ``;``)."""
    from triton.backends.nvidia.compiler import get_ptxas

    cuobjdump = str(Path(get_ptxas(90).path).with_name("cuobjdump"))
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
    return [(int(m.group(1), 16), m.group(2))
            for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]


def mma_loops(cubin: bytes) -> list[tuple[int, int, int]]:
    """``(instructions, tensor-core products, LDL/STL)`` of every loop of ``cubin``'s SASS
    (:func:`sass_instructions`) that holds an ``HMMA``/``HGMMA``; loops are the ranges of
    backward branches, outer loops included."""
    ins = sass_instructions(cubin)
    loops = []
    for addr, text in ins:
        target = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < addr:
            body = [t for a, t in ins if int(target.group(1), 16) <= a <= addr]
            mma = sum(1 for t in body if "MMA" in t)
            if mma:
                local = sum(1 for t in body if re.search(r"\b(LDL|STL)\b", t))
                loops.append((len(body), mma, local))
    return loops


def token_loop_spills(cubin: bytes) -> int:
    """``LDL``/``STL`` instructions in the innermost loop of ``cubin``'s SASS that holds an
    ``HMMA``/``HGMMA`` (:func:`mma_loops`): the token loop of stage 1.  Raises RuntimeError when
    no such loop is found."""
    loops = mma_loops(cubin)
    if not loops:
        raise RuntimeError("no loop with tensor-core products found in the SASS")
    return min(loops)[2]


def stage1_resources(kernel: str, rows_per_tile: int, *, target: str = "sm90",
                     launch: tuple[int, int, int] | None = None, qo_len: int | None = None,
                     causal: bool = True, policy_rows: int = 0, dtype: str = "bf16",
                     page_size: int = 64) -> StageResources:
    """Compile stage 1 of ``kernel`` (``"splitkv"`` or ``"persistent"``) for ``target``
    (``"sm90"`` or ``"gfx942"``) and return its :class:`StageResources`.

    ``launch`` ``(block_n, num_warps, num_stages)`` defaults to the tile's default for the target
    (:func:`mlabench.kernels.triton_launch.default_launch_for`); ``qo_len`` to :data:`TILE_QO_LEN`
    (causal when > 1 and ``causal``); ``policy_rows`` > 0 compiles the split-KV kernel's device
    policy path.  Raises ValueError for an unknown kernel or target, and Triton's errors when the
    compile fails (e.g. no ptxas in this Triton build).
    """
    if kernel == "splitkv":
        from mlabench.kernels.splitkv import SPLIT_ALIGN_TOKENS, _splitkv_stage1 as fn
        extra = {"SPLIT_ALIGN": SPLIT_ALIGN_TOKENS, "POLICY_ROWS": policy_rows}
    elif kernel == "persistent":
        from mlabench.kernels.persistent import _persistent_stage1 as fn
        extra = {}
    else:
        raise ValueError(f"kernel must be 'splitkv' or 'persistent', got {kernel!r}")
    if target not in ("sm90", "gfx942"):
        raise ValueError(f"target must be 'sm90' or 'gfx942', got {target!r}")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    launch = launch or default_launch_for(rows_per_tile, rocm=target != "sm90")
    block_n, num_warps, num_stages = launch
    qo_len = qo_len or TILE_QO_LEN[rows_per_tile]
    constexprs = {"PAGE_SIZE": page_size, "BLOCK_N": block_n, "BLOCK_H": rows_per_tile,
                  "UPCAST": False, "NUM_STAGES": num_stages, "QO_LEN": qo_len,
                  "CAUSAL": causal and qo_len > 1, **extra}
    sig, attrs = _signature(fn, dtype, constexprs)
    gpu = GPUTarget("cuda", 90, 32) if target == "sm90" else GPUTarget("hip", "gfx942", 64)
    compiled = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                              target=gpu, options={"num_warps": num_warps, "num_stages": num_stages})
    loop_spills = None
    if target == "sm90":
        regs, spills = _ptxas_usage(compiled.asm["ptx"])
        loop_spills = token_loop_spills(compiled.asm["cubin"])
    else:
        amdgcn = compiled.asm["amdgcn"]
        regs = int(re.search(r"\.vgpr_count:\s*(\d+)", amdgcn).group(1))
        spills = int(re.search(r"\.vgpr_spill_count:\s*(\d+)", amdgcn).group(1))
    return StageResources(kernel, target, rows_per_tile, tuple(launch), regs, spills,
                          int(compiled.metadata.shared), loop_spills)


def compile_stage1_sm90(num_stages: int | None = None, dtype: str = "bf16", *,
                        block_rows: int = 16, qo_len: int = 1, causal: bool = False,
                        policy_rows: int = 0, variant=None, num_splits: int = 132):
    """Compile gluon-splitkv's stage 1 for sm_90 without a GPU (Triton bundles ptxas) and return
    Triton's compiled kernel: ``.asm["ptx"]``, ``.asm["ttgir"]``, ``.asm["cubin"]``,
    ``.metadata.shared`` (bytes).  ``num_stages`` None: the kernel's default ring depth.
    ``block_rows`` 16, 32 or 64 compiles the variant :class:`RowTiling` launches for that tile
    (4 warps for 16 rows, 8 for 32 and 64); ``variant`` a
    :class:`~mlabench.kernels.gluon_splitkv.KernelVariant` (None: the default; with
    ``split_loop`` the kernel of :mod:`mlabench.kernels.gluon_split_loop`, which a launch runs
    where the loop's grid holds fewer programs than splits); ``num_splits`` the grid's split
    count a fused merge's tiling is sized for.  For the resource
    report in docs/PERFORMANCE.md and the CPU tests; run it in a process where Triton's
    interpreter has not run (the interpreter patches the language module it shares with Gluon).
    """
    from mlabench.kernels.gluon_fused_merge import MergeTiling
    from mlabench.kernels.gluon_split_loop import stage1_split_loop
    from mlabench.kernels.gluon_splitkv import (
        DEFAULT_NUM_STAGES, KernelVariant, _gluon_splitkv_stage1,
    )

    num_stages = num_stages or DEFAULT_NUM_STAGES
    variant = variant or KernelVariant()

    num_warps = RowTiling.for_rows(block_rows).num_warps
    mt = MergeTiling.for_launch(block_rows, num_splits, num_warps)
    consts = {"BLOCK_R": block_rows, "ROW_TILES": 1, "QO_LEN": qo_len, "CAUSAL": causal,
              "POLICY_ROWS": policy_rows, "NUM_STAGES": num_stages, "PDL": 1,
              "O_WARPS_M": variant.o_warps_m(num_warps), "LAZY_SUM": variant.lazy_sum,
              "WAIT_PRIOR": variant.pdl_prologue, "FUSED": variant.fused_merge,
              **mt.constexprs(), "num_warps": num_warps}
    fn = stage1_split_loop if variant.split_loop else _gluon_splitkv_stage1
    return _compile_gluon(fn, dtype, consts, {"num_warps": num_warps})


def _compile_gluon(fn, dtype: str, consts: dict, options: dict):
    """Compile the Gluon stage-1 kernel ``fn`` for sm_90 with ``consts``: its arguments typed by
    name (``q_ptr``/``qr_ptr``/``out_ptr`` in ``dtype``, the partials fp32, the two cache descriptors, other
    pointers int32, other scalars int32 but the fp32 scale), pointers and strides marked 16-byte
    aligned as Triton's launcher would specialise them."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from mlabench.kernels.gluon_blocks import PAGE_SIZE

    elem = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]

    def desc(width: int) -> str:
        layout = gl.NVMMASharedLayout.get_default_for([PAGE_SIZE, width], elem)
        return f"tensordesc<{dtype}[{PAGE_SIZE}, {width}],{layout!r}>"

    named = {"q_ptr": f"*{dtype}", "qr_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "po_ptr": "*fp32", "plse_ptr": "*fp32",
             "kvn_desc": desc(512), "kvr_desc": desc(64), "qk_scale_log2": "fp32"}
    sig = {n: "constexpr" if n in consts else named.get(n, "*i32" if n.endswith("_ptr") else "i32")
           for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, (n, t) in enumerate(sig.items())
             if t.startswith("*") or n.startswith("stride")}
    src = GluonASTSource(fn=fn, signature=sig, attrs=attrs, constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def compile_multi_token_sm90(block_rows: int = 64, qo_len: int = 8, *, causal: bool = True,
                             policy_rows: int = 0, num_stages: int = 2, dtype: str = "bf16",
                             pdl_prologue: bool = False, scores_first: bool = False,
                             rows_as_m: int = 0, isolate: int = 0):
    """Compile the multi-token stage 1 (:mod:`mlabench.kernels.gluon_multi_token`) for sm_90
    without a GPU and return Triton's compiled kernel (as :func:`compile_stage1_sm90`):
    ``block_rows`` 32 or 64 (the tile :func:`~mlabench.kernels.gluon_multi_token.multi_token_tiling`
    launches), the launch's ``maxnreg`` and partition registers; ``scores_first`` the softmax
    warpgroup's order of ``multi_token`` 2, ``rows_as_m`` the products with the rows as M (64
    rows; 0 elsewhere, as :func:`~mlabench.kernels.gluon_multi_token.launch_multi_token_stage1`
    launches it); ``isolate`` 1 or 2 the timing-only kernels of ``KernelVariant.isolate``.
    Run it where Triton's interpreter has not run."""
    from mlabench.kernels.gluon_multi_token import (
        MT_NUM_WARPS, _multi_token_stage1, mt_maxnreg, p_buffers, rows_m_for,
    )

    consts = {"BLOCK_R": block_rows, "ROW_TILES": 1, "QO_LEN": qo_len, "CAUSAL": causal,
              "POLICY_ROWS": policy_rows, "NUM_STAGES": num_stages,
              "P_BUFS": p_buffers(block_rows), "SCORES_FIRST": scores_first,
              "ROWS_M": rows_m_for(rows_as_m, block_rows), "ISOLATE": isolate, "PDL": 1,
              "WAIT_PRIOR": pdl_prologue,
              "num_warps": MT_NUM_WARPS}
    return _compile_gluon(_multi_token_stage1, dtype, consts,
                          {"num_warps": MT_NUM_WARPS,
                           "maxnreg": mt_maxnreg(rows_m_for(rows_as_m, block_rows))})


def compile_wide_merge_sm90(policy_rows: int = 16, *, pdl: bool = True, from_lengths: bool = True):
    """Compile the wide merge (:mod:`mlabench.kernels.wide_merge`) for sm_90 without a GPU, as
    gluon-splitkv launches it at batch 1 (bf16 output, 32 columns a program, the lengths and a
    ``policy_rows``-row device table with ``from_lengths``; ``pdl`` its programmatic dependent
    launch) and return Triton's compiled kernel.  Run it where Triton's interpreter has not run."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from mlabench.kernels.wide_merge import FEW_SLOTS, _wide_merge_kernel

    consts = {"SPLITS_POW2": 256, "BLOCK_S": 64, "BLOCK_DV": 32, "USE_PDL": pdl,
              "RELEASE_NEXT": False, "FROM_LENGTHS": from_lengths,
              "POLICY_ROWS": policy_rows if from_lengths else 0,
              "FEW_SLOTS": FEW_SLOTS if from_lengths else 0, "FEW_BLOCK_S": 32}
    sig, attrs = _signature(_wide_merge_kernel, "bf16", consts)
    return triton.compile(ASTSource(fn=_wide_merge_kernel, signature=sig, constexprs=consts,
                                    attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


def main() -> None:
    """Print the resources of every row tile's default launch (both kernels, both targets, and
    the split-KV kernel's device policy path), then those of gluon-splitkv's multi-token stage 1,
    then where the wide merge's PDL wait lies."""
    print("kernel            target  rows  launch (block_n, warps, stages)  registers  spills  "
          "shared  spills in token loop")
    for target in ("sm90", "gfx942"):
        for rows in ROW_TILES:
            for kernel, policy in (("splitkv", 0), ("splitkv", 8), ("persistent", 0)):
                r = stage1_resources(kernel, rows, target=target, policy_rows=policy)
                name = kernel + ("-policy" if policy else "")
                print(f"{name:<17} {target:<7} {rows:>4}  {str(r.launch):<31}  {r.registers:>9}  "
                      f"{r.spill_bytes:>6}  {r.shared_bytes:>6}  {r.token_loop_spills}", flush=True)
    print("\ngluon-splitkv multi_token stage 1, sm90 (causal): rows, shared bytes, spill bytes, "
          "(instructions, wgmma, LDL/STL) of each loop with products")
    for rows in (32, 64):
        k = compile_multi_token_sm90(rows, TILE_QO_LEN[rows])
        print(rows, k.metadata.shared, _ptxas_usage(k.asm["ptx"])[1], mma_loops(k.asm["cubin"]),
              flush=True)
    sass = [t for _, t in sass_instructions(compile_wide_merge_sm90().asm["cubin"])]
    wait = next(i for i, t in enumerate(sass) if "ACQBULK" in t)
    print(f"\nwide merge, sm90 (batch 1, 16-row table, PDL): griddepcontrol.wait at instruction "
          f"{wait} of {len(sass)}, after {sum('MUFU.RCP' in t for t in sass[:wait])} reciprocals")


if __name__ == "__main__":
    main()
