// --optimizer galore-adamw[-8bit]: the kernel's steps against a float64 reference written with
// python3-torch from the paper's algorithm (tests/data/make_galore_fixture.py: left, right and
// square projections, five steps, the projector refreshed every two); the 8-bit moments follow
// the fp32 ones; in the engine, the projected moments and projectors are planned = measured and
// far below AdamW's, the loss falls, and a resume continues bit for bit across a refresh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/moments8.h"
#include "core/error.h"
#include "run/compat.h"
#include "train/engine.h"
#include "test_util.h"

namespace memfit {
namespace {

using test::host_view;

nlohmann::json reference() {
    std::ifstream in(std::string(MEMFIT_TEST_DATA) + "/galore_reference.json");
    EXPECT_TRUE(in.good());
    return nlohmann::json::parse(in);
}

// One fixture case through `o`'s kernel: the weights after each of its five steps.
std::vector<std::vector<float>> run_case(Optimizer o, const nlohmann::json & ref, const nlohmann::json & c) {
    const std::vector<int64_t> shape = c["shape"].get<std::vector<int64_t>>();
    const int64_t R = shape[0], C = shape[1], r = c["rank"].get<int64_t>();
    const OptimizerRow & row = optimizer_row(o);
    std::vector<std::vector<float>> states(size_t(row.n_states));
    OptimizerStates st;
    for (int i = 0; i < row.n_states; ++i) {
        const OptimizerState & d = row.states[size_t(i)];
        const size_t len = state_len(d.size, R, C, r);
        states[size_t(i)].assign((len * dtype_size(d.dtype) + 3) / 4, 0.0f);
        st.t[size_t(i)] = host_view(states[size_t(i)], d.dtype, 0, int64_t(len));
    }
    std::vector<float> p = c["init"].get<std::vector<float>>();
    std::vector<std::vector<float>> out;
    CpuBackend be;
    for (int t = 0; t < 5; ++t) {
        std::vector<float> g = c["grads"][size_t(t)].get<std::vector<float>>();
        OptimHyper h;
        h.lr = ref["lr"].get<float>(), h.beta1 = ref["beta1"].get<float>(), h.beta2 = ref["beta2"].get<float>();
        h.eps = ref["eps"].get<float>(), h.weight_decay = c["weight_decay"].get<float>(), h.t = t + 1;
        h.galore_rank = int(r), h.galore_update_gap = ref["update_gap"].get<int>(), h.galore_scale = ref["scale"].get<float>();
        be.optimizer_step(o, host_view(p, DType::f32).view(0, {R, C}), host_view(g, DType::f32).view(0, {R, C}), st,
                          Tensor{}, Tensor{}, h);
        out.push_back(p);
    }
    return out;
}

TEST(Galore, MatchesTheFloat64Reference) {
    const nlohmann::json ref = reference();
    for (const auto & c : ref["cases"]) {
        SCOPED_TRACE(c["name"].get<std::string>());
        const auto got = run_case(Optimizer::galore_adamw, ref, c);
        for (size_t t = 0; t < got.size(); ++t) {
            const std::vector<double> want = c["after"][t].get<std::vector<double>>();
            for (size_t i = 0; i < want.size(); ++i)
                ASSERT_NEAR(got[t][i], want[i], 2e-6 * (1.0 + std::fabs(want[i]))) << "step " << t + 1 << " element " << i;
        }
    }
}

// The 8-bit row against float64 step by step (as LowpAdamW.EightBitMomentsMatchDoubleReference):
// the reference decodes the kernel's stored codes before each step and takes the projector the
// kernel holds after it (refreshed or not), then projects, updates the moments, projects back and
// steps in double; the weights within float rounding of it.
TEST(Galore, EightBitStepMatchesTheDoubleReference) {
    const nlohmann::json ref = reference();
    CpuBackend be;
    for (const auto & c : ref["cases"]) {
        SCOPED_TRACE(c["name"].get<std::string>());
        const std::vector<int64_t> shape = c["shape"].get<std::vector<int64_t>>();
        const int64_t R = shape[0], C = shape[1], r = c["rank"].get<int64_t>(), s = std::min(R, C);
        const bool left = R < C;
        const size_t nl = state_len(StateSize::projected, R, C, r), nb = moments8_blocks(nl);
        std::vector<uint8_t> m(nl, 0), v(nl, 0);
        std::vector<float> ms(nb, 0.0f), vs(nb, 0.0f), proj(size_t(r * s), 0.0f);
        std::vector<float> scratch(state_len(StateSize::scratch, R, C, r), 0.0f);
        std::vector<float> p = c["init"].get<std::vector<float>>();
        OptimHyper h;
        h.lr = ref["lr"].get<float>(), h.beta1 = ref["beta1"].get<float>(), h.beta2 = ref["beta2"].get<float>();
        h.eps = ref["eps"].get<float>(), h.weight_decay = c["weight_decay"].get<float>();
        h.galore_rank = int(r), h.galore_update_gap = ref["update_gap"].get<int>(), h.galore_scale = ref["scale"].get<float>();
        for (int t = 1; t <= 5; ++t) {
            std::vector<float> g = c["grads"][size_t(t - 1)].get<std::vector<float>>();
            std::vector<double> m0(nl), v0(nl);
            for (size_t i = 0; i < nl; ++i)
                m0[i] = decode_m8(m[i], ms[i / kMoments8Block]), v0[i] = decode_v8(v[i], vs[i / kMoments8Block]);
            const std::vector<float> p0 = p;
            h.t = t;
            OptimizerStates st{{host_view(m, DType::u8), host_view(v, DType::u8), host_view(ms, DType::f32),
                                host_view(vs, DType::f32), host_view(proj, DType::f32), host_view(scratch, DType::f32)}};
            be.optimizer_step(Optimizer::galore_adamw_8bit, host_view(p, DType::f32).view(0, {R, C}),
                              host_view(g, DType::f32).view(0, {R, C}), st, Tensor{}, Tensor{}, h);
            const double bc1 = 1 - std::pow(double(h.beta1), t), bc2 = 1 - std::pow(double(h.beta2), t);
            std::vector<double> n(nl);   // N in the projected space: r x C (left) or R x r
            for (size_t e = 0; e < nl; ++e) {
                const int64_t a = int64_t(e) / (left ? C : r), b = int64_t(e) % (left ? C : r);
                double low = 0;   // (Q G)[a][b] or (G Q^T)[a][b]
                for (int64_t k = 0; k < s; ++k)
                    low += left ? double(proj[size_t(a * s + k)]) * g[size_t(k * C + b)]
                                : double(g[size_t(a * C + k)]) * proj[size_t(b * s + k)];
                const double mi = h.beta1 * m0[e] + (1 - double(h.beta1)) * low;
                const double vi = h.beta2 * v0[e] + (1 - double(h.beta2)) * low * low;
                n[e] = (mi / bc1) / (std::sqrt(vi / bc2) + h.eps);
            }
            for (int64_t i = 0; i < R; ++i)
                for (int64_t j = 0; j < C; ++j) {
                    double d = 0;   // (Q^T N)[i][j] or (N Q)[i][j]
                    for (int64_t k = 0; k < r; ++k)
                        d += left ? double(proj[size_t(k * s + i)]) * n[size_t(k * C + j)]
                                  : n[size_t(i * r + k)] * double(proj[size_t(k * s + j)]);
                    const size_t e = size_t(i * C + j);
                    const double want = p0[e] * (1 - double(h.lr) * h.weight_decay) - double(h.lr) * h.galore_scale * d;
                    ASSERT_NEAR(p[e], want, 2e-6 * (1 + std::fabs(want))) << "step " << t << " element " << e;
                }
        }
    }
}

TEST(Galore, EightBitMomentsFollowTheFp32Ones) {
    const nlohmann::json ref = reference();
    for (const auto & c : ref["cases"]) {
        SCOPED_TRACE(c["name"].get<std::string>());
        const auto a = run_case(Optimizer::galore_adamw, ref, c), b = run_case(Optimizer::galore_adamw_8bit, ref, c);
        const std::vector<float> init = c["init"].get<std::vector<float>>();
        double moved = 0, diff = 0;   // over the five steps' weights: how far they moved, how far apart
        for (size_t i = 0; i < init.size(); ++i) {
            moved = std::max(moved, double(std::fabs(a.back()[i] - init[i])));
            diff = std::max(diff, double(std::fabs(a.back()[i] - b.back()[i])));
        }
        EXPECT_GT(moved, 1e-3);
        EXPECT_LT(diff, 0.05 * moved);
    }
}

TEST(Galore, EngineStatesArePlannedAndResumeBitwise) {
    const ModelConfig cfg = test::small_family(true, 64, 32, 2, 2, 48);
    CpuBackend backend;
    for (const Optimizer o : {Optimizer::galore_adamw, Optimizer::galore_adamw_8bit}) {
        SCOPED_TRACE(optimizer_name(o));
        EngineOptions eo;
        eo.B = 2, eo.T = 16, eo.with_eval = false, eo.optimizer = o, eo.galore_rank = 4;
        auto batch = [&](int s, std::vector<int32_t> & in, std::vector<int32_t> & tg) {
            in.resize(32), tg.resize(32);
            test::random_batch(in, tg, cfg.vocab_size, 90 + uint64_t(s));
        };
        OptimHyper h{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1};
        h.galore_update_gap = 4, h.galore_scale = 1.0f;
        Engine a(cfg, backend, eo);
        a.init_params(5);
        std::vector<int32_t> in, tg;
        batch(0, in, tg);
        float first = 0, last = 0;
        for (int s = 0; s < 6; ++s) {   // one batch, learnt; the projectors refreshed at step 5
            h.t = s + 1;
            last = a.train_step(in.data(), tg.data(), h).loss;
            if (s == 0) first = last;
        }
        EXPECT_LT(last, first);
        // The projected pieces' moments and projectors, the others' moments, in the row's dtypes.
        const OptimizerRow & row = optimizer_row(o);
        size_t want = 0, projected = 0, scratch = 0;
        for (const auto & p : a.step().moment_pieces()) {
            projected += p.rank > 0;
            for (int i = 0; i < row.n_states; ++i) {
                const OptimizerState & d = row.states[size_t(i)];
                const size_t bytes = state_len(d.size, p.rows, p.cols, p.rank) * dtype_size(d.dtype);
                if (d.size == StateSize::scratch) scratch = std::max(scratch, bytes);
                else want += bytes;
            }
        }
        EXPECT_EQ(projected, 14u);   // 7 projection matrices a layer
        EXPECT_EQ(a.planned_peak_live()[Category::optimizer_states], want);
        EXPECT_EQ(a.ledger().live_peak()[Category::optimizer_states], want);
        // The update's scratch: the largest projected matrix's, workspace, used by the optimizer
        // ops (so placed for them), and nowhere else.
        EXPECT_GT(scratch, 0u);
        int scratch_buffers = 0;
        for (const BufferDecl & b : a.step().program().buffers()) {
            if (!b.name.ends_with("galore.scratch")) continue;
            ++scratch_buffers;
            EXPECT_EQ(b.bytes, scratch);
            EXPECT_EQ(b.category, Category::workspace);
            EXPECT_FALSE(b.persistent);
            ASSERT_GE(b.first_op, 0) << "no op uses the scratch";
            EXPECT_EQ(a.step().program().ops()[size_t(b.first_op)].phase, Phase::optimizer);
        }
        EXPECT_EQ(scratch_buffers, 1);
        EXPECT_EQ(a.planned_peak_live().total(), a.ledger().live_peak().total());
        // Exported (the projected moments at each matrix's start, the projector after the first),
        // imported into another engine, continued over the next refresh (step 9).
        const TrainState saved = a.export_state();
        Engine b(cfg, backend, eo);
        b.init_params(6);
        b.import_state(saved);
        for (int s = 6; s < 9; ++s) {
            batch(s, in, tg);
            h.t = s + 1;
            EXPECT_EQ(a.train_step(in.data(), tg.data(), h).loss, b.train_step(in.data(), tg.data(), h).loss);
        }
        EXPECT_TRUE(a.export_state().params == b.export_state().params);
        EXPECT_TRUE(a.export_state().m == b.export_state().m);
    }
}

TEST(Galore, StatesAreSmallerThanAdamWs) {
    const ModelConfig cfg = test::small_family(false, 64, 64, 2, 2, 256);
    CpuBackend backend;
    auto states = [&](Optimizer o) {
        EngineOptions eo;
        eo.B = 1, eo.T = 8, eo.with_eval = false, eo.optimizer = o, eo.galore_rank = 8;
        Engine e(cfg, backend, eo);
        return e.planned_peak_live()[Category::optimizer_states];
    };
    const size_t adamw = states(Optimizer::adamw), galore = states(Optimizer::galore_adamw);
    const size_t galore8 = states(Optimizer::galore_adamw_8bit);
    EXPECT_LT(galore, adamw * 6 / 10);   // the blocks' matrices (most of the model) at rank 8 of 64
    EXPECT_LT(galore8, galore * 6 / 10);
}

TEST(Galore, RefusesWhatCutsAMatrixOrTrainsNoFullWeight) {
    const ModelConfig cfg = test::small_config(64, 32, 2, 2);
    auto refusal = [&](auto edit) {
        RunConfig r;
        r.optimizer = Optimizer::galore_adamw;
        edit(r);
        return test::refusal(r, cfg);
    };
    EXPECT_EQ(refusal([](RunConfig &) {}), "");
    EXPECT_NE(refusal([](RunConfig & r) { r.layout.zero = 1; }).find("--zero 1"), std::string::npos);
    EXPECT_NE(refusal([](RunConfig & r) { r.lora.rank = 8; }).find("--lora-rank 8"), std::string::npos);
    EXPECT_NE(refusal([](RunConfig & r) { r.galore_rank = 0; }).find("--galore-rank 0"), std::string::npos);
    CpuBackend backend;
    EngineOptions eo;
    eo.B = 2, eo.T = 16, eo.optimizer = Optimizer::galore_adamw_8bit, eo.offload = 0.5;
    eo.offload_dir = "/tmp";
    EXPECT_THROW(Engine(cfg, backend, eo), ConfigError);
}

}  // namespace
}  // namespace memfit
