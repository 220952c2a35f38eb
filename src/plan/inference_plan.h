// `memfit plan --inference`: what serving a model takes on one device of a cluster, and how many
// requests of a given context fit at once.
//
// Memory is the paged decoder's own plan (infer/decoder.h: Decoder::plan_paged, its programs
// recorded without allocating): the weights in their storage (bf16, fp32, int8, NF4, GPTQ), the
// KV pool of `concurrency` full contexts in blocks, and the activations and workspace of a step
// of `batched_tokens` rows over `concurrency` sequences. On one CPU device that is the engine's
// measured peak byte for byte. With tensor parallelism each rank's slice is planned as the model
// it is (model/tensor_parallel.h: heads, KV heads, MLP width and vocabulary split by tp), plus the
// whole vocabulary's logits a rank gathers to sample.
//
// Time is a roofline: a decode step reads every weight byte and each sequence's cached keys and
// values (on average half the context) at the device's memory bandwidth, or spends the step's
// FLOPs at its matmul rate, whichever is longer, plus two all-reduces per layer under tensor
// parallelism; decode tokens/s is the concurrency over that. Prefill of one context-long prompt
// is compute-bound: 2 x parameters x tokens plus causal attention's FLOPs.
#pragma once

#include <cstdint>
#include <optional>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "model/config.h"
#include "model/lora.h"
#include "plan/plan_types.h"

namespace memfit {

struct InferenceRequest {
    ModelConfig cfg;
    Hardware hw;
    int tp = 1;
    DType compute = DType::bf16;   // activations and the KV cache; the weights unless quantized
    std::optional<QuantDesc> quant;   // the block projections packed in this format (make_quant_layout's prototype)
    int context = 4096;            // positions per request (prompt and generated tokens)
    int concurrency = 0;           // requests at once (0: the most that fit)
    int kv_block = 16;
    bool kv_int8 = false;          // --kv-dtype int8 (backend/paged_kv.h)
    int batched_tokens = 512;      // token rows a step runs at most (prefill chunks)
};

// The most requests the planner tries at once.
constexpr int kMaxConcurrency = 4096;

struct InferencePlan {
    int concurrency = 0;           // planned (the request's, or the most that fit)
    int max_concurrency = 0;       // the most that fit, up to kMaxConcurrency (0: not even one)
    int blocks = 0;                // the KV pool's
    uint64_t kv_per_token = 0;     // one position's keys and values, every layer, this device
    CategoryBytes bytes;           // the plan's peak: parameters (weights), activations (KV pool, steps), workspace
    uint64_t weights = 0, kv_pool = 0, usable = 0;
    double decode_step_s = 0, decode_tokens_per_s = 0, prefill_s = 0;
    bool fits = false;
};

// ConfigError for a tp the model does not divide by, or a context past the model's positions.
InferencePlan plan_inference(const InferenceRequest & r, const Backend & sizing);

std::string format_inference_plan(const InferenceRequest & r, const InferencePlan & p);
nlohmann::json inference_plan_json(const InferenceRequest & r, const InferencePlan & p);

}  // namespace memfit
