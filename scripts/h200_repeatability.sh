#!/usr/bin/env bash
# Issue 13 on one GPU (written for an H200, about 8 minutes): (a) where a point's run-to-run
# difference comes from (placement, time, launch: noise.md/json), (b) per-call time against the calls
# a graph replay holds, (c) the kimi-k3-tp8 sweep twice in a row, (d) `mlabench diff` of the two.
#   bash scripts/h200_repeatability.sh OUTDIR
# Writes OUTDIR/amortisation.{md,json}, OUTDIR/sweep-1.md, sweep-2.md, the two run folders under
# OUTDIR/runs/, OUTDIR/diff.md (summary and the points that differ) and diff.json (every point);
# prints a short summary last.  SWEEPS_ONLY=1 runs only the two sweeps and the diff; SWEEP_FLAGS adds
# flags to both sweeps (e.g. SWEEP_FLAGS="--graph-captures 4").  FLASHMLA_WHEEL=path installs FlashMLA first (no network needed).
set -uo pipefail
out="${1:?usage: $0 OUTDIR}"
mkdir -p "$out/runs"
export COLUMNS=200
mlabench=(python3 -m mlabench)
if [[ -n "${FLASHMLA_WHEEL:-}" ]]; then
  python3 -m pip install --quiet --no-deps "$FLASHMLA_WHEEL" || echo "FlashMLA wheel not installed" >&2
fi
start=$SECONDS
if [[ "${SWEEPS_ONLY:-0}" != 1 ]]; then  # SWEEPS_ONLY=1: only (c) and (d)
# Placement check: the same streaming reads over six 4 GiB buffers held at once in one process.
# A spread here (not a drift in time) is what min_copies averages over (mlabench/timing.py).
python3 - > "$out/placement.md" <<'PY'
import statistics, torch
from mlabench.bandwidth import _median_us
from mlabench.device import current_device
from mlabench.kernels.stream_read import STREAM_PROGRAMS_PER_SM, stream_sum
dev = current_device()
size = 4 << 30
bufs = [torch.empty(size // 4, dtype=torch.float32, device="cuda").uniform_() for _ in range(6)]
part = torch.empty(STREAM_PROGRAMS_PER_SM * dev.num_sms, device="cuda")
rows = []
for rnd in range(2):
    for i, x in enumerate(bufs):
        amax = size / _median_us(lambda: torch.amax(x), dev, 10, 3) / 1e6
        tsum = size / _median_us(lambda: stream_sum(x, part), dev, 10, 3) / 1e6
        rows.append((rnd, i, amax, tsum))
print("| round | buffer | torch.amax TB/s | Triton stream TB/s |\n|---|---|---|---|")
for rnd, i, a, t in rows:
    print(f"| {rnd} | {i} | {a:.3f} | {t:.3f} |")
ts = [t for *_, t in rows]
print(f"\nTriton stream: min {min(ts):.3f}, max {max(ts):.3f}, spread {100 * (max(ts) / min(ts) - 1):.2f}% "
      f"over 6 buffers x 2 rounds (a spread between buffers that repeats across rounds is placement)")
PY
tail -n 1 "$out/placement.md"
python3 scripts/gpu_noise_sources.py --out "$out/noise.json" > "$out/noise.md" || { cat "$out/noise.md"; exit 1; }
echo "noise sources: $((SECONDS - start)) s"
python3 scripts/gpu_replay_amortisation.py --out "$out/amortisation.json" > "$out/amortisation.md" \
  || { cat "$out/amortisation.md"; exit 1; }
echo "amortisation: $((SECONDS - start)) s"
fi
for i in 1 2; do
  t=$SECONDS
  # shellcheck disable=SC2086  # SWEEP_FLAGS is a list of flags, split on spaces
  "${mlabench[@]}" sweep --config configs/sweeps/kimi-k3-tp8.toml ${SWEEP_FLAGS:-} --results-dir "$out/runs" --markdown \
    > "$out/sweep-$i.md" 2> "$out/sweep-$i.log" || { tail -n 20 "$out/sweep-$i.log"; exit 1; }
  echo "sweep $i: $((SECONDS - t)) s"
done
mapfile -t runs < <(ls -d "$out"/runs/kimi-k3-tp8-* | sort)
"${mlabench[@]}" diff "${runs[0]}" "${runs[1]}" --markdown > "$out/diff.md"
"${mlabench[@]}" diff "${runs[0]}" "${runs[1]}" --all --json > "$out/diff.json"
echo "total: $((SECONDS - start)) s"
echo; [[ -f "$out/amortisation.md" ]] && cat "$out/amortisation.md"
python3 - "$out" "${runs[@]}" <<'PY'
import json, sys
from pathlib import Path
out, runs = Path(sys.argv[1]), sys.argv[2:]
summary, points = json.load(open(out / "diff.json"))[:2]
allrow = summary["rows"][-1]
print(f"\n== issue 13 target: two kimi-k3-tp8 sweeps ({', '.join(Path(r).name for r in runs)})")
print(f"points compared {allrow['points']}; of the {allrow['points_over_min']} of >= 20 us: "
      f"{100 * allrow['within_1pct']:.1f}% within 1% (target >= 95%), {100 * allrow['within_2pct']:.1f}% within 2%, "
      f"worst {100 * allrow['worst']:.2f}% (target <= 2%)")
sig = allrow["significant_slower"] + allrow["significant_faster"]
print(f"significant differences: {sig} ({allrow['significant_slower']} slower, {allrow['significant_faster']} faster) "
      f"= {100 * sig / max(1, allrow['points']):.1f}% of points (target <= 5%); geomean B/A {allrow['geomean_ratio']:.4f}")
big = sorted((r for r in points["rows"] if r["a_us"] >= 20), key=lambda r: -abs(r["ratio"] - 1))[:5]
for r in big:
    print(f"  {r['backend']} B={r['batch']} L={r['context']} {r['params']}: {r['a_us']:.1f} vs {r['b_us']:.1f} us "
          f"({100 * (r['ratio'] - 1):+.2f}%, z {r['z']:.1f})")
for run in runs:
    m = json.load(open(Path(run) / "manifest.json"))
    d, w = m.get("drift") or {}, (m.get("warmups") or [{}])[0]
    noise = "n/a" if d.get("repeat_noise") is None else f"{100 * d['repeat_noise']:.2f}%"
    print(f"{Path(run).name}: warm-up {w.get('reason')} ({w.get('sm_clock_mhz')} MHz); read "
          f"{m.get('read_bandwidth_tbps') or 0:.2f} / copy {m['copy_bandwidth_tbps']:.2f} / datasheet "
          f"{m.get('datasheet_bandwidth_tbps')} TB/s; sentinel drift max {100 * d.get('max_abs_drift', 0):.2f}%, "
          f"repeat noise {noise}{' DRIFTING' if d.get('drifting') else ''}")
PY
