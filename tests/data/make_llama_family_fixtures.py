"""Writes reference fixtures for `memfit verify` of tiny LLaMA-family models, computed in float64
by the model written out below after transformers' modeling_llama.py, modeling_qwen2.py,
modeling_qwen3.py and modeling_rope_utils.py (RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU, cross-entropy
with ignore_index -100) and torch.optim.AdamW for two steps:
  tests/data/llama31_tiny.safetensors  Llama 3.1's rope_scaling (rope_type llama3), untied head;
  tests/data/qwen2_tiny.safetensors    Qwen2: biases on q, k and v, rope_theta 1e6, tied head;
  tests/data/qwen3_tiny.safetensors    Qwen3: RMSNorm over each q and k head before RoPE (q_norm,
                                       k_norm), explicit head_dim 32 != hidden_size / heads, tied head;
  tests/data/mistral_tiny.safetensors  Mistral: sliding_window 7 < T = 24 (query t sees keys t-6..t,
                                       transformers' sliding-window causal mask: key > t - window).
  tests/data/phi3_tiny.safetensors     Phi-3 (modeling_phi3.py): LLaMA blocks stored with q|k|v fused
                                       into self_attn.qkv_proj and gate|up into mlp.gate_up_proj (rows
                                       stacked in that order), sliding_window 9, untied head.
  tests/data/qwen2_yarn_tiny.safetensors  Qwen2.5's long-context form: rope_scaling type yarn (factor 4
                                       over an original context of 4096, theta 1e4, head_dim 16: pairs
                                       0-2 kept, 3-5 blended, 6-7 interpolated; cos and sin scaled by
                                       0.1 ln 4 + 1), after modeling_rope_utils.py; yarn applies at
                                       every length, T = 24 included.
  tests/data/olmo2_tiny.safetensors    OLMo 2 (modeling_olmo2.py): RMSNorm over all of q and all of k
                                       (q_norm [heads x head_dim]) before RoPE, and each block's norms
                                       on the attention and MLP outputs before the residual adds
                                       (post_attention_layernorm, post_feedforward_layernorm), untied head.
  tests/data/gemma3_tiny.safetensors   Gemma 3 text (modeling_gemma3.py): embeddings times sqrt(hidden),
                                       RMSNorm times (1 + weight) before and after attention and the
                                       GELU-tanh gated MLP, q_norm / k_norm over each head (head_dim 32),
                                       scores times query_pre_attn_scalar^-0.5 (24), layers sliding
                                       (window 7, RoPE base 1e4) / full (1e6, linear factor 2) / sliding,
                                       tied head.

The fixture stores the parameters under their Hugging Face names, input_ids, targets, and
expected.logits / loss / grad.* / step1.* / loss_step2 / step2.*, in float32, with the config and
the AdamW hyperparameters in the metadata (the format of llama_tiny.safetensors).

Run with Debian's python3-torch:  /usr/bin/python3 tests/data/make_llama_family_fixtures.py
"""
import json
import math
import os
import struct

import torch

