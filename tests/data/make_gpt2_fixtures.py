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
import math

import torch

from make_llama_family_fixtures import two_adamw_steps, write_fixture

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
    out = two_adamw_steps(p, lambda: forward(p, ids), ids, targets, V)
    write_fixture("gpt2_gelu_tiny.safetensors", out, "gpt2", GPT2_GELU, B, T)

if __name__ == "__main__":
    main()
