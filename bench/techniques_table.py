#!/usr/bin/env python3
"""Markdown table from `memfit bench` JSON lines (stdin): bench/memory_techniques.sh's output."""
import json
import sys

rows = []
for line in sys.stdin:
    line = line.strip()
    if line.startswith("{"):
        rows.append(json.loads(line))
if not rows:
    sys.exit("no bench JSON lines on stdin")


def gib(b):
    return f"{b / 2**30:.2f} GiB"


print("| precision | attention | recompute | B x T | planned peak (B) | measured peak | peak RSS | tokens/s | vs first row |")
print("|---|---|---|---|---|---|---|---|---|")
base = rows[0]["tokens_per_s"]
for r in rows:
    same = "= planned" if r["planned_peak_bytes"] == r["measured_peak_bytes"] else f"{r['measured_peak_bytes']:,}"
    print(f"| {r['precision']} | {r['attention']} | {r['recompute']} | {r['batch']} x {r['seq']} | "
          f"{r['planned_peak_bytes']:,} | {same} | {gib(r['peak_rss_bytes'])} | {r['tokens_per_s']:.1f} | "
          f"{r['tokens_per_s'] / base:.2f} |")
for r in rows:
    if r["precision"] == "bf16":
        print(f"\nmatmul probe (same process as the first bf16 row): fp32 {r['matmul_peak_gflops']:.1f} GFLOP/s, "
              f"bf16 storage (fp32 compute on converted tiles) {r['matmul_bf16_storage_gflops']:.1f}, "
              f"oneDNN native bf16 {r['matmul_bf16_onednn_gflops']:.1f}"
              + (" (0: oneDNN has no bf16 matmul for this CPU)" if r['matmul_bf16_onednn_gflops'] == 0 else
                 " (this CPU has bf16 arithmetic; memfit's gemms do not use it yet)"))
        break
