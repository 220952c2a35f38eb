// Preference tuning (--objective dpo, model/preference.h) in the training step. Checked: on a
// tiny LLaMA the loss, the TRL metrics and every parameter's gradient equal a float64 reference
// written from the paper's formula (tests/data/make_dpo_fixture.py) for the sigmoid loss, cDPO's
// label smoothing, IPO and the hinge loss, with a frozen reference copy; the three reference modes
// give the same loss and gradients (LoRA's adapters switched off, the log-probabilities computed
// before and handed in, a frozen copy); a copy stored in bf16, int8 or nf4 is planned exactly and
// gives a loss near the exact copy's; planned == measured per category, the adapters-off
// reference costing no bytes and the copy its weights' bytes (category `reference`); evaluation
// reports the same loss; the combinations that cannot work are refused in one line.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/verify.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/hf_weights.h"
#include "model/param_layout.h"
#include "model/safetensors.h"
#include "plan/fit.h"
#include "run/compat.h"
#include "train/engine.h"
#include "train/replan.h"
#include "test_util.h"

namespace memfit {
namespace {

constexpr OptimHyper kNoUpdate{0.0f, 0.9f, 0.95f, 1e-8f, 0.0f, 1};   // lr 0: the step leaves the weights

std::string fixture() { return std::string(MEMFIT_TEST_DATA) + "/dpo_tiny.safetensors"; }

// The fixture's tensors `prefix`<name> in memfit's flat layout.
std::vector<float> read_params(const SafetensorsFile & f, const ModelConfig & cfg, const std::string & prefix) {
    const ParamLayout layout = checkpoint_layout(cfg, make_param_layout(cfg));
    std::vector<float> full(layout.total);
    for (const auto & p : layout.params) {
        const std::vector<float> v = f.read_f32(prefix + p.name);
        EXPECT_EQ(v.size(), p.numel) << p.name;
        std::copy(v.begin(), v.end(), full.begin() + std::ptrdiff_t(p.offset));
        from_checkpoint(cfg, p, full.data() + p.offset);
    }
    return full;
}

TEST(Dpo, LossMetricsAndGradientsEqualTheFloat64Reference) {
    const SafetensorsFile f = SafetensorsFile::open(fixture());
    const ModelConfig cfg = parse_hf_config(nlohmann::json::parse(f.metadata().at("config")), fixture());
    const std::vector<int32_t> ids = f.read_i32("input_ids"), tg = f.read_i32("targets");
    const int B = 4, T = 16;
    ASSERT_EQ(ids.size(), size_t(B * T));
    const std::vector<float> policy = read_params(f, cfg, ""), reference = read_params(f, cfg, "reference.");
    const nlohmann::json cases = nlohmann::json::parse(f.metadata().at("cases"));
    ASSERT_EQ(cases.size(), 4u);
    const ParamLayout layout = checkpoint_layout(cfg, make_param_layout(cfg));
    CpuBackend cpu;
    for (size_t k = 0; k < cases.size(); ++k) {
        const auto & c = cases[k];
        SCOPED_TRACE(c.dump());
        EngineOptions eo;
        eo.B = B, eo.T = T, eo.with_eval = true;
        eo.loss_chunk = 24;   // chunks that cut across rows
        eo.pref.dpo = true;
        eo.pref.loss = parse_dpo_loss(c.at("loss_type").get<std::string>());
        eo.pref.beta = c.at("beta").get<float>();
        eo.pref.label_smoothing = c.at("label_smoothing").get<float>();
        eo.pref.reference = Reference::copy;
        Engine e(cfg, cpu, eo);
        e.init_params(0);
        e.set_params(policy.data());
        e.set_reference(reference.data());
        const StepResult r = e.train_step(ids.data(), tg.data(), kNoUpdate);
        EXPECT_NEAR(r.loss, c.at("loss").get<double>(), 2e-5 * std::max(1.0, c.at("loss").get<double>()));
        EXPECT_NEAR(e.eval_loss(ids.data(), tg.data()), r.loss, 1e-6 * std::max(1.0, double(r.loss)));
        for (const auto & [name, mean] : r.pref.means())
            EXPECT_NEAR(mean, c.at(name).get<double>(), 2e-5 * std::max(1.0, std::fabs(c.at(name).get<double>())))
                << name;
        const float * g = e.grads();
        double worst = 0;
        for (const auto & p : layout.params) {
            std::vector<float> ours(g + p.offset, g + p.offset + p.numel);
            to_checkpoint(cfg, p, ours.data(), true);
            const std::vector<float> want = f.read_f32(fmt::format("case{}.grad.{}", k, p.name));
            const double err = relative_error(ours.data(), want.data(), want.size());
            worst = std::max(worst, err);
            EXPECT_LT(err, 1e-4) << p.name;
        }
        // A change of the loss's gradient by 1% would be seen: the comparison is that tight.
        EXPECT_LT(worst, 1e-3);
    }
}

ModelConfig small() { return test::small_family(true, 53, 32, 2, 4, 64); }

std::vector<float> random_weights(size_t n, uint32_t seed, float sd) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, sd);
    std::vector<float> w(n);
    for (float & x : w) x = nd(rng);
    return w;
}

