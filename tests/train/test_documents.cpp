// Packed documents in the engine (EngineOptions::documents): a row holding several documents
// trains as those documents would in rows of their own (padded), for both families, naive and
// flash attention; the plan stays exact (the document starts are one more persistent buffer of
// 4 bytes per token); recomputation stays bitwise; malformed document starts are refused.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "train/engine.h"
#include "test_util.h"

using namespace memfit;
using memfit::test::small_family;

namespace {

constexpr int kT = 24;

struct Doc {
    std::vector<int32_t> in, tg;   // pairs: inputs and their targets (-100: not trained)
};

Doc random_doc(int pairs, int V, std::mt19937 & rng) {
    Doc d;
    for (int i = 0; i < pairs; ++i) {
        d.in.push_back(int32_t(rng() % uint32_t(V)));
        d.tg.push_back(i < pairs / 3 ? -100 : int32_t(rng() % uint32_t(V)));   // a prompt, then a response
    }
    return d;
}

// Rows of kT: the documents of each row one after the other, then padding (token 0, target -100,
// a document of its own).
struct Batch {
    std::vector<int32_t> in, tg, starts;
};

Batch lay_out(const std::vector<std::vector<const Doc *>> & rows) {
    Batch b;
    for (const auto & row : rows) {
        int at = 0;
        for (const Doc * d : row) {
            for (size_t i = 0; i < d->in.size(); ++i) {
                b.in.push_back(d->in[i]);
                b.tg.push_back(d->tg[i]);
                b.starts.push_back(at);
            }
            at += int(d->in.size());
        }
        for (int t = at; t < kT; ++t) {
            b.in.push_back(0);
            b.tg.push_back(-100);
            b.starts.push_back(at);
        }
    }
    return b;
}

struct Outcome {
    float loss = 0;
    int tokens = 0;
    std::vector<float> grads;
};

Outcome run(const ModelConfig & cfg, bool flash, bool documents, const Batch & b, const char * recompute = "none") {
    CpuBackend backend;
    EngineOptions eo;
    eo.B = int(b.in.size()) / kT;
    eo.T = kT;
    eo.flash_attention = flash;
    eo.documents = documents;
    eo.with_eval = false;
    eo.recompute = parse_recompute(recompute, cfg.n_layer);
    Engine e(cfg, backend, eo);
    e.init_params(3);
    const StepResult r = e.train_step(b.in.data(), b.tg.data(), OptimHyper{0.0f, 0.9f, 0.95f, 1e-8f, 0.0f, 1},
                                      documents ? b.starts.data() : nullptr);
    Outcome o{r.loss, r.tokens, {}};
    o.grads.assign(e.grads(), e.grads() + e.step().layout().total);
    return o;
}

double rel_err(const std::vector<float> & a, const std::vector<float> & b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return std::sqrt(num / den);
}

}  // namespace

TEST(Documents, APackedRowTrainsAsItsDocumentsInRowsOfTheirOwn) {
    for (const bool llama : {false, true}) {
        const ModelConfig cfg = small_family(llama, 53, 32, 2, 4, 48, kT);
        std::mt19937 rng(7);
        const Doc a = random_doc(9, 53, rng), b = random_doc(7, 53, rng), c = random_doc(1, 53, rng),
                  d = random_doc(5, 53, rng), e = random_doc(kT, 53, rng);
        const Batch packed = lay_out({{&a, &b, &c, &d}, {&e}});
        const Batch alone = lay_out({{&a}, {&b}, {&c}, {&d}, {&e}});
        for (const bool flash : {false, true}) {
            SCOPED_TRACE(std::string(llama ? "llama" : "gpt2") + (flash ? " flash" : " naive"));
            const Outcome p = run(cfg, flash, true, packed), q = run(cfg, flash, false, alone);
            EXPECT_EQ(p.tokens, q.tokens);
            EXPECT_NEAR(p.loss, q.loss, 1e-6 * std::fabs(q.loss));
            EXPECT_LT(rel_err(p.grads, q.grads), 1e-5);
            // Without the document starts the packed row is one sequence: a different loss.
            const Outcome mixed = run(cfg, flash, false, packed);
            EXPECT_GT(std::fabs(mixed.loss - q.loss), 1e-4 * std::fabs(q.loss));
        }
    }
}

