// Knowledge distillation in the training step (--teacher): a frozen teacher's forward on the
// same tokens, the loss (1 - alpha) CE + alpha T^2 KL chunk by chunk with the LM head. Checked:
// the step's loss equals the formula on the two models' own logits (computed in double, with
// loss chunks that cut across sequences, a teacher of another family and width); alpha = 0 trains
// exactly as without a teacher; a teacher equal to the student at alpha = 1 teaches nothing (zero
// loss, zero gradients); planned == measured per category for f32 and bf16, dense and packed
// teachers (the `teacher` category holds exactly the teacher's bytes, and the teacher keeps no
// activations for a backward); the combinations that cannot work are refused in one line.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/quant_format.h"
#include "core/error.h"
#include "model/distill.h"
#include "model/param_layout.h"
#include "plan/fit.h"
#include "run/compat.h"
#include "train/engine.h"
#include "test_util.h"

namespace memfit {
namespace {

using test::random_batch;

constexpr int kVocab = 61;

ModelConfig student() { return test::small_family(false, kVocab, 32, 2, 4, 48); }
ModelConfig teacher_cfg() { return test::small_family(true, kVocab, 64, 3, 4, 96); }

std::vector<float> random_weights(const ModelConfig & c, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 0.4f);
    std::vector<float> w(make_param_layout(c).total);
    for (float & x : w) x = nd(rng);
    return w;
}

EngineOptions options(int B, int T, const ModelConfig * teacher, float alpha, float temperature) {
    EngineOptions eo;
    eo.B = B, eo.T = T;
    if (teacher) {
        eo.distill.teacher = *teacher;
        eo.distill.alpha = alpha;
        eo.distill.temperature = temperature;
    }
    return eo;
}

// An engine holding `w` (and the teacher's `tw`).
std::unique_ptr<Engine> engine(CpuBackend & cpu, const ModelConfig & c, const std::vector<float> & w,
                               const EngineOptions & eo, const std::vector<float> * tw = nullptr) {
    auto e = std::make_unique<Engine>(c, cpu, eo);
    e->init_params(1);
    e->set_params(w.data());
    if (tw) e->set_teacher(tw->data());
    return e;
}

constexpr OptimHyper kNoUpdate{0.0f, 0.9f, 0.95f, 1e-8f, 0.0f, 1};   // lr 0: the step leaves the weights

TEST(Distill, StepLossIsTheFormulaOnBothModelsLogits) {
    const ModelConfig s = student(), t = teacher_cfg();
    const int B = 2, T = 12, N = B * T;
    const std::vector<float> sw = random_weights(s, 1), tw = random_weights(t, 2);
    std::vector<int32_t> in(static_cast<size_t>(N)), tg(static_cast<size_t>(N));
    random_batch(in, tg, kVocab, 5);
    CpuBackend cpu;
    const std::vector<float> zs = engine(cpu, s, sw, options(B, T, nullptr, 0, 1))->logits(in.data(), B);
    const std::vector<float> zt = engine(cpu, t, tw, options(B, T, nullptr, 0, 1))->logits(in.data(), B);
    ASSERT_EQ(zs.size(), size_t(N * kVocab));
    for (const float alpha : {0.3f, 1.0f}) {
        for (const float temp : {0.7f, 2.0f}) {
            for (const int chunk : {0, 7}) {   // 7: chunks cut across the two sequences
                SCOPED_TRACE(testing::Message() << "alpha " << alpha << " T " << temp << " chunk " << chunk);
                EngineOptions eo = options(B, T, &t, alpha, temp);
                eo.loss_chunk = chunk;
                const float got = engine(cpu, s, sw, eo, &tw)->train_step(in.data(), tg.data(), kNoUpdate).loss;
                double sum = 0;
                int valid = 0;
                for (int i = 0; i < N; ++i) {
                    if (tg[size_t(i)] == -100) continue;
                    const float * z = &zs[size_t(i) * kVocab];
                    const float * q = &zt[size_t(i) * kVocab];
                    double zm = -1e30, qm = -1e30;
                    for (int j = 0; j < kVocab; ++j) zm = std::max(zm, double(z[j])), qm = std::max(qm, double(q[j]));
                    double se = 0, st = 0, sq = 0;
                    for (int j = 0; j < kVocab; ++j) {
                        se += std::exp(z[j] - zm);
                        st += std::exp((z[j] - zm) / temp);
                        sq += std::exp((q[j] - qm) / temp);
                    }
                    const double ce = zm + std::log(se) - z[tg[size_t(i)]];
                    double kl = 0;
                    for (int j = 0; j < kVocab; ++j) {
                        const double lq = (q[j] - qm) / temp - std::log(sq), lp = (z[j] - zm) / temp - std::log(st);
                        kl += std::exp(lq) * (lq - lp);
                    }
                    sum += (1 - alpha) * ce + alpha * temp * temp * kl;
                    ++valid;
                }
                EXPECT_NEAR(got, sum / valid, 2e-5 * std::max(1.0, sum / valid));
            }
        }
    }
}

TEST(Distill, AlphaZeroTrainsAsWithoutATeacher) {
    const ModelConfig s = student(), t = teacher_cfg();
    const int B = 2, T = 12;
    const std::vector<float> sw = random_weights(s, 3), tw = random_weights(t, 4);
    std::vector<int32_t> in(size_t(B * T)), tg(size_t(B * T));
    random_batch(in, tg, kVocab, 6);
    CpuBackend cpu;
    const auto plain = engine(cpu, s, sw, options(B, T, nullptr, 0, 1));
    const auto distilled = engine(cpu, s, sw, options(B, T, &t, 0.0f, 3.0f), &tw);
    EXPECT_NEAR(plain->train_step(in.data(), tg.data(), kNoUpdate).loss,
                distilled->train_step(in.data(), tg.data(), kNoUpdate).loss, 1e-5);
    const float * a = plain->grads();
    const float * b = distilled->grads();
    double worst = 0, scale = 0;
    for (size_t i = 0; i < make_param_layout(s).total; ++i)
        worst = std::max(worst, double(std::fabs(a[i] - b[i]))), scale = std::max(scale, double(std::fabs(a[i])));
    EXPECT_LT(worst, 1e-5 * scale);
}

TEST(Distill, ATeacherEqualToTheStudentTeachesNothing) {
    const ModelConfig s = student();
    const int B = 2, T = 12;
    const std::vector<float> sw = random_weights(s, 7);
    std::vector<int32_t> in(size_t(B * T)), tg(size_t(B * T));
    random_batch(in, tg, kVocab, 8);
    CpuBackend cpu;
    EngineOptions eo = options(B, T, &s, 1.0f, 2.0f);
    eo.loss_chunk = 5;
    const auto e = engine(cpu, s, sw, eo, &sw);
    EXPECT_NEAR(e->train_step(in.data(), tg.data(), kNoUpdate).loss, 0.0f, 1e-5f);
    for (size_t i = 0; i < make_param_layout(s).total; ++i) ASSERT_NEAR(e->grads()[i], 0.0f, 1e-6f) << i;
}

TEST(Distill, PlannedEqualsMeasuredAndTheTeacherKeepsNothingForBackward) {
    const ModelConfig s = student(), t = teacher_cfg();
    const int B = 2, T = 16;
    const std::vector<float> sw = random_weights(s, 9), tw = random_weights(t, 10);
    std::vector<int32_t> in(size_t(B * T)), tg(size_t(B * T));
    random_batch(in, tg, kVocab, 11);
    CpuBackend cpu;
    for (const DType dt : {DType::f32, DType::bf16}) {
        for (const BaseWeights bw : {BaseWeights::compute, BaseWeights::int8, BaseWeights::nf4}) {
            SCOPED_TRACE(testing::Message() << dtype_name(dt) << " teacher " << base_weights_name(bw));
            EngineOptions plain = options(B, T, nullptr, 0, 1);
            plain.compute = dt;
            plain.loss_chunk = 8;
            EngineOptions eo = options(B, T, &t, 0.5f, 2.0f);
            eo.compute = dt;
            eo.loss_chunk = 8;
            eo.distill.weights = bw;
            const auto e = engine(cpu, s, sw, eo, &tw);
            const float loss = e->train_step(in.data(), tg.data(), OptimHyper{}).loss;
            EXPECT_TRUE(std::isfinite(loss));
            const CategoryBytes plan = e->planned_peak_live();
            for (size_t k = 0; k < kCategoryCount; ++k) EXPECT_EQ(plan.v[k], e->ledger().live_peak().v[k]) << k;
            const QuantLayout q = bw == BaseWeights::compute ? QuantLayout{} : make_quant_layout(t, eo.distill.format());
            EXPECT_EQ(plan[Category::teacher], dense_layout(t, q).total * dtype_size(dt) + q.bytes);
            if (bw == BaseWeights::compute) {
                EXPECT_EQ(plan[Category::teacher], make_param_layout(t).total * dtype_size(dt));
            }
            // Beside the student's own activations the teacher adds, at the peak, at most its final
            // norm's output, one logits chunk and the loss's two floats per row: nothing of its blocks.
            const CategoryBytes alone = StepPlans(s, cpu, plain).peak_live();
            const uint64_t allowed = uint64_t(B * T) * uint64_t(t.n_embd) * dtype_size(dt) + 8 * uint64_t(kVocab) * 4 + 2 * 8 * 4;
            EXPECT_LE(plan[Category::activations], alone[Category::activations] + allowed);
            EXPECT_EQ(alone[Category::teacher], 0u);
        }
    }
}

TEST(Distill, FitAutoCountsTheTeachersBytes) {
    CpuBackend cpu;
    ModelConfig s = model_preset("nano");
    s.vocab_size = 256;
    RunConfig r;
    r.seq = 64;
    r.micro_batch = 4;
    r.grad_accum = 1;
    r.attention = Attention::naive;
    r.loss_chunk = 0;
    r.distill.teacher = "micro";   // a preset: the student's vocabulary
    // The budget: 1 byte less than the asked configuration with its teacher needs.
    const CategoryBytes asked = StepPlans(s, cpu, engine_options(r, s, cpu, false)).reserved();
    ASSERT_GT(asked[Category::teacher], 0u);
    r.fit_auto = true;
    r.budget = asked.total() - 1;
    const ResolvedRun got = resolve_run(r, s, cpu, false);
    const CategoryBytes chosen = StepPlans(s, cpu, got.eo).reserved();
    EXPECT_LE(chosen.total(), r.budget);
    EXPECT_EQ(chosen[Category::teacher], asked[Category::teacher]);
    EXPECT_TRUE(got.eo.distill.enabled());
}

TEST(Distill, RefusesWhatCannotWork) {
    const ModelConfig s = student();
    ModelConfig other = teacher_cfg();
    other.vocab_size = kVocab + 1;
    try {
        check_teacher(other, s, 16);
        ADD_FAILURE() << "a different vocabulary was accepted";
    } catch (const ConfigError & e) {
        EXPECT_NE(std::string(e.what()).find("vocabulary of 62 tokens, the student 61"), std::string::npos) << e.what();
    }
    ModelConfig short_ctx = teacher_cfg();
    short_ctx.max_seq = 8;
    EXPECT_THROW(check_teacher(short_ctx, s, 16), ConfigError);
    RunConfig r;
    r.seq = 16;
    r.micro_batch = 2;
    r.distill.teacher = "nano";
    r.layout.tp = 2;
    const auto why = unsupported(r, s, nullptr);
    ASSERT_TRUE(why.has_value());
    EXPECT_NE(why->find("--teacher with --tp 2"), std::string::npos) << *why;
    RunConfig a;
    a.seq = 16;
    a.distill.teacher = "nano";
    a.distill.alpha = 1.5f;
    EXPECT_THROW(distill_options(a, s, DType::f32), ConfigError);
    RunConfig w;
    w.distill.weights = "int8";
    EXPECT_THROW(distill_options(w, s, DType::f32), ConfigError);
    RunConfig p;
    p.seq = 16;
    p.distill.teacher = "nano";
    p.distill.weights = "bf16";   // the compute precision is fp32
    EXPECT_THROW(distill_options(p, s, DType::f32), ConfigError);
}

}  // namespace
}  // namespace memfit
