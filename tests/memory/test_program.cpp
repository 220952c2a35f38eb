// The step program, its placement and the ledger, on hand-built programs.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/graph.h"
#include "memory/arena.h"
#include "memory/ledger.h"
#include "memory/step_memory.h"

using namespace memfit;

namespace {

// p (persistent, 100 B) and a chain a -> b -> c of 1000-byte activations: a lives [0,1],
// b [1,2], c [2,2].
Program chain() {
    Program p;
    BufferId w = p.declare("w", Category::parameters, 100, true);
    BufferId a = p.declare("a", Category::activations, 1000);
    BufferId b = p.declare("b", Category::activations, 1000);
    BufferId c = p.declare("c", Category::activations, 1000);
    p.record(OpRecord{"op0", Phase::forward, 0, 0, 0, {a, w}});
    p.record(OpRecord{"op1", Phase::forward, 0, 0, 0, {a, b}});
    p.record(OpRecord{"op2", Phase::forward, 0, 0, 0, {b, c}});
    p.finalize();
    return p;
}

}  // namespace

TEST(Program, LifetimesFromRecordedUses) {
    const Program p = chain();
    EXPECT_EQ(p.buffer(1).first_op, 0);
    EXPECT_EQ(p.buffer(1).last_op, 1);
    EXPECT_EQ(p.buffer(3).first_op, 2);
    auto ids = [](std::span<const BufferId> r) { return std::vector<BufferId>(r.begin(), r.end()); };
    EXPECT_EQ(ids(p.starts_at(2)), (std::vector<BufferId>{3}));
    EXPECT_EQ(ids(p.ends_at(1)), (std::vector<BufferId>{1}));
}

TEST(Program, PlanPeakAndPlacement) {
    const Program p = chain();
    const MemoryPlan plan = plan_memory(p, 64);
    EXPECT_EQ(plan.peak_live[Category::activations], 2000u);   // two of the chain at once
    EXPECT_EQ(plan.peak_live[Category::parameters], 100u);
    EXPECT_EQ(plan.persistent[Category::parameters], 128u);    // aligned
    EXPECT_EQ(plan.transient[Category::activations], align_up(1000, 64) * 2);
    EXPECT_EQ(plan.offsets[3], plan.offsets[1]);               // c reuses a's bytes
    EXPECT_EQ(plan.peak_live_total, 2100u);
}

TEST(Program, StepMemoryMeasuresWhatThePlanSays) {
    const Program p = chain();
    const MemoryPlan plan = plan_memory(p, 64);
    Ledger ledger;
    {
        StepMemory mem(p, plan, ledger, host_allocator());
        EXPECT_EQ(ledger.reserved()[Category::activations], plan.transient[Category::activations]);
        EXPECT_EQ(ledger.live()[Category::parameters], 100u);
        for (int i = 0; i < p.num_ops(); ++i) {
            mem.begin_op(i);
            mem.end_op(i);
        }
        EXPECT_EQ(ledger.live_peak()[Category::activations], 2000u);
        EXPECT_EQ(ledger.live()[Category::activations], 0u);
        EXPECT_EQ(ledger.live_total_peak(), plan.peak_live_total);
    }
    EXPECT_EQ(ledger.reserved_total(), 0u);   // everything handed back
    EXPECT_EQ(ledger.live_total(), 0u);
}

TEST(Program, CheckingModePoisonsAfterLastUse) {
    const Program p = chain();
    const MemoryPlan plan = plan_memory(p, 64);
    Ledger ledger;
    StepMemory mem(p, plan, ledger, host_allocator(), true);
    mem.begin_op(0);
    float * a = static_cast<float *>(mem.base(1));
    ASSERT_NE(a, nullptr);
    a[0] = 1.0f;
    mem.end_op(0);
    mem.begin_op(1);
    EXPECT_EQ(mem.base(1), a);
    mem.end_op(1);
    EXPECT_EQ(mem.base(1), nullptr);   // released after its last use
    mem.begin_op(2);
    mem.end_op(2);
}

TEST(Ledger, CurrentAndPeakPerCategory) {
    Ledger l;
    l.acquire(Category::activations, 10);
    l.acquire(Category::gradients, 5);
    l.release(Category::activations, 10);
    l.acquire(Category::activations, 3);
    EXPECT_EQ(l.live()[Category::activations], 3u);
    EXPECT_EQ(l.live_peak()[Category::activations], 10u);
    EXPECT_EQ(l.live_total_peak(), 15u);
    l.reset_peaks();
    EXPECT_EQ(l.live_peak()[Category::activations], 3u);
    EXPECT_DEATH(l.release(Category::workspace, 1), "negative");
}

TEST(Graph, ExecutingADifferentOpSequenceAborts) {
    Program p;
    BufferId a = p.declare("a", Category::activations, 16);
    {
        Graph rec(p, nullptr);
        rec.fill_zero(Tensor(a, DType::f32, {4}));
    }
    p.finalize();
    EXPECT_EQ(p.num_ops(), 1);
    EXPECT_STREQ(p.ops()[0].name, "fill_zero");
    const MemoryPlan plan = plan_memory(p);
    Ledger ledger;
    StepMemory mem(p, plan, ledger, host_allocator());
    CpuBackend backend;
    EXPECT_DEATH(
        {
            Graph g(p, mem, backend);
            g.residual_fwd(Tensor(a, DType::f32, {4}), Tensor(a, DType::f32, {4}), Tensor(a, DType::f32, {4}));
        },
        "different op");
}
