"""Test-only backends for the tuner: correct (or deliberately wrong) and fast, with a synthetic
cost landscape, so studies finish in seconds on a loaded CPU.

The output is the fp32 reference of the inputs as they are (recomputed only when q or the cache
changed); the timed call spins for a cost in µs that depends on the parameters (on a GPU, in a
kernel, so that graph replay times it), then copies it.  Workers started by the tuner import
this module through ``MLABENCH_WORKER_IMPORTS``; ``TEST_TUNE_PREPARE_S`` slows every ``prepare``
(to kill a worker mid-trial, or to let two workers overlap), and ``TEST_TUNE_TOGETHER`` holds each
worker's first ``prepare`` until every worker has begun one (so that they overlap however late one
of them starts).
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from mlabench.backends import registry
from mlabench.backends.base import Backend, ParamSpec, PreparedCall
from mlabench.inputs import MLADecodeInputs
from mlabench.kernels.reference import mla_decode_reference
from mlabench.shapes import MLADecodeShape

MODULE = "tests.tune.fake_backends"
PREPARE_ENV = "TEST_TUNE_PREPARE_S"
#: ``FOLDER:N``: the first ``prepare`` of each process leaves a file named by its pid in FOLDER and
#: waits until N processes have (at most :data:`TOGETHER_WAIT_S`), so that no worker finishes its
#: first trial before every worker has begun measuring one: a worker whose start a loaded machine
#: delays by seconds still finds trials left.
TOGETHER_ENV = "TEST_TUNE_TOGETHER"
TOGETHER_WAIT_S = 120.0
#: ``FILE:S``: the first process whose ``prepare`` creates FILE stops itself (SIGSTOP: every thread,
#: its heartbeat too) for S seconds, as a machine that stalls (swapping, a debugger) without dying.
#: It stops in ``prepare``, holding no lock of the storage, so the other workers go on meanwhile.
STALL_ENV = "TEST_TUNE_STALL"


#: GPU clock cycles per µs of synthetic cost (an H200's 1.98 GHz boost clock; only the order of the
#: costs matters to the tests, not their scale).
GPU_CYCLES_PER_US = 1980


def spin_us(us: float, device: torch.device) -> None:
    """Take about ``us`` µs where the measurement sees it: a busy wait on the CPU (wall clock); on a
    GPU a kernel that spins (``torch.cuda._sleep``), which graph replay and device events time."""
    if device.type == "cuda":
        torch.cuda._sleep(int(us * GPU_CYCLES_PER_US))
        return
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def wait_for_peers() -> None:
    """The first call in this process with :data:`TOGETHER_ENV` set: arrive, then wait for the others."""
    spec = os.environ.get(TOGETHER_ENV)
    folder = Path(spec.rsplit(":", 1)[0]) if spec else None
    if folder is None or (folder / str(os.getpid())).exists():
        return
    (folder / str(os.getpid())).touch()
    deadline = time.monotonic() + TOGETHER_WAIT_S
    while len(list(folder.iterdir())) < int(spec.rsplit(":", 1)[1]) and time.monotonic() < deadline:
        time.sleep(0.05)


def stall_once() -> None:
    """With :data:`STALL_ENV` set, the first process to get here stops itself for its seconds (a
    child process sends SIGCONT), its pid written into the file."""
    spec = os.environ.get(STALL_ENV)
    if not spec:
        return
    path, seconds = spec.rsplit(":", 1)
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    Path(path).write_text(str(os.getpid()))
    subprocess.Popen(["/bin/sh", "-c", f"sleep {float(seconds)}; kill -CONT {os.getpid()}"], start_new_session=True)
    os.kill(os.getpid(), signal.SIGSTOP)


class _Synthetic(Backend):
    family = "split-kv"
    summary = "test-only synthetic backend"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def cost_us(self, params: dict[str, Any]) -> float:
        raise NotImplementedError

    def cost_at_us(self, params: dict[str, Any], context_len: int) -> float:
        """The cost at one context length (by default the same at every length)."""
        return self.cost_us(params)

    def wrong(self, params: dict[str, Any]) -> bool:
        return False

    def prepare(self, inputs: MLADecodeInputs, params: dict[str, Any]) -> PreparedCall:
        wait_for_peers()
        stall_once()
        time.sleep(float(os.environ.get(PREPARE_ENV, "0")))
        s = inputs.shape
        bias = 1.0 if self.wrong(params) else 0.0
        out = inputs.new_output()
        cost = self.cost_at_us(params, s.max_context_len)
        seen: dict[str, Any] = {"versions": None}

        def fn() -> torch.Tensor:
            # The answer of the inputs as they are now: the check writes its input sets into q and
            # the cache after prepare.  Recomputed only when they changed (tensor version counters).
            versions = (inputs.q._version, inputs.kv_cache._version)
            if versions != seen["versions"]:
                ref, _ = mla_decode_reference(inputs.q, inputs.kv_cache, inputs.block_table,
                                              list(s.context_lens), s.scale, s.kv_lora_rank)
                seen.update(versions=versions, ref=ref.to(inputs.q.dtype) + bias)
            spin_us(cost, out.device)
            return out.copy_(seen["ref"])

        return PreparedCall(fn=fn, out=out, effective_params=dict(params))


class LaunchParamsBackend(_Synthetic):
    """Declares a split count and three launch parameters (and one unbounded, hence fixed, int); each
    step away from the optimum costs at least 20%, beyond a loaded CPU's timing noise."""

    name = "test-launch"
    params = (
        ParamSpec("num_kv_splits", int, default=4, help="splits", low=1, high=64),
        ParamSpec("block_n", str, default="32", help="tokens per tile", choices=("16", "32", "64")),
        ParamSpec("num_warps", int, default=4, help="warps", low=1, high=8),
        ParamSpec("num_stages", int, default=2, help="pipeline stages", low=1, high=4),
        ParamSpec("tile_rows", int, default=16, help="unbounded: never searched"),
    )

    def cost_us(self, p: dict[str, Any]) -> float:
        return (40 + 10 * abs(p["num_kv_splits"] - 12) + 30 * (p["block_n"] != "32")
                + 8 * abs(p["num_warps"] - 4) + 10 * abs(p["num_stages"] - 2))


