"""Writes tests/data/gptq_tiny.safetensors: GPTQ (Frantar et al. 2022, "GPTQ: Accurate
Post-Training Quantization for Generative Pre-trained Transformers") on one small layer, in
float64, written from the paper's Algorithm 1 without its lazy batches: after each column the
error is spread over every later column at once, the plainest form of the method (memfit's solver
batches the updates by blocks, the same arithmetic in another order).

The layer: W [16, 64] = randn, and inputs X [64, 512] with correlated rows (X = A Z, A = I + 0.3
randn, Z = randn; torch.manual_seed(5)); one input is never active (row 37 of X is zero), so its
weights become 0. H = 2 X X^T / 512, rounded to float32 (what memfit's calibration accumulates
in), then used in float64.

Algorithm (for each case):
    dead inputs (H_ii = 0): H_ii = 1, W[:, i] = 0
    act-order: perm = argsort(diag H, descending, stable); W, H permuted
    H += damp * mean(diag H) I                             damp = 0.01
    U = cholesky(H^-1, upper)                               H^-1 = U^T U
    for j in 0 .. in - 1:
        if j % group == 0: scale, zero of every row from W[:, j : j + group] (as updated)
        q = clamp(round(W[:, j] / scale) + zero, 0, maxq)
        e = (W[:, j] - scale (q - zero)) / U[j, j]
        W[:, j + 1:] -= e U[j, j + 1:]
The grid (GPTQ's quantizer): lo = min(0, min), hi = max(0, max); symmetric: hi = max(|lo|, hi),
lo = -hi if lo < 0; lo = hi = 0 becomes [-1, 1]; scale = (hi - lo) / maxq rounded to float16
(what the file stores; used so), zero = (maxq + 1) / 2 symmetric, else clamp(round(-lo / scale),
1, maxq) (the v1 format stores zero - 1). round: half to even.

Cases: 0: 4 bits, groups of 16, symmetric; 1: 4 bits, groups of 16, asymmetric, act-order;
2: 4 bits, one group per row (group_size -1), symmetric; 3: 8 bits, groups of 32, symmetric.
The file holds W [16, 64] F32, H [64, 64] F32 and per case k: case{k}.codes [16, 64] I32 (input
order), case{k}.scales [groups, 16] F32 (the float16 values, exactly), case{k}.zeros [groups, 16]
I32, case{k}.g_idx [64] I32; the cases' options in the metadata.

Run with Debian's python3-torch:  /usr/bin/python3 tests/data/make_gptq_fixture.py
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_llama_family_fixtures as M  # noqa: E402  (the file writer)

OUT, IN, SAMPLES = 16, 64, 512
CASES = [
    {"bits": 4, "group": 16, "sym": True, "desc_act": False},
    {"bits": 4, "group": 16, "sym": False, "desc_act": True},
    {"bits": 4, "group": -1, "sym": True, "desc_act": False},
    {"bits": 8, "group": 32, "sym": True, "desc_act": False},
]


def grid(x, bits, sym):
    maxq = 2 ** bits - 1
    lo = torch.clamp(x.min(dim=1).values, max=0.0)
    hi = torch.clamp(x.max(dim=1).values, min=0.0)
    if sym:
        hi = torch.maximum(lo.abs(), hi)
        lo = torch.where(lo < 0, -hi, lo)
    both = (lo == 0) & (hi == 0)
    lo = torch.where(both, -torch.ones_like(lo), lo)
    hi = torch.where(both, torch.ones_like(hi), hi)
    scale = ((hi - lo) / maxq).to(torch.float32).to(torch.float16).to(torch.float64)
    if sym:
        zero = torch.full_like(scale, float((maxq + 1) // 2))
    else:
        zero = torch.clamp(torch.round(-lo / scale), 1, maxq)
    return scale, zero


def gptq(W, H, bits, group, sym, desc_act, damp=0.01):
    W, H = W.clone(), H.clone()
    n = W.shape[1]
    group = n if group <= 0 else group
    maxq = 2 ** bits - 1
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    perm = torch.arange(n)
    if desc_act:
        perm = torch.sort(torch.diag(H), descending=True, stable=True).indices
        W, H = W[:, perm], H[perm][:, perm]
    H += damp * torch.mean(torch.diag(H)) * torch.eye(n, dtype=torch.float64)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    G = n // group
    codes = torch.zeros_like(W, dtype=torch.int64)
    scales = torch.zeros(G, W.shape[0], dtype=torch.float64)
    zeros = torch.zeros(G, W.shape[0], dtype=torch.int64)
    for j in range(n):
        if j % group == 0:
            s, z = grid(W[:, j:j + group], bits, sym)
            scales[j // group], zeros[j // group] = s, z.to(torch.int64)
        s, z = scales[j // group], zeros[j // group].to(torch.float64)
        q = torch.clamp(torch.round(W[:, j] / s) + z, 0, maxq)
        codes[:, j] = q.to(torch.int64)
        e = (W[:, j] - s * (q - z)) / U[j, j]
        W[:, j + 1:] -= e.unsqueeze(1) * U[j, j + 1:].unsqueeze(0)
    g_idx = torch.zeros(n, dtype=torch.int64)
    g_idx[perm] = torch.arange(n) // group
    out_codes = torch.zeros_like(codes)
    out_codes[:, perm] = codes
    return out_codes, scales, zeros, g_idx


def main():
    torch.manual_seed(5)
    W = torch.randn(OUT, IN, dtype=torch.float64).to(torch.float32)
    A = torch.eye(IN, dtype=torch.float64) + 0.3 * torch.randn(IN, IN, dtype=torch.float64)
    X = A @ torch.randn(IN, SAMPLES, dtype=torch.float64)
    X[37] = 0
    H = (2 * X @ X.T / SAMPLES).to(torch.float32)
    tensors = {"W": W, "H": H}
    for k, c in enumerate(CASES):
        codes, scales, zeros, g_idx = gptq(W.double(), H.double(), c["bits"], c["group"], c["sym"], c["desc_act"])
        tensors[f"case{k}.codes"] = codes
        tensors[f"case{k}.scales"] = scales
        tensors[f"case{k}.zeros"] = zeros
        tensors[f"case{k}.g_idx"] = g_idx
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gptq_tiny.safetensors")
    M.write_safetensors(path, tensors, {"cases": json.dumps(CASES)})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
