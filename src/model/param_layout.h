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

ParamLayout make_param_layout(const ModelConfig & cfg);

}  // namespace memfit
