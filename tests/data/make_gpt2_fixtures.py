"""Writes the reference fixture for `memfit verify` of a tiny GPT-2 with the exact GELU
(activation_function "gelu": x Phi(x), transformers' GELUActivation, torch.nn.functional.gelu),
computed in float64 by the model written out below after transformers' modeling_gpt2.py (Conv1D
projections y = x W + b with W [in, out], LayerNorm with bias, causal attention scaled by
1/sqrt(head_dim), the LM head tied to wte, cross-entropy with ignore_index -100) and
torch.optim.AdamW for two steps:
  tests/data/gpt2_gelu_tiny.safetensors
The format, the AdamW hyperparameters and the writer are make_llama_family_fixtures.py's.

Run with Debian's python3-torch:  /usr/bin/python3 tests/data/make_gpt2_fixtures.py
"""
import json
import math
import os

import torch

from make_llama_family_fixtures import ADAMW, write_safetensors

DT = torch.float64
GPT2_GELU = {
    "model_type": "gpt2", "vocab_size": 101, "n_positions": 32, "n_embd": 64, "n_layer": 2, "n_head": 4,
    "layer_norm_epsilon": 1e-5, "activation_function": "gelu", "tie_word_embeddings": True,
}
B, T = 2, 13


def layer_norm(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, GPT2_GELU["layer_norm_epsilon"])


def forward(p, ids):
    C, NH = GPT2_GELU["n_embd"], GPT2_GELU["n_head"]
    HD = C // NH
    x = p["wte.weight"][ids] + p["wpe.weight"][:T]
    mask = torch.full((T, T), float("-inf"), dtype=DT).triu(1)
    for l in range(GPT2_GELU["n_layer"]):
        h = f"h.{l}."
        a = layer_norm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"])
        q, k, v = (a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]).split(C, dim=-1)
        q, k, v = (t.view(B, T, NH, HD).transpose(1, 2) for t in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(HD) + mask, dim=-1)
        o = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + o @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"]
        m = layer_norm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"])
        f = torch.nn.functional.gelu(m @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"])   # exact (erf)
        x = x + f @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"]
    return layer_norm(x, p["ln_f.weight"], p["ln_f.bias"]) @ p["wte.weight"].T


def parameters():
    C, V, P = GPT2_GELU["n_embd"], GPT2_GELU["vocab_size"], GPT2_GELU["n_positions"]
    shapes = [("wte.weight", (V, C)), ("wpe.weight", (P, C))]
    for l in range(GPT2_GELU["n_layer"]):
        h = f"h.{l}."
        shapes += [(h + "ln_1.weight", (C,)), (h + "ln_1.bias", (C,)), (h + "attn.c_attn.weight", (C, 3 * C)),
                   (h + "attn.c_attn.bias", (3 * C,)), (h + "attn.c_proj.weight", (C, C)), (h + "attn.c_proj.bias", (C,)),
                   (h + "ln_2.weight", (C,)), (h + "ln_2.bias", (C,)), (h + "mlp.c_fc.weight", (C, 4 * C)),
                   (h + "mlp.c_fc.bias", (4 * C,)), (h + "mlp.c_proj.weight", (4 * C, C)), (h + "mlp.c_proj.bias", (C,))]
    shapes += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    p = {}
    for name, shape in shapes:
        if name.endswith(".bias"):
            t = 0.1 * torch.randn(shape, dtype=DT)
        elif len(shape) == 1:
            t = 1.0 + 0.1 * torch.randn(shape, dtype=DT)
        else:   # c_fc wider than GPT-2's 0.02, so that its outputs reach GELU's curved part and tails
            t = (0.3 if "c_fc" in name else 0.02) * torch.randn(shape, dtype=DT)
        p[name] = t.requires_grad_()
    return p


def main():
    torch.manual_seed(5)
    p = parameters()
    V = GPT2_GELU["vocab_size"]
    ids = torch.randint(0, V, (B, T))
    targets = torch.roll(ids, -1, dims=1)
    targets[0, 5] = targets[1, -1] = -100   # ignored positions
    out = {name: t.detach().clone() for name, t in p.items()}
    out["input_ids"], out["targets"] = ids.to(torch.int32), targets.to(torch.int32)
    names = list(p)
    opt = torch.optim.AdamW([{"params": [p[n] for n in names if p[n].dim() >= 2], "weight_decay": ADAMW["weight_decay"]},
                             {"params": [p[n] for n in names if p[n].dim() < 2], "weight_decay": 0.0}],
                            lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"])
    for step in (1, 2):
        logits = forward(p, ids)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        if step == 1:
            out["expected.logits"], out["expected.loss"] = logits.detach().clone(), loss.detach().clone()
            for n in names:
                out["expected.grad." + n] = p[n].grad.detach().clone()
        else:
            out["expected.loss_step2"] = loss.detach().clone()
        opt.step()
        for n in names:
            out[f"expected.step{step}." + n] = p[n].detach().clone()
    meta = {"family": "gpt2", "config": json.dumps(GPT2_GELU), "batch": str(B), "seq": str(T),
            "adamw": json.dumps(ADAMW), "decay": "parameters with 2 or more dimensions", "ignore_index": "-100",
            "reference": f"float64 PyTorch {torch.__version__}"}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt2_gelu_tiny.safetensors")
    write_safetensors(path, out, meta)
    print(f"wrote {path}: loss {out['expected.loss'].item():.6f}, step 2 {out['expected.loss_step2'].item():.6f}")


if __name__ == "__main__":
    main()
