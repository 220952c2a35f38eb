// LoRA and QLoRA: target parsing and PEFT names, the frozen base (no gradients, no master copy,
// no optimizer states in the step program), B = 0 starts at the base model, adapter gradients
// against finite differences (dense and quantized bases, both families), planned == measured,
// recomputation bitwise equal, and a fine-tune on a 4-bit base lowering the loss on the corpus.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "backend/quant_format.h"
#include "core/error.h"
#include "model/lora.h"
#include "model/recompute.h"
#include "train/engine.h"
#include "grad_check.h"
#include "lora_steps.h"
#include "test_util.h"

using namespace memfit;
using memfit::test::expect_largest_grads_match_fd;
using memfit::test::random_batch;

namespace {

ModelConfig tiny(bool llama, int V = 37, int C = 16, int L = 2) { return test::small_family(llama, V, C, L, 4, 32); }

EngineOptions opts(int B, int T, const LoraOptions & lora, DType dt = DType::f32, const RecomputePlan & rc = {}) {
    return test::lora_engine_options(B, T, lora, dt, rc);
}

// e's parameters set to w (the whole flat buffer).
void set_params(Engine & e, const std::vector<float> & w) {
    std::copy(w.begin(), w.end(), e.params());
    e.params_changed();
}

// Each adapter tensor's largest gradient against central differences of the loss (lr 0 steps).
void expect_adapter_grads_match_fd(Engine & e, int B, int T, int vocab) {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 0.3f);   // B nonzero, so that A has gradients too
    const ParamLayout & layout = e.step().layout();
    for (size_t i = 0; i < layout.total; ++i) e.params()[i] = nd(rng);
    e.params_changed();
    std::vector<int32_t> in(size_t(B * T)), tg(in.size());
    random_batch(in, tg, vocab, 3);
    expect_largest_grads_match_fd(e, in, tg, 2e-3f);   // q and k adapters are strongly curved: a small step
}

size_t bytes_named(const Program & p, const std::string & name) {
    for (const auto & b : p.buffers())
        if (b.name == name) return b.bytes;
    return 0;
}

}  // namespace

TEST(Lora, TargetsFollowTheFamilyNames) {
    const ModelConfig llama = tiny(true), gpt = tiny(false);
    EXPECT_EQ(parse_lora_targets(llama, ""), (std::vector<std::string>{"q", "v"}));
    EXPECT_EQ(parse_lora_targets(llama, "down,q_proj,q,up"), (std::vector<std::string>{"q", "up", "down"}));
    EXPECT_EQ(parse_lora_targets(llama, "all").size(), 7u);
    EXPECT_EQ(parse_lora_targets(gpt, ""), (std::vector<std::string>{"c_attn"}));
    EXPECT_EQ(parse_lora_targets(gpt, "q,v,o"), (std::vector<std::string>{"c_attn", "attn.c_proj"}));
    EXPECT_EQ(parse_lora_targets(gpt, "c_proj"), (std::vector<std::string>{"attn.c_proj", "mlp.c_proj"}));
    EXPECT_EQ(parse_lora_targets(gpt, "gate,down"), (std::vector<std::string>{"c_fc", "mlp.c_proj"}));
    EXPECT_THROW(parse_lora_targets(llama, "c_attn"), ConfigError);
    EXPECT_THROW(parse_lora_targets(gpt, "qq"), ConfigError);
    EXPECT_THROW(parse_lora_targets(gpt, ","), ConfigError);
    EXPECT_THROW(parse_base_weights("int4"), ConfigError);
}

