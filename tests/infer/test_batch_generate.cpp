// Paged KV cache and batched generation (infer/batch_generate.h): a paged step's logits are the
// contiguous decoder's; many requests at once give each one the tokens it gets alone (greedy and
// sampled, through chunked prefill and pre-emption); the bytes are planned exactly; a sliding
// window gives blocks back; and the paged pool serves more sequences at once than reserving the
// context per sequence does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "infer/batch_generate.h"
#include "infer/decoder.h"
#include "train/engine.h"
#include "test_util.h"

using namespace memfit;
using memfit::test::max_rel;

namespace {

ModelConfig family(bool llama) { return memfit::test::small_family(llama, 61, 32, 2, 4, 40, 96); }

// Initial weights scaled up: sharp logits and attention that depends on the positions, so that a
// wrong position, block or sequence changes the tokens (at GPT-2's initial scale the next token
// is mostly the current token's own embedding's nearest).
std::vector<float> trained_like_params(const ModelConfig & cfg, CpuBackend & backend, uint64_t seed) {
    EngineOptions eo;
    eo.B = 1;
    eo.T = 8;
    eo.with_eval = false;
    Engine e(cfg, backend, eo);
    e.init_params(seed);
    std::vector<float> p = e.full_params();
    for (float & x : p) x *= 6.0f;
    return p;
}

PagedKv pool(int blocks, int block = 4, int seqs = 8, int tokens = 16) {
    PagedKv kv;
    kv.block = block;
    kv.blocks = blocks;
    kv.seqs = seqs;
    kv.tokens = tokens;
    return kv;
}

std::vector<GenerationRequest> requests(const ModelConfig & cfg, int n, float temperature) {
    std::vector<GenerationRequest> r(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
        const int len = 3 + (i * 7) % 23;   // 3 .. 25 tokens: some prefill in several chunks
        for (int t = 0; t < len; ++t) r[size_t(i)].prompt.push_back((t * 13 + i * 5 + 1) % cfg.vocab_size);
        r[size_t(i)].sample.temperature = temperature;
        r[size_t(i)].sample.max_new_tokens = 6 + (i * 5) % 17;
        r[size_t(i)].sample.seed = uint64_t(100 + i);
    }
    return r;
}

}  // namespace

// One sequence through paged steps (a prompt in chunks, then tokens one by one, padded rows
// beside them) gives the contiguous decoder's logits at every position.
TEST(PagedDecoder, LogitsEqualTheContiguousDecoder) {
    for (const bool llama : {false, true}) {
        SCOPED_TRACE(llama ? "llama" : "gpt2");
        const ModelConfig cfg = family(llama);
        CpuBackend backend;
        const std::vector<float> params = trained_like_params(cfg, backend, 5);
        const int V = cfg.vocab_size;
        Decoder ref(cfg, backend, 40);
        ref.set_weights(params.data());
        Decoder d(cfg, backend, pool(12), 40, DType::f32);
        d.set_weights(params.data());
        EXPECT_EQ(d.paged().max_blocks, 10);
        EXPECT_EQ(d.kv_cache_bytes(), uint64_t(2) * cfg.n_layer * 12 * 4 * cfg.kv_heads() * cfg.head_dim() * 4);
        std::vector<int32_t> seq;
        for (int t = 0; t < 30; ++t) seq.push_back((t * 11 + 2) % V);
        const PagedKv & kv = d.paged();
        std::vector<int32_t> meta(size_t(kv.meta_words()), -1);
        // Sequence slot 3, its blocks scattered over the pool in reverse order.
        for (int j = 0; j < kv.max_blocks; ++j) meta[size_t(kv.table_at() + 3 * kv.max_blocks + j)] = 11 - j;
        int done = 0;
        for (const int chunk : {13, 1, 9, 1, 1, 5}) {   // 30 positions
            const int rows = (chunk + 7) / 8 * 8;
            std::vector<int32_t> tokens(size_t(rows), 0);
            for (int i = 0; i < kv.tokens; ++i) {
                meta[size_t(kv.seq_at() + i)] = i < chunk ? 3 : -1;
                meta[size_t(kv.pos_at() + i)] = i < chunk ? done + i : 0;
                meta[size_t(kv.doc_at() + i)] = i - meta[size_t(kv.pos_at() + i)];
                if (i < chunk) tokens[size_t(i)] = seq[size_t(done + i)];
            }
            for (int s = 0; s < kv.seqs; ++s) meta[size_t(kv.logit_rows_at() + s)] = s == 3 ? chunk - 1 : 0;
            const float * l = d.run_paged(tokens, meta);
            done += chunk;
            const float * want = ref.prefill(std::vector<int32_t>(seq.begin(), seq.begin() + done));
            EXPECT_LT(max_rel(l + 3 * V, want, V), 1e-5) << "after " << done << " positions";
        }
        const CategoryBytes plan = d.planned_peak_live();
        for (size_t c = 0; c < kCategoryCount; ++c) EXPECT_EQ(plan.v[c], d.ledger().live_peak().v[c]) << kCategoryNames[c];
    }
}

