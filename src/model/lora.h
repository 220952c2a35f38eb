// LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") and the frozen,
// optionally quantized base it adapts (Dettmers et al. 2023, QLoRA).
//
// A target projection W [out, in] gets a trainable pair A [r, in], B [out, r]; its output
// becomes x W^T + (alpha / r) (x A^T) B^T. A starts Gaussian, B at zero, so the first forward is
// the base model's. The adapters live in their own flat buffer, under PEFT's tensor names
// ("base_model.model.<module>.lora_A.weight"), and are the only trainable parameters: the base
// has no gradients, no master copy and no optimizer states.
//
// memfit fuses q|k|v (GPT-2's c_attn, LLaMA's q_proj|k_proj|v_proj) and GPT-2's c_fc or LLaMA's
// gate_proj|up_proj into one matmul each; an adapter on one of them writes into its column
// slice of the fused output (a LoraSite).
//
// DoRA (Liu et al. 2024, "DoRA: Weight-Decomposed Low-Rank Adaptation", as PEFT computes it):
// the adapted weight's rows are renormalised and scaled by a trainable magnitude m [cols],
// W' = m / ||W + s B A||_row (W + s B A), the norm detached from the gradient (the paper's
// section 4.3, PEFT's default). So out = m / n (x W^T + s x A^T B^T) + bias: LoRA's output
// slice, less its bias, times a per-column factor. m starts at the base's row norms (a packed
// base's dequantized rows, QDoRA), so the first forward is again the base model's.
//
// Quantized base: the four block projections of every layer are stored packed
// (backend/quant_format.h), always [out, in] (GPT-2's Conv1D [in, out] weights are transposed
// when quantized); embeddings, norms, biases and the LM head stay in the compute dtype, as in
// QLoRA.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "model/config.h"
#include "model/param_layout.h"

namespace memfit {

// The base storage `--base-weights` names (sparse24: 2:4 structured sparse, model/sparsity.h;
// gptq: a GPTQ folder's packed projections, model/gptq_folder.h, as they are).
enum class BaseWeights : uint8_t { compute, int8, nf4, sparse24, gptq };

// The packed format of a quantized base storage (not `compute`).
inline QuantFormat quant_format(BaseWeights b, bool double_quant) {
    if (b == BaseWeights::int8) return QuantFormat::int8;
    if (b == BaseWeights::sparse24) return QuantFormat::sparse24;
    if (b == BaseWeights::gptq) return QuantFormat::gptq;
    return double_quant ? QuantFormat::nf4_dq : QuantFormat::nf4;
}

struct LoraOptions {
    int   rank = 0;                  // 0: no LoRA (every parameter trains)
    float alpha = 16;
    // Target modules, family names: LLaMA q,k,v,o,gate,up,down; GPT-2 c_attn, attn.c_proj,
    // c_fc, mlp.c_proj. Empty: the family's default (q,v | c_attn). parse_lora_targets makes them.
    std::vector<std::string> targets;
    BaseWeights base = BaseWeights::compute;
    bool  double_quant = true;       // nf4: quantize the block absmaxes too (QLoRA's default)
    float dropout = 0;               // on the adapters' input while training (not in evaluation)
    bool  dora = false;              // --lora-variant dora: a magnitude vector per site (above)
    // --use-rslora (Kalajdzievski 2023, rank-stabilized LoRA; PEFT's use_rslora): the adapters
    // scaled by alpha / sqrt(r) instead of alpha / r.
    bool  rslora = false;
    // gptq base: the folder's bits and group size (<= 0: whole rows).
    int   gptq_bits = 4, gptq_group = 128;

