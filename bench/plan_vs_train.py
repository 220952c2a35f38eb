"""The table of bench/plan_vs_train.sh: planned against measured step seconds per cell."""
import json
import statistics
import sys

cells, calibration = sys.argv[1], sys.argv[2]
cal = json.load(open(calibration))
print(f"machine: {cal.get('cpu', '?')}, {cal.get('threads', '?')} threads; calibrated fp32 gemm "
      f"{cal['fp32_gflops']:.0f} GFLOP/s, triad {cal['mem_bw_gbs']:.1f} GB/s")
print("| model | batch x seq | precision | recompute | planned s | measured s | planned / measured |")
print("|---|---|---|---|---|---|---|")
worst = 0.0
for line in open(cells):
    cell, model, batch, seq, prec, rc = line.split()
    steps = [json.loads(l) for l in open(f"{cell}/metrics.jsonl") if '"ms"' in l]
    measured = statistics.median(s["ms"] for s in steps[1:]) / 1000
    plan = json.load(open(f"{cell}.plan.json"))
    planned = plan["best"][0]["time"]["step_s"]
    ratio = planned / measured
    worst = max(worst, abs(ratio - 1))
    print(f"| {model} | {batch} x {seq} | {prec} | {rc} | {planned:.3f} | {measured:.3f} | {ratio:.2f} |")
print(f"worst |planned / measured - 1| = {worst:.2f}")
