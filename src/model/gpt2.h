// GPT-2: the per-op forward and backward of the transformer, written once against Graph.
// The constructor declares every activation buffer the pass needs (name, category, bytes);
// forward()/backward() issue the ops. What each buffer's lifetime is follows from the ops that
// touch it, so tensors that backward does not need (the projection outputs, for example) are
// freed as soon as forward is done with them.
#pragma once

#include <vector>

#include "backend/graph.h"
#include "model/config.h"
#include "model/param_layout.h"

namespace memfit {

// Views of every weight (or gradient) inside one flat buffer.
struct Gpt2Weights {
    struct Layer {
        Tensor ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
    };
    Tensor wte, wpe, lnfw, lnfb;
    std::vector<Layer> h;
};
Gpt2Weights gpt2_weights(const ModelConfig & cfg, const ParamLayout & layout, BufferId flat);

class Gpt2 {
public:
    // Declares activation buffers for batch B, sequence T; with_backward adds the gradient
    // buffers of the backward pass; keep_logits makes the logits buffer persistent so the host
    // can read it after the step.
    Gpt2(const ModelConfig & cfg, int B, int T, Program & program, bool with_backward, bool keep_logits = false);

    // tokens [B,T] i32 -> logits [B,T,V] (the `logits` buffer).
    void forward(Graph & g, const Gpt2Weights & w, Tensor tokens) const;
    // Expects dlogits in the logits buffer; accumulates parameter gradients into dw.
    void backward(Graph & g, const Gpt2Weights & w, const Gpt2Weights & dw, Tensor tokens) const;

    Tensor logits() const { return logits_; }

private:
    struct LayerActs {
        Tensor ln1, ln1_mean, ln1_rstd, qkv, att, atty, attproj, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu,
            fcproj, res3;
        // backward
        Tensor dfch_gelu, dfch, dln2, datty, dqkv, dln1;
    };
    ModelConfig cfg_;
    int B_, T_;
    Tensor encoded_, lnf_, lnf_mean_, lnf_rstd_, logits_;
    Tensor dres_, dlnf_;
    std::vector<LayerActs> layers_;
};

}  // namespace memfit
