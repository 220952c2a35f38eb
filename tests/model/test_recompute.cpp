// Recomputation policies: the bytes each keeps from forward to backward against formulas
// written here, the FLOPs it recomputes against layer_keep_cost, gradients bitwise equal to
// keeping everything, and `budget` against brute force and the planner.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "memory/budget.h"
#include "model/config.h"
#include "model/recompute.h"
#include "train/engine.h"
#include "plan/fit.h"
#include "test_util.h"

using namespace memfit;
using memfit::test::random_batch;
using memfit::test::small_config;

namespace {

constexpr int V = 97, C = 48, L = 5, NH = 3, B = 2, T = 24;

// Activation bytes live at the first backward op (the LM head's first backward), from the
// program's buffer lifetimes: what forward left for backward.
uint64_t live_at_backward_start(const Program & p) {
    int op = 0;
    while (p.ops()[size_t(op)].phase != Phase::backward) ++op;
    uint64_t live = 0;
    for (const BufferDecl & b : p.buffers())
        if (b.category == Category::activations && (b.persistent || (b.first_op <= op && op <= b.last_op)))
            live += b.bytes;
    return live;
}

double recompute_flops(const Program & p) { return p.phase_flops(Phase::recompute); }

// What one layer keeps, written out unit by unit: s bytes per stored element, f32 statistics.
uint64_t kept_formula(uint32_t mask, bool flash, uint64_t s) {
    const uint64_t bt = uint64_t(B) * T, btc = bt * C;
    auto has = [&](Saved u) { return (mask >> int(u)) & 1u; };
    uint64_t k = 0;
    if (has(Saved::ln1)) k += btc * s + 2 * bt * 4;                       // ln_1 out, mean, rstd
    if (has(Saved::qkv)) k += 3 * btc * s;                                // qkv
    if (has(Saved::attn_out)) k += btc * s + (flash ? uint64_t(B) * NH * T * 4 : 0);   // out (+ lse)
    if (!flash && has(Saved::attn_probs)) k += uint64_t(B) * NH * T * T * s;          // T x T probs
    if (has(Saved::res2)) k += btc * s;                                   // residual after attention
    if (has(Saved::ln2)) k += btc * s + 2 * bt * 4;                       // ln_2 out, mean, rstd
    if (has(Saved::fc)) k += 4 * btc * s;                                 // fc
    if (has(Saved::gelu)) k += 4 * btc * s;                               // gelu
    return k;
}

EngineOptions options(const RecomputePlan & rc, bool flash, DType compute = DType::f32) {
    EngineOptions eo;
    eo.B = B;
    eo.T = T;
    eo.with_eval = false;
    eo.flash_attention = flash;
    eo.recompute = rc;
    eo.compute = compute;
    return eo;
}

RecomputePlan random_masks(std::mt19937 & rng, const char * name = "random") {
    RecomputePlan p;
    p.name = name;
    for (int l = 0; l < L; ++l) p.keep.push_back(uint32_t(rng()) & kKeepAll);
    return p;
}

// Two AdamW steps under each policy: the same loss and the same weights, bit for bit.
void expect_bitwise_equal(const ModelConfig & cfg, CpuBackend & backend, const std::vector<RecomputePlan> & policies,
                          bool flash) {
    std::vector<float> ref;
    float ref_loss = 0;
    for (const RecomputePlan & rc : policies) {
        SCOPED_TRACE(rc.name + (flash ? " flash" : " naive"));
        Engine e(cfg, backend, options(rc, flash));
        e.init_params(5);
        std::vector<int32_t> in(size_t(B * T)), tg(in.size());
        float loss = 0;
        for (int s = 0; s < 2; ++s) {
            random_batch(in, tg, V, uint64_t(s));
            loss = e.train_step(in.data(), tg.data(), OptimHyper{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1}).loss;
        }
        const size_t P = e.step().layout().total;
        if (ref.empty()) {
            ref.assign(e.params(), e.params() + P);
            ref_loss = loss;
            continue;
        }
        EXPECT_EQ(loss, ref_loss);
        EXPECT_EQ(0, std::memcmp(ref.data(), e.params(), P * 4));
    }
}

// `none` keeps layer_keep_cost(kKeepAll) bytes per layer more than `full`, which recomputes
// layer_keep_cost(0) FLOPs per layer: the program's bytes and FLOPs as the cost model counts them.
void expect_keep_costs(const ModelConfig & cfg, CpuBackend & backend, bool flash) {
    const int layers = cfg.n_layer;
    auto program = [&](const RecomputePlan & rc) { return StepPlans(cfg, backend, options(rc, flash)); };
    const StepPlans full = program(parse_recompute("full", layers));
    const uint64_t base = live_at_backward_start(full.train->program());
    EXPECT_EQ(live_at_backward_start(program(parse_recompute("none", layers)).train->program()),
              base + layers * layer_keep_cost(cfg, B, T, flash, DType::f32, kKeepAll).bytes);
    EXPECT_DOUBLE_EQ(recompute_flops(full.train->program()), layers * layer_keep_cost(cfg, B, T, flash, DType::f32, 0).flops);
}

}  // namespace

