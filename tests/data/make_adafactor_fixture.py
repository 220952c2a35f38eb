# Writes tests/data/adafactor_reference.json: Adafactor (Shazeer & Stern 2018, Algorithms 4 and 5,
# with the update clipping of section 6, no first moment, a fixed step size, decoupled weight
# decay as transformers' Adafactor applies it) in float64 with torch, from float32-representable
# inputs: a 5 x 7 matrix (factored), a vector and a 1 x 6 matrix (whose factoring changes
# nothing), three steps, the second with ten times larger gradients so that the update's RMS is
# clipped; then the matrix again with a first moment (transformers' beta1 = 0.9: the clipped,
# lr-scaled update averaged, then applied). Run: python3 tests/data/make_adafactor_fixture.py
import json
import os

import torch

torch.manual_seed(7)
LR, DECAY_RATE, EPS1, CLIP = 1e-2, -0.8, 1e-30, 1.0


def f32(t):
    return t.to(torch.float32).to(torch.float64)


def step(p, g, state, t, wd, beta1):
    beta2t = 1.0 - t ** DECAY_RATE
    sq = g * g + EPS1
    if p.dim() == 2 and min(p.shape) >= 2:
        state["row"] = beta2t * state["row"] + (1 - beta2t) * sq.mean(dim=1)
        state["col"] = beta2t * state["col"] + (1 - beta2t) * sq.mean(dim=0)
        r = state["row"] / state["row"].mean()
        v_hat = r[:, None] * state["col"][None, :]   # the factored estimate of the second moment
    else:
        state["v"] = beta2t * state["v"] + (1 - beta2t) * sq
        v_hat = state["v"]
    u = g / v_hat.sqrt()
    rms = u.pow(2).mean().sqrt()
    u = u / max(1.0, float(rms) / CLIP)
    if beta1 == 0:
        return p - LR * wd * p - LR * u
    state["m"] = beta1 * state["m"] + (1 - beta1) * (LR * u)
    return p - LR * wd * p - state["m"]


def case(name, shape, wd, beta1=0.0):
    p = f32(torch.randn(shape))
    init = p.clone()
    st = {"row": torch.zeros(shape[0], dtype=torch.float64), "col": torch.zeros(shape[-1], dtype=torch.float64)} \
        if len(shape) == 2 and min(shape) >= 2 else {"v": torch.zeros(shape, dtype=torch.float64)}
    st["m"] = torch.zeros(shape, dtype=torch.float64)
    grads, after = [], []
    for t in (1, 2, 3):
        g = f32(torch.randn(shape) * (1.0 if t != 2 else 10.0) * 0.1)
        p = step(p, g, st, t, wd, beta1)
        grads.append(g.flatten().tolist())
        after.append(p.flatten().tolist())
    return {"name": name, "shape": list(shape), "weight_decay": wd, "beta1": beta1, "init": init.flatten().tolist(),
            "grads": grads, "after": after}


out = {"lr": LR, "decay_rate": DECAY_RATE, "eps1": EPS1, "clip_threshold": CLIP,
       "cases": [case("matrix", (5, 7), 0.1), case("vector", (7,), 0.0), case("one_row", (1, 6), 0.1),
                 case("matrix_beta1", (5, 7), 0.1, 0.9)]}
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "adafactor_reference.json")
with open(path, "w") as f:
    json.dump(out, f)
print("wrote", path)
