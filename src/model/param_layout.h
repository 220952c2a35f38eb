// Parameter layout: every weight of the model under its Hugging Face name, at an offset (in
// elements) in one flat buffer, in module order. GPT-2 Conv1D weights are [in, out]; LLaMA
// Linear weights are [out, in].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace memfit {

struct ParamInfo {
    std::string          name;    // "h.3.attn.c_attn.weight"
    std::vector<int64_t> shape;
    size_t               offset = 0;  // elements into the flat buffer
    size_t               numel  = 0;
    bool decay() const { return shape.size() >= 2; }   // AdamW weight decay applies
};

struct ParamLayout {
    std::vector<ParamInfo> params;
    size_t total = 0;   // elements
    const ParamInfo & find(const std::string & name) const;   // aborts if absent (a bug)
    const ParamInfo * try_find(const std::string & name) const;
};

// A part of a model (a pipeline stage's, an expert-parallel rank's: a layout whose names are all
// in `whole`) and the whole model's flat data: the part's parameters taken from it by name, and
// put back into it.
std::vector<float> take_by_name(const ParamLayout & whole, const ParamLayout & part, const float * from);
void put_by_name(const ParamLayout & whole, const ParamLayout & part, const float * from, float * into);

// Stored blocks only: with cfg.share_layers = G, block g's names ("h.g.", "model.layers.g.")
// hold the weights of layers gG .. gG + G - 1.
ParamLayout make_param_layout(const ModelConfig & cfg);

// The transformer block a parameter name belongs to ("model.layers.3.", "h.3.",
// "...transformer.h.3."), or -1; and the same name in block `block` (a name with a block).
int param_block(const std::string & name);
std::string in_block(const std::string & name, int block);

// Shared blocks (cfg.share_layers > 1) written out one per layer: the unshared twin's flat
// parameters (its layout: make_param_layout of the config with share_layers = 1).
std::vector<float> unshared_params(const ModelConfig & cfg, const float * params);

}  // namespace memfit