TEST(Lora, AdaptersHavePeftNamesAndShapes) {
    const ModelConfig cfg = tiny(true);
    LoraOptions l;
    l.rank = 4;
    l.targets = parse_lora_targets(cfg, "q,v,down");
    const ParamLayout a = make_lora_layout(cfg, l);
    ASSERT_EQ(a.params.size(), 2u * 3u * 2u);
    EXPECT_EQ(a.params[0].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
    EXPECT_EQ(a.params[0].shape, (std::vector<int64_t>{4, 16}));
    EXPECT_EQ(a.params[1].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
    EXPECT_EQ(a.params[1].shape, (std::vector<int64_t>{16, 4}));
    EXPECT_EQ(a.params[3].shape, (std::vector<int64_t>{8, 4}));   // v: 2 KV heads of 4
    EXPECT_EQ(a.params[4].shape, (std::vector<int64_t>{4, 32}));  // down: in = ffn
    EXPECT_EQ(a.params[6].name, "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight");
    EXPECT_EQ(peft_target_modules(cfg, l), (std::vector<std::string>{"q_proj", "v_proj", "down_proj"}));
    const auto sites = lora_sites(cfg, l);
    EXPECT_EQ(sites[1].col0, 16 + 8);   // v's slice of the fused q|k|v
    const ModelConfig gpt = tiny(false);
    LoraOptions g;
    g.rank = 2;
    const ParamLayout ga = make_lora_layout(gpt, g);
    EXPECT_EQ(ga.params[0].name, "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight");
    EXPECT_EQ(ga.params[1].shape, (std::vector<int64_t>{48, 2}));
    EXPECT_EQ(lora_param_count(gpt, g), size_t(2 * (2 * 16 + 48 * 2)));
}

TEST(Lora, TheBaseIsFrozenInTheStepProgram) {
    CpuBackend backend;
    for (DType dt : {DType::f32, DType::bf16}) {
        const ModelConfig cfg = tiny(true);
        const LoraOptions l = test::lora_options(cfg, 4);
        Engine e(cfg, backend, opts(2, 8, l, dt));
        const Program & p = e.step().program();
        const size_t A = lora_param_count(cfg, l), P = size_t(cfg.num_params());
        EXPECT_EQ(bytes_named(p, "gradients"), 0u);
        EXPECT_EQ(bytes_named(p, "adamw.m"), 0u);
        EXPECT_EQ(bytes_named(p, "master_parameters"), 0u);
        EXPECT_EQ(bytes_named(p, "parameters"), P * dtype_size(dt));
        EXPECT_EQ(bytes_named(p, "lora.parameters"), A * dtype_size(dt));
        EXPECT_EQ(bytes_named(p, "lora.adamw.m"), A * 4);
        const CategoryBytes r = e.planned_reserved();
        EXPECT_EQ(r[Category::gradients], A * dtype_size(dt));
        EXPECT_EQ(r[Category::optimizer_states], 8 * A);
        EXPECT_EQ(r[Category::master_weights], dt == DType::f32 ? 0 : 4 * A);
        // Two persistent buffers, each placed 64-byte aligned.
        EXPECT_GE(r[Category::parameters], (P + A) * dtype_size(dt));
        EXPECT_LT(r[Category::parameters], (P + A) * dtype_size(dt) + 128);
    }
    // A quantized base: the four projections of every layer packed, the rest dense.
    const ModelConfig cfg = tiny(true, 37, 64, 2);
    for (BaseWeights b : {BaseWeights::int8, BaseWeights::nf4, BaseWeights::sparse24}) {
        const LoraOptions l = test::lora_options(cfg, 4, b);
        Engine e(cfg, backend, opts(2, 8, l));
        const QuantLayout & q = e.step().quant_layout();
        ASSERT_EQ(q.entries.size(), 8u);
        size_t packed = 0, held = 0;
        for (const auto & en : q.entries) packed += (quant_bytes(en.q) + 63) / 64 * 64, held += size_t(en.q.out * en.q.in);
        EXPECT_EQ(bytes_named(e.step().program(), "parameters.quantized"), packed);
        EXPECT_EQ(bytes_named(e.step().program(), "parameters"), (size_t(cfg.num_params()) - held) * 4);
    }
}

TEST(Lora, ZeroBStartsAtTheBaseModel) {
    CpuBackend backend;
    for (bool llama : {true, false}) {
        SCOPED_TRACE(llama ? "llama" : "gpt2");
        const ModelConfig cfg = tiny(llama);
        Engine full(cfg, backend, opts(2, 8, LoraOptions{}));
        full.init_params(5);
        Engine lora(cfg, backend, opts(2, 8, test::lora_options(cfg, 4)));
        lora.init_params(5);
        std::vector<int32_t> in(16), tg(16);
        random_batch(in, tg, cfg.vocab_size, 1);
        const auto a = full.logits(in.data(), 2), b = lora.logits(in.data(), 2);
        ASSERT_EQ(a.size(), b.size());
        for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << i;
        // A nonzero B moves them.
        const ParamLayout & al = lora.step().layout();
        lora.params()[al.params[1].offset] = 0.5f;
        lora.params_changed();
        const auto c = lora.logits(in.data(), 2);
        double diff = 0;
        for (size_t i = 0; i < a.size(); ++i) diff += std::fabs(a[i] - c[i]);
        EXPECT_GT(diff, 1e-3);
    }
}

TEST(Lora, QuantizedBaseComputesWithTheDequantizedWeights) {
    CpuBackend backend;
    for (bool llama : {true, false})
        for (BaseWeights bw : {BaseWeights::int8, BaseWeights::nf4, BaseWeights::sparse24}) {
            SCOPED_TRACE(std::string(llama ? "llama " : "gpt2 ") + base_weights_name(bw));
            const ModelConfig cfg = tiny(llama, 37, 32, 2);
            Engine q(cfg, backend, opts(2, 8, test::lora_options(cfg, 4, bw)));
            q.init_params(9);
            const std::vector<float> w = q.base_weights();
            Engine full(cfg, backend, opts(2, 8, LoraOptions{}));
            full.init_params(9);
            // Quantization moved the weights, but not far (sparse24 drops half of the projections'
            // weights: the smaller ones).
            double err = 0, norm = 0;
            for (size_t i = 0; i < w.size(); ++i) err += std::pow(w[i] - full.params()[i], 2), norm += std::pow(full.params()[i], 2);
            EXPECT_GT(err, 0.0);
            EXPECT_LT(std::sqrt(err / norm), bw == BaseWeights::int8 ? 0.01 : bw == BaseWeights::sparse24 ? 0.4 : 0.12);
            std::copy(w.begin(), w.end(), full.params());
            full.params_changed();
            std::vector<int32_t> in(16), tg(16);
            random_batch(in, tg, cfg.vocab_size, 2);
            const auto a = full.logits(in.data(), 2), b = q.logits(in.data(), 2);
            for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-5f * (1 + std::fabs(a[i]))) << i;
        }
}

TEST(Lora, AdapterGradientsMatchFiniteDifferences) {
    CpuBackend backend;
    const int B = 2, T = 9;
    for (bool llama : {true, false})
        for (BaseWeights bw : {BaseWeights::compute, BaseWeights::nf4}) {
            SCOPED_TRACE(std::string(llama ? "llama " : "gpt2 ") + base_weights_name(bw));
            const ModelConfig cfg = tiny(llama, 37, 32, 2);
            Engine e(cfg, backend, opts(B, T, test::lora_options(cfg, 3, bw)));
            e.init_params(1);
            expect_adapter_grads_match_fd(e, B, T, cfg.vocab_size);
        }
}

// LoRA on an untied LM head and token embedding (targets lm_head, embed_tokens: PEFT's module
// names): their adapters last and first in the layout under PEFT's names (the embedding's A held
// [V, r]), their gradients against finite differences (with the loss in chunks too), merged
// weights computing what they do, planned bytes equal to measured; a tied model refused.
TEST(Lora, LmHeadAndEmbeddingAdaptersOnAnUntiedModel) {
    CpuBackend backend;
    ModelConfig cfg = tiny(true, 37, 32, 2);
    for (bool llama : {true, false}) {   // GPT-2's head is always its embedding
        ModelConfig tied = tiny(llama, 37, 32, 2);
        tied.tied_head = true;
        try {
            parse_lora_targets(tied, llama ? "q,lm_head" : "q,embed_tokens");
            ADD_FAILURE() << "lm_head or embed_tokens accepted on a tied head";
        } catch (const ConfigError & e) {
            EXPECT_NE(std::string(e.what()).find("ties its LM head to the token embedding"), std::string::npos) << e.what();
        }
    }
    cfg.tied_head = false;
    EXPECT_EQ(parse_lora_targets(cfg, "lm_head,v").back(), "lm_head");
    EXPECT_EQ(parse_lora_targets(cfg, "all").size(), 7u);   // all: the blocks' seven projections
    EXPECT_EQ(parse_lora_targets(cfg, "lm_head,all").size(), 8u);
    EXPECT_EQ(parse_lora_targets(cfg, "lm_head,all,embed_tokens").front(), "embed_tokens");
    const LoraOptions l = test::lora_options(cfg, 3, BaseWeights::compute, "q,v,lm_head,embed_tokens");
    const ParamLayout a = make_lora_layout(cfg, l);
    EXPECT_EQ(a.params[0].name, "base_model.model.model.embed_tokens.lora_embedding_A");
    EXPECT_EQ(a.params[0].shape, (std::vector<int64_t>{37, 3}));   // [V, r]: PEFT's [r, V] transposed
    EXPECT_EQ(a.params[1].name, "base_model.model.model.embed_tokens.lora_embedding_B");
    EXPECT_EQ(a.params[1].shape, (std::vector<int64_t>{32, 3}));
    EXPECT_EQ(peft_target_modules(cfg, l).front(), "embed_tokens");
    EXPECT_EQ(a.params[a.params.size() - 2].name, "base_model.model.lm_head.lora_A.weight");
    EXPECT_EQ(a.params.back().name, "base_model.model.lm_head.lora_B.weight");
    EXPECT_EQ(a.params.back().shape, (std::vector<int64_t>{37, 3}));
    EXPECT_EQ(peft_target_modules(cfg, l).back(), "lm_head");
    for (int chunk : {0, 7}) {
        SCOPED_TRACE("loss chunk " + std::to_string(chunk));
        EngineOptions eo = opts(2, 9, l);
        eo.loss_chunk = chunk;
        Engine e(cfg, backend, eo);
        e.init_params(1);
        expect_adapter_grads_match_fd(e, 2, 9, cfg.vocab_size);
        const CategoryBytes plan = e.planned_peak_live();
        for (size_t k = 0; k < kCategoryCount; ++k) EXPECT_EQ(plan.v[k], e.ledger().live_peak().v[k]) << kCategoryNames[k];
        // The merged model's logits are the adapted model's.
        Engine full(cfg, backend, opts(2, 9, LoraOptions{}));
        set_params(full, e.merged_weights());
        std::vector<int32_t> in(18), tg(18);
        random_batch(in, tg, cfg.vocab_size, 8);
        const auto x = full.logits(in.data(), 2), y = e.logits(in.data(), 2);
        for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], y[i], 2e-5f * (1 + std::fabs(x[i]))) << i;
    }
    // bf16 trains as fp32 does, to bf16's precision (the head's backward may round the logits'
    // gradient in place: the adapter reads it first; read after, the loss drifted 1.6% in 3 steps).
    std::vector<float> losses;
    for (DType dt : {DType::f32, DType::bf16}) {
        Engine e(cfg, backend, opts(4, 9, l, dt));
        e.init_params(1);
        std::vector<int32_t> in(36), tg(36);
        float loss = 0;
        for (int s = 0; s < 4; ++s) {
            random_batch(in, tg, cfg.vocab_size, uint64_t(s % 2));
            loss = e.train_step(in.data(), tg.data(), OptimHyper{1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f, 1}).loss;
        }
        losses.push_back(loss);
    }
    EXPECT_NEAR(losses[1], losses[0], 0.004 * losses[0]);
}

