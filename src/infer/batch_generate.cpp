#include "infer/batch_generate.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <random>

#include <fmt/format.h>

#include "core/error.h"
#include "core/finite.h"

namespace memfit {

BlockPool::BlockPool(int blocks) : total_(blocks) {
    // Handed out lowest index first (popped from the back).
    for (int b = blocks - 1; b >= 0; --b) free_.push_back(b);
}

int BlockPool::allocate() {
    if (free_.empty()) return -1;
    const int b = free_.back();
    free_.pop_back();
    return b;
}

void BlockPool::release(int block) {
    MF_ASSERT(block >= 0 && block < total_ && int(free_.size()) < total_);
    free_.push_back(block);
}

namespace {

struct Seq {
    size_t req = 0;
    int slot = -1;
    std::vector<int32_t> tokens;   // prompt, then the tokens generated
    int computed = 0;              // positions whose keys and values are cached
    std::vector<int32_t> blocks;   // its block-table row (-1: none, or freed by the window)
    std::mt19937_64 rng;
};

// The rows one sequence runs in a step: positions computed .. computed + n - 1.
struct Take {
    Seq * seq;
    int n;
};

class Scheduler {
public:
    Scheduler(Decoder & d, const std::vector<GenerationRequest> & reqs, const BatchOptions & o)
        : d_(d), reqs_(reqs), opt_(o), kv_(d.paged()), pool_(kv_.blocks), results_(reqs.size()) {
        window_ = d.config().sliding_window;
        for (int l = 0; l < d.config().n_layer; ++l)
            if (d.config().layer_window(l) == 0) window_ = 0;   // a global layer reads every position
        for (int s = kv_.seqs - 1; s >= 0; --s) free_slots_.push_back(s);
        for (size_t i = 0; i < reqs.size(); ++i) {
            GenerationResult & r = results_[i];
            r.prompt_tokens = int(reqs[i].prompt.size());
            if (reqs[i].prompt.empty())
                r.error = "an empty prompt";
            else if (r.prompt_tokens >= d.capacity())
                r.error = fmt::format("a prompt of {} tokens leaves no room in the context of {} positions",
                                      r.prompt_tokens, d.capacity());
            else if (blocks_for(r.prompt_tokens) + 1 > kv_.blocks)
                r.error = fmt::format("a prompt of {} tokens needs {} KV blocks of {} positions and the pool holds {} "
                                      "(raise --kv-memory)", r.prompt_tokens, blocks_for(r.prompt_tokens) + 1,
                                      kv_.block, kv_.blocks);
            else
                waiting_.push_back(make_seq(i));
        }
    }

    std::vector<GenerationResult> run(BatchStats & st) {
        const auto t0 = std::chrono::steady_clock::now();
        while (!waiting_.empty() || !running_.empty()) {
            std::vector<Take> takes = schedule(st);
            if (takes.empty()) {   // the queue's head outgrew the whole pool while it ran alone
                MF_ASSERT(running_.empty() && !waiting_.empty());
                const Seq & s = waiting_.front();
                results_[s.req].finish_reason = "length";
                results_[s.req].error = fmt::format(
                    "the KV pool's {} blocks of {} positions cannot hold its {} positions (raise --kv-memory)",
                    kv_.blocks, kv_.block, s.tokens.size() + 1);
                waiting_.pop_front();
                ++st.finished;
                continue;
            }
            step(takes, st);
            st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            st.running = int(running_.size());
            st.waiting = int(waiting_.size());
            if (opt_.on_step) opt_.on_step(st);
        }
        return std::move(results_);
    }

private:
    int blocks_for(int positions) const { return (positions + kv_.block - 1) / kv_.block; }

    Seq make_seq(size_t i) {
        Seq s;
        s.req = i;
        s.tokens = reqs_[i].prompt;
        s.rng.seed(reqs_[i].sample.seed);
        return s;
    }

    // Blocks for positions computed .. computed + n - 1 (n cut to what the pool holds unless
    // all_or_none); returns the positions covered.
    int reserve(Seq & s, int n, bool all_or_none) {
        const int first = s.computed / kv_.block, last = (s.computed + n - 1) / kv_.block;
        int missing = 0;
        for (int j = first; j <= last; ++j) missing += s.blocks[size_t(j)] < 0;
        if (missing > pool_.free() && all_or_none) return 0;
        for (int j = first; j <= last; ++j) {
            if (s.blocks[size_t(j)] >= 0) continue;
            const int b = pool_.allocate();
            if (b < 0) return std::max(0, j * kv_.block - s.computed);
            s.blocks[size_t(j)] = b;
        }
        return n;
    }

