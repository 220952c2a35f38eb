# Writes tests/data/galore_reference.json: GaLore with AdamW (Zhao et al. 2024, Algorithm 1: the
# gradient projected onto the top-r singular vectors of its shorter side, refreshed every T
# steps, Adam's bias-corrected moments in the projected space, the direction projected back and
# scaled by alpha), with decoupled weight decay as torch.optim.AdamW applies it, in float64 with
# torch from float32-representable inputs. Orientation as GaLore's projector: R < C takes the
# left singular vectors (Q G, r x C), else the right ones (G Q^T, R x r). An SVD leaves each
# vector's sign free and the moments carry over a refresh, so each row of Q is signed to make its
# largest-magnitude component positive (memfit's convention). Three matrices (left, right,
# square), five steps, a refresh every two. Run: python3 tests/data/make_galore_fixture.py
import json
import os

import torch

torch.manual_seed(11)
LR, B1, B2, EPS, ALPHA, GAP = 1e-2, 0.9, 0.95, 1e-8, 0.25, 2


def f32(t):
    return t.to(torch.float32).to(torch.float64)


def projector(g, r):
    U, S, Vh = torch.linalg.svd(g, full_matrices=False)
    q = U[:, :r].T.clone() if g.shape[0] < g.shape[1] else Vh[:r, :].clone()
    for k in range(r):
        big = int(torch.argmax(q[k].abs()))   # the first of equal magnitudes
        if q[k, big] < 0:
            q[k] = -q[k]
    return q


def case(name, shape, rank, wd):
    R, C = shape
    left = R < C
    p = f32(torch.randn(shape))
    init = p.clone()
    low_shape = (rank, C) if left else (R, rank)
    m, v = torch.zeros(low_shape, dtype=torch.float64), torch.zeros(low_shape, dtype=torch.float64)
    q = None
    grads, after = [], []
    for t in range(1, 6):
        g = f32(torch.randn(shape) * 0.1)
        if (t - 1) % GAP == 0:
            q = projector(g, rank)
        low = q @ g if left else g @ q.T
        m = B1 * m + (1 - B1) * low
        v = B2 * v + (1 - B2) * low * low
        n = (m / (1 - B1 ** t)) / ((v / (1 - B2 ** t)).sqrt() + EPS)
        d = q.T @ n if left else n @ q
        p = p * (1 - LR * wd) - LR * ALPHA * d
        grads.append(g.flatten().tolist())
        after.append(p.flatten().tolist())
    return {"name": name, "shape": list(shape), "rank": rank, "weight_decay": wd, "init": init.flatten().tolist(),
            "grads": grads, "after": after}


out = {"lr": LR, "beta1": B1, "beta2": B2, "eps": EPS, "scale": ALPHA, "update_gap": GAP,
       "cases": [case("left", (6, 20), 2, 0.1), case("right", (20, 8), 3, 0.0), case("square", (8, 8), 4, 0.1)]}
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "galore_reference.json")
with open(path, "w") as f:
    json.dump(out, f)
print("wrote", path)