TEST(Lora, PlannedEqualsMeasuredAndRecomputationIsBitwiseEqual) {
    CpuBackend backend;
    const ModelConfig cfg = tiny(true, 61, 64, 3);
    struct Case { const char * rc; DType dt; BaseWeights bw; float dropout = 0; };
    std::map<float, std::vector<float>> reference;   // by dropout
    for (const Case & c : {Case{"none", DType::f32, BaseWeights::compute}, Case{"selective", DType::f32, BaseWeights::compute},
                           Case{"full", DType::f32, BaseWeights::compute}, Case{"every:2", DType::f32, BaseWeights::compute},
                           Case{"none", DType::bf16, BaseWeights::compute}, Case{"full", DType::bf16, BaseWeights::nf4},
                           Case{"none", DType::f32, BaseWeights::int8}, Case{"none", DType::f32, BaseWeights::compute, 0.2f},
                           Case{"full", DType::f32, BaseWeights::compute, 0.2f},
                           Case{"selective", DType::bf16, BaseWeights::nf4, 0.2f}}) {
        SCOPED_TRACE(std::string(c.rc) + " " + std::string(dtype_name(c.dt)) + " " + base_weights_name(c.bw) +
                     " dropout " + std::to_string(c.dropout));
        LoraOptions l = test::lora_options(cfg, 4, c.bw);
        l.dropout = c.dropout;
        Engine e(cfg, backend, opts(2, 16, l, c.dt, parse_recompute(c.rc, cfg.n_layer)));
        e.init_params(1);
        const std::vector<float> after = test::two_steps_as_planned(e, cfg.vocab_size, 2, 16);
        if (c.dt != DType::f32 || c.bw != BaseWeights::compute) continue;
        auto & ref = reference[c.dropout];
        if (ref.empty()) ref = after;
        else EXPECT_EQ(after, ref) << "recomputation changed the adapters";
    }
}