TEST(Recompute, KeptBytesMatchFormulasPerPolicy) {
    CpuBackend backend;
    const ModelConfig cfg = small_config(V, C, L, NH);
    std::mt19937 rng(3);
    for (DType dt : {DType::f32, DType::bf16})
        for (bool flash : {false, true}) {
            const uint64_t s = dtype_size(dt);
            const uint64_t res3 = uint64_t(B) * T * C * s;   // a layer's output: the next layer's input
            const uint64_t base = live_at_backward_start(
                StepPlans(cfg, backend, options(parse_recompute("full", L), flash, dt)).train->program());
            auto live = [&](const RecomputePlan & rc) {
                return live_at_backward_start(StepPlans(cfg, backend, options(rc, flash, dt)).train->program());
            };
            // Mask policies keep every layer's output plus their units on top of full's bytes.
            for (const char * pol : {"none", "selective"}) {
                SCOPED_TRACE(std::string(pol) + (flash ? " flash " : " naive ") + std::string(dtype_name(dt)));
                const uint32_t m = std::string(pol) == "none" ? kKeepAll : kKeepSelective;
                EXPECT_EQ(live(parse_recompute(pol, L)), base + L * kept_formula(m, flash, s));
            }
            for (int trial = 0; trial < 4; ++trial) {
                const RecomputePlan rc = random_masks(rng);
                uint64_t want = base;
                for (int l = 0; l < L; ++l) want += kept_formula(rc.keep[size_t(l)], flash, s);
                EXPECT_EQ(live(rc), want);
            }
            // every:K keeps only the checkpoints' inputs (and the last layer's output for ln_f):
            // relative to full, the other layers' outputs are dropped too.
            for (int K : {2, 3}) {
                int kept_outputs = 1;   // the last layer's
                for (int l = 0; l < L - 1; ++l) kept_outputs += (l + 1) % K == 0;
                EXPECT_EQ(live(parse_recompute("every:" + std::to_string(K), L)),
                          base - uint64_t(L - kept_outputs) * res3)
                    << "every:" << K;
            }
        }
}

TEST(Recompute, RecomputeFlopsMatchTheCostModel) {
    CpuBackend backend;
    const ModelConfig cfg = small_config(V, C, L, NH);
    std::mt19937 rng(11);
    for (bool flash : {false, true})
        for (int trial = 0; trial < 6; ++trial) {
            const RecomputePlan rc = trial == 0 ? parse_recompute("full", L)
                                   : trial == 1 ? parse_recompute("selective", L)
                                                : random_masks(rng);
            double want = 0;
            for (int l = 0; l < L; ++l) want += layer_keep_cost(cfg, B, T, flash, DType::f32, rc.kept(l)).flops;
            const StepPlans plans(cfg, backend, options(rc, flash));
            EXPECT_DOUBLE_EQ(recompute_flops(plans.train->program()), want) << "trial " << trial << " flash " << flash;
            // And the bytes: the cost model's kept bytes are the formula's.
            for (int l = 0; l < L; ++l)
                EXPECT_EQ(layer_keep_cost(cfg, B, T, flash, DType::f32, rc.kept(l)).bytes,
                          kept_formula(rc.kept(l), flash, 4));
        }
}

TEST(Recompute, EveryPolicyIsBitwiseEqualToKeepingEverything) {
    CpuBackend backend;
    const ModelConfig cfg = small_config(V, C, L, NH);
    std::mt19937 rng(5);
    std::vector<RecomputePlan> policies;
    for (const char * p : {"none", "full", "every:2", "every:3", "sqrt", "selective"})
        policies.push_back(parse_recompute(p, L));
    for (int i = 0; i < 3; ++i) policies.push_back(random_masks(rng));
    for (bool flash : {false, true}) expect_bitwise_equal(cfg, backend, policies, flash);
}