// Pairs that share a prompt: rows 2i and 2i + 1 hold the same first tokens and train on the rest.
void pair_batch(std::vector<int32_t> & in, std::vector<int32_t> & tg, int B, int T, int V, uint32_t seed) {
    test::random_batch(in, tg, V, seed);
    for (int i = 0; i < B; i += 2)
        for (int t = 0; t < T; ++t) {
            const int prompt = 3 + i;
            if (t < prompt) in[size_t((i + 1) * T + t)] = in[size_t(i * T + t)];
            for (int k = 0; k < 2; ++k) {
                int32_t & target = tg[size_t((i + k) * T + t)];
                target = t + 1 < prompt ? -100 : t + 1 < T ? in[size_t((i + k) * T + t + 1)] : -100;
            }
        }
}

EngineOptions dpo_options(int B, int T, Reference ref, bool lora, const ModelConfig & cfg) {
    EngineOptions eo;
    eo.B = B, eo.T = T, eo.with_eval = true;
    eo.loss_chunk = 12;
    eo.pref.dpo = true;
    eo.pref.reference = ref;
    if (lora) eo.lora = test::lora_options(cfg, 4);
    return eo;
}

struct Outcome {
    float loss;
    std::vector<float> grads;
    PreferenceMetrics pref;
};

// One step (lr 0) on `base` (LoRA: the frozen base, with `adapters`; else the weights).
Outcome run(CpuBackend & cpu, const ModelConfig & cfg, const EngineOptions & eo, const std::vector<float> & base,
            const std::vector<float> & adapters, const std::vector<int32_t> & in, const std::vector<int32_t> & tg) {
    Engine e(cfg, cpu, eo);
    e.init_params(3);
    std::vector<float> ref;
    if (eo.lora.enabled()) e.set_base(base.data());
    else e.set_params(base.data());
    if (eo.pref.copy()) e.reference_from_start();
    if (eo.pref.reference == Reference::precompute) ref = e.row_logps(in.data(), tg.data());
    if (eo.lora.enabled()) e.set_params(adapters.data());
    else e.set_params(adapters.data());   // full fine-tuning: the policy has moved from the start
    const StepResult r = e.train_step(in.data(), tg.data(), kNoUpdate, nullptr, ref.empty() ? nullptr : ref.data());
    const float * g = e.grads();
    return {r.loss, std::vector<float>(g, g + e.step().layout().total), r.pref};
}

