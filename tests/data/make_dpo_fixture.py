"""Writes tests/data/dpo_tiny.safetensors: DPO (Rafailov et al. 2023, "Direct Preference
Optimization") on the tiny LLaMA of llama_tiny.safetensors, in float64, with TRL's DPOTrainer
conventions (dpo_loss, get_batch_logps, the logged metrics), by the model of
make_llama_family_fixtures.py.

The policy is llama_tiny's parameters; the frozen reference is policy + 0.02 randn
(torch.manual_seed(11), one draw per tensor in the file's order), rounded to float32. The batch
holds B = 4 rows of T = 16: rows 2i and 2i+1 are pair i's chosen and rejected answers to one
shared prompt. targets[t] = input_ids[t + 1] where that token is an answer token, else -100
(prompt, last position, padding: token 0). Pair 0's answers differ in length and end in padding;
pair 1's fill the row. For each row, by policy and by reference,

    logp = sum over t with targets[t] != -100 of log_softmax(logits[t])[targets[t]],   n = how many.

With pc, pr, rc, rr the policy's and the reference's logps of chosen and rejected (for ipo the
means logp / n, TRL's average_log_prob), per pair

    h = (pc - rc) - (pr - rr)
    sigmoid: -(1 - ls) logsigmoid(beta h) - ls logsigmoid(-beta h)
    ipo:     (h - 1 / (2 beta))^2
    hinge:   relu(1 - beta h)

and loss = the mean over pairs. Cases: sigmoid (beta 0.1, ls 0), sigmoid (0.5, 0.1), ipo (0.1)
and hinge (0.5: beta h = 0.36 and 1.47, so pair 0 lies inside the hinge and pair 1 past it, at
zero loss and gradient; 0.1 would leave both inside). Metrics as TRL logs them, means over
pairs: rewards/chosen = beta (pc - rc), rewards/rejected = beta (pr - rr), rewards/margins = their
difference, rewards/accuracies = [chosen > rejected], logps/chosen = pc, logps/rejected = pr (all
with the logps the loss used: means for ipo).

The fixture holds the policy under its Hugging Face names, the reference as reference.<name>,
input_ids, targets, n_targets, and per case k case{k}.loss [1], case{k}.policy_logps and
case{k}.reference_logps [B] (sums over the row's targets) and case{k}.grad.<name>, d loss /
d policy by autograd; float32 and int32, the cases and their metrics in the metadata.

Run with Debian's python3-torch:  /usr/bin/python3 tests/data/make_dpo_fixture.py
"""
import json
import os
import struct
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_llama_family_fixtures as M  # noqa: E402  (the model and the file writer)

HERE = os.path.dirname(os.path.abspath(__file__))
B, T = 4, 16
HINGE_BETA = 0.5   # beta h = 0.36 and 1.47: pair 0 inside the hinge, pair 1 past it (zero loss)
CASES = [("sigmoid", 0.1, 0.0), ("sigmoid", 0.5, 0.1), ("ipo", 0.1, 0.0), ("hinge", HINGE_BETA, 0.0)]
# (prompt length, length of the chosen row, length of the rejected row), per pair; rows pad to T.
PAIRS = [(5, 12, 15), (3, T, T)]


