"""Writes reference fixtures for `memfit verify` of tiny mixture-of-experts models, computed in
float64 by the model written out below after transformers' modeling_mixtral.py,
modeling_qwen3_moe.py, modeling_olmoe.py and modeling_qwen2_moe.py (MixtralSparseMoeBlock,
Qwen3MoeSparseMoeBlock, OlmoeSparseMoeBlock, Qwen2MoeSparseMoeBlock, load_balancing_loss_func) and
torch.optim.AdamW for two steps:
  tests/data/mixtral_tiny.safetensors    Mixtral: LLaMA blocks (grouped-query attention, RoPE 1e6,
                                         no sliding window) whose MLP is block_sparse_moe: router
                                         gate [4 x hidden], 4 experts w1 (gate) / w3 (up) / w2 (down),
                                         top-2 of the softmax, the two weights renormalised to sum 1;
                                         untied head.
  tests/data/qwen3_moe_tiny.safetensors  Qwen3-MoE: Qwen3 attention (q_norm / k_norm over each head,
                                         head_dim 32 != hidden / heads) and 3 layers: 0 and 2 sparse
                                         (mlp.gate [6 x hidden], 6 experts of width
                                         moe_intermediate_size 32, top-3, norm_topk_prob), layer 1 in
                                         mlp_only_layers a dense SwiGLU MLP of intermediate_size 96
                                         (no router logits); untied head.
  tests/data/olmoe_tiny.safetensors      OLMoE: pre-norm blocks with q_norm over all of q and k_norm
                                         over all of k (weights [heads x head_dim], [kv_heads x
                                         head_dim]) before RoPE, 8 experts, top-2 WITHOUT
                                         renormalisation (norm_topk_prob false: the weights are the
                                         raw softmax probabilities); untied head.
  tests/data/qwen2_moe_tiny.safetensors  Qwen2-MoE: Qwen2 attention (q_proj / k_proj / v_proj with
                                         biases, o_proj without) and 3 layers: 0 and 2 sparse
                                         (mlp.gate [6 x hidden], 6 experts of width
                                         moe_intermediate_size 32, top-2 without renormalisation,
                                         PLUS mlp.shared_expert, a SwiGLU MLP of width
                                         shared_expert_intermediate_size 80 over every token, scaled
                                         per token by sigmoid(mlp.shared_expert_gate [1 x hidden] of
                                         the block's input) and added), layer 1 in mlp_only_layers a
                                         dense SwiGLU MLP of intermediate_size 96; untied head.

Each MoE block: router_logits = x @ gate.T, p = softmax(router_logits) over the experts, the top-k
of p (torch.topk: no gradient through the choice; the k values keep theirs), divided by their sum
where norm_topk_prob (Mixtral: always), output = sum_j w_j * down(silu(gate(x)) * up(x)) of the
chosen experts (Qwen2-MoE: plus sigmoid(x @ shared_expert_gate.T) * shared_expert(x) for every
token, the shared expert's weight per token not part of the routing). The loss is the mean
cross-entropy over the targets that are not -100 plus router_aux_loss_coef x
load_balancing_loss_func over the router logits of every MoE layer concatenated along the tokens
(attention_mask None): num_experts x sum over (slot j, expert e) of mean_tokens(top-k slot j
chose e) x mean_tokens(p_e); the choice mask carries no gradient.
output_router_logits is true in every config (transformers adds the aux loss only then).

Routing: each fixture's seed is the first (from a fixed start) whose k-th and (k+1)-th largest
router probabilities differ by at least GAP_MIN for every token of every MoE layer, and whose float32
forward chooses the same experts, at the initial weights, at step 1's weights (the forward of
loss_step2) and at step 2's, so an engine in float32 routes as this reference does; every MoE layer
sends tokens to every expert at the two points where gradients are taken (an expert without tokens
would have no .grad, which torch.optim.AdamW skips, weight decay included) and to at least
MIN_EXPERTS_USED at step 2's weights.

The fixture stores the parameters under their Hugging Face names, input_ids, targets, and
expected.logits / loss / grad.* / step1.* / loss_step2 / step2.*, in float32, with the config and
the AdamW hyperparameters in the metadata (the format of make_llama_family_fixtures.py's fixtures),
and for reference expected.aux_loss and expected.aux_loss_step2 (the load-balancing terms inside
expected.loss and expected.loss_step2, before the coefficient).

Run with Debian's python3-torch:  /usr/bin/python3 tests/data/make_moe_fixtures.py
(--only FILE [FILE ...] writes only those fixtures, e.g. --only qwen2_moe_tiny.safetensors)
"""
import argparse
import json
import math
import os
import struct