DT = torch.float64
LLAMA31 = {
    "model_type": "llama", "vocab_size": 101, "hidden_size": 64, "intermediate_size": 176,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 128, "hidden_act": "silu", "tie_word_embeddings": False,
    # head_dim 16: wavelengths 6.3 (kept: < 32 / 4), 19.9 (smoothed), 62.8 and longer (divided by 4).
    "rope_scaling": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 32},
}
QWEN2 = {
    "model_type": "qwen2", "vocab_size": 97, "hidden_size": 64, "intermediate_size": 160,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "max_position_embeddings": 128, "hidden_act": "silu", "tie_word_embeddings": True,
    "use_sliding_window": False,
}
QWEN3 = {
    "model_type": "qwen3", "vocab_size": 83, "hidden_size": 64, "intermediate_size": 160,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 128, "hidden_act": "silu",
    "tie_word_embeddings": True, "attention_bias": False, "use_sliding_window": False,
}
MISTRAL = {
    "model_type": "mistral", "vocab_size": 89, "hidden_size": 64, "intermediate_size": 176,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 128, "hidden_act": "silu", "tie_word_embeddings": False,
    "sliding_window": 7,
}
PHI3 = {
    "model_type": "phi3", "vocab_size": 79, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 128, "original_max_position_embeddings": 128,
    "hidden_act": "silu", "tie_word_embeddings": False, "sliding_window": 9,
}
# Phi-4-mini's form (model_type phi3): partial rotary (0.75 of head_dim 16: 12 dimensions turn)
# and LongRoPE past an original context of 16 (T = 24 takes the long factors; scale sqrt(1.5)).
PHI3_LONGROPE = dict(PHI3, partial_rotary_factor=0.75, max_position_embeddings=64,
                     original_max_position_embeddings=16, sliding_window=None,
                     rope_scaling={"type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
                                   "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0]})
QWEN2_YARN = dict(QWEN2, rope_theta=10000.0, max_position_embeddings=16384,
                  rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096})
OLMO2 = {
    "model_type": "olmo2", "vocab_size": 71, "hidden_size": 64, "intermediate_size": 160,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "rms_norm_eps": 1e-6,
    "rope_theta": 500000.0, "max_position_embeddings": 128, "hidden_act": "silu", "tie_word_embeddings": False,
    "attention_bias": False,
}
GEMMA3 = {
    "model_type": "gemma3_text", "vocab_size": 67, "hidden_size": 64, "intermediate_size": 160,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
    "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "sliding_window": 7,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"], "query_pre_attn_scalar": 24,
    "max_position_embeddings": 128, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
    "attention_bias": False, "final_logit_softcapping": None, "attn_logit_softcapping": None,
}
# Phi-3's fused checkpoint tensors: name -> the parts (rows stacked in this order), per layer.
FUSED = {"phi3": {"self_attn.qkv_proj.weight": ["self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                                "self_attn.v_proj.weight"],
                  "mlp.gate_up_proj.weight": ["mlp.gate_proj.weight", "mlp.up_proj.weight"]}}
ADAMW = {"lr": 0.01, "beta1": 0.9, "beta2": 0.95, "eps": 1e-5, "weight_decay": 0.1}
B, T = 2, 24
CONFIG = None
C = F = L = NH = KVH = V = HD = 0


def configure(cfg):
    global CONFIG, C, F, L, NH, KVH, V, HD
    CONFIG = cfg
    C, F, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    NH, KVH, V = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]
    HD = cfg.get("head_dim", C // NH)


def rotary_dims():
    """int(head_dim x partial_rotary_factor): the dimensions of each head that turn."""
    return int(HD * CONFIG.get("partial_rotary_factor", 1.0))


def longrope():
    """(ext factors, cos/sin scale) of rope_scaling type longrope, after transformers'
    _compute_longrope_parameters: the long factors when the forward's length T exceeds the
    original context, else the short ones; the scale sqrt(1 + ln s / ln O), s = max / O."""
    rs, original = CONFIG["rope_scaling"], CONFIG["original_max_position_embeddings"]
    ext = torch.tensor(rs["long_factor"] if T > original else rs["short_factor"], dtype=DT)
    s = CONFIG["max_position_embeddings"] / original
    return ext, (math.sqrt(1 + math.log(s) / math.log(original)) if s > 1 else 1.0)


def yarn():
    """(inv_freq, cos/sin scale) of rope_scaling type yarn, after transformers'
    _compute_yarn_parameters: pair i blends the plain frequency (weight e) with it divided by
    factor (1 - e), e = 1 - clamp((i - low) / (high - low), 0, 1), low and high the pair indices
    turning beta_fast and beta_slow times over the original context (floor, ceil, clamped to
    [0, D - 1]); the scale 0.1 ln(factor) + 1."""
    rs, D, base = CONFIG["rope_scaling"], rotary_dims(), CONFIG["rope_theta"]
    factor, original = rs["factor"], rs["original_max_position_embeddings"]

    def index_of(turns):
        return D * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(index_of(rs.get("beta_fast", 32))), 0)
    high = min(math.ceil(index_of(rs.get("beta_slow", 1))), D - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(D // 2, dtype=DT) - low) / (high - low), 0, 1)
    keep = 1 - ramp
    plain = 1.0 / (base ** (torch.arange(0, D, 2, dtype=DT) / D))
    return plain / factor * (1 - keep) + plain * keep, (0.1 * math.log(factor) + 1 if factor > 1 else 1.0)


def inv_freq():
    D = rotary_dims()
    inv = 1.0 / (CONFIG["rope_theta"] ** (torch.arange(0, D, 2, dtype=DT) / D))
    rs = CONFIG.get("rope_scaling")
    if rs is None:
        return inv
    if rs.get("type", rs.get("rope_type")) == "longrope":
        return inv / longrope()[0]
    if rs.get("type", rs.get("rope_type")) == "yarn":
        return yarn()[0]
    low_wavelen = rs["original_max_position_embeddings"] / rs["low_freq_factor"]
    high_wavelen = rs["original_max_position_embeddings"] / rs["high_freq_factor"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / rs["factor"], inv)
    smooth = (rs["original_max_position_embeddings"] / wavelen - rs["low_freq_factor"]) / (
        rs["high_freq_factor"] - rs["low_freq_factor"])
    smoothed = (1 - smooth) * scaled / rs["factor"] + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x, cos, sin):
    """The first rotary_dims of each head turned (apply_rotary_pos_emb), the rest passed through."""
    D = rotary_dims()
    r, rest = x[..., :D], x[..., D:]
    return torch.cat((r * cos + rotate_half(r) * sin, rest), dim=-1)


def rms_norm(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + CONFIG["rms_norm_eps"]))