    bool enabled() const { return rank > 0; }
    float scaling() const { return rslora ? alpha / std::sqrt(float(rank)) : alpha / float(rank); }
    bool quantized() const { return base != BaseWeights::compute; }
    QuantFormat format() const { return quant_format(base, double_quant); }
    // make_quant_layout's prototype: the format, and a gptq base's bits and group.
    QuantDesc quant() const {
        return base == BaseWeights::gptq ? QuantDesc{format(), 0, 0, gptq_bits, gptq_group} : QuantDesc{format()};
    }
};

// "q,v" | "all" | HF module names (q_proj, c_attn, ...) -> the family's target names, in module
// order, deduplicated. GPT-2 maps q/k/v to c_attn, o to attn.c_proj, gate/up to c_fc, down to
// mlp.c_proj, and c_proj to both c_proj modules; lm_head (not in "all") adapts an untied LM head.
// Empty csv: the default. ConfigError on unknown, and on lm_head with a tied head.
std::vector<std::string> parse_lora_targets(const ModelConfig & cfg, const std::string & csv);
// "bf16" | "fp16" | "fp32" | "compute" -> compute (they must match the run's precision: checked by
// the caller), "int8", "nf4", "sparse24". `flag` names the flag in the error (--teacher-weights
// takes the same storages).
BaseWeights parse_base_weights(const std::string & s, const char * flag = "--base-weights");
const char * base_weights_name(BaseWeights b);

// The four matmuls of a block (model/transformer.h): fused qkv, attention output, the first MLP
// matmul (c_fc | gate|up), the second (mlp c_proj | down_proj).
enum class Proj : uint8_t { qkv, o, fc, down };

// The output width of a block projection of cfg (fused: q|k|v, gate|up).
inline int64_t proj_out_cols(const ModelConfig & cfg, Proj p) {
    return p == Proj::qkv ? cfg.qkv_dim() : p == Proj::fc ? cfg.fc_dim() : cfg.n_embd;
}

struct LoraSite {
    int         layer = 0;
    Proj        proj = Proj::qkv;
    int64_t     col0 = 0, cols = 0;   // the slice of the projection's output it adds to
    int64_t     in = 0;               // the projection's input width
    std::string module;               // Hugging Face module name, "model.layers.0.self_attn.q_proj"
    size_t      a = 0, b = 0;         // indices of lora_A [r, in] and lora_B [cols, r] in the layout
    size_t      m = 0;                // DoRA: index of lora_magnitude_vector [cols] (after b)
    // The LM head (target and module lm_head, an untied head only): after the blocks (layer =
    // n_layer), cols the vocabulary, in the channels; proj unused.
    bool        head = false;
    // The token embedding (target embed_tokens, untied only): before the blocks (layer = -1), in
    // the vocabulary, cols the channels. PEFT's Embedding LoRA: out += scale A^T[token] B^T, A
    // "lora_embedding_A" [r, V] zero at the start, B "lora_embedding_B" [C, r] Gaussian. memfit
    // holds A transposed, [V, r] (a token's row is what it reads): PEFT's [r, V] at export and load.
    bool        embed = false;
    // A mixture of experts' sparse layer: expert e's own matrix (module "...experts.<e>.gate_proj";
    // proj fc or down, col0 its slice of the expert's gate|up). Each expert's sites are adjacent
    // in the layout, so its A (and B) matrices sit at one stride from the previous expert's: the
    // grouped matmul reads them as a stack (model/transformer_moe.cpp).
    int         expert = -1;
};

// PEFT's tensor names of a site's A and B (an embedding's lora_embedding_A / _B).
std::string peft_name(const LoraSite & s, bool b_matrix);
// PEFT's name of a DoRA site's magnitude vector: "base_model.model.<module>.lora_magnitude_vector".
std::string peft_magnitude_name(const std::string & module);
// Whether memfit holds the adapter tensor `name` transposed from PEFT's layout (lora_embedding_A).
inline bool peft_transposed(const std::string & name) { return name.ends_with(".lora_embedding_A"); }
// m [rows, cols] transposed, [cols, rows].
inline std::vector<float> transpose_rows(const float * m, int64_t rows, int64_t cols) {
    std::vector<float> t(size_t(rows * cols));
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) t[size_t(j * rows + i)] = m[i * cols + j];
    return t;
}

