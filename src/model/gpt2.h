// GPT-2: the per-op forward and backward of the transformer, written once against Graph.
// The constructor declares every activation buffer the pass needs (name, category, bytes);
// forward()/backward() issue the ops. What each buffer's lifetime is follows from the ops that
// touch it, so tensors that backward does not need (the projection outputs, for example) are
// freed as soon as forward is done with them.
#pragma once

#include <string>
#include <vector>

#include "backend/graph.h"
#include "model/config.h"
#include "model/param_layout.h"
#include "model/recompute.h"

namespace memfit {

// Views of every weight (or gradient) inside one flat buffer.
struct Gpt2Weights {
    struct Layer {
        Tensor ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
    };
    Tensor wte, wpe, lnfw, lnfb;
    std::vector<Layer> h;
};
// `dtype`: the storage of the flat buffer (element offsets scale with it).
Gpt2Weights gpt2_weights(const ModelConfig & cfg, const ParamLayout & layout, BufferId flat, DType dtype = DType::f32);

struct Gpt2Options {
    bool with_backward = false;  // declare the backward pass's gradient buffers
    bool keep_logits = false;    // logits persistent, so the host can read them after the step
    int  loss_chunk = 0;         // rows (tokens) per LM-head + loss chunk; 0: the whole batch at once
    bool flash_attention = false;// tiled attention: saves one log-sum-exp per query, not the T x T probabilities
    RecomputePlan recompute;     // what each layer keeps for backward (model/recompute.h)
    // Storage of weights and activations (kernels compute in f32 from it); mean/rstd/lse and
    // logits stay f32. Parameter gradients are stored as `grad`.
    DType compute = DType::f32;
    DType grad = DType::f32;
};

class Gpt2 {
public:
    // Declares the activation buffers for batch B, sequence T.
    Gpt2(const ModelConfig & cfg, int B, int T, Program & program, const Gpt2Options & opt);

    // tokens [B,T] i32 -> the final layer norm's output (the blocks and ln_f).
    void forward(Graph & g, const Gpt2Weights & w, Tensor tokens) const;
    // The LM head, for the whole batch: logits [B,T,V] into the `logits` buffer.
    void head_logits(Graph & g, const Gpt2Weights & w) const;
    // The LM head and the cross-entropy (losses [B,T]); with dw, also their backward (dlogits
    // scaled by dloss, dwte accumulated, d(ln_f output) written). Chunked by loss_chunk rows, so
    // that with chunks the B*T*V logits never exist whole: each chunk's logits are turned into
    // gradients and consumed before the next chunk's are computed.
    void head_loss(Graph & g, const Gpt2Weights & w, const Gpt2Weights * dw, Tensor targets, Tensor losses,
                   float dloss) const;
    // The blocks' backward, after head_loss with dw; accumulates parameter gradients into dw.
    // Recomputes what the recompute plan dropped just before each layer's (or segment's) backward.
    void backward(Graph & g, const Gpt2Weights & w, const Gpt2Weights & dw, Tensor tokens) const;

    Tensor logits() const { return logits_; }

private:
    struct LayerActs {
        Tensor ln1, ln1_mean, ln1_rstd, qkv, att, lse, atty, attproj, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu,
            fcproj, res3;
        // backward
        Tensor dfch_gelu, dfch, dln2, datty, dqkv, dln1;
    };
    // One layer's forward from input x into the buffers of `a`; the output projection and the
    // last residual are skipped when the output is not needed (the last layer of a recomputed segment).
    void layer_forward(Graph & g, const LayerActs & a, const Gpt2Weights::Layer & p, Tensor x, bool need_output) const;
    LayerActs declare_layer(Program & program, const std::string & prefix, bool with_backward) const;
    Tensor act(Program & program, const std::string & name, std::initializer_list<int64_t> dims, bool f32 = false) const;
    // Recomputes the units layer l's mask dropped into rc_[l]; returns the layer's activations
    // as backward reads them (kept ones from forward, the rest recomputed).
    LayerActs recompute_dropped(Graph & g, int l, const Gpt2Weights::Layer & p, Tensor x) const;

    ModelConfig cfg_;
    int B_, T_;
    RecomputePlan rc_plan_;
    DType dt_ = DType::f32;
    std::vector<LayerActs> rc_;   // recomputed activations (used by backward) when recomputing
    int chunk_rows_ = 0;   // rows per head chunk (B*T when unchunked)
    bool flash_ = false;
    Tensor encoded_, lnf_, lnf_mean_, lnf_rstd_, logits_;
    Tensor dres_, dlnf_;
    std::vector<LayerActs> layers_;
};

}  // namespace memfit