TEST(Recompute, BudgetMatchesBruteForceOverAllMasks) {
    // Two layers, every pair of masks (128 per layer with flash, 256 with naive attention).
    const ModelConfig cfg = small_config(V, C, 2, NH);
    for (bool flash : {true, false}) {
        std::vector<KeepSet> one;
        for (uint32_t m = 0; m <= kKeepAll; ++m)
            if (!flash || ((m >> int(Saved::attn_probs)) & 1u))
                one.push_back(layer_keep_cost(cfg, B, T, flash, DType::f32, m));
        std::mt19937 rng(17);
        const uint64_t all = 2 * layer_keep_cost(cfg, B, T, flash, DType::f32, kKeepAll).bytes;
        for (int trial = 0; trial < 30; ++trial) {
            const uint64_t budget = trial == 0 ? 0 : trial == 1 ? all : uint64_t(rng()) % (all + 1);
            double best = 1e300;
            for (const KeepSet & a : one)
                for (const KeepSet & b : one)
                    if (a.bytes + b.bytes <= budget) best = std::min(best, a.flops + b.flops);
            const RecomputePlan rc = recompute_for_budget(cfg, B, T, flash, DType::f32, budget);
            ASSERT_EQ(rc.keep.size(), 2u);
            const KeepSet a = layer_keep_cost(cfg, B, T, flash, DType::f32, rc.keep[0]);
            const KeepSet b = layer_keep_cost(cfg, B, T, flash, DType::f32, rc.keep[1]);
            EXPECT_LE(a.bytes + b.bytes, budget);
            EXPECT_DOUBLE_EQ(a.flops + b.flops, best) << "budget " << budget << (flash ? " flash" : " naive");
        }
    }
}

TEST(Recompute, BudgetPolicyFitsTheMemoryBudgetWithTheLeastRecompute) {
    CpuBackend backend;
    const ModelConfig cfg = small_config(V, C, L, NH);
    RunConfig s;
    s.micro_batch = B;
    s.grad_accum = 1;
    s.seq = T;
    s.recompute = "full";
    auto resolve = [&](uint64_t budget) {
        RunConfig r = s;
        r.budget = budget;
        return resolve_run(r, cfg, backend, false);
    };
    const uint64_t full = StepPlans(cfg, backend, resolve(0).eo).reserved().total();
    s.recompute = "none";
    const uint64_t none = StepPlans(cfg, backend, resolve(0).eo).reserved().total();
    ASSERT_LT(full, none);
    s.recompute = "budget";
    double last_flops = 1e300;
    for (int i = 0; i <= 4; ++i) {
        const uint64_t budget = full + (none - full) * uint64_t(i) / 4;
        const ResolvedRun r = resolve(budget);
        const StepPlans plans(cfg, backend, r.eo);
        EXPECT_LE(plans.reserved().total(), budget) << i;
        const double f = recompute_flops(plans.train->program());
        EXPECT_LE(f, last_flops) << "a larger budget never recomputes more";
        last_flops = f;
        EXPECT_FALSE(r.notes.empty());
    }
    EXPECT_EQ(last_flops, 0.0);   // with none's bytes, nothing is recomputed
    const std::string note = resolve(none).notes.back();
    EXPECT_NE(note.find("(100%), recomputing 0 GFLOP"), std::string::npos) << note;
    try {
        resolve(full - 1);
        ADD_FAILURE() << "expected OutOfMemory";
    } catch (const OutOfMemory & e) {
        EXPECT_NE(std::string(e.what()).find("even full recomputation"), std::string::npos) << e.what();
    }
}

// Qwen3's q/k norms belong to the qkv unit: their inputs and rstd are kept with it or recomputed
// with it (bytes and FLOPs as layer_keep_cost counts them), and every policy trains bitwise equal.
TEST(Recompute, Qwen3QkNormsRecomputeWithQkv) {
    CpuBackend backend;
    const nlohmann::json j = {{"model_type", "qwen3"}, {"vocab_size", V}, {"hidden_size", C},
                              {"intermediate_size", 64}, {"num_hidden_layers", 3}, {"num_attention_heads", 4},
                              {"num_key_value_heads", 2}, {"head_dim", 16}, {"max_position_embeddings", T}};
    const ModelConfig cfg = parse_hf_config(j, "qwen3");
    const int layers = cfg.n_layer;
    for (bool flash : {false, true}) {
        SCOPED_TRACE(flash ? "flash" : "naive");
        expect_keep_costs(cfg, backend, flash);
        std::vector<RecomputePlan> policies;
        for (const char * pol : {"none", "full", "selective", "every:2"}) policies.push_back(parse_recompute(pol, layers));
        expect_bitwise_equal(cfg, backend, policies, flash);
    }
}