// Twelve requests of mixed lengths, eight slots, sixteen rows a step, a pool too small for all of
// them at once (pre-emption): each request's tokens are the ones it gets alone, greedy or sampled.
TEST(BatchGenerate, EveryRequestGetsTheTokensItGetsAlone) {
    for (const bool llama : {false, true}) {
        for (const float temperature : {0.0f, 0.9f}) {
            SCOPED_TRACE(fmt::format("{} temperature {}", llama ? "llama" : "gpt2", temperature));
            const ModelConfig cfg = family(llama);
            CpuBackend backend;
            const std::vector<float> params = trained_like_params(cfg, backend, 9);
            const std::vector<GenerationRequest> reqs = requests(cfg, 12, temperature);
            Decoder d(cfg, backend, pool(24), 64, DType::f32);
            d.set_weights(params.data());
            BatchStats st;
            const std::vector<GenerationResult> all = generate_batch(d, reqs, {}, &st);
            ASSERT_EQ(all.size(), reqs.size());
            EXPECT_GT(st.preemptions, 0);          // 24 blocks of 4 cannot hold them all
            EXPECT_GT(st.peak_running, 2);
            EXPECT_LE(st.peak_blocks_used, 24);
            for (size_t i = 0; i < reqs.size(); ++i) {
                const std::vector<GenerationResult> alone = generate_batch(d, {reqs[i]});
                EXPECT_EQ(all[i].error, "");
                EXPECT_EQ(all[i].tokens, alone[0].tokens) << "request " << i;
                EXPECT_EQ(all[i].finish_reason, "length");
                EXPECT_EQ(int(all[i].tokens.size()), reqs[i].sample.max_new_tokens);
                EXPECT_EQ(alone[0].preemptions, 0);
            }
            const CategoryBytes plan = d.planned_peak_live();
            EXPECT_EQ(plan.total(), d.ledger().live_peak().total());
        }
    }
}

// Steps of 8 rows for 16 slots: decoding rows first, prompts in chunks of what is left; admission
// stops while the rows are taken, so no more sequences decode than a step has rows.
TEST(BatchGenerate, FewRowsAStep) {
    const ModelConfig cfg = family(false);
    CpuBackend backend;
    const std::vector<float> params = trained_like_params(cfg, backend, 6);
    const std::vector<GenerationRequest> reqs = requests(cfg, 12, 0.0f);
    Decoder d(cfg, backend, pool(200, 4, 16, 8), 64, DType::f32);
    d.set_weights(params.data());
    BatchStats st;
    const auto all = generate_batch(d, reqs, {}, &st);
    EXPECT_GT(st.peak_running, 2);
    EXPECT_LE(st.peak_running, 16);
    EXPECT_GT(st.steps, int64_t(st.decode_tokens + st.prefill_tokens) / 8);
    for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(all[i].tokens, generate_batch(d, {reqs[i]})[0].tokens) << i;
}

// The greedy tokens of one request alone are the contiguous decoder's (generate()).
TEST(BatchGenerate, GreedyAloneEqualsTheContiguousDecoder) {
    const ModelConfig cfg = family(true);
    CpuBackend backend;
    const std::vector<float> params = trained_like_params(cfg, backend, 4);
    GenerationRequest r = requests(cfg, 3, 0.0f)[2];
    r.sample.max_new_tokens = 20;
    Decoder ref(cfg, backend, 64);
    ref.set_weights(params.data());
    const std::vector<int32_t> want = generate(ref, r.prompt, r.sample);
    Decoder d(cfg, backend, pool(20), 64, DType::f32);
    d.set_weights(params.data());
    EXPECT_EQ(generate_batch(d, {r})[0].tokens, want);
}

// Stop tokens end a request (not returned); a prompt the context cannot hold is one request's
// error, the others run.
TEST(BatchGenerate, StopTokensAndBadRequests) {
    const ModelConfig cfg = family(false);
    CpuBackend backend;
    const std::vector<float> params = trained_like_params(cfg, backend, 3);
    std::vector<GenerationRequest> reqs = requests(cfg, 3, 0.0f);
    Decoder d(cfg, backend, pool(24), 32, DType::f32);
    d.set_weights(params.data());
    const std::vector<int32_t> free_run = generate_batch(d, {reqs[0]})[0].tokens;
    ASSERT_GE(free_run.size(), 3u);
    reqs[0].sample.stop = {free_run[2]};
    reqs[1].prompt.assign(40, 1);   // past the context of 32
    const std::vector<GenerationResult> out = generate_batch(d, reqs);
    const size_t first = size_t(std::find(free_run.begin(), free_run.end(), free_run[2]) - free_run.begin());
    EXPECT_EQ(out[0].finish_reason, "stop");
    EXPECT_EQ(out[0].tokens, std::vector<int32_t>(free_run.begin(), free_run.begin() + long(first)));
    EXPECT_NE(out[1].error.find("context of 32"), std::string::npos) << out[1].error;
    EXPECT_TRUE(out[1].tokens.empty());
    EXPECT_EQ(out[2].error, "");
    EXPECT_EQ(int(out[2].tokens.size()), reqs[2].sample.max_new_tokens);
}