def forward(p, ids):
    x = p["model.embed_tokens.weight"][ids]
    freqs = torch.outer(torch.arange(T, dtype=DT), inv_freq())
    emb = torch.cat((freqs, freqs), dim=-1)
    kind = (CONFIG.get("rope_scaling") or {}).get("type")
    scale = longrope()[1] if kind == "longrope" else yarn()[1] if kind == "yarn" else 1.0
    cos, sin = scale * emb.cos()[None, None], scale * emb.sin()[None, None]
    mask = torch.full((T, T), float("-inf"), dtype=DT).triu(1)
    if CONFIG.get("sliding_window"):   # keys at or before t - window are out of reach
        mask = mask + torch.full((T, T), float("-inf"), dtype=DT).tril(-CONFIG["sliding_window"])
    olmo2 = CONFIG["model_type"] == "olmo2"   # norms after attention and the MLP, q/k norms whole
    for l in range(L):
        h = f"model.layers.{l}."
        a = x if olmo2 else rms_norm(x, p[h + "input_layernorm.weight"])
        q, k, v = (a @ p[h + f"self_attn.{n}_proj.weight"].T + p.get(h + f"self_attn.{n}_proj.bias", 0.0)
                   for n in "qkv")
        if olmo2:   # over all heads of q, and of k, before RoPE
            q, k = rms_norm(q, p[h + "self_attn.q_norm.weight"]), rms_norm(k, p[h + "self_attn.k_norm.weight"])
        q, k = q.view(B, T, NH, HD), k.view(B, T, KVH, HD)
        if CONFIG["model_type"] == "qwen3":   # each head normalized over head_dim, before RoPE
            q, k = rms_norm(q, p[h + "self_attn.q_norm.weight"]), rms_norm(k, p[h + "self_attn.k_norm.weight"])
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(B, T, KVH, HD).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        k, v = k.repeat_interleave(NH // KVH, dim=1), v.repeat_interleave(NH // KVH, dim=1)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(HD) + mask, dim=-1)
        o = (att @ v).transpose(1, 2).reshape(B, T, NH * HD)
        o = o @ p[h + "self_attn.o_proj.weight"].T
        if olmo2:
            x = x + rms_norm(o, p[h + "post_attention_layernorm.weight"])
            m = x
        else:
            x = x + o
            m = rms_norm(x, p[h + "post_attention_layernorm.weight"])
        gate, up = m @ p[h + "mlp.gate_proj.weight"].T, m @ p[h + "mlp.up_proj.weight"].T
        y = (torch.nn.functional.silu(gate) * up) @ p[h + "mlp.down_proj.weight"].T
        x = x + (rms_norm(y, p[h + "post_feedforward_layernorm.weight"]) if olmo2 else y)
    head = p["model.embed_tokens.weight"] if CONFIG["tie_word_embeddings"] else p["lm_head.weight"]
    return rms_norm(x, p["model.norm.weight"]) @ head.T


def gemma_norm(x, w):
    """Gemma3RMSNorm: the stored weight is an offset from 1."""
    return rms_norm(x, 1.0 + w)


def attention_gemma3(p, h, a, cos, sin, mask):
    """Gemma3Attention of layer prefix h on the normed input a: each q and k head normed over
    head_dim (q_norm, k_norm) before RoPE, scores times query_pre_attn_scalar^-0.5, then o_proj."""
    q, k, v = (a @ p[h + f"self_attn.{n}_proj.weight"].T for n in "qkv")
    q = gemma_norm(q.view(B, T, NH, HD), p[h + "self_attn.q_norm.weight"]).transpose(1, 2)
    k = gemma_norm(k.view(B, T, KVH, HD), p[h + "self_attn.k_norm.weight"]).transpose(1, 2)
    v = v.view(B, T, KVH, HD).transpose(1, 2)
    q, k = rope(q, cos, sin), rope(k, cos, sin)
    k, v = k.repeat_interleave(NH // KVH, dim=1), v.repeat_interleave(NH // KVH, dim=1)
    att = torch.softmax(q @ k.transpose(-1, -2) * CONFIG["query_pre_attn_scalar"] ** -0.5 + mask, dim=-1)
    return (att @ v).transpose(1, 2).reshape(B, T, NH * HD) @ p[h + "self_attn.o_proj.weight"].T


def gemma3_layer_inputs():
    """{layer type: (cos, sin, mask)}: full_attention layers turn at rope_theta with linear
    rope_scaling (inv_freq / factor) under the causal mask; sliding_attention layers at
    rope_local_base_freq unscaled, keys at or before t - sliding_window masked too."""
    causal = torch.full((T, T), float("-inf"), dtype=DT).triu(1)
    sliding = causal + torch.full((T, T), float("-inf"), dtype=DT).tril(-CONFIG["sliding_window"])
    out = {}
    for kind, base, factor, mask in (
            ("full_attention", CONFIG["rope_theta"], CONFIG["rope_scaling"]["factor"], causal),
            ("sliding_attention", CONFIG["rope_local_base_freq"], 1.0, sliding)):
        inv = 1.0 / (base ** (torch.arange(0, HD, 2, dtype=DT) / HD)) / factor
        freqs = torch.outer(torch.arange(T, dtype=DT), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        out[kind] = emb.cos()[None, None], emb.sin()[None, None], mask
    return out


def forward_gemma3(p, ids):
    """Gemma3ForCausalLM: sandwich norms around attention and the GELU-tanh gated MLP, tied head."""
    x = p["model.embed_tokens.weight"][ids] * math.sqrt(C)
    inputs = gemma3_layer_inputs()
    for l in range(L):
        h = f"model.layers.{l}."
        a = gemma_norm(x, p[h + "input_layernorm.weight"])
        o = attention_gemma3(p, h, a, *inputs[CONFIG["layer_types"][l]])
        x = x + gemma_norm(o, p[h + "post_attention_layernorm.weight"])
        m = gemma_norm(x, p[h + "pre_feedforward_layernorm.weight"])
        gate, up = m @ p[h + "mlp.gate_proj.weight"].T, m @ p[h + "mlp.up_proj.weight"].T
        y = (torch.nn.functional.gelu(gate, approximate="tanh") * up) @ p[h + "mlp.down_proj.weight"].T
        x = x + gemma_norm(y, p[h + "post_feedforward_layernorm.weight"])
    return gemma_norm(x, p["model.norm.weight"]) @ p["model.embed_tokens.weight"].T


def parameters():
    shapes = [("model.embed_tokens.weight", (V, C))]
    gemma3 = CONFIG["model_type"] == "gemma3_text"   # norm weights are offsets from 1
    for l in range(L):
        h = f"model.layers.{l}."
        olmo2 = CONFIG["model_type"] == "olmo2"
        shapes += [] if olmo2 else [(h + "input_layernorm.weight", (C,))]
        shapes += [(h + "self_attn.q_proj.weight", (NH * HD, C)),
                   (h + "self_attn.k_proj.weight", (KVH * HD, C)), (h + "self_attn.v_proj.weight", (KVH * HD, C))]
        if CONFIG["model_type"] == "qwen2":
            shapes += [(h + "self_attn.q_proj.bias", (NH * HD,)), (h + "self_attn.k_proj.bias", (KVH * HD,)),
                       (h + "self_attn.v_proj.bias", (KVH * HD,))]
        if CONFIG["model_type"] in ("qwen3", "gemma3_text"):
            shapes += [(h + "self_attn.q_norm.weight", (HD,)), (h + "self_attn.k_norm.weight", (HD,))]
        if olmo2:
            shapes += [(h + "self_attn.q_norm.weight", (NH * HD,)), (h + "self_attn.k_norm.weight", (KVH * HD,))]
        shapes += [(h + "self_attn.o_proj.weight", (C, NH * HD)), (h + "post_attention_layernorm.weight", (C,))]
        shapes += [(h + "pre_feedforward_layernorm.weight", (C,))] if gemma3 else []
        shapes += [(h + "post_feedforward_layernorm.weight", (C,))] if olmo2 or gemma3 else []
        shapes += [(h + "mlp.gate_proj.weight", (F, C)), (h + "mlp.up_proj.weight", (F, C)),
                   (h + "mlp.down_proj.weight", (C, F))]
    shapes += [("model.norm.weight", (C,))] + ([] if CONFIG["tie_word_embeddings"] else [("lm_head.weight", (V, C))])
    p = {}
    for name, shape in shapes:
        mean = 0.0 if gemma3 else 1.0
        t = mean + 0.1 * torch.randn(shape, dtype=DT) if len(shape) == 1 else 0.02 * torch.randn(shape, dtype=DT)
        if name.endswith(".bias"):
            t = 0.1 * torch.randn(shape, dtype=DT)
        p[name] = t.requires_grad_()
    return p


def fuse(tensors):
    """The tensors under the checkpoint's names: each layer's fused parts concatenated by rows,
    for the parameters and every expected.<what>. copy of them."""
    fused = FUSED.get(CONFIG["model_type"], {})
    out = {}
    for name, t in tensors.items():
        for whole, parts in fused.items():
            if name.endswith(parts[0]):
                stem = name[:-len(parts[0])]
                out[stem + whole] = torch.cat([tensors[stem + p] for p in parts], dim=0)
        if not any(name.endswith(p) for parts in fused.values() for p in parts):
            out[name] = t
    return out


def write_safetensors(path, tensors, metadata):
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        data = t.to(torch.int32 if t.dtype in (torch.int32, torch.int64) else torch.float32).numpy().tobytes()
        header[name] = {"dtype": "I32" if t.dtype in (torch.int32, torch.int64) else "F32",
                        "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def fixture(config, file, seed):
    configure(config)
    torch.manual_seed(seed)
    p = parameters()
    ids = torch.randint(0, V, (B, T))
    targets = torch.roll(ids, -1, dims=1)
    targets[0, 5] = targets[1, -1] = -100   # ignored positions
    run = forward_gemma3 if CONFIG["model_type"] == "gemma3_text" else forward
    out = two_adamw_steps(p, lambda: run(p, ids), ids, targets, V)
    write_fixture(file, fuse(out), "llama", CONFIG, B, T)


def two_adamw_steps(p, logits_of, ids, targets, vocab):
    """The fixture's tensors: the parameters, inputs and targets, then expected.logits / loss /
    grad.* / step1.* / loss_step2 / step2.* of two torch.optim.AdamW steps (ADAMW; weight decay
    on the parameters with 2 or more dimensions) on the cross-entropy of logits_of()."""
    out = {name: t.detach().clone() for name, t in p.items()}
    out["input_ids"], out["targets"] = ids.to(torch.int32), targets.to(torch.int32)
    names = list(p)
    decay = [p[n] for n in names if p[n].dim() >= 2]
    no_decay = [p[n] for n in names if p[n].dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": ADAMW["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"])
    for step in (1, 2):
        logits = logits_of()
        loss = torch.nn.functional.cross_entropy(logits.view(-1, vocab), targets.view(-1), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        if step == 1:
            out["expected.logits"] = logits.detach().clone()
            out["expected.loss"] = loss.detach().clone()
            for n in names:
                out["expected.grad." + n] = p[n].grad.detach().clone()
        else:
            out["expected.loss_step2"] = loss.detach().clone()
        opt.step()
        for n in names:
            out[f"expected.step{step}." + n] = p[n].detach().clone()
    return out


def write_fixture(file, out, family, config, batch, seq):
    """tests/data/<file> with the metadata `memfit verify` reads."""
    meta = {"family": family, "config": json.dumps(config), "batch": str(batch), "seq": str(seq),
            "adamw": json.dumps(ADAMW), "decay": "parameters with 2 or more dimensions", "ignore_index": "-100",
            "reference": f"float64 PyTorch {torch.__version__}"}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), file)
    write_safetensors(path, out, meta)
    print(f"wrote {path}: loss {out['expected.loss'].item():.6f}, step 2 {out['expected.loss_step2'].item():.6f}")


if __name__ == "__main__":
    fixture(LLAMA31, "llama31_tiny.safetensors", 31)
    fixture(QWEN2, "qwen2_tiny.safetensors", 2)
    fixture(MISTRAL, "mistral_tiny.safetensors", 7)
    fixture(PHI3, "phi3_tiny.safetensors", 3)
    fixture(PHI3_LONGROPE, "phi3_longrope_tiny.safetensors", 4)
    fixture(QWEN3, "qwen3_tiny.safetensors", 3)
    fixture(OLMO2, "olmo2_tiny.safetensors", 5)
    fixture(QWEN2_YARN, "qwen2_yarn_tiny.safetensors", 6)
    fixture(GEMMA3, "gemma3_tiny.safetensors", 12)