// Gemma 3's blocks keep their norms on the inputs and add two on the outputs, whose inputs (the o
// and down projections' outputs) and rstd every policy keeps; the other units recompute as
// LLaMA's (res2 with the first output norm, GeGLU at GELU's FLOPs), at layer_keep_cost's bytes and
// FLOPs, and every policy, random masks included, trains bitwise equal to keeping everything,
// through a window below T on layers 0 and 2 and query_pre_attn_scalar's scaled q norm.
TEST(Recompute, Gemma3SandwichNormsRecomputeAsPlanned) {
    CpuBackend backend;
    const nlohmann::json j = {{"model_type", "gemma3_text"}, {"vocab_size", V}, {"hidden_size", C},
                              {"intermediate_size", 64}, {"num_hidden_layers", 3}, {"num_attention_heads", 4},
                              {"num_key_value_heads", 2}, {"head_dim", 8}, {"query_pre_attn_scalar", 6},
                              {"sliding_window", T / 2}, {"sliding_window_pattern", 2}, {"max_position_embeddings", T}};
    const ModelConfig cfg = parse_hf_config(j, "gemma3");
    const int layers = cfg.n_layer;
    std::mt19937 rng(9);
    for (bool flash : {false, true}) {
        SCOPED_TRACE(flash ? "flash" : "naive");
        expect_keep_costs(cfg, backend, flash);
        std::vector<RecomputePlan> policies;
        for (const char * pol : {"none", "full", "selective", "every:2"}) policies.push_back(parse_recompute(pol, layers));
        for (int i = 0; i < 3; ++i) {
            RecomputePlan p;
            p.name = "random";
            for (int l = 0; l < layers; ++l) p.keep.push_back(uint32_t(rng()) & kKeepAll);
            policies.push_back(p);
        }
        expect_bitwise_equal(cfg, backend, policies, flash);
    }
}

// GPT-NeoX: LayerNorms with biases, biased projections, an ungated MLP and (parallel) attention and
// the MLP reading the same input, so backward never reads res2; every policy at layer_keep_cost's
// bytes and FLOPs and bitwise equal to keeping everything, parallel or not.
TEST(Recompute, GptNeoxRecomputesAsPlanned) {
    CpuBackend backend;
    std::mt19937 rng(10);
    for (bool parallel : {true, false}) {
        const nlohmann::json j = {{"model_type", "gpt_neox"}, {"vocab_size", V}, {"hidden_size", C},
                                  {"intermediate_size", 96}, {"num_hidden_layers", 3}, {"num_attention_heads", 4},
                                  {"rotary_pct", 0.5}, {"use_parallel_residual", parallel}, {"max_position_embeddings", T}};
        const ModelConfig cfg = parse_hf_config(j, "neox");
        for (bool flash : {false, true}) {
            SCOPED_TRACE(std::string(parallel ? "parallel " : "sequential ") + (flash ? "flash" : "naive"));
            expect_keep_costs(cfg, backend, flash);
            std::vector<RecomputePlan> policies;
            for (const char * pol : {"none", "full", "selective", "every:2"})
                policies.push_back(parse_recompute(pol, cfg.n_layer));
            RecomputePlan p;
            p.name = "random";
            for (int l = 0; l < cfg.n_layer; ++l) p.keep.push_back(uint32_t(rng()) & kKeepAll);
            policies.push_back(p);
            expect_bitwise_equal(cfg, backend, policies, flash);
        }
    }
}

// OLMo 2's norms follow attention and the MLP: backward reads their inputs (the o and down
// projections' outputs) and rstd, which the ln1 and ln2 units keep or recompute with their
// projections; the bytes and FLOPs are layer_keep_cost's, and every policy, random masks and
// TiledMLP included, trains bitwise equal to keeping everything.
TEST(Recompute, Olmo2PostNormsRecomputeWithTheirProjections) {
    CpuBackend backend;
    const nlohmann::json j = {{"model_type", "olmo2"}, {"vocab_size", V}, {"hidden_size", C},
                              {"intermediate_size", 64}, {"num_hidden_layers", 3}, {"num_attention_heads", 4},
                              {"max_position_embeddings", T}};
    const ModelConfig cfg = parse_hf_config(j, "olmo2");
    const int layers = cfg.n_layer;
    std::mt19937 rng(7);
    for (bool flash : {false, true}) {
        SCOPED_TRACE(flash ? "flash" : "naive");
        expect_keep_costs(cfg, backend, flash);
        const RecomputePlan selective = parse_recompute("selective", layers);
        EXPECT_DOUBLE_EQ(recompute_flops(StepPlans(cfg, backend, options(selective, flash)).train->program()),
                         layers * layer_keep_cost(cfg, B, T, flash, DType::f32, kKeepSelective).flops);
        std::vector<RecomputePlan> policies;
        for (const char * pol : {"none", "full", "selective", "every:2"}) policies.push_back(parse_recompute(pol, layers));
        for (int i = 0; i < 4; ++i) {
            RecomputePlan p;
            p.name = "random";
            for (int l = 0; l < layers; ++l) p.keep.push_back(uint32_t(rng()) & kKeepAll);
            policies.push_back(p);
        }
        expect_bitwise_equal(cfg, backend, policies, flash);
    }
}
