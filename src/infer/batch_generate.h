// Batched generation with continuous batching over a paged KV cache (infer/decoder.h's paged
// mode, backend/paged_kv.h), as vLLM serves requests:
//
// - Every step runs up to the decoder's paged().tokens token rows of up to paged().seqs
//   sequences. Running sequences that decode take one row each first; the rest of the rows go
//   to prompts, in chunks (chunked prefill), so a long prompt never stalls the others' decoding.
// - A sequence holds the blocks its positions fill, one block at a time, and gives them back as
//   it ends; under a sliding window (every layer's), blocks that fall wholly out of the window
//   are given back as the sequence moves on.
// - A waiting request is admitted, first come first served, when a sequence slot is free and the
//   pool has blocks for its whole prompt and one more.
// - When a decoding sequence needs a block and none is free, the sequence admitted last is
//   pre-empted: its blocks are freed and it goes back to the front of the queue, to be recomputed
//   from its prompt and the tokens it had generated (vLLM's recompute pre-emption).
//
// Each request samples with its own generator seeded from its seed, and every matmul of a step
// runs in equal row tiles (Decoder::kRowTile), so a request's tokens are the ones it gets when it
// runs alone, whatever else shares its steps.
//
// BatchOptions::reserve_context is the baseline the bench compares with: each sequence reserves
// blocks for the whole context when admitted, as a contiguous cache of the context's length does.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "infer/decoder.h"
#include "infer/generate.h"

namespace memfit {

struct GenerationRequest {
    std::vector<int32_t> prompt;
    SampleOptions sample;
};

struct GenerationResult {
    std::vector<int32_t> tokens;   // the continuation (without the stop token)
    int prompt_tokens = 0;
    std::string finish_reason;     // "stop" (a stop token), "length" (max_new_tokens or the context)
    int preemptions = 0;           // times it was pre-empted and recomputed
    std::string error;             // non-empty: the request could not run (too long a prompt)
};

struct BatchOptions {
    bool reserve_context = false;   // the contiguous baseline: blocks for the whole context at admission
    int max_seqs = 0;               // sequences running at once at most (0: the decoder's paged().seqs)
    // Called after every step with the step's index (progress output).
    std::function<void(const struct BatchStats &)> on_step;
};

struct BatchStats {
    int64_t steps = 0, prefill_tokens = 0, decode_tokens = 0, padding_rows = 0, preemptions = 0;
    int running = 0, waiting = 0, finished = 0;
    int peak_running = 0;        // the most sequences one step served
    int blocks_used = 0, peak_blocks_used = 0;   // blocks held (now, at most)
    int64_t positions_at_peak = 0;   // the positions holding keys when the most blocks were held
    double seconds = 0;
};

// A free list of the pool's block indices.
class BlockPool {
public:
    explicit BlockPool(int blocks);
    int allocate();            // a free block, or -1
    void release(int block);
    int free() const { return int(free_.size()); }
    int total() const { return total_; }

private:
    std::vector<int32_t> free_;
    int total_;
};

// Runs every request to its end on a paged decoder; results in the requests' order.
std::vector<GenerationResult> generate_batch(Decoder & decoder, const std::vector<GenerationRequest> & requests,
                                             const BatchOptions & options = {}, BatchStats * stats = nullptr);

}  // namespace memfit