TEST(Lora, FineTuningA4BitBaseLowersTheLossOnTheCorpus) {
    // Pre-train a small byte-level LLaMA briefly, quantize it to NF4, then train only the
    // adapters: the held-out loss must fall below the quantized base's.
    CpuBackend backend;
    std::ifstream f(std::string(MEMFIT_DATA_DIR) + "/tinyshakespeare.txt", std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    ASSERT_GT(text.size(), 100000u);
    const ModelConfig cfg = tiny(true, 256, 64, 2);
    const int B = 4, T = 32;
    std::uniform_int_distribution<size_t> pos(0, text.size() - size_t(T) - 2);
    std::vector<int32_t> in(size_t(B * T)), tg(in.size());
    auto batch = [&](std::mt19937 & r) {
        for (int b = 0; b < B; ++b) {
            const size_t p0 = pos(r);
            for (int t = 0; t < T; ++t) {
                in[size_t(b * T + t)] = uint8_t(text[p0 + size_t(t)]);
                tg[size_t(b * T + t)] = uint8_t(text[p0 + size_t(t) + 1]);
            }
        }
    };
    auto held_out = [&](Engine & e) {
        std::mt19937 r(99);
        double s = 0;
        for (int i = 0; i < 8; ++i) {
            batch(r);
            s += e.eval_loss(in.data(), tg.data());
        }
        return s / 8;
    };
    OptimHyper h;
    h.lr = 1e-2f;
    std::mt19937 rng(11);
    Engine full(cfg, backend, opts(B, T, LoraOptions{}));
    full.init_params(3);
    for (int s = 0; s < 60; ++s) {
        batch(rng);
        full.train_step(in.data(), tg.data(), h);
    }
    Engine q(cfg, backend, opts(B, T, test::lora_options(cfg, 8, BaseWeights::nf4)));
    q.init_params(3);
    q.set_base(full.params());
    const double pretrained = held_out(full), before = held_out(q);
    for (int s = 0; s < 60; ++s) {
        batch(rng);
        q.train_step(in.data(), tg.data(), h);
    }
    const double after = held_out(q);
    std::printf("held-out loss: pre-trained %.4f, nf4 base %.4f, after 60 QLoRA steps %.4f\n", pretrained, before, after);
    EXPECT_LT(after, before - 0.1);
}

TEST(Lora, MergedWeightsComputeWhatTheAdaptersDo) {
    CpuBackend backend;
    for (bool llama : {true, false}) {
        SCOPED_TRACE(llama ? "llama" : "gpt2");
        const ModelConfig cfg = tiny(llama, 37, 32, 2);
        Engine lora(cfg, backend, opts(2, 8, test::lora_options(cfg, 4)));
        lora.init_params(4);
        std::mt19937 rng(3);
        const auto r = test::randn(lora.step().layout().total, rng, 0.2f);
        std::copy(r.begin(), r.end(), lora.params());
        lora.params_changed();
        Engine full(cfg, backend, opts(2, 8, LoraOptions{}));
        set_params(full, lora.merged_weights());
        std::vector<int32_t> in(16), tg(16);
        random_batch(in, tg, cfg.vocab_size, 8);
        const auto a = full.logits(in.data(), 2), b = lora.logits(in.data(), 2);
        double diff = 0, base = 0;
        full.init_params(4);
        const auto c = full.logits(in.data(), 2);
        for (size_t i = 0; i < a.size(); ++i) {
            ASSERT_NEAR(a[i], b[i], 2e-5f * (1 + std::fabs(a[i]))) << i;
            diff += std::fabs(c[i] - b[i]), base += std::fabs(c[i]);
        }
        EXPECT_GT(diff, 0.01 * base) << "the adapters should have changed the model";
    }
}

TEST(Lora, DropoutMasksTheAdapterInputAndItsGradientsMatchFiniteDifferences) {
    CpuBackend backend;
    // The mask: about p of the elements dropped, the rest scaled by 1/(1-p), reproducible.
    std::vector<float> x(20000, 1.0f), y(x.size()), z(x.size());
    Tensor tx(-1, DType::f32, {int64_t(x.size())}), ty = tx, tz = tx;
    tx.data = x.data(), ty.data = y.data(), tz.data = z.data();
    backend.dropout(ty, tx, 0.25f, 42);
    backend.dropout(tz, tx, 0.25f, 42);
    size_t dropped = 0;
    for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_TRUE(y[i] == 0.0f || y[i] == 1.0f / 0.75f);
        dropped += y[i] == 0.0f;
    }
    EXPECT_NEAR(double(dropped) / double(y.size()), 0.25, 0.01);
    EXPECT_EQ(y, z);
    backend.dropout(tz, tx, 0.25f, 43);
    EXPECT_NE(y, z);

    // A step's loss and adapter gradients with dropout, against finite differences of that
    // step's loss (the mask follows the step count, which import_state restores).
    const ModelConfig cfg = tiny(true, 37, 32, 2);
    LoraOptions l = test::lora_options(cfg, 3);
    l.dropout = 0.3f;
    EngineOptions eo = opts(2, 9, l);
    eo.seed = 5;
    Engine e(cfg, backend, eo);
    e.init_params(1);
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 0.15f);   // milder curvature than 0.3: finite differences stay accurate
    for (size_t i = 0; i < e.step().layout().total; ++i) e.params()[i] = nd(rng);
    e.params_changed();
    const TrainState s0 = e.export_state();
    std::vector<int32_t> in(18), tg(18);
    random_batch(in, tg, cfg.vocab_size, 3);
    const OptimHyper zero_lr{0.0f, 0.9f, 0.95f, 1e-8f, 0.0f, 1};
    auto loss_at = [&](size_t idx, float dx) {
        TrainState s = s0;
        s.params[idx] += dx;
        e.import_state(s);
        return double(e.train_step(in.data(), tg.data(), zero_lr).loss);
    };
    const double l0 = loss_at(0, 0.0f);
    const std::vector<float> g(e.grads(), e.grads() + s0.params.size());
    EXPECT_NE(l0, double(e.eval_loss(in.data(), tg.data()))) << "evaluation runs without dropout";
    for (const auto & p : e.step().layout().params) {
        size_t best = p.offset;
        for (size_t i = p.offset; i < p.offset + p.numel; ++i)
            if (std::fabs(g[i]) > std::fabs(g[best])) best = i;
        const float h = 1e-3f;
        const double fd = (loss_at(best, h) - loss_at(best, -h)) / (2.0 * h);
        EXPECT_NEAR(fd, g[best], 0.02 * std::fabs(g[best]) + 2e-4) << p.name;
        EXPECT_GT(std::fabs(g[best]), 1e-4) << p.name;
    }
}
