"""Print the markdown table of docs/correctness.md: relative errors of a correct split-KV and of
each deliberately broken one, per input set, on ``check``'s default shape (12 heads, softmax scale
576^-0.5, page size 64, one request, 16 splits), at 4096 and 32768 tokens.

Run from the repository root, on the CPU (about a minute per dtype):
``python3 scripts/verdict_mutant_table.py bfloat16 float16``
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlabench.measure import ShapeBench  # noqa: E402
from mlabench.shapes import MLADecodeShape  # noqa: E402
from mlabench.verdict import INPUT_SETS  # noqa: E402
from tests.core.mutant_kernels import Fault, MutantBackend  # noqa: E402

SPLITS = 16
FAULTS = {
    "correct": Fault(),
    "softmax scale +1%": Fault(scale=1.01),
    "softmax scale +5%": Fault(scale=1.05),
    "averaging merge": Fault(average_merge=True),
    "page 5 dropped": Fault(drop_page=5),
    "last 1/16 dropped": Fault(drop_tail_fraction=1 / 16),
    "first token of each split dropped": Fault(drop_split_firsts=True),
    "last token of each split doubled": Fault(double_split_lasts=True),
    "last valid token dropped": Fault(drop_last_token=True),
}


def table(dtype: str) -> str:
    """Markdown rows ``fault | length | set: rel RMSE / rel max err ...`` for ``dtype``."""
    lines = [f"| {dtype} | tokens | " + " | ".join(INPUT_SETS) + " |",
             "|---|---|" + "---|" * len(INPUT_SETS)]
    for length in (4096, 32768):
        shape = MLADecodeShape.create(num_heads=12, context_lens=(length,), page_size=64, q_dtype=dtype,
                                      kv_dtype=dtype)
        bench = ShapeBench(shape, seed=0, copies=1)
        for name, fault in FAULTS.items():
            _, v = bench.check(MutantBackend(fault), {"num_kv_splits": SPLITS})
            cells = [f"{s.rel_rmse:.4f} / {s.rel_max_err:.3f}{'' if s.passed else ' **fail**'}"
                     for s in (v.by_input_set[n] for n in INPUT_SETS)]
            lines.append(f"| {name} | {length} | " + " | ".join(cells) + " |")
        limits = v.by_input_set["random"]
    lines.append(f"\nLimits ({dtype}): relative RMSE {limits.rel_rmse_limit:.4g}, "
                 f"normalised max error {limits.rel_max_err_limit:.4g}.")
    return "\n".join(lines)


if __name__ == "__main__":
    for dt in sys.argv[1:] or ["bfloat16"]:
        print(table(dt) + "\n")
