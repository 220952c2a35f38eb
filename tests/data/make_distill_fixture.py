"""Writes tests/data/distill_loss.json: the distillation loss and its logit gradient in float64,
computed with PyTorch's own functions as DistilBERT's training code combines them
(examples/research_projects/distillation: KLDivLoss of log_softmax(student / T) against
softmax(teacher / T), times T^2, plus the cross-entropy with ignore_index -100):

    loss_i = (1 - alpha) * CE(z_i, target_i) + alpha * T^2 * sum_j q_ij (log q_ij - log p_ij),
    q = softmax(t / T), p = softmax(z / T); 0 for ignored rows,

and dlogits = d(dloss * sum_i loss_i) / dz by autograd, for several (alpha, T) including the
ends of alpha's range and temperatures below and above 1. Rows are wide-ranged (one with a
dominant logit, one nearly uniform) and one row is ignored.

Run with Debian's python3-torch:  /usr/bin/python3 tests/data/make_distill_fixture.py
"""
import json
import os

import torch
import torch.nn.functional as F

DT = torch.float64
N, V = 7, 53
torch.manual_seed(7)
z = torch.randn(N, V, dtype=DT) * 3.0
t = torch.randn(N, V, dtype=DT) * 2.0 + 0.5 * z
z[1, 5] += 12.0           # a dominant logit
t[2] = t[2] * 0.01        # a nearly uniform teacher row
z, t = z.float().double(), t.float().double()   # the float32 inputs the kernels read, exactly
targets = torch.randint(0, V, (N,))
targets[4] = -100         # an ignored row
DLOSS = 0.25

cases = []
for alpha, temp in [(0.5, 2.0), (0.0, 1.0), (1.0, 1.0), (0.3, 0.5), (0.9, 4.0)]:
    zz = z.clone().requires_grad_(True)
    valid = targets != -100
    ce = F.cross_entropy(zz, targets, ignore_index=-100, reduction="none")
    kl = F.kl_div(F.log_softmax(zz / temp, dim=-1), F.softmax(t / temp, dim=-1), reduction="none").sum(-1)
    loss = ((1 - alpha) * ce + alpha * temp * temp * kl) * valid
    (DLOSS * loss.sum()).backward()
    cases.append({"alpha": alpha, "temperature": temp, "losses": loss.detach().tolist(),
                  "kl": (kl * valid).detach().tolist(), "dlogits": zz.grad.flatten().tolist()})

out = {"N": N, "V": V, "dloss": DLOSS, "logits": z.flatten().tolist(), "teacher": t.flatten().tolist(),
       "targets": targets.tolist(), "cases": cases}
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "distill_loss.json")
with open(path, "w") as f:
    json.dump(out, f)
print("wrote", path)