def read_safetensors(path):
    """({name: tensor}, metadata) of a file holding F32 and I32 tensors, in the file's order."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__")
    out = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        dtype = {"F32": torch.float32, "I32": torch.int32}[h["dtype"]]
        out[name] = torch.frombuffer(bytearray(blob[8 + n + a:8 + n + b]), dtype=dtype).reshape(h["shape"])
    return out, meta


def batch(vocab):
    """input_ids [B, T] (answers drawn from 1..vocab-1, padding 0), targets [B, T]."""
    ids = torch.zeros(B, T, dtype=torch.int64)
    targets = torch.full((B, T), -100, dtype=torch.int64)
    for i, (prompt, *lengths) in enumerate(PAIRS):
        shared = torch.randint(1, vocab, (prompt,))
        for r, length in enumerate(lengths):
            row = 2 * i + r
            ids[row, :prompt] = shared
            ids[row, prompt:length] = torch.randint(1, vocab, (length - prompt,))
            targets[row, prompt - 1:length - 1] = ids[row, prompt:length]
        while ids[2 * i, prompt] == ids[2 * i + 1, prompt]:   # the answers differ from their first token
            ids[2 * i + 1, prompt] = torch.randint(1, vocab, ())
            targets[2 * i + 1, prompt - 1] = ids[2 * i + 1, prompt]
    return ids, targets


def row_logps(p, ids, targets):
    """Per row, the sum over trained targets of log_softmax(logits)[target] (TRL's get_batch_logps)."""
    logp = torch.log_softmax(M.forward(p, ids), dim=-1)
    mask = targets != -100
    picked = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (picked * mask).sum(-1)


def dpo(policy_sum, reference_sum, n, loss_type, beta, ls):
    """(loss, metrics) of TRL's dpo_loss over rows 2i (chosen) and 2i+1 (rejected)."""
    pol, ref = (policy_sum / n, reference_sum / n) if loss_type == "ipo" else (policy_sum, reference_sum)
    pc, pr, rc, rr = pol[0::2], pol[1::2], ref[0::2], ref[1::2]
    h = (pc - rc) - (pr - rr)
    if loss_type == "sigmoid":
        losses = -(1 - ls) * F.logsigmoid(beta * h) - ls * F.logsigmoid(-beta * h)
    elif loss_type == "ipo":
        losses = (h - 1 / (2 * beta)) ** 2
    else:
        losses = torch.relu(1 - beta * h)
    chosen, rejected = (beta * (pc - rc)).detach(), (beta * (pr - rr)).detach()
    metrics = {"rewards/chosen": chosen.mean().item(), "rewards/rejected": rejected.mean().item(),
               "rewards/margins": (chosen - rejected).mean().item(),
               "rewards/accuracies": (chosen > rejected).double().mean().item(),
               "logps/chosen": pc.detach().mean().item(), "logps/rejected": pr.detach().mean().item()}
    return losses.mean(), metrics, (beta * h).detach()


def main():
    model, meta = read_safetensors(os.path.join(HERE, "llama_tiny.safetensors"))
    config = json.loads(meta["config"])
    M.configure(config)
    M.B, M.T = B, T
    names = [n for n in model if n.startswith(("model.", "lm_head."))]
    policy = {n: model[n].double().requires_grad_() for n in names}
    torch.manual_seed(11)
    reference = {n: (policy[n].detach() + 0.02 * torch.randn(policy[n].shape, dtype=M.DT)).float().double()
                 for n in names}
    ids, targets = batch(M.V)
    n = (targets != -100).sum(-1).to(M.DT)
    assert len(set(n.tolist())) > 1 and (ids[0] != 0).sum() != (ids[1] != 0).sum()
    with torch.no_grad():
        reference_sum = row_logps(reference, ids, targets)

    out = {n_: t.detach() for n_, t in policy.items()}
    out.update({"reference." + n_: t for n_, t in reference.items()})
    out["input_ids"], out["targets"], out["n_targets"] = ids.int(), targets.int(), n.int()
    cases = []
    for k, (loss_type, beta, ls) in enumerate(CASES):
        policy_sum = row_logps(policy, ids, targets)
        loss, metrics, scaled = dpo(policy_sum, reference_sum, n, loss_type, beta, ls)
        grads = torch.autograd.grad(loss, [policy[n_] for n_ in names])
        if loss_type == "hinge":   # one pair on each side of the hinge, away from the kink
            inside = 1 - scaled
            assert (inside > 0.05).any() and (inside < -0.05).any(), inside
        # finite difference of the largest entry of one gradient, in float64
        name = names[(3 * k + 2) % len(names)]
        g = grads[names.index(name)]
        j = g.abs().argmax().item()
        eps, w = 1e-5, policy[name].detach().view(-1)
        with torch.no_grad():
            w[j] += eps
            up = dpo(row_logps(policy, ids, targets), reference_sum, n, loss_type, beta, ls)[0]
            w[j] -= 2 * eps
            down = dpo(row_logps(policy, ids, targets), reference_sum, n, loss_type, beta, ls)[0]
            w[j] += eps
        fd = ((up - down) / (2 * eps)).item()
        rel = abs(fd - g.view(-1)[j].item()) / abs(g.view(-1)[j].item())
        assert rel < 1e-6, (k, name, j, fd, g.view(-1)[j].item())
        out[f"case{k}.loss"] = loss.detach().reshape(1)
        out[f"case{k}.policy_logps"] = policy_sum.detach()
        out[f"case{k}.reference_logps"] = reference_sum
        for n_, g_ in zip(names, grads):
            out[f"case{k}.grad.{n_}"] = g_
        cases.append({"loss_type": loss_type, "beta": beta, "label_smoothing": ls, "loss": loss.item(), **metrics,
                      "logps": "mean over the row's targets" if loss_type == "ipo" else "sum over the row's targets"})
        print(f"case{k} {loss_type} beta {beta} ls {ls}: loss {loss.item():.12g}, beta*h {scaled.tolist()}, "
              f"finite difference {name}[{j}] rel. error {rel:.2e}")

    meta = {"family": "llama", "config": meta["config"], "batch": str(B), "seq": str(T), "ignore_index": "-100",
            "pairs": "rows 2i chosen, 2i+1 rejected", "cases": json.dumps(cases),
            "reference_model": "reference.<name>: policy + 0.02 randn (torch.manual_seed(11)), float32",
            "grads": "every case, every policy parameter; the reference frozen",
            "reference": f"float64 PyTorch {torch.__version__}, TRL's dpo_loss formulas"}
    path = os.path.join(HERE, "dpo_tiny.safetensors")
    M.write_safetensors(path, out, meta)
    size = os.path.getsize(path)
    assert size < 3_200_000, size
    print(f"wrote {path}: {size} bytes, n_targets {n.int().tolist()}")


if __name__ == "__main__":
    main()