// Adapters' layout: lora_A then lora_B (DoRA: then lora_magnitude_vector) of each site, sites in
// layer then module order.
ParamLayout make_lora_layout(const ModelConfig & cfg, const LoraOptions & lora);
std::vector<LoraSite> lora_sites(const ModelConfig & cfg, const LoraOptions & lora);
// PEFT's tensor names: "base_model.model." + module + ".lora_A.weight" (".lora_B.weight").
std::string peft_name(const std::string & module, bool b_matrix);
// The module names target_modules lists in adapter_config.json ("q_proj", "attn.c_proj", ...).
std::vector<std::string> peft_target_modules(const ModelConfig & cfg, const LoraOptions & lora);

// Quantized base layout: one packed matrix per layer and projection, at a byte offset in one
// buffer. `names` are the Hugging Face weights it holds, stacked by rows in order.
struct QuantEntry {
    int         layer = 0;
    Proj        proj = Proj::qkv;
    // A sparse layer's experts: expert e's gate|up (fc) or down matrix, entries of one layer and
    // projection adjacent in expert order, so one expert's packed bytes follow the previous one's
    // at a fixed stride (QWeight::stride).
    int         expert = -1;
    QuantDesc   q;
    size_t      offset = 0;            // bytes
    std::vector<std::string> names;
};
struct QuantLayout {
    std::vector<QuantEntry> entries;   // layer-major, Proj order
    size_t bytes = 0;
    const QuantEntry * find(int layer, Proj p) const;
};
// proto: the format, and for gptq its bits and group (0 or less: each matrix's whole row, the
// file's group_size -1). ConfigError when a matrix's shape does not suit the format.
QuantLayout make_quant_layout(const ModelConfig & cfg, const QuantDesc & proto);
inline QuantLayout make_quant_layout(const ModelConfig & cfg, QuantFormat format) {
    return make_quant_layout(cfg, QuantDesc{format});
}
// Every parameter of make_param_layout(cfg) that `q` does not hold, in the same order (offsets
// renumbered). With an empty q: the whole layout.
ParamLayout dense_layout(const ModelConfig & cfg, const QuantLayout & q);
// The same of any part of the model's layout (a pipeline stage's).
ParamLayout dense_part(const ParamLayout & layout, const QuantLayout & q);
// The matrix a quantized entry holds, [out, in], gathered from the whole model's fp32 weights
// `full` (`all` = make_param_layout(cfg)); GPT-2's Conv1D [in, out] weights are transposed. And
// scatter_quant_entry: the way back, m [out, in] into `full`.
std::vector<float> gather_quant_entry(const ModelConfig & cfg, const ParamLayout & all, const QuantEntry & e,
                                      const float * full);
void scatter_quant_entry(const ModelConfig & cfg, const ParamLayout & all, const QuantEntry & e, const float * m,
                         float * full);

// {"r", "alpha", "targets", "base_weights", "double_quant", "dropout", "use_dora", "use_rslora"}: how checkpoints record the options;
// lora_from_json reads it back (FormatError naming `what` on a malformed record).
nlohmann::json lora_json(const LoraOptions & lora);
// A LoRA checkpoint's record of its base weights: bytes_digest of their fp32 values as loaded.
inline constexpr const char * kBaseDigestKey = "base_digest";
LoraOptions lora_from_json(const nlohmann::json & j, const ModelConfig & cfg, const std::string & what);

// Folds the adapters into the whole model's fp32 weights w (make_param_layout order): each
// target W += (alpha / r) B A, in the family's storage ([out, in] LLaMA, [in, out] GPT-2); DoRA:
// each adapted row then times m / ||row||.
void merge_lora(const ModelConfig & cfg, const LoraOptions & lora, float * w, const float * adapters);

// DoRA: each site's magnitude (in `adapters`, a make_lora_layout buffer) set to the norms of the
// adapted rows of W + (alpha / r) B A, W from the whole model's fp32 weights `w`: with B = 0, the
// base's row norms, as PEFT starts them.
void init_dora_magnitudes(const ModelConfig & cfg, const LoraOptions & lora, const float * w, float * adapters);

// Trainable adapter parameters.
size_t lora_param_count(const ModelConfig & cfg, const LoraOptions & lora);

}  // namespace memfit
