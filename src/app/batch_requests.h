// `memfit generate --prompts FILE.jsonl --out RESULTS.jsonl`: many requests served at once by
// continuous batching over a paged KV cache (infer/batch_generate.h).
//
// FILE.jsonl holds one request per line: "prompt" (text, continued as given) or "messages" (a
// chat, rendered with the tokenizer's chat template and its generation prompt; generation stops
// at the template's end-of-turn and end-of-sequence tokens), and optionally "max_tokens",
// "temperature", "top_p", "top_k", "seed" (the command line's values otherwise). RESULTS.jsonl
// gets one line per request, in the input's order: {"index", "text" (the continuation only; bytes
// that are not UTF-8 as U+FFFD), "token_ids" (the continuation's, exact), "finish_reason" ("stop" |
// "length"), "prompt_tokens", "completion_tokens", "preemptions"} and
// "error" for a request that could not run (a prompt longer than the context). It is written
// atomically when every request has finished.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/instruct.h"
#include "infer/batch_generate.h"
#include "tokenizer/tokenizer.h"

namespace memfit {

// The requests of a prompts file. ConfigError naming the file and line for a malformed line, an
// unknown key, or messages without a chat template.
std::vector<GenerationRequest> read_generation_requests(const std::string & path, const Tokenizer & tok,
                                                        const ChatFormat & chat, const SampleOptions & defaults);

// RESULTS.jsonl's text (invalid UTF-8 in a continuation replaced by U+FFFD).
std::string generation_results_jsonl(const std::vector<GenerationResult> & results, const Tokenizer & tok);

struct BatchServeOptions {
    int kv_block = 16;                  // --kv-block
    uint64_t kv_memory = 0;             // --kv-memory (0: what the requests can use, below)
    int max_num_seqs = 32;              // --max-num-seqs (the decoder's slots: rounded up to Decoder::kRowTile)
    int max_num_batched_tokens = 128;   // --max-num-batched-tokens (the same)
    int context = 0;                    // positions per sequence
    bool kv_int8 = false;               // --kv-dtype int8 (backend/paged_kv.h)
};

// The paged cache for `requests` under the options: the pool holds kv_memory bytes, or (0) every
// block the max_num_seqs largest requests can use at once (so none is pre-empted). ConfigError
// when kv_memory holds fewer than two blocks.
PagedKv batch_kv_geometry(const ModelConfig & cfg, DType kv_dtype, const BatchServeOptions & o,
                          const std::vector<GenerationRequest> & requests);

// --memory-budget: the most blocks the budget holds beside the decoder's other planned bytes
// (weights, the largest step's activations, workspace: Decoder::plan_paged, `sizing` the backend
// that will run it). ConfigError with the numbers when that is fewer than two.
int blocks_within_budget(const ModelConfig & cfg, const Backend & sizing, PagedKv kv, int context, DType compute,
                         const QuantLayout & quant, uint64_t budget);

// Runs them, printing a progress line about every second and a closing line to `progress`.
std::vector<GenerationResult> serve_requests(Decoder & decoder, const std::vector<GenerationRequest> & requests,
                                             std::FILE * progress, const BatchOptions & options);

}  // namespace memfit