TEST(Dpo, TheThreeReferencesGiveOneLossAndOneGradient) {
    const ModelConfig cfg = small();
    const int B = 4, T = 12;
    std::vector<int32_t> in(size_t(B * T)), tg(in.size());
    pair_batch(in, tg, B, T, cfg.vocab_size, 5);
    const size_t P = make_param_layout(cfg).total;
    const std::vector<float> base = random_weights(P, 7, 0.3f);
    CpuBackend cpu;
    {   // LoRA: adapters that have moved (B != 0), against the base
        const size_t A = make_lora_layout(cfg, test::lora_options(cfg, 4)).total;
        const std::vector<float> adapters = random_weights(A, 8, 0.2f);
        const Outcome off = run(cpu, cfg, dpo_options(B, T, Reference::adapters_off, true, cfg), base, adapters, in, tg);
        const Outcome copy = run(cpu, cfg, dpo_options(B, T, Reference::copy, true, cfg), base, adapters, in, tg);
        const Outcome pre = run(cpu, cfg, dpo_options(B, T, Reference::precompute, true, cfg), base, adapters, in, tg);
        EXPECT_GT(std::fabs(off.pref.chosen) + std::fabs(off.pref.rejected), 1e-3);   // the policy did move
        EXPECT_FLOAT_EQ(copy.loss, off.loss);
        EXPECT_FLOAT_EQ(pre.loss, off.loss);
        EXPECT_EQ(copy.grads, off.grads);
        EXPECT_EQ(pre.grads, off.grads);
        EXPECT_DOUBLE_EQ(pre.pref.accurate, off.pref.accurate);
    }
    {   // full fine-tuning: the starting weights against moved ones
        std::vector<float> moved = base;
        const std::vector<float> d = random_weights(P, 9, 0.02f);
        for (size_t i = 0; i < P; ++i) moved[i] += d[i];
        const Outcome copy = run(cpu, cfg, dpo_options(B, T, Reference::copy, false, cfg), base, moved, in, tg);
        const Outcome pre = run(cpu, cfg, dpo_options(B, T, Reference::precompute, false, cfg), base, moved, in, tg);
        EXPECT_FLOAT_EQ(pre.loss, copy.loss);
        EXPECT_EQ(pre.grads, copy.grads);
        EXPECT_NE(copy.loss, float(std::log(2.0)));   // the policy differs from its reference
    }
}

TEST(Dpo, AtTheStartTheLossIsLog2AndTheRewardsZero) {
    const ModelConfig cfg = small();
    const int B = 4, T = 12;
    std::vector<int32_t> in(size_t(B * T)), tg(in.size());
    pair_batch(in, tg, B, T, cfg.vocab_size, 6);
    CpuBackend cpu;
    Engine e(cfg, cpu, dpo_options(B, T, Reference::adapters_off, true, cfg));
    e.init_params(4);
    const StepResult r = e.train_step(in.data(), tg.data(), kNoUpdate);
    EXPECT_NEAR(r.loss, std::log(2.0), 1e-6);
    EXPECT_EQ(r.pref.pairs, 2.0);
    EXPECT_EQ(r.pref.chosen, 0.0);
    EXPECT_EQ(r.pref.rejected, 0.0);
    EXPECT_LT(r.pref.logps_chosen, 0.0);
    // Only the adapters' B matrices get a gradient at the start (A's is multiplied by B = 0).
    float norm = 0;
    for (size_t i = 0; i < e.step().layout().total; ++i) norm += e.grads()[i] * e.grads()[i];
    EXPECT_GT(norm, 0.0f);
}

