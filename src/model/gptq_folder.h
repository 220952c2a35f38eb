// GPTQ model folders as the Hub holds them (AutoGPTQ's and GPTQModel's v1 checkpoint format,
// what transformers' GPTQ integration loads and vLLM serves): config.json with
//   "quantization_config": {"quant_method": "gptq", "bits", "group_size" (-1: whole rows),
//                           "desc_act", "sym", "damp_percent", "checkpoint_format": "gptq", ...}
// and per quantized linear layer (the block projections: q/k/v/o/gate/up/down, GPT-2's c_attn,
// attn.c_proj, c_fc, mlp.c_proj) the tensors <module>.qweight (I32 [in/p, out]), .qzeros (I32
// [groups, out/p], zero points minus one), .scales (F16 [groups, out]) and .g_idx (I32 [in]),
// p = 32/bits (backend/quant_format.h's gptq layout, one module's columns); the rest of the model
// (embeddings, norms, biases, head) as a plain folder holds it, in fp16 by default.
//
// memfit keeps a model's fused projections (q|k|v, gate|up) as one packed matrix: the modules'
// columns side by side, which needs their g_idx equal (GPTQ gives them one Hessian, so act-order
// gives them one order); a folder whose fused modules differ is refused.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/lora.h"

namespace memfit {

// GPTQ's settings (infer/gptq.h's solver reads them; the folder records them).
struct GptqOptions {
    int    bits = 4;
    int    group = 128;        // inputs per group; <= 0: the whole row (the file's group_size -1)
    bool   sym = true;
    bool   desc_act = false;   // act-order
    double damp = 0.01;        // times the mean of H's diagonal
    int    block = 128;        // lazy-batch columns (see above)
    // The projections of one block quantized in forward order (q|k|v, o, gate|up, down), each
    // calibrated on inputs that the ones before it already quantized produce (AutoGPTQ's
    // true_sequential, its default); false: all four from the block's unquantized inputs.
    bool   true_sequential = true;
};

// What the folder's quantization_config records.
struct GptqSpec {
    GptqOptions options;           // bits, group (<= 0: -1 in the file), sym, desc_act, damp
    std::string method = "gptq";   // gptq | rtn (meta.quantizer; quant_method stays "gptq")
};
nlohmann::json gptq_config_json(const GptqSpec & s);
// config.json's quantization_config when its quant_method is "gptq"; nullopt for a plain folder.
// ConfigError for what memfit does not read (bits other than 4 or 8, checkpoint_format gptq_v2,
// another quant_method).
std::optional<GptqSpec> read_gptq_spec(const std::string & dir);

// The packed projections of a model in these settings (make_quant_layout's gptq entries).
QuantLayout gptq_layout(const ModelConfig & cfg, const GptqSpec & s);

// make_quant_layout's prototype of these settings (format gptq, bits, group).
QuantDesc gptq_proto(const GptqOptions & o);

// A GPTQ model in memory: the packed projections (layout's bytes, each entry at its offset) and
// the whole model's fp32 weights in make_param_layout order, the projections dequantized.
struct GptqModel {
    ModelConfig          cfg;
    GptqSpec             spec;
    QuantLayout          layout;
    std::vector<uint8_t> packed;
    std::vector<float>   params;
};

// Writes dir/config.json and dir/model.safetensors (atomically; the dense part in `dtype`:
// "F16", "BF16" or "F32"); config_extra is merged into config.json (the tokenizer's ids).
// Returns the bytes of the tensors written.
uint64_t write_gptq_folder(const std::string & dir, const GptqModel & m, const std::string & dtype = "F16",
                           const nlohmann::json & config_extra = nlohmann::json::object());
// Reads a folder read_gptq_spec says is GPTQ. FormatError naming the file and tensor for a
// missing, misshapen or inconsistent tensor.
GptqModel read_gptq_folder(const std::string & dir);

}  // namespace memfit
