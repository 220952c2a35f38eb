// The step-time model of `memfit plan`: the formulas the issue gives (model FLOPs per token,
// ring collective volumes, pipeline bubbles) exactly, and the model's behaviour on whole
// candidates: what data, tensor and pipeline parallelism, recomputation and ZeRO do to a step.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/config.h"
#include "model/recompute.h"
#include "plan/time_model.h"
#include "test_util.h"
#include "train/engine.h"

using namespace memfit;

namespace {


Candidate candidate(int dp, int tp, int pp, int micro_batch, int accum) {
    Candidate c;
    c.layout.dp = dp;
    c.layout.tp = tp;
    c.layout.pp = pp;
    c.micro_batch = micro_batch;
    c.grad_accum = accum;
    return c;
}

}  // namespace

TEST(TimeModel, TrainFlopsPerTokenGpt2) {
    const ModelConfig cfg = model_preset("gpt2");
    ASSERT_EQ(cfg.num_params(), 124'439'808);
    // N excludes the position table (1024 x 768); 12 L H T with L = 12, H = 768, T = 1024.
    EXPECT_EQ(train_flops_per_token(cfg, 1024), 6.0 * (124'439'808.0 - 1024.0 * 768) + 12.0 * 12 * 768 * 1024);
}

TEST(TimeModel, TrainFlopsPerTokenLlama2_7b) {
    const ModelConfig cfg = model_preset("llama2-7b");
    ASSERT_EQ(cfg.num_params(), 6'738'415'616);
    // N excludes the untied input embedding (32000 x 4096); the head multiplies.
    EXPECT_EQ(train_flops_per_token(cfg, 4096), 6.0 * (6'738'415'616.0 - 32000.0 * 4096) + 12.0 * 32 * 4096 * 4096);
}

TEST(TimeModel, CollectiveVolumes) {
    EXPECT_EQ(ring_allreduce_bytes(1e9, 8), 1.75e9);
    EXPECT_EQ(reduce_scatter_bytes(1e9, 8), 0.875e9);
    EXPECT_EQ(all_gather_bytes(1e9, 8), 0.875e9);
    EXPECT_DOUBLE_EQ(reduce_scatter_bytes(3e6, 3), 2e6);
    EXPECT_DOUBLE_EQ(all_gather_bytes(3e6, 3), 2e6);
    EXPECT_DOUBLE_EQ(ring_allreduce_bytes(3e6, 3), 4e6);
    EXPECT_EQ(ring_allreduce_bytes(1e9, 1), 0.0);
    EXPECT_EQ(reduce_scatter_bytes(1e9, 1), 0.0);
    EXPECT_EQ(all_gather_bytes(1e9, 1), 0.0);
}

TEST(TimeModel, BubbleFraction) {
    EXPECT_DOUBLE_EQ(bubble_fraction(PipeSchedule::gpipe, 4, 8, 1), 3.0 / 11);
    EXPECT_DOUBLE_EQ(bubble_fraction(PipeSchedule::one_f_one_b, 4, 8, 1), 3.0 / 11);
    EXPECT_DOUBLE_EQ(bubble_fraction(PipeSchedule::interleaved, 4, 8, 2), 3.0 / 19);
    EXPECT_DOUBLE_EQ(bubble_fraction(PipeSchedule::interleaved, 4, 8, 1), 3.0 / 11);
    EXPECT_DOUBLE_EQ(bubble_fraction(PipeSchedule::gpipe, 4, 8, 2), 3.0 / 11);   // v only interleaves
    EXPECT_EQ(bubble_fraction(PipeSchedule::gpipe, 1, 8, 1), 0.0);
    EXPECT_EQ(bubble_fraction(PipeSchedule::interleaved, 1, 8, 4), 0.0);
}

// The same global batch on 8 data-parallel devices instead of 1 accumulating: a faster step, but
// each device does less of what counts (the gradient collectives and the optimizer update weigh more).
TEST(TimeModel, DataParallelRaisesThroughputLowersEfficiency) {
    const ModelConfig cfg = model_preset("llama2-7b");
    const Hardware hw = memfit::test::h100_like();
    const StepTime one = predict_step_time(cfg, hw, candidate(1, 1, 1, 1, 8), 4096, 1);
    const StepTime eight = predict_step_time(cfg, hw, candidate(8, 1, 1, 1, 1), 4096, 1);
    EXPECT_EQ(one.comm, 0.0);
    EXPECT_GT(eight.comm, 0.0);
    EXPECT_GT(eight.tokens_per_s, one.tokens_per_s);
    EXPECT_LT(eight.tokens_per_s, 8 * one.tokens_per_s);
    EXPECT_LT(eight.mfu, one.mfu);
    EXPECT_NEAR(eight.compute * 8, one.compute, 1e-12 * one.compute);   // the math splits evenly
}

// Tensor parallelism's collectives: 4 ring all-reduces of b T C s per layer per micro-batch, on the
// intra-node link; a tp group forced across nodes is slower.
TEST(TimeModel, TensorParallelLinks) {
    const ModelConfig cfg = model_preset("gpt2");
    const Hardware hw = memfit::test::h100_like();
    Candidate c = candidate(1, 2, 1, 4, 2);
    const StepTime intra = predict_step_time(cfg, hw, c, 1024, 1);
    const double payload = 4.0 * 1024 * 768 * 2;   // b T C s
    const double one = ring_allreduce_bytes(payload, 2) / (kLinkEfficiency * hw.intra_bw) + 2 * hw.intra_latency;
    EXPECT_NEAR(intra.comm, 2 * 12 * 4 * one, 1e-12 * intra.comm);
    EXPECT_EQ(intra.comm_exposed, intra.comm);   // tp collectives are not hidden
    const StepTime inter = predict_step_time(cfg, hw, c, 1024, 2);   // one device per node
    EXPECT_GT(inter.comm, 4 * intra.comm);
    EXPECT_GT(inter.total, intra.total);
    EXPECT_LT(inter.tokens_per_s, intra.tokens_per_s);
    // Sequence parallelism: the same volume, and the norms and residuals split over tp.
    c.layout.sp = true;
    const StepTime sp = predict_step_time(cfg, hw, c, 1024, 1);
    EXPECT_NEAR(sp.comm, intra.comm, 1e-12 * intra.comm);
    EXPECT_LT(sp.memory_bound, intra.memory_bound);
    // Full recompute re-runs the forward and its 2 all-reduces per layer.
    c.layout.sp = false;
    c.recompute = "full";
    EXPECT_NEAR(predict_step_time(cfg, hw, c, 1024, 1).comm, 1.5 * intra.comm, 1e-12 * intra.comm);
}

// memfit's full recompute re-runs each layer's forward but the MLP's down projection (the layer
// output is kept as the next layer's input): for GPT-2, 16 C^2 of the 72 C^2 matmul FLOPs per
// token and layer, plus one attention forward. Megatron's full recompute would add 1/3.
TEST(TimeModel, RecomputeAddsWhatTheEngineRecomputes) {
    const ModelConfig cfg = model_preset("gpt2");
    Hardware hw = memfit::test::h100_like();
    hw.mem_bw = 1e30;     // the gemms' operand traffic free: every gemm at matmul_eff of the peak
    Candidate c = candidate(1, 1, 1, 8, 1);
    c.set_flash(false);   // attention at the matmul efficiency: every FLOP at one rate
    const StepTime none = predict_step_time(cfg, hw, c, 1024, 1);
    EXPECT_EQ(none.recompute, 0.0);
    c.recompute = "full";
    const StepTime full = predict_step_time(cfg, hw, c, 1024, 1);
    const double rate = hw.matmul_eff * hw.bf16_flops;
    EXPECT_NEAR(full.recompute, 12 * layer_keep_cost(cfg, 8, 1024, false, DType::bf16, 0).flops / rate,
                1e-12 * full.recompute);
    EXPECT_NEAR(full.compute - none.compute, full.recompute, 1e-9 * full.compute);
    // Against the layers' matmuls (72 C^2 per token and layer, at the same rate): 2/9 of them
    // plus attention forwards and elementwise work, under Megatron's 1/3.
    const double matmul = 12 * 72.0 * 768 * 768 * 8 * 1024 / rate;
    EXPECT_GT(full.recompute / matmul, 2.0 / 9);
    EXPECT_LT(full.recompute / matmul, 1.0 / 3);
    hw.mem_bw = memfit::test::h100_like().mem_bw;
    c.recompute = "none";
    const double none_bound = predict_step_time(cfg, hw, c, 1024, 1).memory_bound;
    c.recompute = "full";
    EXPECT_GT(predict_step_time(cfg, hw, c, 1024, 1).memory_bound, none_bound);   // recomputed norms and GELUs
    // Selective (Korthikanti et al. 2022): with naive attention it recomputes the attention core
    // and the elementwise ops, a few percent; with flash attention only norms and activations.
    c.recompute = "selective";
    const StepTime sel = predict_step_time(cfg, hw, c, 1024, 1);
    EXPECT_GT(sel.recompute, 0.0);
    EXPECT_LT(sel.recompute, 0.1 * none.compute);
    c.set_flash(true);
    const StepTime sel_flash = predict_step_time(cfg, hw, c, 1024, 1);
    EXPECT_LT(sel_flash.recompute, 0.01 * sel_flash.compute);
}

// ZeRO-3 gathers the weights again in forward and backward: 1.5x the all-reduce's volume (ZeRO
// paper) with one micro-batch, where gradients are exchanged in the compute dtype either way.
TEST(TimeModel, ZeroStagesCommunication) {
    const ModelConfig cfg = model_preset("llama2-7b");
    Hardware hw = memfit::test::h100_like();
    hw.intra_latency = 0;   // volumes only: ZeRO-3 pays its latencies per layer, the others per bucket
    Candidate c = candidate(8, 1, 1, 1, 1);
    double comm[4];
    for (int z = 0; z < 4; ++z) {
        c.layout.zero = z;
        const StepTime t = predict_step_time(cfg, hw, c, 4096, 1);
        comm[z] = t.comm;
        EXPECT_LE(t.comm_exposed, t.comm);
        EXPECT_GT(t.comm, 0.0);
    }
    EXPECT_GT(comm[3], comm[0]);
    EXPECT_NEAR(comm[3] / comm[0], 1.5, 1e-9);
    EXPECT_NEAR(comm[1], comm[0], 1e-9 * comm[0]);   // reduce-scatter + all-gather = all-reduce
    EXPECT_NEAR(comm[2], comm[0], 1e-9 * comm[0]);
    // With accumulation ZeRO-2 and -3 exchange every micro-batch; ZeRO-0 once per step.
    c.grad_accum = 4;
    c.layout.zero = 0;
    const double z0 = predict_step_time(cfg, hw, c, 4096, 1).comm;
    c.layout.zero = 2;
    EXPECT_GT(predict_step_time(cfg, hw, c, 4096, 1).comm, z0);
}

// A sliding window W makes the attention FLOPs linear in T: doubling T past W doubles them
// (plus the first W's triangle), where the causal attention's quadruple.
TEST(TimeModel, SlidingWindowAttentionIsLinearInT) {
    ModelConfig cfg = model_preset("llama2-7b");
    cfg.max_seq = 32768;
    const Hardware hw = memfit::test::h100_like();
    Candidate c = candidate(1, 1, 1, 1, 1);
    auto attention = [&](int seq) {   // the attention part of compute: total minus the matmul-only run
        Hardware no_attn = hw;
        no_attn.attention_eff = 1e-9;   // attention dominates: compute ~ attention FLOPs / (1e-9 peak)
        return predict_step_time(cfg, no_attn, c, seq, 1).compute * 1e-9 * hw.bf16_flops;
    };
    const double causal8 = attention(8192), causal16 = attention(16384);
    EXPECT_NEAR(causal16 / causal8, 2.0 * 2.0, 0.01);   // per sequence: T^2 (the batch is sequences)
    cfg.sliding_window = 4096;
    const double w8 = attention(8192), w16 = attention(16384);
    // 4 (W(W+1)/2 + (T - W) W) C per layer per sequence.
    auto pairs = [](double T, double W) { return W * (W + 1) / 2 + (T - W) * W; };
    EXPECT_NEAR(w16 / w8, pairs(16384, 4096) / pairs(8192, 4096), 1e-3);
    EXPECT_LT(w16 / w8, 2.4);   // against the causal 4
    EXPECT_NEAR(w8 / causal8, pairs(8192, 4096) / (8192.0 * 8193 / 2), 1e-3);
    EXPECT_EQ(attention(4096), [&] { cfg.sliding_window = 0; return attention(4096); }());   // W >= T: causal
}

// A data-parallel group spanning nodes crosses them over every member's NIC at once (one NCCL
// ring per NIC): 8 per node at 50 GB/s each are 400 GB/s, under NVLink's 450. With one device per
// node the ring runs at one NIC's 50 GB/s.
TEST(TimeModel, InterNodeRingsUseEveryNic) {
    const ModelConfig cfg = model_preset("llama2-7b");
    Hardware hw = memfit::test::h100_like();
    hw.intra_latency = hw.inter_latency = 0;
    Candidate c = candidate(16, 1, 1, 1, 1);   // ZeRO-0: one all-reduce of the bf16 gradients
    const double payload = double(cfg.num_params()) * 2;
    const double volume = ring_allreduce_bytes(payload, 16);
    const StepTime two_nodes = predict_step_time(cfg, hw, c, 4096, 2);
    EXPECT_NEAR(two_nodes.comm, volume / (kLinkEfficiency * 8 * hw.inter_bw), 1e-9 * two_nodes.comm);
    const StepTime sixteen = predict_step_time(cfg, hw, c, 4096, 16);
    EXPECT_NEAR(sixteen.comm, volume / (kLinkEfficiency * hw.inter_bw), 1e-9 * sixteen.comm);
    // tp 2 inside each node: each data-parallel group has 4 members per node, so 4 NICs.
    c = candidate(8, 2, 1, 1, 1);
    const StepTime tp2 = predict_step_time(cfg, hw, c, 4096, 2);
    EXPECT_GT(tp2.comm, volume / 2 / (kLinkEfficiency * 4 * hw.inter_bw));
    hw.inter_bw = 1e15;   // a free network: NVLink bounds it
    EXPECT_NEAR(predict_step_time(cfg, hw, candidate(16, 1, 1, 1, 1), 4096, 2).comm,
                volume / (kLinkEfficiency * hw.intra_bw), 1e-9 * two_nodes.comm);
}

// 4 stages, 4 micro-batches, 1F1B: 3 of 7 slots idle, so the bubble is 3/7 of the step's pipeline
// time (its math, layer traffic and pipeline/tensor communication, plus the bubble itself).
// memory_bound is the micro-batches' layer traffic plus the optimizer update, which the bubble
// does not stretch: the update is what is left of memory_bound past m micro-batches' traffic
// (read off two accumulation counts).
TEST(TimeModel, PipelineBubble) {
    const ModelConfig cfg = model_preset("gpt2");
    const Hardware hw = memfit::test::h100_like();
    Candidate c = candidate(1, 1, 4, 2, 4), c8 = candidate(1, 1, 4, 2, 8);
    const StepTime t = predict_step_time(cfg, hw, c, 1024, 1), t8 = predict_step_time(cfg, hw, c8, 1024, 1);
    const double update = t.memory_bound - (t8.memory_bound - t.memory_bound);   // 4 mb's traffic = (8 - 4)'s
    EXPECT_GT(update, 0.0);
    const double pipe = t.compute + t.memory_bound - update + t.comm + t.bubble;
    EXPECT_NEAR(t.bubble / pipe, 3.0 / 7, 1e-9);
    c.layout.schedule = PipeSchedule::gpipe;
    const StepTime gp = predict_step_time(cfg, hw, c, 1024, 1);
    EXPECT_NEAR(gp.bubble, t.bubble, 1e-12 * t.bubble);
    c.layout.schedule = PipeSchedule::interleaved;
    c.layout.virtual_stages = 3;   // 12 layers: 3 chunks of 1 layer per stage, as many as 1F1B's 3
    const StepTime il = predict_step_time(cfg, hw, c, 1024, 1);
    EXPECT_NEAR(il.bubble / (il.compute + il.memory_bound - update + il.comm + il.bubble), 3.0 / 15, 1e-9);
    EXPECT_GT(il.comm, t.comm);   // v times the point-to-point messages
    EXPECT_LT(il.total, t.total);
}

// memfit's optimizer offload: the device still updates (memory_bound unchanged) and the offloaded
// fp32 master weights and moments go up and back over the host link: 2 x 12 bytes per parameter
// in bf16, 2 x 8 in fp32 (the weights are the master there).
TEST(TimeModel, OffloadStreamsTheStatesUpAndBack) {
    const ModelConfig cfg = model_preset("gpt2");
    const Hardware hw = memfit::test::h100_like();
    for (DType dt : {DType::bf16, DType::f32}) {
        Candidate c = candidate(1, 1, 1, 4, 1);
        c.compute = dt;
        const StepTime none = predict_step_time(cfg, hw, c, 1024, 1);
        c.layout.offload = Offload::optimizer;
        const StepTime off = predict_step_time(cfg, hw, c, 1024, 1);
        EXPECT_DOUBLE_EQ(off.memory_bound, none.memory_bound);
        const double per = dt == DType::bf16 ? 24.0 : 16.0;
        EXPECT_NEAR(off.offload, double(cfg.num_params()) * per / hw.host_bw, 1e-9 * off.offload);
        EXPECT_NEAR(off.total, none.total + off.offload, 1e-12 * off.total);
    }
}

// The op-level model (--fit auto's) of an offloaded program: its copies move the staged states at
// offload_rate, up and back, on top of the in-memory program's time.
TEST(TimeModel, OffloadCopiesCostTheStoresRate) {
    const ModelConfig cfg = memfit::test::small_config(64, 32, 2, 2);
    CpuBackend cpu;
    EngineOptions eo;
    eo.B = 2, eo.T = 16, eo.with_eval = false;
    const StepPlans mem(cfg, cpu, eo, false);
    eo.offload = 1, eo.offload_dir = "/tmp", eo.offload_unit = 512;
    const StepPlans off(cfg, cpu, eo, false);
    TimeModel tm;
    tm.offload_rate = 1e6;   // slow enough to dominate
    uint64_t moved = 0, copies = 0;
    for (const auto & b : off.train->program().buffers())
        if (b.category == Category::offloaded) moved += b.bytes;
    for (const auto & op : off.train->program().ops())
        copies += std::string_view(op.name).starts_with("offload_read") || std::string_view(op.name) == "offload_write";
    const double extra = tm.step_seconds(off, 1) - tm.step_seconds(mem, 1);
    const double expected = 2.0 * double(moved) / tm.offload_rate;   // fp32: m and v, read and written
    EXPECT_GT(copies, 0u);
    EXPECT_NEAR(extra, expected, 0.05 * expected);
}

// Whatever the layout, the step is positive, its parts are consistent and MFU lies in (0, 1).
TEST(TimeModel, MfuInUnitIntervalEverywhere) {
    const Hardware hw = memfit::test::h100_like();
    int checked = 0;
    for (const char * model : {"llama2-70b", "gpt2"}) {
        const ModelConfig cfg = model_preset(model);
        const int seq = cfg.max_seq;
        for (int tp : {1, 2, 4, 8})
            for (int pp : {1, 2, 4, 8})
                for (int zero = 0; zero < 4; ++zero)
                    for (const char * rc : {"none", "selective", "full"})
                        for (bool flash : {true, false})
                            for (PipeSchedule sch : {PipeSchedule::one_f_one_b, PipeSchedule::interleaved})
                                for (Offload off : {Offload::none, Offload::optimizer, Offload::optimizer_params})
                                    for (int accum : {1, 4, 16}) {
                                        Candidate c = candidate(64 / (tp * pp), tp, pp, 2, accum);
                                        c.layout.zero = zero;
                                        c.layout.sp = tp > 1 && accum == 4;
                                        c.layout.schedule = sch;
                                        c.layout.virtual_stages = 2;
                                        c.layout.offload = off;
                                        c.recompute = rc;
                                        c.set_flash(flash);
                                        const StepTime t = predict_step_time(cfg, hw, c, seq, 8);
                                        ASSERT_TRUE(std::isfinite(t.total));
                                        ASSERT_GT(t.total, 0.0);
                                        ASSERT_GT(t.tokens_per_s, 0.0);
                                        ASSERT_GT(t.mfu, 0.0);
                                        ASSERT_LT(t.mfu, 1.0);
                                        ASSERT_LE(t.recompute, t.compute);
                                        ASSERT_GE(t.comm_exposed, 0.0);
                                        ASSERT_LE(t.comm_exposed, t.comm * (1 + 1e-12));
                                        ASSERT_GE(t.bubble, 0.0);
                                        ASSERT_EQ(t.bubble == 0.0, pp == 1);
                                        ASSERT_EQ(t.offload == 0.0, off == Offload::none);
                                        ASSERT_NEAR(t.total, t.compute + t.memory_bound + t.comm_exposed + t.bubble +
                                                                 t.offload, 1e-12 * t.total);
                                        ++checked;
                                    }
    }
    EXPECT_EQ(checked, 2 * 4 * 4 * 4 * 3 * 2 * 2 * 3 * 3);
}

// A well-balanced 70B layout on 64 devices lands in a believable MFU range: below the best
// published H100 run's 0.46 (tests/data/published_runs.json), above a quarter.
TEST(TimeModel, Llama70bOn64Devices) {
    const ModelConfig cfg = model_preset("llama2-70b");
    Candidate c = candidate(2, 8, 4, 1, 16);   // tp 8 in a node, 4 stages, 2 replicas
    c.layout.sp = true;
    c.layout.zero = 1;
    c.recompute = "selective";
    const StepTime t = predict_step_time(cfg, memfit::test::h100_like(), c, 4096, 8);
    EXPECT_GT(t.mfu, 0.25);
    EXPECT_LT(t.mfu, 0.46);
    EXPECT_NEAR(t.tokens_per_s, 4096.0 * 2 * 16 / t.total, 1e-9 * t.tokens_per_s);
}

TEST(TimeModel, RejectsWhatItCannotModel) {
    const ModelConfig cfg = model_preset("gpt2");
    Hardware hw = memfit::test::h100_like();
    Candidate c = candidate(1, 1, 1, 1, 1);
    c.recompute = "every:2";
    EXPECT_THROW(predict_step_time(cfg, hw, c, 1024, 1), ConfigError);
    c.recompute = "none";
    c.compute = DType::f32;
    hw.fp32_flops = 0;
    EXPECT_THROW(predict_step_time(cfg, hw, c, 1024, 1), ConfigError);
    c.compute = DType::bf16;
    c.layout.tp = 2;
    hw.intra_bw = 0;
    EXPECT_THROW(predict_step_time(cfg, hw, c, 1024, 1), ConfigError);
    ModelConfig novocab = cfg;
    novocab.vocab_size = 0;
    EXPECT_THROW(train_flops_per_token(novocab, 1024), ConfigError);
}

// A device without bf16 arithmetic (the catalog's v100: "bf16_tflops": null) refuses a bf16 plan
// with the way out, and plans fp16 at its fp16 rate.
TEST(TimeModel, NoBf16DeviceNamesTheWayOut) {
    const ModelConfig cfg = model_preset("gpt2");
    Hardware hw = memfit::test::h100_like();
    hw.name = "volta";
    hw.bf16_flops = 0;
    Candidate c = candidate(1, 1, 1, 1, 1);
    try {
        predict_step_time(cfg, hw, c, 1024, 1);
        FAIL() << "no error";
    } catch (const ConfigError & e) {
        EXPECT_NE(std::string(e.what()).find("'volta' has no bf16 arithmetic: use --precision fp16"), std::string::npos)
            << e.what();
    }
    c.compute = DType::f16;
    const StepTime t = predict_step_time(cfg, hw, c, 1024, 1);
    EXPECT_GT(t.tokens_per_s, 0);
    EXPECT_GT(t.mfu, 0);
    EXPECT_LT(t.mfu, 1);
}

// Megatron-Core's TP communication overlap (Candidate::tp_comm_overlap) hides the tensor
// collectives under the gemms, and only with sequence parallelism (their reduce-scatter /
// all-gather pairs sit next to the gemms); without either, they stay exposed.
TEST(TimeModel, TensorCollectivesHideOnlyWithOverlapAndSp) {
    const ModelConfig cfg = model_preset("gpt2-xl");
    const Hardware hw = memfit::test::h100_like();
    Candidate c = candidate(1, 8, 1, 4, 1);
    const StepTime plain = predict_step_time(cfg, hw, c, 2048, 1);
    c.tp_comm_overlap = true;
    EXPECT_DOUBLE_EQ(predict_step_time(cfg, hw, c, 2048, 1).comm_exposed, plain.comm_exposed);   // no sp
    c.layout.sp = true;
    const StepTime hidden = predict_step_time(cfg, hw, c, 2048, 1);
    EXPECT_NEAR(hidden.comm, plain.comm, 1e-12 * plain.comm);
    EXPECT_GT(plain.comm_exposed, 0.0);
    EXPECT_LT(hidden.comm_exposed, 0.5 * plain.comm_exposed);
    c.tp_comm_overlap = false;
    EXPECT_NEAR(predict_step_time(cfg, hw, c, 2048, 1).comm_exposed, plain.comm_exposed, 1e-12 * plain.comm);
}

// A pipeline stage's boundary tensor leaves as tp slices (Megatron's scatter/gather): across
// nodes each tensor rank sends 1/tp of it, and without sequence parallelism the receivers
// all-gather it over the node's links.
TEST(TimeModel, PipelineSendsAreScatteredOverTheTensorGroup) {
    const ModelConfig cfg = model_preset("gpt2-xl");
    const Hardware hw = memfit::test::h100_like();
    auto pp_comm = [&](int tp, bool sp) {
        Candidate c = candidate(1, tp, 2, 1, 8);
        c.layout.sp = sp;
        Candidate no_pp = c;
        no_pp.layout.pp = 1;
        // The pipeline's share of the communication: with pp = 2 on 2 nodes minus the same without.
        return predict_step_time(cfg, hw, c, 2048, 2).comm - predict_step_time(cfg, hw, no_pp, 2048, 1).comm;
    };
    const double payload = 2048.0 * 1600 * 2;   // b T C s, one micro-batch
    const double one = payload / (kLinkEfficiency * hw.inter_bw) + hw.inter_latency;
    EXPECT_NEAR(pp_comm(1, false), 8 * 2 * one, 0.02 * 16 * one);
    EXPECT_LT(pp_comm(4, true), 0.3 * pp_comm(1, false));
    EXPECT_GT(pp_comm(4, false), pp_comm(4, true));   // plus the gather inside the node
    EXPECT_LT(pp_comm(4, false), 0.5 * pp_comm(1, false));
}

// The gemms' operands and results cost memory traffic beside their FLOPs (matmul_rate): a thin
// model's gemms reach a smaller share of the peak than a wide one's, both under matmul_eff.
TEST(TimeModel, ThinGemmsRunFurtherBelowThePeak) {
    const Hardware hw = memfit::test::h100_like();
    auto mfu = [&](const char * preset) {
        Candidate c = candidate(1, 1, 1, 8, 1);
        c.set_flash(true);
        return predict_step_time(model_preset(preset), hw, c, 2048, 1).mfu;
    };
    EXPECT_LT(mfu("gpt2"), mfu("llama2-7b"));
    EXPECT_LT(mfu("llama2-7b"), hw.matmul_eff);
}