TEST(Dpo, PlannedEqualsMeasuredAndTheCopyCostsItsWeights) {
    const ModelConfig cfg = small();
    const int B = 4, T = 12;
    std::vector<int32_t> in(size_t(B * T)), tg(in.size());
    pair_batch(in, tg, B, T, cfg.vocab_size, 7);
    CpuBackend cpu;
    CategoryBytes peak[4];
    int k = 0;
    for (const auto & [ref, w] : {std::pair{Reference::adapters_off, ReferenceWeights::compute},
                                  std::pair{Reference::copy, ReferenceWeights::compute},
                                  std::pair{Reference::copy, ReferenceWeights::nf4},
                                  std::pair{Reference::precompute, ReferenceWeights::compute}}) {
        SCOPED_TRACE(reference_name(ref));
        for (const DType dt : {DType::f32, DType::bf16}) {
            EngineOptions eo = dpo_options(B, T, ref, true, cfg);
            eo.compute = dt;
            eo.pref.weights = w;
            Engine e(cfg, cpu, eo);
            e.init_params(2);
            const std::vector<float> zeros(size_t(B), 0.0f);
            const float loss = e.train_step(in.data(), tg.data(), OptimHyper{}, nullptr,
                                            ref == Reference::precompute ? zeros.data() : nullptr).loss;
            EXPECT_TRUE(std::isfinite(loss));
            const CategoryBytes plan = e.planned_peak_live();
            for (size_t c = 0; c < kCategoryCount; ++c) EXPECT_EQ(plan.v[c], e.ledger().live_peak().v[c]) << c;
            if (dt == DType::f32) peak[k] = plan;
        }
        ++k;
    }
    EXPECT_EQ(peak[0][Category::reference], 0u);
    EXPECT_EQ(peak[3][Category::reference], 0u);
    EXPECT_EQ(peak[1][Category::reference], make_param_layout(cfg).total * 4);
    EXPECT_LT(peak[2][Category::reference], peak[1][Category::reference] / 2);
    // The reference's forward keeps nothing for a backward and is over before the policy's starts:
    // the peak is the policy's, whichever the reference.
    EXPECT_EQ(peak[0][Category::activations], peak[3][Category::activations]);
    EXPECT_EQ(peak[1][Category::activations], peak[3][Category::activations]);
    EXPECT_EQ(peak[2][Category::activations], peak[3][Category::activations]);
}

TEST(Dpo, EveryCopyStorageIsPlannedExactlyAndNearTheExactCopy) {
    const ModelConfig cfg = small();
    const int B = 4, T = 12;
    std::vector<int32_t> in(size_t(B * T)), tg(in.size());
    pair_batch(in, tg, B, T, cfg.vocab_size, 8);
    const size_t P = make_param_layout(cfg).total;
    const std::vector<float> start = random_weights(P, 12, 0.3f);
    std::vector<float> moved = start;
    const std::vector<float> d = random_weights(P, 13, 0.05f);
    for (size_t i = 0; i < P; ++i) moved[i] += d[i];
    CpuBackend cpu;
    float exact = 0;
    for (const ReferenceWeights w : {ReferenceWeights::compute, ReferenceWeights::bf16, ReferenceWeights::int8,
                                     ReferenceWeights::nf4}) {
        SCOPED_TRACE(reference_weights_name(w));
        EngineOptions eo = dpo_options(B, T, Reference::copy, false, cfg);
        eo.pref.weights = w;
        Engine e(cfg, cpu, eo);
        e.init_params(1);
        e.set_reference(start.data());
        e.set_params(moved.data());
        const float loss = e.train_step(in.data(), tg.data(), kNoUpdate).loss;
        const CategoryBytes plan = e.planned_peak_live();
        for (size_t c = 0; c < kCategoryCount; ++c) EXPECT_EQ(plan.v[c], e.ledger().live_peak().v[c]) << c;
        const uint64_t ref = plan[Category::reference];
        if (w == ReferenceWeights::compute) {
            exact = loss;
            EXPECT_EQ(ref, P * 4);
        } else if (w == ReferenceWeights::bf16) {
            EXPECT_EQ(ref, P * 2);   // the copy computes in bf16 inside an fp32 run
            EXPECT_NEAR(loss, exact, 0.005 * exact);
            EXPECT_NE(loss, exact);
        } else {
            EXPECT_LT(ref, P * 2);   // the projections packed, the rest fp32
            EXPECT_NEAR(loss, exact, (w == ReferenceWeights::int8 ? 0.005 : 0.03) * exact);
            EXPECT_NE(loss, exact);
        }
        EXPECT_NE(loss, float(std::log(2.0)));
    }
}