// Under a sliding window of 6 a long generation holds at most the window's blocks (plus the one
// being filled and the admission's spare), and its tokens are those with every block kept.
TEST(BatchGenerate, SlidingWindowGivesBlocksBack) {
    ModelConfig cfg = family(true);
    cfg.model_type = "mistral";
    cfg.sliding_window = 6;
    CpuBackend backend;
    const std::vector<float> params = trained_like_params(cfg, backend, 8);
    GenerationRequest r;
    r.prompt = {1, 2, 3, 4, 5};
    r.sample.temperature = 0;
    r.sample.max_new_tokens = 80;
    Decoder d(cfg, backend, pool(40), 90, DType::f32);
    d.set_weights(params.data());
    BatchStats st;
    const auto windowed = generate_batch(d, {r}, {}, &st);
    EXPECT_EQ(windowed[0].tokens.size(), 80u);
    EXPECT_LE(st.peak_blocks_used, 4);   // ceil(6 / 4) + 1 for the next positions + 1 spare
    BatchOptions keep;
    keep.reserve_context = true;         // nothing given back
    BatchStats kst;
    EXPECT_EQ(generate_batch(d, {r}, keep, &kst)[0].tokens, windowed[0].tokens);
    EXPECT_EQ(kst.peak_blocks_used, d.paged().max_blocks);
}

// In the same pool, blocks on demand serve more sequences at once than a context's reservation.
TEST(BatchGenerate, PagedPoolServesMoreSequencesThanReservingTheContext) {
    const ModelConfig cfg = family(false);
    CpuBackend backend;
    const std::vector<float> params = trained_like_params(cfg, backend, 2);
    const std::vector<GenerationRequest> reqs = requests(cfg, 8, 0.0f);
    Decoder d(cfg, backend, pool(48), 64, DType::f32);   // 16 blocks per context: 3 reserved at once
    d.set_weights(params.data());
    BatchStats paged, reserved;
    BatchOptions o;
    o.reserve_context = true;
    const auto a = generate_batch(d, reqs, {}, &paged);
    const auto b = generate_batch(d, reqs, o, &reserved);
    EXPECT_EQ(reserved.peak_running, 3);
    EXPECT_GT(paged.peak_running, reserved.peak_running);
    EXPECT_LT(paged.steps, reserved.steps);
    for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(a[i].tokens, b[i].tokens);
}

// An int8 KV cache (--kv-dtype int8): one byte a value and an fp32 scale per position and KV head;
// logits within int8 rounding of the fp32 cache's, and each request's tokens still the ones it gets
// alone.
TEST(BatchGenerate, Int8CacheServesAsAlone) {
    const ModelConfig cfg = family(true);
    CpuBackend backend;
    const std::vector<float> params = trained_like_params(cfg, backend, 9);
    PagedKv kv = pool(24);
    kv.int8 = true;
    Decoder d(cfg, backend, kv, 64, DType::f32);
    d.set_weights(params.data());
    const int64_t KVH = cfg.kv_heads(), hd = cfg.head_dim();
    EXPECT_EQ(d.kv_cache_bytes(), uint64_t(2) * cfg.n_layer * 24 * 4 * uint64_t(KVH * hd + 4 * KVH));
    const std::vector<GenerationRequest> reqs = requests(cfg, 10, 0.0f);
    BatchStats st;
    const auto all = generate_batch(d, reqs, {}, &st);
    EXPECT_GT(st.preemptions, 0);
    for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(all[i].tokens, generate_batch(d, {reqs[i]})[0].tokens) << i;
    EXPECT_EQ(d.planned_peak_live().total(), d.ledger().live_peak().total());

    // One sequence's logits against the fp32 cache's.
    Decoder f(cfg, backend, pool(24), 64, DType::f32);
    f.set_weights(params.data());
    const PagedKv & g = d.paged();
    std::vector<int32_t> meta(size_t(g.meta_words()), -1), tokens(24, 0);
    for (int j = 0; j < g.max_blocks; ++j) meta[size_t(g.table_at() + j)] = j;
    for (int i = 0; i < g.tokens; ++i) {
        meta[size_t(g.seq_at() + i)] = i < 20 ? 0 : -1;
        meta[size_t(g.pos_at() + i)] = i < 20 ? i : 0;
        meta[size_t(g.doc_at() + i)] = i < 20 ? 0 : i;
        if (i < 20) tokens[size_t(i)] = (i * 7 + 3) % cfg.vocab_size;
    }
    tokens.resize(16);
    for (int i = 16; i < g.tokens; ++i) meta[size_t(g.seq_at() + i)] = -1;
    for (int s = 0; s < g.seqs; ++s) meta[size_t(g.logit_rows_at() + s)] = s == 0 ? 15 : 0;
    const int V = cfg.vocab_size;
    const float * a = d.run_paged(tokens, meta);
    const std::vector<float> q(a, a + V);
    const float * b = f.run_paged(tokens, meta);
    const double err = max_rel(q.data(), b, V);
    EXPECT_GT(err, 0.0);     // the codes are not the values
    EXPECT_LT(err, 0.05);
}