import torch

DT = torch.float64
MIXTRAL = {
    "model_type": "mixtral", "vocab_size": 61, "hidden_size": 64, "intermediate_size": 48,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4,
    "num_experts_per_tok": 2, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "max_position_embeddings": 128,
    "hidden_act": "silu", "tie_word_embeddings": False, "sliding_window": None, "router_aux_loss_coef": 0.02,
    "output_router_logits": True, "router_jitter_noise": 0.0,
}
QWEN3_MOE = {
    "model_type": "qwen3_moe", "vocab_size": 67, "hidden_size": 64, "intermediate_size": 96,
    "moe_intermediate_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32, "num_experts": 6, "num_experts_per_tok": 3, "norm_topk_prob": True, "decoder_sparse_step": 1,
    "mlp_only_layers": [1], "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 128,
    "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False, "use_sliding_window": False,
    "router_aux_loss_coef": 0.01, "output_router_logits": True,
}
OLMOE = {
    "model_type": "olmoe", "vocab_size": 71, "hidden_size": 64, "intermediate_size": 40,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "num_experts": 8,
    "num_experts_per_tok": 2, "norm_topk_prob": False, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "max_position_embeddings": 128, "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False,
    "clip_qkv": None, "router_aux_loss_coef": 0.01, "output_router_logits": True,
}
QWEN2_MOE = {
    "model_type": "qwen2_moe", "vocab_size": 73, "hidden_size": 64, "intermediate_size": 96,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 80, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 6, "num_experts_per_tok": 2,
    "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [1], "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "max_position_embeddings": 128, "hidden_act": "silu", "tie_word_embeddings": False,
    "use_sliding_window": False, "router_aux_loss_coef": 0.01, "output_router_logits": True, "qkv_bias": True,
}
ADAMW = {"lr": 0.01, "beta1": 0.9, "beta2": 0.95, "eps": 1e-5, "weight_decay": 0.1}
B, T = 2, 24
GAP_MIN = 1e-3          # least k-th minus (k+1)-th router probability, every token, layer and point
MIN_EXPERTS_USED = 3    # experts that receive tokens in every MoE layer
ROUTER_STD = 0.15       # router weights: logits of std ~ 0.15 sqrt(hidden) = 1.2 (0.3 and up make the
                        # softmax so peaked that the k-th and (k+1)-th probabilities are both tiny); the
                        # Qwen2-MoE shared_expert_gate [1 x hidden] alike (sigmoids spread over (0, 1))
BIAS_STD = 0.02         # Qwen2-MoE q / k / v biases (transformers initialises them to zero; nonzero
                        # here so that a missing or misplaced bias shows); 0.1 passes v's bias through
                        # o_proj into every token alike, and the routing of most seeds collapses at
                        # step 1's weights onto the same two experts
CONFIG = None
C = L = NH = KVH = V = HD = E = K = 0


def configure(cfg):
    global CONFIG, C, L, NH, KVH, V, HD, E, K
    CONFIG = cfg
    C, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    NH, KVH, V = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]
    HD = cfg.get("head_dim") or C // NH
    E = cfg["num_local_experts"] if cfg["model_type"] == "mixtral" else cfg["num_experts"]
    K = cfg["num_experts_per_tok"]
    assert not cfg.get("sliding_window") and not cfg.get("use_sliding_window")
    assert not cfg.get("router_jitter_noise")


