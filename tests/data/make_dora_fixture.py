"""Writes tests/data/qwen2_dora_tiny.safetensors: DoRA adapters (Liu et al. 2024, "DoRA:
Weight-Decomposed Low-Rank Adaptation") on every projection of the tiny Qwen2 model of
make_llama_family_fixtures.py (biases on q, k and v, tied head), in float64.

DoRA as PEFT computes it (tuners/lora/dora.py, DoraLinearLayer): for a target Linear with weight W
[out, in], bias b and adapters A [r, in], B [out, r], scale s = lora_alpha / r and magnitude m [out],

    n = || W + s B A ||  over each output row, detached from the graph (the paper's section 4.3),
    y = (m / n - 1) (x W^T) + (m / n) s (x A^T B^T) + (x W^T + b) = (m / n) (x W^T + s x A^T B^T) + b,

which is the Linear with the weight (m / n)[:, None] (W + s B A) and the bias b, n held constant
for autograd. The base is frozen; A, B and m train with torch.optim.AdamW for two steps (weight
decay on the 2-D tensors A and B, as memfit applies it). B and m start away from PEFT's start
(B = 0, m = n), so that every gradient is nonzero and m / n differs from 1.

The fixture holds the base under its Hugging Face names, the adapters under PEFT's names
(base_model.model.<module>.lora_A.weight, .lora_B.weight, .lora_magnitude_vector), input_ids,
targets and expected.logits / loss / grad.* / step1.* / loss_step2 / step2.* of the adapters, and
the metadata `memfit verify` reads, with "lora" memfit's record of the adapters (model/lora.h).

Run with Debian's python3-torch:  /usr/bin/python3 tests/data/make_dora_fixture.py
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_llama_family_fixtures as M  # noqa: E402  (the model, the AdamW steps, the file writer)

RANK, ALPHA = 4, 8.0
SCALE = ALPHA / RANK
TARGETS = ["q", "k", "v", "o", "gate", "up", "down"]
MODULES = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj"]


def main():
    M.configure(M.QWEN2)
    torch.manual_seed(17)
    base = {n: t.detach() for n, t in M.parameters().items()}
    ids = torch.randint(0, M.V, (M.B, M.T))
    targets = torch.roll(ids, -1, dims=1)
    targets[0, 5] = targets[1, -1] = -100   # ignored positions
    adapters, sites = {}, []
    for l in range(M.L):
        for mod in MODULES:
            module = f"model.layers.{l}.{mod}"
            W = base[module + ".weight"]
            out, inp = W.shape
            A = torch.randn(RANK, inp, dtype=M.DT) / inp ** 0.5
            B = 0.05 * torch.randn(out, RANK, dtype=M.DT)
            m = (W + SCALE * B @ A).norm(dim=1) * (1 + 0.2 * torch.randn(out, dtype=M.DT))
            stem = "base_model.model." + module
            names = (stem + ".lora_A.weight", stem + ".lora_B.weight", stem + ".lora_magnitude_vector")
            for name, t in zip(names, (A, B, m)):
                adapters[name] = t.float().double().requires_grad_()   # the float32 values memfit reads
            sites.append((module, names))

    def effective():
        p = dict(base)
        for module, (a, b, m) in sites:
            adapted = base[module + ".weight"] + SCALE * adapters[b] @ adapters[a]
            n = adapted.norm(dim=1).detach()
            p[module + ".weight"] = (adapters[m] / n)[:, None] * adapted
        return p

    out = M.two_adamw_steps(adapters, lambda: M.forward(effective(), ids), ids, targets, M.V)
    out = {**base, **out}
    lora = {"r": RANK, "alpha": ALPHA, "targets": TARGETS, "base_weights": "compute", "double_quant": True,
            "dropout": 0.0, "use_dora": True}
    meta = {"family": "llama", "config": json.dumps(M.CONFIG), "batch": str(M.B), "seq": str(M.T),
            "adamw": json.dumps(M.ADAMW), "decay": "adapters with 2 or more dimensions", "ignore_index": "-100",
            "lora": json.dumps(lora), "reference": f"float64 PyTorch {torch.__version__}, PEFT's DoRA formula"}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "qwen2_dora_tiny.safetensors")
    M.write_safetensors(path, out, meta)
    print(f"wrote {path}: loss {out['expected.loss'].item():.6f}, step 2 {out['expected.loss_step2'].item():.6f}")


if __name__ == "__main__":
    main()