    void release(Seq & s) {
        for (int32_t & b : s.blocks)
            if (b >= 0) pool_.release(b), b = -1;
        free_slots_.push_back(s.slot);
        s.slot = -1;
    }

    // The running sequence admitted last goes back to the queue's front, to be recomputed.
    void preempt_last(BatchStats & st) {
        Seq s = std::move(running_.back());
        running_.pop_back();
        release(s);
        s.computed = 0;
        ++results_[s.req].preemptions;
        ++st.preemptions;
        waiting_.push_front(std::move(s));
    }

    bool admit(int budget) {
        const int most = opt_.max_seqs > 0 ? std::min(opt_.max_seqs, kv_.seqs) : kv_.seqs;
        if (waiting_.empty() || int(running_.size()) >= most || budget <= 0) return false;
        Seq & s = waiting_.front();
        const int need = opt_.reserve_context ? kv_.max_blocks : blocks_for(int(s.tokens.size())) + 1;
        if (pool_.free() < need) return false;
        s.slot = free_slots_.back();
        free_slots_.pop_back();
        s.blocks.assign(size_t(kv_.max_blocks), -1);
        if (opt_.reserve_context)
            for (int32_t & b : s.blocks) b = pool_.allocate();
        running_.push_back(std::move(s));
        waiting_.pop_front();
        return true;
    }

    std::vector<Take> schedule(BatchStats & st);
    void step(const std::vector<Take> & takes, BatchStats & st);
    void finish_token(Seq & s, const float * logits, BatchStats & st);
    void drop_window(Seq & s);