def is_moe_layer(l):
    """Qwen3MoeDecoderLayer's and Qwen2MoeDecoderLayer's rule: sparse unless in mlp_only_layers, or off
    the decoder_sparse_step grid; every Mixtral and OLMoE layer is sparse."""
    if CONFIG["model_type"] not in ("qwen3_moe", "qwen2_moe"):
        return True
    return l not in CONFIG["mlp_only_layers"] and E > 0 and (l + 1) % CONFIG["decoder_sparse_step"] == 0


def moe_names(h):
    """(router, [(gate, up, down) per expert]) of the layer prefix h, under the checkpoint's names."""
    if CONFIG["model_type"] == "mixtral":
        m = h + "block_sparse_moe."
        return m + "gate.weight", [tuple(m + f"experts.{e}.{w}.weight" for w in ("w1", "w3", "w2")) for e in range(E)]
    m = h + "mlp."
    return m + "gate.weight", [tuple(m + f"experts.{e}.{w}_proj.weight" for w in ("gate", "up", "down"))
                               for e in range(E)]


def expert_width():
    if CONFIG["model_type"] in ("qwen3_moe", "qwen2_moe"):
        return CONFIG["moe_intermediate_size"]
    return CONFIG["intermediate_size"]


def qkv_bias():
    """Qwen2MoeAttention: q_proj, k_proj and v_proj with biases where qkv_bias (o_proj never)."""
    return CONFIG["model_type"] == "qwen2_moe" and CONFIG["qkv_bias"]


def shared_expert_names(h):
    """Qwen2MoeSparseMoeBlock's shared expert of the layer prefix h: ((gate, up, down), its gate [1 x hidden])."""
    m = h + "mlp.shared_expert"
    return tuple(f"{m}.{w}_proj.weight" for w in ("gate", "up", "down")), m + "_gate.weight"


def parameters():
    shapes = [("model.embed_tokens.weight", (V, C))]
    for l in range(L):
        h = f"model.layers.{l}."
        shapes += [(h + "input_layernorm.weight", (C,))]
        for n, rows in (("q", NH * HD), ("k", KVH * HD), ("v", KVH * HD)):
            shapes += [(h + f"self_attn.{n}_proj.weight", (rows, C))]
            if qkv_bias():
                shapes += [(h + f"self_attn.{n}_proj.bias", (rows,))]
        if CONFIG["model_type"] == "qwen3_moe":   # per head
            shapes += [(h + "self_attn.q_norm.weight", (HD,)), (h + "self_attn.k_norm.weight", (HD,))]
        if CONFIG["model_type"] == "olmoe":       # over all heads
            shapes += [(h + "self_attn.q_norm.weight", (NH * HD,)), (h + "self_attn.k_norm.weight", (KVH * HD,))]
        shapes += [(h + "self_attn.o_proj.weight", (C, NH * HD)), (h + "post_attention_layernorm.weight", (C,))]
        if is_moe_layer(l):
            router, experts = moe_names(h)
            F = expert_width()
            shapes += [(router, (E, C))]
            for gate, up, down in experts:
                shapes += [(gate, (F, C)), (up, (F, C)), (down, (C, F))]
            if CONFIG["model_type"] == "qwen2_moe":   # after the experts, as Qwen2MoeSparseMoeBlock
                (gate, up, down), shared_gate = shared_expert_names(h)
                S = CONFIG["shared_expert_intermediate_size"]
                shapes += [(gate, (S, C)), (up, (S, C)), (down, (C, S)), (shared_gate, (1, C))]
        else:
            F = CONFIG["intermediate_size"]
            shapes += [(h + "mlp.gate_proj.weight", (F, C)), (h + "mlp.up_proj.weight", (F, C)),
                       (h + "mlp.down_proj.weight", (C, F))]
    shapes += [("model.norm.weight", (C,))] + ([] if CONFIG["tie_word_embeddings"] else [("lm_head.weight", (V, C))])
    p = {}
    for name, shape in shapes:
        if name.endswith(".bias"):
            t = BIAS_STD * torch.randn(shape, dtype=DT)
        elif len(shape) == 1:
            t = 1.0 + 0.1 * torch.randn(shape, dtype=DT)
        elif name.endswith("gate.weight") and ".experts." not in name:   # the router (and shared_expert_gate)
            t = ROUTER_STD * torch.randn(shape, dtype=DT)
        else:
            t = 0.02 * torch.randn(shape, dtype=DT)
        p[name] = t.requires_grad_()
    return p


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rms_norm(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + CONFIG["rms_norm_eps"]))


