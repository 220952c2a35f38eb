// Decoder: text generation with a KV cache, planned like a training step.
//
// Two kinds of forward-only programs share one set of persistent buffers (bound by name): the
// weights in the compute dtype, each layer's key and value caches ([capacity, KVH * head_dim],
// category activations, named kv_cache.<l>.k|v), the token slots and the last token's logits.
// A prefill program runs a prompt of n tokens at once; the step program runs one token. Each
// appends its keys and values to the caches and attends over everything cached before it, so a
// new token costs one token's forward instead of the whole window's. Programs for new prompt
// lengths are recorded on first use and run inside the step program's arenas where they fit.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "memory/ledger.h"
#include "memory/step_memory.h"
#include "model/config.h"
#include "model/param_layout.h"
#include "model/transformer.h"

namespace memfit {

class Decoder {
public:
    // capacity: positions the caches hold (at most the model's max_seq).
    Decoder(const ModelConfig & cfg, Backend & backend, int capacity, DType compute = DType::f32);
    ~Decoder();

    // Sets the weights from fp32 values in the layout's order (converted to the compute dtype).
    void set_weights(const float * params);
    const ParamLayout & layout() const { return layout_; }
    const ModelConfig & config() const { return cfg_; }

    // Forgets the cache and runs `tokens` (1 .. capacity of them) from position 0; returns the
    // last token's V logits (valid until the next call).
    const float * prefill(const std::vector<int32_t> & tokens);
    // Appends one token at position() (< capacity); returns its logits.
    const float * step(int32_t token);
    int position() const { return pos_; }
    int capacity() const { return capacity_; }

    // Planned bytes over every program recorded so far (step plus prefills), and the KV cache's.
    CategoryBytes planned_peak_live() const;
    CategoryBytes planned_reserved() const;
    uint64_t kv_cache_bytes() const;
    const Ledger & ledger() const { return ledger_; }

private:
    struct Pass;
    Pass & program_for(int n);
    const float * run(Pass & p, const int32_t * tokens, int pos0);

    ModelConfig cfg_;
    Backend & backend_;
    int capacity_;
    DType compute_;
    ParamLayout layout_;
    Ledger ledger_;
    std::unique_ptr<Pass> step_;                    // n = 1; owns the persistent buffers
    std::map<int, std::unique_ptr<Pass>> prefill_; // by prompt length
    int pos_ = 0;
};

}  // namespace memfit
