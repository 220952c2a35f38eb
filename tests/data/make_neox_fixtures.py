"""Writes reference fixtures for `memfit verify` of tiny GPT-NeoX / Pythia models (transformers'
GPTNeoXForCausalLM, model_type gpt_neox), computed in float64 by the model written out below after
transformers' modeling_gpt_neox.py (token embeddings only, LayerNorm with bias, query_key_value
fused per head: its output viewed as [heads, 3 x head_dim] with each head's q, k, v adjacent,
rotate-half RoPE on the first int(head_dim x rotary_pct) dimensions of q and k, causal attention
scaled by 1/sqrt(head_dim), exact-erf GELU MLP, biases everywhere, untied embed_out,
cross-entropy with ignore_index -100) and torch.optim.AdamW for two steps:
  tests/data/gpt_neox_tiny.safetensors             Pythia's form: use_parallel_residual (attention
                                                   and MLP both read the block's input,
                                                   x + attn(ln_in(x)) + mlp(ln_post(x))),
                                                   rotary_pct 0.25 (4 of 16 dimensions turn), base 1e4.
  tests/data/gpt_neox_sequential_tiny.safetensors  use_parallel_residual false (the MLP reads x after
                                                   the attention's residual add), rotary_pct 0.5
                                                   (8 of 16), rotary_emb_base 500.

The format, the AdamW hyperparameters, B and T, and the writer are make_llama_family_fixtures.py's
(the metadata's family is "llama", as for its other fixtures).

Run with Debian's python3-torch:  /usr/bin/python3 tests/data/make_neox_fixtures.py
With --check it also compares the attention with one built from q, k, v matrices de-interleaved
out of query_key_value (rotary_pct 1 and the fixtures'), and one gradient entry of each parameter
kind with central finite differences, and writes nothing.
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_llama_family_fixtures as base  # noqa: E402  (two_adamw_steps, write_fixture, B, T, ADAMW)

DT = torch.float64
NEOX = {
    "model_type": "gpt_neox", "vocab_size": 73, "hidden_size": 64, "intermediate_size": 256,
    "num_hidden_layers": 2, "num_attention_heads": 4, "rotary_pct": 0.25, "rotary_emb_base": 10000,
    "max_position_embeddings": 128, "layer_norm_eps": 1e-5, "use_parallel_residual": True,
    "hidden_act": "gelu", "tie_word_embeddings": False, "attention_bias": True,
}
NEOX_SEQUENTIAL = dict(NEOX, use_parallel_residual=False, rotary_pct=0.5, rotary_emb_base=500, vocab_size=61)
B, T = base.B, base.T


def dims(cfg):
    """(C, NH, head_dim, rotary_ndims)."""
    C, NH = cfg["hidden_size"], cfg["num_attention_heads"]
    hd = C // NH
    return C, NH, hd, int(hd * cfg["rotary_pct"])


def layer_norm(cfg, x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, cfg["layer_norm_eps"])


def cos_sin(cfg):
    """cos and sin [1, 1, T, rotary_ndims] at positions 0..T-1, each frequency twice (rotate-half)."""
    rd = dims(cfg)[3]
    inv = 1.0 / (cfg["rotary_emb_base"] ** (torch.arange(0, rd, 2, dtype=DT) / rd))
    freqs = torch.outer(torch.arange(T, dtype=DT), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[None, None], emb.sin()[None, None]


def turn(cfg, x, cos, sin):
    """The first rotary_ndims of each head turned, x_rot cos + rotate_half(x_rot) sin; the rest as is."""
    rd = dims(cfg)[3]
    r, rest = x[..., :rd], x[..., rd:]
    half = rd // 2
    r_half = torch.cat((-r[..., half:], r[..., :half]), dim=-1)
    return torch.cat((r * cos + r_half * sin, rest), dim=-1)


def attention(cfg, p, h, a):
    """GPTNeoXAttention of layer prefix h on the normed input a [B, T, C]."""
    C, NH, hd, _ = dims(cfg)
    qkv = (a @ p[h + "attention.query_key_value.weight"].T + p[h + "attention.query_key_value.bias"])
    qkv = qkv.view(B, T, NH, 3 * hd).transpose(1, 2)          # [B, NH, T, 3 hd]: per head q | k | v
    q, k, v = qkv[..., :hd], qkv[..., hd:2 * hd], qkv[..., 2 * hd:]
    cos, sin = cos_sin(cfg)
    q, k = turn(cfg, q, cos, sin), turn(cfg, k, cos, sin)
    mask = torch.full((T, T), float("-inf"), dtype=DT).triu(1)
    att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + mask, dim=-1)
    o = (att @ v).transpose(1, 2).reshape(B, T, C)
    return o @ p[h + "attention.dense.weight"].T + p[h + "attention.dense.bias"]


def mlp(p, h, m):
    up = m @ p[h + "mlp.dense_h_to_4h.weight"].T + p[h + "mlp.dense_h_to_4h.bias"]
    return torch.nn.functional.gelu(up) @ p[h + "mlp.dense_4h_to_h.weight"].T + p[h + "mlp.dense_4h_to_h.bias"]


def forward(cfg, p, ids):
    x = p["gpt_neox.embed_in.weight"][ids]
    for l in range(cfg["num_hidden_layers"]):
        h = f"gpt_neox.layers.{l}."
        a = attention(cfg, p, h, layer_norm(cfg, x, p[h + "input_layernorm.weight"], p[h + "input_layernorm.bias"]))
        if cfg["use_parallel_residual"]:     # both norms read the block's input
            m = layer_norm(cfg, x, p[h + "post_attention_layernorm.weight"], p[h + "post_attention_layernorm.bias"])
            x = x + a + mlp(p, h, m)
        else:
            x = x + a
            m = layer_norm(cfg, x, p[h + "post_attention_layernorm.weight"], p[h + "post_attention_layernorm.bias"])
            x = x + mlp(p, h, m)
    x = layer_norm(cfg, x, p["gpt_neox.final_layer_norm.weight"], p["gpt_neox.final_layer_norm.bias"])
    return x @ p["embed_out.weight"].T


def parameters(cfg):
    """LayerNorm weights 1 + 0.1 randn, biases 0.1 randn, matrices 0.02 randn, in checkpoint order."""
    C, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    shapes = [("gpt_neox.embed_in.weight", (V, C))]
    for l in range(cfg["num_hidden_layers"]):
        h = f"gpt_neox.layers.{l}."
        shapes += [(h + "input_layernorm.weight", (C,)), (h + "input_layernorm.bias", (C,)),
                   (h + "post_attention_layernorm.weight", (C,)), (h + "post_attention_layernorm.bias", (C,)),
                   (h + "attention.query_key_value.weight", (3 * C, C)), (h + "attention.query_key_value.bias", (3 * C,)),
                   (h + "attention.dense.weight", (C, C)), (h + "attention.dense.bias", (C,)),
                   (h + "mlp.dense_h_to_4h.weight", (F, C)), (h + "mlp.dense_h_to_4h.bias", (F,)),
                   (h + "mlp.dense_4h_to_h.weight", (C, F)), (h + "mlp.dense_4h_to_h.bias", (C,))]
    shapes += [("gpt_neox.final_layer_norm.weight", (C,)), ("gpt_neox.final_layer_norm.bias", (C,)),
               ("embed_out.weight", (V, C))]
    p = {}
    for name, shape in shapes:
        if name.endswith(".bias"):
            t = 0.1 * torch.randn(shape, dtype=DT)
        elif len(shape) == 1:
            t = 1.0 + 0.1 * torch.randn(shape, dtype=DT)
        else:
            t = 0.02 * torch.randn(shape, dtype=DT)
        p[name] = t.requires_grad_()
    return p


def inputs(cfg, seed):
    """Parameters, input_ids and targets (shifted by one, two positions ignored) as base.fixture()."""
    torch.manual_seed(seed)
    p = parameters(cfg)
    ids = torch.randint(0, cfg["vocab_size"], (B, T))
    targets = torch.roll(ids, -1, dims=1)
    targets[0, 5] = targets[1, -1] = -100   # ignored positions
    return p, ids, targets


def fixture(cfg, file, seed):
    p, ids, targets = inputs(cfg, seed)
    out = base.two_adamw_steps(p, lambda: forward(cfg, p, ids), ids, targets, cfg["vocab_size"])
    base.write_fixture(file, out, "llama", cfg, B, T)


def attention_plain(cfg, p, h, a):
    """The attention again, from separate q, k, v matrices taken out of query_key_value's rows
    (head n's q, k, v at rows 3 hd n + [0, hd), [hd, 2 hd), [2 hd, 3 hd)), each position's pairs
    (i, i + rd/2) turned by angle t / base^(2i / rd) one by one."""
    C, NH, hd, rd = dims(cfg)
    W, bias = p[h + "attention.query_key_value.weight"], p[h + "attention.query_key_value.bias"]
    rows = [[list(range(3 * hd * n + j * hd, 3 * hd * n + (j + 1) * hd)) for n in range(NH)] for j in range(3)]
    q, k, v = (a @ W[sum(r, [])].T + bias[sum(r, [])] for r in rows)
    q, k, v = (t.reshape(B, T, NH, hd).clone() for t in (q, k, v))
    for x in (q, k):
        for t in range(T):
            for i in range(rd // 2):
                ang = t / cfg["rotary_emb_base"] ** (2 * i / rd)
                x0, x1 = x[:, t, :, i].clone(), x[:, t, :, i + rd // 2].clone()
                x[:, t, :, i] = x0 * math.cos(ang) - x1 * math.sin(ang)
                x[:, t, :, i + rd // 2] = x1 * math.cos(ang) + x0 * math.sin(ang)
    o = torch.zeros(B, T, NH, hd, dtype=DT)
    for t in range(T):
        s = torch.einsum("bnd,bsnd->bns", q[:, t], k[:, :t + 1]) / math.sqrt(hd)
        o[:, t] = torch.einsum("bns,bsnd->bnd", torch.softmax(s, dim=-1), v[:, :t + 1])
    return o.reshape(B, T, C) @ p[h + "attention.dense.weight"].T + p[h + "attention.dense.bias"]


def check(cfg, seed):
    p, ids, targets = inputs(cfg, seed)
    with torch.no_grad():
        a = torch.randn(B, T, cfg["hidden_size"], dtype=DT)
        for pct in (1.0, cfg["rotary_pct"]):
            c = dict(cfg, rotary_pct=pct)
            err = (attention(c, p, "gpt_neox.layers.1.", a) - attention_plain(c, p, "gpt_neox.layers.1.", a)).abs().max()
            print(f"  attention, rotary_pct {pct}: max |fused - de-interleaved| {err.item():.2e}")
            assert err < 1e-12

    def loss():
        logits = forward(cfg, p, ids)
        return torch.nn.functional.cross_entropy(logits.view(-1, cfg["vocab_size"]), targets.view(-1),
                                                 ignore_index=-100)

    loss().backward()
    eps = 1e-5
    for name in ("gpt_neox.layers.0.attention.query_key_value.weight", "gpt_neox.layers.1.attention.query_key_value.bias",
                 "gpt_neox.layers.0.post_attention_layernorm.bias", "gpt_neox.layers.1.input_layernorm.bias",
                 "embed_out.weight"):   # at each one's largest gradient
        g = p[name].grad
        flat = int(g.abs().argmax())
        index = divmod(flat, g.shape[1]) if g.dim() == 2 else (flat,)
        with torch.no_grad():
            t = p[name]
            old = t[index].item()
            t[index] = old + eps
            up = loss().item()
            t[index] = old - eps
            down = loss().item()
            t[index] = old
        fd, ag = (up - down) / (2 * eps), p[name].grad[index].item()
        print(f"  {name}{list(index)}: finite difference {fd:.9e}, autograd {ag:.9e}, "
              f"rel diff {abs(fd - ag) / max(abs(ag), 1e-12):.1e}")
        assert abs(fd - ag) <= 1e-6 * abs(ag) + 1e-9


if __name__ == "__main__":
    if "--check" in sys.argv[1:]:
        for cfg, seed in ((NEOX, 21), (NEOX_SEQUENTIAL, 22)):
            print(f"check: parallel residual {cfg['use_parallel_residual']}, rotary_pct {cfg['rotary_pct']}")
            check(cfg, seed)
    else:
        fixture(NEOX, "gpt_neox_tiny.safetensors", 21)
        fixture(NEOX_SEQUENTIAL, "gpt_neox_sequential_tiny.safetensors", 22)