def silu_mlp(x, gate, up, down):
    return (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T


def route(router_logits):
    """(weights [N, k], experts [N, k]) as the sparse MoE blocks choose them: the top-k of the
    softmax (the index choice carries no gradient), renormalised to sum 1 where norm_topk_prob
    (Mixtral always)."""
    probs = torch.softmax(router_logits, dim=-1)
    weights, experts = torch.topk(probs, K, dim=-1)
    if CONFIG["model_type"] == "mixtral" or CONFIG["norm_topk_prob"]:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


def sparse_moe(p, h, x):
    """The MoE block of layer prefix h on x [B, T, C]: (output [B, T, C], router_logits [B*T, E])."""
    router, experts = moe_names(h)
    x = x.reshape(-1, C)
    router_logits = x @ p[router].T
    weights, chosen = route(router_logits)
    out = torch.zeros_like(x)
    for e, (gate, up, down) in enumerate(experts):
        token, slot = torch.where(chosen == e)
        if token.numel():
            y = silu_mlp(x[token], p[gate], p[up], p[down]) * weights[token, slot, None]
            out = out.index_add(0, token, y)
    if CONFIG["model_type"] == "qwen2_moe":   # the shared expert over every token, gated per token
        (gate, up, down), shared_gate = shared_expert_names(h)
        out = out + torch.sigmoid(x @ p[shared_gate].T) * silu_mlp(x, p[gate], p[up], p[down])
    return out.view(B, T, C), router_logits


def attention(p, h, a, cos, sin, mask):
    q, k, v = (a @ p[h + f"self_attn.{n}_proj.weight"].T for n in "qkv")
    if qkv_bias():
        q, k, v = (t + p[h + f"self_attn.{n}_proj.bias"] for t, n in zip((q, k, v), "qkv"))
    if CONFIG["model_type"] == "olmoe":   # over all of q and all of k, before RoPE
        q, k = rms_norm(q, p[h + "self_attn.q_norm.weight"]), rms_norm(k, p[h + "self_attn.k_norm.weight"])
        if CONFIG.get("clip_qkv") is not None:
            q, k, v = (t.clamp(-CONFIG["clip_qkv"], CONFIG["clip_qkv"]) for t in (q, k, v))
    q, k, v = q.view(B, T, NH, HD), k.view(B, T, KVH, HD), v.view(B, T, KVH, HD)
    if CONFIG["model_type"] == "qwen3_moe":   # each head over head_dim, before RoPE
        q, k = rms_norm(q, p[h + "self_attn.q_norm.weight"]), rms_norm(k, p[h + "self_attn.k_norm.weight"])
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    k, v = k.repeat_interleave(NH // KVH, dim=1), v.repeat_interleave(NH // KVH, dim=1)
    att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(HD) + mask, dim=-1)
    return (att @ v).transpose(1, 2).reshape(B, T, NH * HD) @ p[h + "self_attn.o_proj.weight"].T


def forward(p, ids):
    """(logits [B, T, V], router logits [B*T, E] of each MoE layer in order), in the dtype of p."""
    dt = p["model.embed_tokens.weight"].dtype
    x = p["model.embed_tokens.weight"][ids]
    inv = 1.0 / (CONFIG["rope_theta"] ** (torch.arange(0, HD, 2, dtype=DT) / HD))
    freqs = torch.outer(torch.arange(T, dtype=DT), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None, None].to(dt), emb.sin()[None, None].to(dt)
    mask = torch.full((T, T), float("-inf"), dtype=dt).triu(1)
    router_logits = []
    for l in range(L):
        h = f"model.layers.{l}."
        x = x + attention(p, h, rms_norm(x, p[h + "input_layernorm.weight"]), cos, sin, mask)
        m = rms_norm(x, p[h + "post_attention_layernorm.weight"])
        if is_moe_layer(l):
            y, r = sparse_moe(p, h, m)
            router_logits.append(r)
        else:
            y = silu_mlp(m, p[h + "mlp.gate_proj.weight"], p[h + "mlp.up_proj.weight"], p[h + "mlp.down_proj.weight"])
        x = x + y
    head = p["model.embed_tokens.weight"] if CONFIG["tie_word_embeddings"] else p["lm_head.weight"]
    return rms_norm(x, p["model.norm.weight"]) @ head.T, router_logits


def load_balancing_loss(router_logits):
    """transformers' load_balancing_loss_func(attention_mask None): the layers' router logits
    concatenated along the tokens; E x sum over (slot j, expert e) of the share of tokens whose
    j-th choice is e times the mean probability of e."""
    logits = torch.cat(router_logits, dim=0)
    probs = torch.softmax(logits, dim=-1)
    _, chosen = torch.topk(probs, K, dim=-1)
    tokens_per_expert = torch.nn.functional.one_hot(chosen, E).to(probs.dtype).mean(dim=0)   # [K, E]
    prob_per_expert = probs.mean(dim=0)                                                      # [E]
    return E * torch.sum(tokens_per_expert * prob_per_expert[None])


def losses(p, ids, targets):
    """(total loss, logits, aux loss, router logits): cross-entropy plus router_aux_loss_coef x aux."""
    logits, router_logits = forward(p, ids)
    ce = torch.nn.functional.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-100)
    aux = load_balancing_loss(router_logits)
    return ce + CONFIG["router_aux_loss_coef"] * aux, logits, aux, router_logits


