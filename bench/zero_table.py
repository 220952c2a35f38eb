"""Tabulates bench/zero_memory.sh: measured bytes per rank (max over ranks) per category, the
plan's prediction, and the model states against ZeRO's formulas."""
import json
import sys

out, ranks = sys.argv[1], [int(n) for n in sys.argv[2].split()]
precisions = sys.argv[3].split() if len(sys.argv) > 3 else ["fp32", "bf16"]
STATES = ["parameters", "master_weights", "gradients", "optimizer_states"]
CATS = STATES + ["activations", "workspace", "communication"]


def mib(b):
    return f"{b / 2**20:.1f}"


def formula(prec, n, zero, psi):
    if prec == "bf16":
        return [16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n][zero]
    return [16 * psi, 8 * psi + 8 * psi / n, 4 * psi + 12 * psi / n, 16 * psi / n][zero]


print("MiB per rank: measured peak live (max over ranks) / plan. states = P + M + G + O; "
      "formula = ZeRO's model states; ratio = measured states / formula.")
print("| precision | N | ZeRO | " + " | ".join(CATS) + " | states | formula | ratio | ranks min..max total |")
print("|---" * (len(CATS) + 7) + "|")
for prec in precisions:
    for n in ranks:
        for zero in range(4):
            cell = f"{out}/{prec}-n{n}-z{zero}"
            s = json.load(open(f"{cell}/summary.json"))
            plan = json.load(open(f"{cell}.plan.json"))
            best = plan["best"][0] if "best" in plan else plan["results"][0]
            pdev = best["memory"]["per_device"]
            psi = s["config"]["params"]
            if "per_rank" in s:
                live = {c: s["per_rank"]["peak_live"][c]["max"] for c in CATS}
                tot = s["per_rank"]["peak_live_total"]
                span = f"{mib(tot['min'])}..{mib(tot['max'])}"
            else:
                live = {c: s["measured"]["peak_live"][c] for c in CATS}
                span = "-"
            states = sum(live[c] for c in STATES)
            f = formula(prec, n, zero, psi)
            cells = [f"{mib(live[c])} / {mib(pdev.get(c, 0))}" for c in CATS]
            print(f"| {prec} | {n} | {zero} | " + " | ".join(cells) +
                  f" | {mib(states)} | {mib(f)} | {states / f:.3f} | {span} |")