class FastWrongBackend(_Synthetic):
    """Splits 1-16; from 12 splits on it is 20x faster than anything else and wrong; the correct
    ones are fastest at 6 splits, each step away 30% slower (robust to a loaded CPU's noise)."""

    name = "test-fast-wrong"
    params = (ParamSpec("num_kv_splits", int, default=1, help="splits", low=1, high=16),)

    def cost_us(self, p: dict[str, Any]) -> float:
        return 10.0 if self.wrong(p) else 200.0 + 60 * abs(p["num_kv_splits"] - 6)

    def wrong(self, p: dict[str, Any]) -> bool:
        return p["num_kv_splits"] >= 12


class FlatBackend(_Synthetic):
    """Splits 1-64, all equally fast: the noise-aware choice must take the fewest."""

    name = "test-flat"
    params = (ParamSpec("num_kv_splits", int, default=8, help="splits", low=1, high=64),)

    def cost_us(self, p: dict[str, Any]) -> float:
        return 300.0


class LengthScaledBackend(_Synthetic):
    """Splits 1-16 whose best count grows with the length, ``ceil(L / 4)``: each octave away from it
    costs 60% more.  One fixed count per bucket is then off by up to an octave at the bucket's ends,
    while the rule ``clamp(ceil(L / 4), 1, 16)`` is best at every length."""

    name = "test-length-scaled"
    params = (ParamSpec("num_kv_splits", int, default=1, help="splits", low=1, high=16),)

    def cost_at_us(self, p: dict[str, Any], context_len: int) -> float:
        best = -(-context_len // 4)
        return 200.0 * (1 + 0.6 * abs(math.log2(p["num_kv_splits"] / best)))


class WaveTrapBackend(_Synthetic):
    """Splits 1-64 of a kernel that runs 8 programs at once, ``ceil(qo_len x heads / 16)`` per
    split: more splits are always faster here (``100 + 3000 / splits`` µs), also beyond one wave, as
    17 splits at batch 16 looked at the H200's tuned lengths and were not at the held-out ones.
    Only the wave cap keeps the tuner below ``8 / (batch x tiles)`` splits."""

    name = "test-wave-trap"
    params = (ParamSpec("num_kv_splits", int, default=1, help="splits", low=1, high=64),)
    RESIDENT = 8

    def resident_programs(self, shape: MLADecodeShape, params: dict[str, Any]) -> int | None:
        return self.RESIDENT

    def split_programs(self, shape: MLADecodeShape, params: dict[str, Any]) -> int:
        return -(-shape.qo_len * shape.num_heads // 16)

    def cost_us(self, p: dict[str, Any]) -> float:
        return 100.0 + 3000.0 / p["num_kv_splits"]


class TiledBackend(_Synthetic):
    """Splits 1-64 of a kernel that walks each split in 4-token tiles and runs 16 programs at once,
    two per "SM": ``100 x tiles per split (x 2.2 past 8 splits, SMs shared) + 25 x splits`` µs,
    a split being ``ceil(L / S)`` tokens.  The fastest count at every length is then the whole-tile
    rule capped at 8 (the fewest tiles per split within one program per SM, as few splits as carry
    them), which neither one fixed count nor a ``clamp(ceil(L / t), 1, n)`` rule follows over
    65-256 tokens (65: 6 splits of 3 tiles; 128: 8 of 4)."""

    name = "test-tiles"
    params = (ParamSpec("num_kv_splits", int, default=1, help="splits", low=1, high=64),)
    TILE, RESIDENT = 4, 16

    def resident_programs(self, shape: MLADecodeShape, params: dict[str, Any]) -> int | None:
        return self.RESIDENT

    def split_tile_tokens(self, shape: MLADecodeShape, params: dict[str, Any]) -> int | None:
        return self.TILE

    def cost_at_us(self, p: dict[str, Any], context_len: int) -> float:
        splits = p["num_kv_splits"]
        tiles = -(-(-(-context_len // splits)) // self.TILE)
        return 100.0 * tiles * (1.0 if splits <= self.RESIDENT // 2 else 2.2) + 25.0 * splits


class SteppedBackend(_Synthetic):
    """Splits 1-12 and a launch parameter, whose best count falls from 10 to 3 at 512 tokens (as the
    H200's gluon-splitkv's best count at batch 1 went 28, 23, 54 over three lengths of one bucket):
    each split away from it costs 50%, ``pdl`` 1 costs 50% more than its default 0.  A bucket
    (256, 1024] then has no count, and no rule growing with the length, within 3% at both ends."""

    name = "test-steps"
    params = (ParamSpec("num_kv_splits", int, default=1, help="splits", low=1, high=12),
              ParamSpec("pdl", int, default=0, help="a launch parameter", low=0, high=1))
    STEP = 512

    def cost_at_us(self, p: dict[str, Any], context_len: int) -> float:
        best = 10 if context_len <= self.STEP else 3
        return 200.0 * (1 + 0.5 * abs(p["num_kv_splits"] - best)) * (1.5 if p.get("pdl") else 1.0)


CLASSES = (LaunchParamsBackend, FastWrongBackend, FlatBackend, LengthScaledBackend, WaveTrapBackend, TiledBackend,
           SteppedBackend)


def register_all() -> None:
    """Register the test backends (again after :func:`unregister_all`)."""
    for cls in CLASSES:
        if cls.name not in registry._REGISTRY:
            registry.register(cls)


def unregister_all() -> None:
    for cls in CLASSES:
        registry._REGISTRY.pop(cls.name, None)
        registry._INSTANCES.pop(cls.name, None)


# A worker process started by the tuner imports this module through MLABENCH_WORKER_IMPORTS: it
# registers the backends then.  In the test process the package fixture does it, so that merely
# collecting these tests leaves other packages' tests with the built-in backends only.
if MODULE in os.environ.get("MLABENCH_WORKER_IMPORTS", "").split(","):
    register_all()