def routing_stats(router_logits):
    """(least gap between the k-th and (k+1)-th probability over every token and MoE layer,
    tokens per expert of each MoE layer)."""
    gap, counts = float("inf"), []
    for r in router_logits:
        probs = torch.softmax(r.detach(), dim=-1)
        top = torch.topk(probs, K + 1, dim=-1).values
        gap = min(gap, (top[:, K - 1] - top[:, K]).min().item())
        counts.append(torch.bincount(torch.topk(probs, K, dim=-1).indices.flatten(), minlength=E).tolist())
    return gap, counts


def float32_agrees(p, ids):
    """Whether the same forward in float32 (the engine's precision) chooses the same experts."""
    p32 = {n: t.detach().float() for n, t in p.items()}
    _, r64 = forward({n: t.detach() for n, t in p.items()}, ids)
    _, r32 = forward(p32, ids)
    return all(torch.equal(torch.topk(a.softmax(-1), K, -1).indices.sort(-1).values,
                           torch.topk(b.softmax(-1), K, -1).indices.sort(-1).values) for a, b in zip(r64, r32))


def two_adamw_steps(p, ids, targets):
    """The fixture's tensors (as make_llama_family_fixtures.py's two_adamw_steps, with the MoE loss)
    and the routing at the initial, step-1 and step-2 weights."""
    out = {name: t.detach().clone() for name, t in p.items()}
    out["input_ids"], out["targets"] = ids.to(torch.int32), targets.to(torch.int32)
    names = list(p)
    decay = [p[n] for n in names if p[n].dim() >= 2]
    no_decay = [p[n] for n in names if p[n].dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": ADAMW["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"])
    routing = []
    for step in (1, 2):
        loss, logits, aux, router_logits = losses(p, ids, targets)
        routing.append(routing_stats(router_logits) + (float32_agrees(p, ids),))
        opt.zero_grad()
        loss.backward()
        if step == 1:
            out["expected.logits"] = logits.detach().clone()
            out["expected.loss"] = loss.detach().clone()
            out["expected.aux_loss"] = aux.detach().clone()
            for n in names:
                assert p[n].grad is not None, f"{n} has no gradient (an expert without tokens)"
                out["expected.grad." + n] = p[n].grad.detach().clone()
        else:
            out["expected.loss_step2"] = loss.detach().clone()
            out["expected.aux_loss_step2"] = aux.detach().clone()
        opt.step()
        for n in names:
            out[f"expected.step{step}." + n] = p[n].detach().clone()
    with torch.no_grad():
        routing.append(routing_stats(forward(p, ids)[1]) + (float32_agrees(p, ids),))
    return out, routing


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


def write_fixture(file, out, family, config, batch, seq):
    """tests/data/<file> with the metadata `memfit verify` reads (make_llama_family_fixtures.py's)."""
    meta = {"family": family, "config": json.dumps(config), "batch": str(batch), "seq": str(seq),
            "adamw": json.dumps(ADAMW), "decay": "parameters with 2 or more dimensions", "ignore_index": "-100",
            "reference": f"float64 PyTorch {torch.__version__}"}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), file)
    write_safetensors(path, out, meta)
    return path