TEST(Dpo, FitAutoChoosesMicroBatchesOfWholePairs) {
    const ModelConfig cfg = small();
    CpuBackend cpu;
    RunConfig r;
    r.seq = 32;
    r.micro_batch = 2;
    r.grad_accum = 1;
    r.attention = Attention::naive;
    r.loss_chunk = 0;
    r.pref.objective = "dpo";
    // The budget: what micro-batch 2 needs. Six rows a step could be micro-batches of 1, 2, 3 or
    // 6; 3 would split a pair, 6 does not fit.
    const CategoryBytes two = StepPlans(cfg, cpu, engine_options(r, cfg, cpu, false)).reserved();
    ASSERT_GT(two[Category::reference], 0u);
    r.micro_batch = 6;
    r.fit_auto = true;
    r.budget = two.total();
    const ResolvedRun got = resolve_run(r, cfg, cpu, false);
    EXPECT_TRUE(got.eo.pref.enabled());
    EXPECT_EQ(got.eo.B, 2);
    EXPECT_EQ(got.eo.grad_accum, 3);
    EXPECT_LE(StepPlans(cfg, cpu, got.eo).reserved().total(), r.budget);
    r.micro_batch = 3;   // 3 rows a step: no micro-batch holds whole pairs
    EXPECT_NE(unsupported(r, cfg, nullptr).value_or("").find("cannot be cut into micro-batches of whole pairs"),
              std::string::npos);
}

TEST(Dpo, RefusesWhatCannotWork) {
    const ModelConfig cfg = small();
    auto why = [&](auto edit) {
        RunConfig r;
        r.seq = 16;
        r.micro_batch = 4;
        r.pref.objective = "dpo";
        r.lora.rank = 4;
        edit(r);
        const auto w = unsupported(r, cfg, nullptr);
        return w ? *w : std::string();
    };
    EXPECT_NE(why([](RunConfig & r) { r.layout.tp = 2; }).find("--objective dpo with --tp 2"), std::string::npos);
    EXPECT_NE(why([](RunConfig & r) { r.lora.rank = 0, r.pref.reference = "adapters-off"; }).find("has none"),
              std::string::npos);
    EXPECT_NE(why([](RunConfig & r) { r.micro_batch = 3; }).find("--micro-batch 4"), std::string::npos);
    EXPECT_NE(why([](RunConfig & r) { r.packing = true; }).find("--packing"), std::string::npos);
    EXPECT_EQ(why([](RunConfig &) {}), "");
    RunConfig plain;
    plain.pref.beta = 0.5f;   // a DPO flag without --objective dpo
    EXPECT_THROW(preference_options(plain), ConfigError);
    RunConfig ls;
    ls.pref.objective = "dpo";
    ls.pref.loss = "hinge";
    ls.pref.label_smoothing = 0.1f;
    EXPECT_THROW(preference_options(ls), ConfigError);
    RunConfig w;
    w.pref.objective = "dpo";
    w.lora.rank = 4;
    w.pref.weights = "nf4";   // auto under LoRA is adapters-off: no copy to store
    EXPECT_THROW(preference_options(w), ConfigError);
    // A re-plan never halves a micro-batch into one that splits a pair.
    EngineOptions eo = dpo_options(4, 16, Reference::copy, false, cfg);
    ASSERT_TRUE(halve_micro_batch(eo).has_value());
    EXPECT_EQ(halve_micro_batch(eo)->B, 2);
    eo.B = 2;
    EXPECT_FALSE(halve_micro_batch(eo).has_value());
    eo.pref = {};
    EXPECT_TRUE(halve_micro_batch(eo).has_value());
    RunConfig a;
    a.pref.objective = "dpo";
    EXPECT_EQ(preference_options(a).reference, Reference::copy);
    a.lora.rank = 8;
    EXPECT_EQ(preference_options(a).reference, Reference::adapters_off);
}

}  // namespace
}  // namespace memfit