    Decoder & d_;
    const std::vector<GenerationRequest> & reqs_;
    const BatchOptions & opt_;
    PagedKv kv_;
    BlockPool pool_;
    std::vector<GenerationResult> results_;
    std::deque<Seq> waiting_;
    std::deque<Seq> running_;   // in admission order
    std::vector<int> free_slots_;
    int window_ = 0;            // > 0: every layer attends to this many positions
};

// Decoding sequences first (one row each; pre-empting the last admitted while the pool is short),
// then the prompts' chunks in admission order, then new admissions, within the rows. Admission
// needs a row left after the decoding ones, so the decoding sequences never outnumber the rows
// (the `budget > 0` below only guards that).
std::vector<Take> Scheduler::schedule(BatchStats & st) {
    int budget = kv_.tokens;
    for (size_t i = 0; i < running_.size(); ++i) {
        Seq & s = running_[i];
        if (int(s.tokens.size()) - s.computed != 1) continue;
        while (reserve(s, 1, true) == 0) {
            const bool self = &running_.back() == &s;
            preempt_last(st);
            if (self) break;
        }
    }
    std::vector<Take> takes;
    for (Seq & s : running_)
        if (int(s.tokens.size()) - s.computed == 1 && budget > 0) takes.push_back({&s, 1}), --budget;
    for (Seq & s : running_) {
        const int need = int(s.tokens.size()) - s.computed;
        if (need <= 1 || budget <= 0) continue;
        const int n = reserve(s, std::min(need, budget), false);
        if (n > 0) takes.push_back({&s, n}), budget -= n;
    }
    while (admit(budget)) {
        Seq & s = running_.back();
        const int n = reserve(s, std::min(int(s.tokens.size()), budget), false);
        if (n > 0) takes.push_back({&s, n}), budget -= n;
    }
    return takes;
}

// Runs the rows (padded to whole row tiles), then samples for each sequence whose every token
// is now cached, and retires the finished ones.
void Scheduler::step(const std::vector<Take> & takes, BatchStats & st) {
    int rows = 0;
    for (const Take & t : takes) rows += t.n;
    const int padded = d_.step_rows(rows);
    std::vector<int32_t> tokens(size_t(padded), 0), meta(size_t(kv_.meta_words()), -1);
    int32_t * seq = meta.data() + kv_.seq_at();
    int32_t * pos = meta.data() + kv_.pos_at();
    int32_t * doc = meta.data() + kv_.doc_at();
    int32_t * logit_rows = meta.data() + kv_.logit_rows_at();
    std::fill(logit_rows, logit_rows + kv_.seqs, 0);
    for (int i = 0; i < kv_.tokens; ++i) pos[i] = 0, doc[i] = i;   // padding rows: position 0
    int r = 0;
    for (const Take & t : takes) {
        Seq & s = *t.seq;
        std::copy(s.blocks.begin(), s.blocks.end(), meta.begin() + kv_.table_at() + int64_t(s.slot) * kv_.max_blocks);
        for (int k = 0; k < t.n; ++k, ++r) {
            tokens[size_t(r)] = s.tokens[size_t(s.computed + k)];
            seq[r] = s.slot;
            pos[r] = s.computed + k;
            doc[r] = r - pos[r];
        }
        logit_rows[s.slot] = r - 1;
        // A decoding row feeds the token sampled last; the rest fill the cache (prompts, recomputation).
        if (t.n == 1 && s.computed >= results_[s.req].prompt_tokens) ++st.decode_tokens;
        else st.prefill_tokens += t.n;
    }
    const float * logits = d_.run_paged(tokens, meta);
    ++st.steps;
    st.padding_rows += padded - rows;
    st.peak_running = std::max(st.peak_running, int(running_.size()));
    const int64_t V = d_.config().vocab_size;
    for (const Take & t : takes) {
        Seq & s = *t.seq;
        s.computed += t.n;
        if (s.computed == int(s.tokens.size())) finish_token(s, logits + int64_t(s.slot) * V, st);
    }
    st.blocks_used = pool_.total() - pool_.free();
    int64_t held = 0;   // positions holding keys (a finished sequence's were given back)
    for (const Seq & s : running_) held += s.slot >= 0 ? s.computed : 0;
    if (st.blocks_used > st.peak_blocks_used) st.peak_blocks_used = st.blocks_used, st.positions_at_peak = held;
    for (size_t i = 0; i < running_.size();)   // retire the finished (slot -1)
        if (running_[i].slot < 0) running_.erase(running_.begin() + long(i));
        else drop_window(running_[i++]);
}

// Samples s's next token; a stop token, max_new_tokens or a full context ends it.
void Scheduler::finish_token(Seq & s, const float * logits, BatchStats & st) {
    const SampleOptions & o = reqs_[s.req].sample;
    GenerationResult & r = results_[s.req];
    const int V = d_.config().vocab_size;
    auto done = [&](const char * why) {
        r.finish_reason = why;
        release(s);
        ++st.finished;
    };
    if (const NonFinite bad = find_non_finite(logits, size_t(V))) {
        r.error = fmt::format("the logits after {} tokens hold {}; the model overflows in this weight storage",
                              s.tokens.size(), bad.describe());
        return done("error");
    }
    const int32_t next = sample_token(logits, V, o, s.rng);
    if (std::find(o.stop.begin(), o.stop.end(), next) != o.stop.end()) return done("stop");
    s.tokens.push_back(next);
    r.tokens.push_back(next);
    if (int(r.tokens.size()) >= o.max_new_tokens || s.computed >= d_.capacity()) done("length");
}

// Under a sliding window (every layer's), the blocks wholly below the lowest position the next
// token reads go back to the pool.
void Scheduler::drop_window(Seq & s) {
    if (window_ <= 0 || opt_.reserve_context) return;
    const int lowest = s.computed - window_ + 1;   // the next token's first key
    for (int j = 0; (j + 1) * kv_.block <= lowest; ++j)
        if (s.blocks[size_t(j)] >= 0) pool_.release(s.blocks[size_t(j)]), s.blocks[size_t(j)] = -1;
}

}  // namespace

std::vector<GenerationResult> generate_batch(Decoder & decoder, const std::vector<GenerationRequest> & requests,
                                             const BatchOptions & options, BatchStats * stats) {
    MF_ASSERT(decoder.paged().enabled() && "generate_batch runs on a paged decoder");
    BatchStats local;
    BatchStats & st = stats ? *stats : local;
    Scheduler s(decoder, requests, options);
    return s.run(st);
}

}  // namespace memfit