def routing_ok(gap, counts, agrees, all_experts):
    """Decisive (GAP_MIN, the same experts in float32) and spread: every expert used where
    all_experts (a gradient is taken there: an expert without tokens would have no .grad, which
    torch.optim.AdamW skips, weight decay included), else at least MIN_EXPERTS_USED."""
    least = E if all_experts else MIN_EXPERTS_USED
    return gap >= GAP_MIN and agrees and all(sum(c > 0 for c in layer) >= least for layer in counts)


def fixture(config, file, first_seed, tries=2000, show_names=False):
    """The first seed from first_seed whose routing passes routing_ok at the initial weights (both
    gradients' points: all experts used), step 1's and step 2's."""
    configure(config)
    for seed in range(first_seed, first_seed + tries):
        torch.manual_seed(seed)
        p = parameters()
        ids = torch.randint(0, V, (B, T))
        targets = torch.roll(ids, -1, dims=1)
        targets[0, 5] = targets[1, -1] = -100   # ignored positions
        with torch.no_grad():   # the initial weights first: most seeds stop here
            if not routing_ok(*routing_stats(forward(p, ids)[1]), float32_agrees(p, ids), True):
                continue
        out, routing = two_adamw_steps(p, ids, targets)
        if all(routing_ok(*r, all_experts=i < 2) for i, r in enumerate(routing)):
            break
    else:
        raise SystemExit(f"{file}: no seed in [{first_seed}, {first_seed + tries}) routes decisively")
    path = write_fixture(file, out, "llama", CONFIG, B, T)
    layers = [l for l in range(L) if is_moe_layer(l)]
    print(f"wrote {path} (seed {seed}): loss {out['expected.loss'].item():.6f} "
          f"(aux {out['expected.aux_loss'].item():.6f} x {CONFIG['router_aux_loss_coef']}), "
          f"step 2 {out['expected.loss_step2'].item():.6f} (aux {out['expected.aux_loss_step2'].item():.6f})")
    for point, (gap, counts, _) in zip(("initial", "step 1", "step 2"), routing):
        per_layer = ", ".join(f"layer {l} {c}" for l, c in zip(layers, counts))
        print(f"  {point:7s} weights: smallest top-{K} routing gap {gap:.3e}; tokens per expert: {per_layer}")
    if show_names:
        h = f"model.layers.{layers[0]}."
        print(f"  tensors of sparse layer {layers[0]}:")
        for n in out:
            if n.startswith(h):
                print(f"    {n} {list(out[n].shape)}")


FIXTURES = [   # (config, file, first seed, print a sparse layer's tensor names)
    (MIXTRAL, "mixtral_tiny.safetensors", 100, False),
    (QWEN3_MOE, "qwen3_moe_tiny.safetensors", 300, False),
    (OLMOE, "olmoe_tiny.safetensors", 500, False),
    (QWEN2_MOE, "qwen2_moe_tiny.safetensors", 700, True),
]

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="FILE", choices=[f[1] for f in FIXTURES],
                        help="write only these fixtures (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for config, file, first_seed, show_names in FIXTURES:
        if args.only is None or file in args.only:
            fixture(config, file, first_seed, show_names=show_names)