TEST(Documents, RecomputationStaysBitwise) {
    const ModelConfig cfg = small_family(true, 53, 32, 3, 4, 48, kT);
    std::mt19937 rng(8);
    const Doc a = random_doc(11, 53, rng), b = random_doc(13, 53, rng), c = random_doc(20, 53, rng);
    const Batch packed = lay_out({{&a, &b}, {&c}});
    for (const bool flash : {false, true}) {
        const Outcome none = run(cfg, flash, true, packed);
        for (const char * policy : {"full", "selective", "every:2"}) {
            SCOPED_TRACE(std::string(policy) + (flash ? " flash" : " naive"));
            const Outcome rc = run(cfg, flash, true, packed, policy);
            EXPECT_EQ(rc.loss, none.loss);
            EXPECT_EQ(0, std::memcmp(rc.grads.data(), none.grads.data(), none.grads.size() * sizeof(float)));
        }
    }
}

TEST(Documents, PlannedEqualsMeasuredAndTheStartsAreFourBytesAToken) {
    CpuBackend backend;
    const ModelConfig cfg = small_family(true, 53, 32, 2, 4, 48, kT);
    std::mt19937 rng(9);
    const Doc a = random_doc(10, 53, rng), b = random_doc(14, 53, rng), c = random_doc(24, 53, rng);
    const Batch packed = lay_out({{&a, &b}, {&c}});
    for (const bool flash : {false, true}) {
        EngineOptions eo;
        eo.B = 2;
        eo.T = kT;
        eo.flash_attention = flash;
        eo.documents = true;
        Engine e(cfg, backend, eo);
        e.init_params(1);
        e.train_step(packed.in.data(), packed.tg.data(), OptimHyper{}, packed.starts.data());
        e.eval_loss(packed.in.data(), packed.tg.data(), packed.starts.data());
        const CategoryBytes live = e.planned_peak_live(), rsv = e.planned_reserved();
        for (size_t k = 0; k < kCategoryCount; ++k) {
            SCOPED_TRACE(kCategoryNames[k]);
            EXPECT_EQ(live.v[k], e.ledger().live_peak().v[k]);
            EXPECT_EQ(rsv.v[k], e.ledger().reserved_peak().v[k]);
        }
        eo.documents = false;
        const StepPlans plain(cfg, backend, eo);
        EXPECT_EQ(e.plan().persistent_live[Category::activations],
                  plain.train_plan.persistent_live[Category::activations] + 2 * kT * 4);
    }
}

TEST(Documents, MalformedStartsAreRefused) {
    CpuBackend backend;
    const ModelConfig cfg = small_family(false, 53, 32, 1, 4, 48, kT);
    EngineOptions eo;
    eo.B = 1;
    eo.T = kT;
    eo.documents = true;
    Engine e(cfg, backend, eo);
    e.init_params(1);
    std::vector<int32_t> in(kT, 1), tg(kT, 2), starts(kT, 0);
    EXPECT_NO_THROW(e.train_step(in.data(), tg.data(), OptimHyper{}, starts.data()));
    starts[5] = 3;   // neither itself nor the previous token's start
    EXPECT_THROW(e.train_step(in.data(), tg.data(), OptimHyper{}, starts.data()), FormatError);
    starts[5] = 6;   // a start after the token
    EXPECT_THROW(e.eval_loss(in.data(), tg.data(), starts.data()), FormatError);
    starts.assign(kT, 0);
    starts[0] = 1;
    EXPECT_THROW(e.train_step(in.data(), tg.data(), OptimHyper{}, starts.data()), FormatError);
}
