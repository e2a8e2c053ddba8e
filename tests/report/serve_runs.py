"""A synthetic serve-bench run folder of several input lengths, for the serving figure's tests.

The TPOTs are those of results/h200/serving/README.md (vLLM 0.26, one H200, the Kimi K3 TP8 proxy):
3 variants (flashmla the baseline) at 4096, 32768 and 100000 input tokens and concurrency 1 and 16.
``triton`` runs only 4096 and 32768 (its own ``bench.random_input_len``): its 100000 is "not run".
"""

from __future__ import annotations

import json
from pathlib import Path

from mlabench.serving.config import ServeConfig
from mlabench.serving.results import BenchResult, MetricStats

LENS = [4096, 32768, 100000]
#: Mean TPOT, ms, per variant (config order), per (input length, concurrency).
TPOT_MS = {
    "mlabench": {(4096, 1): 6.31, (32768, 1): 6.76, (100000, 1): 7.64,
                 (4096, 16): 11.59, (32768, 16): 71.73, (100000, 16): 345.17},
    "flashmla": {(4096, 1): 8.12, (32768, 1): 9.33, (100000, 1): 10.41,
                 (4096, 16): 11.82, (32768, 16): 72.73, (100000, 16): 347.35},
    "triton": {(4096, 1): 10.38, (32768, 1): 11.73, (4096, 16): 23.14, (32768, 16): 93.41},
}


def serve_config(prediction: dict | None = None) -> ServeConfig:
    """The run's config: the three variants, flashmla the baseline, triton at two lengths only."""
    variants = [{"name": name, "base_url": f"http://127.0.0.1:{8100 + k}"}
                for k, name in enumerate(TPOT_MS)]
    variants[2]["bench"] = {"random_input_len": LENS[:2]}
    return ServeConfig.model_validate({
        "description": "Kimi K3 TP8 proxy, synthetic", "model": "proxy", "baseline": "flashmla",
        "concurrencies": [1, 16], "variants": variants, "prediction": prediction,
        "bench": {"random_input_len": LENS, "random_output_len": 128, "num_prompts": {1: 3, 16: 16}}})


def result(variant: str, input_len: int, concurrency: int, tpot_ms: float) -> BenchResult:
    """One ok result of every request (3 or 16 prompts of 128 tokens), ``tpot_ms`` as mean and median."""
    prompts = 3 if concurrency == 1 else 16
    return BenchResult(variant=variant, concurrency=concurrency, input_len=input_len, repeat=0, status="ok",
                       num_prompts=prompts, completed=prompts, total_output_tokens=128 * prompts,
                       tpot=MetricStats(mean_ms=tpot_ms, median_ms=tpot_ms))


def write_serve_run(folder: Path, name: str = "serve-20261204T160000Z-h200-synthetic",
                    prediction: dict | None = None, drop: tuple = ()) -> Path:
    """Write the run folder ``folder/name`` (manifest.json, results.jsonl) and return it; ``drop``:
    ``(variant, input_len, concurrency)`` points left unrecorded (missing results)."""
    run = folder / name
    run.mkdir(parents=True)
    manifest = {"kind": "serve-bench", "schema_version": 1, "started_utc": "2026-12-04T16:00:00+00:00",
                "config": serve_config(prediction).model_dump(mode="json")}
    (run / "manifest.json").write_text(json.dumps(manifest, indent=1))
    lines = [result(v, n, c, t).model_dump_json() for v, points in TPOT_MS.items()
             for (n, c), t in points.items() if (v, n, c) not in drop]
    (run / "results.jsonl").write_text("\n".join(lines) + "\n")
    return run


#: A committed H200 sweep of FlashMLA and gluon-splitkv at the three lengths, batch 1 and 16.
PREDICTION_SWEEP = Path(__file__).resolve().parents[2] / \
    "results/h200/deploy/kimi-k3-tp8/kimi-k3-tp8-gluon-flashmla-20261201-183956-973"
#: ``[prediction]`` of the run against :data:`PREDICTION_SWEEP`; triton has no kernel there.
PREDICTION = {"layers": 61, "reference": "flashmla", "short_input_len": 4096,
              "kernels": {"flashmla": {"backend": "flashmla"},
                          "mlabench": {"backend": "gluon-splitkv", "by_concurrency": {
                              1: {"num_kv_splits": 132}, 16: {"num_kv_splits": 16}}}}}
