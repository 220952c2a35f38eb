// The engine on the CUDA backend: training steps equal the CPU backend's (fp32 to rounding, bf16
// within bf16 bounds), the plan equals what the step acquires, checking mode changes nothing,
// and the device memory cudaMemGetInfo sees is the plan's regions plus the measured runtime;
// --sparsity prunes and masks on the device as on the CPU.
// Without a GPU: `--device cuda` is one clear error.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "cuda/op_check.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/recompute.h"
#include "model/sparsity.h"
#include "test_util.h"
#include "train/engine.h"
#include "optim_ops.h"

namespace memfit {
namespace {

struct Trained {
    std::vector<float> losses, params;
    std::vector<float> merged;   // LoRA: the base with the adapters folded in
    CategoryBytes planned_live, measured_live;
};

Trained train(Backend & backend, const ModelConfig & cfg, EngineOptions eo, int steps) {
    Engine engine(cfg, backend, eo);
    engine.init_params(7);
    OptimHyper h;
    h.lr = 1e-3f;
    h.weight_decay = 0.1f;
    h.clip = 1.0f;
    Trained r;
    const size_t n = size_t(eo.B) * size_t(eo.T) * size_t(eo.grad_accum);
    // Packed documents: each row of T cut into documents of 20, 1, 30 and the rest of the tokens.
    std::vector<int32_t> starts;
    for (size_t row = 0; eo.documents && row < n / size_t(eo.T); ++row)
        for (int t = 0; t < eo.T; ++t) starts.push_back(t < 20 ? 0 : t < 21 ? 20 : t < 51 ? 21 : 51);
    for (int s = 0; s < steps; ++s) {
        std::vector<int32_t> in(n), tg(n);
        test::random_batch(in, tg, cfg.vocab_size, 100 + uint64_t(s));
        r.losses.push_back(engine.train_step(in.data(), tg.data(), h, eo.documents ? starts.data() : nullptr).loss);
    }
    r.params = engine.full_params();
    if (eo.lora.enabled()) r.merged = engine.merged_weights();
    r.planned_live = engine.planned_peak_live();
    r.measured_live = engine.ledger().live_peak();
    return r;
}

double rel_diff(const std::vector<float> & a, const std::vector<float> & b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        num = std::max(num, double(std::fabs(a[i] - b[i])));
        den = std::max(den, double(std::fabs(a[i])));
    }
    return num / (den > 0 ? den : 1);
}

// `memfit ARGS` with stdout and stderr captured: exit code (-1: killed by a signal) and output.
struct CliRun {
    int code;
    std::string text;
};
CliRun run_memfit(const std::string & args) {
    const std::string out = std::string(::testing::TempDir()) + "memfit_cuda_cli." + std::to_string(getpid()) + ".txt";
    const int status = std::system((std::string(MEMFIT_BINARY) + " " + args + " > " + out + " 2>&1").c_str());
    std::ifstream f(out);
    CliRun r{WIFEXITED(status) ? WEXITSTATUS(status) : -1,
             std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>())};
    std::remove(out.c_str());
    return r;
}

// A scratch folder holding `bytes` of the bundled Shakespeare prepared with the bytes tokenizer
// (dir/data).
std::string prepared_dir(const std::string & tag, int bytes) {
    const std::string dir = std::string(::testing::TempDir()) + "memfit_cuda_" + tag + "." + std::to_string(getpid());
    const std::string prep = "rm -rf " + dir + " && mkdir -p " + dir + " && head -c " + std::to_string(bytes) + " " +
                             test::env_or("MEMFIT_DATA_DIR", MEMFIT_DATA_DIR) + "/tinyshakespeare.txt > " + dir +
                             "/text.txt && " + MEMFIT_BINARY + " prepare --tokenizer bytes --input " + dir +
                             "/text.txt --out " + dir + "/data > /dev/null";
    EXPECT_EQ(std::system(prep.c_str()), 0) << prep;
    return dir;
}

// The per-step losses a run wrote to OUT/metrics.jsonl.
std::vector<double> logged_losses(const std::string & out) {
    std::ifstream metrics(out + "/metrics.jsonl");
    std::vector<double> losses;
    for (std::string line; std::getline(metrics, line);) {
        const size_t at = line.find("\"loss\":");
        if (at != std::string::npos) losses.push_back(std::stod(line.substr(at + 7)));
    }
    return losses;
}

// The device-memory line's "prediction off by P%" (NaN when the log has none).
double prediction_off_pct(const std::string & log) {
    const std::string mark = "(cudaMemGetInfo); prediction off by ";
    const size_t at = log.find(mark);
    return at == std::string::npos ? NAN : std::stod(log.substr(at + mark.size()));
}

struct Case { bool llama; DType dt; bool flash; const char * recompute; int accum; };

TEST(CudaEngine, TrainingStepsMatchTheCpuBackend) {
    MF_REQUIRE_GPU();
    const Case cases[] = {{false, DType::f32, false, "none", 1}, {false, DType::f32, true, "full", 2},
                          {true, DType::f32, true, "selective", 1}, {false, DType::bf16, true, "none", 1},
                          {true, DType::bf16, false, "full", 2}};
    for (const Case & c : cases) {
        SCOPED_TRACE(std::string(c.llama ? "llama" : "gpt2") + " " + std::string(dtype_name(c.dt)) +
                     (c.flash ? " flash " : " naive ") + c.recompute + " accum " + std::to_string(c.accum));
        const ModelConfig cfg = test::small_family(c.llama, 96, 128, 2, 4, 256, 64);
        EngineOptions eo;
        eo.B = 2, eo.T = 64, eo.with_eval = false, eo.compute = c.dt, eo.flash_attention = c.flash;
        eo.grad_accum = c.accum;
        eo.recompute = parse_recompute(c.recompute, cfg.n_layer);
        CpuBackend cpu;
        const Trained a = train(cpu, cfg, eo, 3), b = train(*test::gpu(), cfg, eo, 3);
        const double tol_loss = c.dt == DType::f32 ? 1e-4 : 2e-2, tol_params = c.dt == DType::f32 ? 1e-4 : 2e-2;
        for (size_t s = 0; s < a.losses.size(); ++s)
            EXPECT_LT(std::fabs(a.losses[s] - b.losses[s]) / std::fabs(a.losses[s]), tol_loss) << "step " << s;
        EXPECT_LT(rel_diff(a.params, b.params), tol_params);
        for (int k = 0; k < kCategoryCount; ++k)
            EXPECT_EQ(b.planned_live.v[size_t(k)], b.measured_live.v[size_t(k)]) << category_name(Category(k));
    }
}

// A mixture of experts on the device (the moe_* kernels, the grouped matmul's per-expert gemms
// over the route's offsets): the CPU's steps, and the plan the bytes acquired.
TEST(CudaEngine, MixtureOfExpertsMatchesTheCpuBackend) {
    MF_REQUIRE_GPU();
    const Case cases[] = {{true, DType::f32, true, "none", 1}, {true, DType::bf16, true, "full", 2}};
    for (const Case & c : cases) {
        SCOPED_TRACE(std::string(dtype_name(c.dt)) + " " + c.recompute);
        ModelConfig cfg = model_preset("qwen3-moe-nano");
        cfg.vocab_size = 96;
        cfg.head_size = 32;   // the CUDA flash kernels' smallest head
        EngineOptions eo;
        eo.B = 2, eo.T = 32, eo.with_eval = false, eo.compute = c.dt, eo.flash_attention = c.flash;
        eo.grad_accum = c.accum;
        eo.recompute = parse_recompute(c.recompute, cfg.n_layer);
        CpuBackend cpu;
        const Trained a = train(cpu, cfg, eo, 3), b = train(*test::gpu(), cfg, eo, 3);
        const double tol = c.dt == DType::f32 ? 1e-4 : 2e-2;
        for (size_t s = 0; s < a.losses.size(); ++s)
            EXPECT_LT(std::fabs(a.losses[s] - b.losses[s]) / std::fabs(a.losses[s]), tol) << "step " << s;
        EXPECT_LT(rel_diff(a.params, b.params), tol);
        for (int k = 0; k < kCategoryCount; ++k)
            EXPECT_EQ(b.planned_live.v[size_t(k)], b.measured_live.v[size_t(k)]) << category_name(Category(k));
    }
    // QLoRA on the experts: each expert's packed matrices through the grouped qgemm.
    ModelConfig cfg = model_preset("qwen3-moe-nano");
    cfg.vocab_size = 96;
    cfg.head_size = 32;
    EngineOptions eo;
    eo.B = 2, eo.T = 32, eo.with_eval = false, eo.flash_attention = true;
    eo.lora = test::lora_options(cfg, 4, BaseWeights::nf4);
    CpuBackend cpu;
    const Trained a = train(cpu, cfg, eo, 3), b = train(*test::gpu(), cfg, eo, 3);
    for (size_t s = 0; s < a.losses.size(); ++s)
        EXPECT_LT(std::fabs(a.losses[s] - b.losses[s]) / std::fabs(a.losses[s]), 1e-4) << "qlora step " << s;
    EXPECT_LT(rel_diff(a.params, b.params), 1e-4);
}

// Packed documents (--packing) on the device: the CPU's steps, the plan the bytes acquired.
TEST(CudaEngine, PackedDocumentsMatchTheCpuBackend) {
    MF_REQUIRE_GPU();
    const Case cases[] = {{true, DType::f32, true, "none", 1}, {false, DType::f32, false, "full", 2},
                          {true, DType::bf16, true, "none", 1}};
    for (const Case & c : cases) {
        SCOPED_TRACE(std::string(c.llama ? "llama" : "gpt2") + " " + std::string(dtype_name(c.dt)) +
                     (c.flash ? " flash" : " naive"));
        const ModelConfig cfg = test::small_family(c.llama, 96, 128, 2, 4, 256, 64);
        EngineOptions eo;
        eo.B = 2, eo.T = 64, eo.with_eval = false, eo.compute = c.dt, eo.flash_attention = c.flash;
        eo.grad_accum = c.accum, eo.documents = true;
        eo.recompute = parse_recompute(c.recompute, cfg.n_layer);
        CpuBackend cpu;
        const Trained a = train(cpu, cfg, eo, 3), b = train(*test::gpu(), cfg, eo, 3);
        const double tol = c.dt == DType::f32 ? 1e-4 : 2e-2;
        for (size_t s = 0; s < a.losses.size(); ++s)
            EXPECT_LT(std::fabs(a.losses[s] - b.losses[s]) / std::fabs(a.losses[s]), tol) << "step " << s;
        EXPECT_LT(rel_diff(a.params, b.params), tol);
        for (int k = 0; k < kCategoryCount; ++k)
            EXPECT_EQ(b.planned_live.v[size_t(k)], b.measured_live.v[size_t(k)]) << category_name(Category(k));
        // Without the document starts the same batch trains otherwise.
        eo.documents = false;
        EXPECT_GT(std::fabs(train(cpu, cfg, eo, 1).losses[0] - a.losses[0]), 1e-4 * std::fabs(a.losses[0]));
    }
}

// --optimizer adamw-bf16 and adamw-8bit on the device: the same steps as the CPU's (8-bit codes
// may round one level apart where the two contract multiply-adds differently), the plan the
// bytes the step acquires.
TEST(CudaEngine, SmallerMomentsMatchTheCpuBackend) {
    MF_REQUIRE_GPU();
    const ModelConfig cfg = test::small_family(false, 96, 128, 2, 4, 256, 64);
    for (DType moments : {DType::bf16, DType::u8}) {
        SCOPED_TRACE(std::string(dtype_name(moments)));
        EngineOptions eo;
        eo.B = 2, eo.T = 64, eo.with_eval = false, eo.optimizer = test::optimizer_for(moments), eo.grad_accum = 2;
        CpuBackend cpu;
        const Trained a = train(cpu, cfg, eo, 3), b = train(*test::gpu(), cfg, eo, 3);
        for (size_t s = 0; s < a.losses.size(); ++s)
            EXPECT_LT(std::fabs(a.losses[s] - b.losses[s]) / std::fabs(a.losses[s]), 1e-4) << "step " << s;
        EXPECT_LT(rel_diff(a.params, b.params), 1e-3);
        for (int k = 0; k < kCategoryCount; ++k)
            EXPECT_EQ(b.planned_live.v[size_t(k)], b.measured_live.v[size_t(k)]) << category_name(Category(k));
    }
}

// --optimizer-in-backward on the device: each layer updated as its backward ends, the CPU's
// steps (fused there too), and the plan the bytes acquired, gradients included.
TEST(CudaEngine, OptimizerInBackwardMatchesTheCpuBackend) {
    MF_REQUIRE_GPU();
    const ModelConfig cfg = test::small_family(true, 96, 128, 3, 4, 256, 64);
    for (const Optimizer o : {Optimizer::adafactor}) {   // the fused path is the same for every row
        SCOPED_TRACE(optimizer_name(o));
        EngineOptions eo;
        eo.B = 2, eo.T = 64, eo.with_eval = false, eo.optimizer = o, eo.compute = DType::bf16;
        eo.optimizer_in_backward = true;
        CpuBackend cpu;
        const Trained a = train(cpu, cfg, eo, 2), b = train(*test::gpu(), cfg, eo, 2);
        for (size_t s = 0; s < a.losses.size(); ++s)
            EXPECT_LT(std::fabs(a.losses[s] - b.losses[s]) / std::fabs(a.losses[s]), 2e-2) << "step " << s;
        EXPECT_LT(rel_diff(a.params, b.params), 2e-2);
        EXPECT_EQ(a.planned_live[Category::gradients], b.planned_live[Category::gradients]);
        for (int k = 0; k < kCategoryCount; ++k)
            EXPECT_EQ(b.planned_live.v[size_t(k)], b.measured_live.v[size_t(k)]) << category_name(Category(k));
    }
}

// Distillation (--teacher) on the device: a LLaMA teacher of another width (dense, and nf4-packed)
// teaching a GPT-2 student, loss chunks; the CPU's steps, the plan the bytes acquired.
TEST(CudaEngine, DistillationMatchesTheCpuBackend) {
    MF_REQUIRE_GPU();
    const ModelConfig cfg = test::small_family(false, 96, 128, 2, 4, 256, 64);
    for (const DType dt : {DType::f32, DType::bf16}) {
        for (const BaseWeights bw : {BaseWeights::compute, BaseWeights::nf4}) {
            SCOPED_TRACE(std::string(dtype_name(dt)) + " teacher " + base_weights_name(bw));
            EngineOptions eo;
            eo.B = 2, eo.T = 64, eo.with_eval = false, eo.compute = dt, eo.loss_chunk = 48;
            eo.distill.teacher = test::small_family(true, 96, 64, 2, 4, 128, 64);
            eo.distill.alpha = 0.6f;
            eo.distill.temperature = 1.5f;
            eo.distill.weights = bw;
            CpuBackend cpu;
            const Trained a = train(cpu, cfg, eo, 3), b = train(*test::gpu(), cfg, eo, 3);
            const double tol = dt == DType::f32 ? 1e-4 : 2e-2;
            for (size_t s = 0; s < a.losses.size(); ++s)
                EXPECT_LT(std::fabs(a.losses[s] - b.losses[s]) / std::fabs(a.losses[s]), tol) << "step " << s;
            // A packed teacher's dequantization contracts its multiply-adds differently on the two
            // backends (as the 8-bit moments above): AdamW's normalised steps carry that further.
            EXPECT_LT(rel_diff(a.params, b.params), dt == DType::f32 && bw != BaseWeights::compute ? 1e-3 : tol);
            EXPECT_GT(b.planned_live[Category::teacher], 0u);
            for (int k = 0; k < kCategoryCount; ++k)
                EXPECT_EQ(b.planned_live.v[size_t(k)], b.measured_live.v[size_t(k)]) << category_name(Category(k));
        }
    }
}

// Preference tuning on the device: the pairs' loss, its per-row gradient factors and the head's
// second pass (backend/preference_loss.h's arithmetic on both), with a frozen copy (fp32 or nf4)
// and with LoRA's adapters switched off; the CPU's steps and the plan the bytes acquired.
TEST(CudaEngine, DpoMatchesTheCpuBackend) {
    MF_REQUIRE_GPU();
    const ModelConfig cfg = test::small_family(true, 96, 128, 2, 4, 256, 64);
    struct DpoCase { DType dt; Reference ref; ReferenceWeights w; DpoLoss loss; };
    const DpoCase cases[] = {{DType::f32, Reference::copy, ReferenceWeights::compute, DpoLoss::sigmoid},
                             {DType::bf16, Reference::copy, ReferenceWeights::nf4, DpoLoss::ipo},
                             {DType::f32, Reference::adapters_off, ReferenceWeights::compute, DpoLoss::hinge}};
    for (const DpoCase & c : cases) {
        SCOPED_TRACE(std::string(dtype_name(c.dt)) + " " + reference_name(c.ref) + " " + dpo_loss_name(c.loss));
        EngineOptions eo;
        eo.B = 4, eo.T = 32, eo.with_eval = false, eo.compute = c.dt, eo.loss_chunk = 48;
        eo.pref.dpo = true, eo.pref.reference = c.ref, eo.pref.weights = c.w, eo.pref.loss = c.loss;
        eo.pref.beta = 0.5f;
        if (c.ref == Reference::adapters_off) eo.lora = test::lora_options(cfg, 8);
        CpuBackend cpu;
        const Trained a = train(cpu, cfg, eo, 3), b = train(*test::gpu(), cfg, eo, 3);
        const double tol = c.dt == DType::f32 ? 1e-4 : 2e-2;
        for (size_t s = 0; s < a.losses.size(); ++s)
            EXPECT_LT(std::fabs(a.losses[s] - b.losses[s]) / std::fabs(a.losses[s]), tol) << "step " << s;
        EXPECT_LT(rel_diff(a.params, b.params), c.dt == DType::f32 && c.w != ReferenceWeights::compute ? 1e-3 : tol);
        EXPECT_EQ(b.planned_live[Category::reference] > 0, c.ref == Reference::copy);
        for (int k = 0; k < kCategoryCount; ++k)
            EXPECT_EQ(b.planned_live.v[size_t(k)], b.measured_live.v[size_t(k)]) << category_name(Category(k));
    }
}

// LoRA and QLoRA on the device: the frozen base in the compute dtype or packed (int8, nf4; the
// product dequantizes it tile by tile into the workspace), adapter dropout, recomputation; the
// CPU's steps, the merged weights, and the plan the bytes acquired.
TEST(CudaEngine, LoraAndQloraMatchTheCpuBackend) {
    MF_REQUIRE_GPU();
    struct LoraCase { bool llama; DType dt; BaseWeights bw; float dropout; const char * targets; const char * rc;
                      bool dora = false; };
    const LoraCase cases[] = {{true, DType::bf16, BaseWeights::compute, 0.1f, "all", "none"},
                              {false, DType::f32, BaseWeights::nf4, 0.1f, "", "full"},
                              {true, DType::f32, BaseWeights::int8, 0.0f, "q,v,down", "none"},
                              {true, DType::bf16, BaseWeights::nf4, 0.05f, "all", "selective"},
                              {true, DType::bf16, BaseWeights::compute, 0.0f, "all", "selective", true},
                              {false, DType::f32, BaseWeights::compute, 0.0f, "all", "none", true},
                              {true, DType::bf16, BaseWeights::nf4, 0.0f, "all", "full", true}};
    for (const LoraCase & c : cases) {
        SCOPED_TRACE(std::string(c.llama ? "llama " : "gpt2 ") + std::string(dtype_name(c.dt)) + " base " +
                     base_weights_name(c.bw) + " dropout " + std::to_string(c.dropout) + " " + c.rc +
                     (c.dora ? " dora" : ""));
        const ModelConfig cfg = test::small_family(c.llama, 96, 128, 2, 4, 256, 64);
        EngineOptions eo;
        eo.B = 2, eo.T = 64, eo.with_eval = false, eo.compute = c.dt, eo.flash_attention = c.llama;
        eo.recompute = parse_recompute(c.rc, cfg.n_layer);
        eo.lora.rank = 4, eo.lora.alpha = 8, eo.lora.base = c.bw, eo.lora.dropout = c.dropout;
        eo.lora.targets = parse_lora_targets(cfg, c.targets);
        eo.lora.dora = c.dora;
        CpuBackend cpu;
        const Trained a = train(cpu, cfg, eo, 3), b = train(*test::gpu(), cfg, eo, 3);
        const double tol = c.dt == DType::f32 ? 1e-4 : 2e-2;
        for (size_t s = 0; s < a.losses.size(); ++s)
            EXPECT_LT(std::fabs(a.losses[s] - b.losses[s]) / std::fabs(a.losses[s]), tol) << "step " << s;
        // A packed base's dequantization contracts its multiply-adds differently on the two backends.
        EXPECT_LT(rel_diff(a.params, b.params), c.dt == DType::f32 && c.bw != BaseWeights::compute ? 1e-3 : tol);
        EXPECT_LT(rel_diff(a.merged, b.merged), tol);
        EXPECT_EQ(a.params.size(), b.params.size());
        EXPECT_LT(b.params.size(), size_t(cfg.num_params()) / 4);   // the adapters alone train
        EXPECT_GT(b.planned_live[Category::parameters], 0u);
        for (int k = 0; k < kCategoryCount; ++k)
            EXPECT_EQ(b.planned_live.v[size_t(k)], b.measured_live.v[size_t(k)]) << category_name(Category(k));
    }
}

// --sparsity 2:4 on the device: pruned (on the host, uploaded) after one dense step in fp32, at
// the start in bf16 (where a dense step's rounding may tip a near tie in a group the other way),
// the masked updates keep every pruned weight at zero, and the steps are the CPU's.
TEST(CudaEngine, SparsityMatchesTheCpuBackend) {
    MF_REQUIRE_GPU();
    for (const DType dt : {DType::f32, DType::bf16}) {
        SCOPED_TRACE(std::string(dtype_name(dt)));
        const ModelConfig cfg = test::small_family(true, 96, 128, 2, 4, 256, 64);
        EngineOptions eo;
        eo.B = 2, eo.T = 64, eo.with_eval = false, eo.compute = dt, eo.flash_attention = true;
        eo.sparsity = NmSparsity{2, 4, dt == DType::f32 ? 1 : 0};
        CpuBackend cpu;
        const Trained a = train(cpu, cfg, eo, 3), b = train(*test::gpu(), cfg, eo, 3);
        const double tol = dt == DType::f32 ? 1e-4 : 2e-2;
        for (size_t s = 0; s < a.losses.size(); ++s)
            EXPECT_LT(std::fabs(a.losses[s] - b.losses[s]) / std::fabs(a.losses[s]), tol) << "step " << s;
        EXPECT_LT(rel_diff(a.params, b.params), tol);
        const ParamLayout layout = make_param_layout(cfg);
        EXPECT_EQ(nm_violations(cfg, layout, b.params.data(), eo.sparsity), 0u);
        for (const auto & p : layout.params)   // the same zeros on both
            for (size_t i = p.offset; sparse_target(p.name) && i < p.offset + p.numel; ++i)
                ASSERT_EQ(a.params[i] == 0.0f, b.params[i] == 0.0f) << p.name << " element " << i - p.offset;
        for (int k = 0; k < kCategoryCount; ++k)
            EXPECT_EQ(b.planned_live.v[size_t(k)], b.measured_live.v[size_t(k)]) << category_name(Category(k));
    }
}

TEST(CudaEngine, CheckingModeGivesBitwiseEqualResults) {
    MF_REQUIRE_GPU();
    const ModelConfig cfg = test::small_family(false, 96, 128, 2, 4, 256, 64);
    EngineOptions eo;
    eo.B = 2, eo.T = 64, eo.with_eval = false, eo.compute = DType::bf16, eo.flash_attention = true;
    const Trained a = train(*test::gpu(), cfg, eo, 2);
    eo.checking = true;
    const Trained b = train(*test::gpu(), cfg, eo, 2);
    EXPECT_EQ(a.losses, b.losses);
    EXPECT_EQ(a.params, b.params);
}

// --skip-spikes' loss limit on the device: the engine reads the step's losses back before the
// first optimizer op (a synchronization mid-program) and leaves the update out; the weights are
// bitwise those before the step. Within the limit, the same step is applied.
TEST(CudaEngine, LossLimitLeavesTheStepOut) {
    MF_REQUIRE_GPU();
    const ModelConfig cfg = test::small_family(false, 64, 64, 2, 2, 128, 16);
    EngineOptions eo;
    eo.B = 2, eo.T = 16, eo.with_eval = false, eo.grad_accum = 2, eo.compute = DType::bf16;
    Engine engine(cfg, *test::gpu(), eo);
    engine.init_params(3);
    std::vector<int32_t> in(64), tg(64);
    test::random_batch(in, tg, cfg.vocab_size, 5);
    OptimHyper h;
    h.lr = 1e-3f;
    const float loss = engine.train_step(in.data(), tg.data(), h).loss;
    const std::vector<float> before = engine.full_params();
    h.skip_above_loss = 0.5f * loss;   // the next step's loss is near the first's
    const StepResult out = engine.train_step(in.data(), tg.data(), h);
    EXPECT_TRUE(out.skipped && out.loss_outlier);
    EXPECT_EQ(engine.full_params(), before);
    EXPECT_EQ(engine.steps_done(), 1);
    h.skip_above_loss = 2.0f * loss;
    const StepResult in_limit = engine.train_step(in.data(), tg.data(), h);
    EXPECT_FALSE(in_limit.skipped);
    EXPECT_NE(engine.full_params(), before);
    EXPECT_EQ(engine.steps_done(), 2);
}

// GPT-2 124M in bf16: the regions the plan reserves plus the runtime measured at start-up equal
// the device memory this process uses (cudaMemGetInfo) within 2%. On the CUDA emulator, whose
// device memory has no allocation granularity, a small model and to the byte.
TEST(CudaEngine, PlannedReservedPlusRuntimeMatchesCudaMemGetInfo) {
    MF_REQUIRE_GPU();
    EngineOptions eo;
#ifdef MEMFIT_CUDA_EMU
    const ModelConfig cfg = test::small_family(false, 96, 128, 2, 4, 256, 64);
    eo.B = 2, eo.T = 64;
#else
    const ModelConfig cfg = model_preset("gpt2");
    eo.B = 8, eo.T = 1024;
#endif
    eo.with_eval = false, eo.compute = DType::bf16, eo.flash_attention = true;
    CudaBackend & g = *test::gpu();
    // The backend is shared by the whole test program: what earlier tests left on the device (NCCL's
    // communicator buffers, about 470 MiB on an H200) is measured before this engine, not counted.
    g.synchronize();
    const uint64_t before = g.device_used_delta();
    Engine engine(cfg, g, eo);
    engine.init_params(1);
    std::vector<int32_t> in(size_t(eo.B) * size_t(eo.T)), tg(in.size());
    test::random_batch(in, tg, cfg.vocab_size, 3);
    engine.train_step(in.data(), tg.data(), OptimHyper{});
    g.synchronize();
    const double predicted = double(engine.planned_reserved().total());
    const double measured = double(g.device_used_delta() - before);
#ifdef MEMFIT_CUDA_EMU
    EXPECT_EQ(predicted, measured) << "planned reserved " << engine.planned_reserved().total();
#else
    EXPECT_LT(std::fabs(predicted - measured) / measured, 0.02)
        << "planned reserved " << engine.planned_reserved().total() << " vs used " << measured << " (runtime "
        << g.runtime_bytes() << ", already used before the engine " << before << ")";
#endif
}

TEST(CudaCli, DeviceCudaWithoutAGpuIsOneClearError) {
    std::string why;
    if (test::gpu(&why)) GTEST_SKIP() << "a GPU is present: the error path cannot be reached";
    const CliRun r = run_memfit("train --device cuda --steps 1 --out " + ::testing::TempDir() + "memfit_cuda_run");
    ASSERT_NE(r.code, -1);
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.text.find("--device cuda: no CUDA device"), std::string::npos) << r.text;
    EXPECT_EQ(std::count(r.text.begin(), r.text.end(), '\n'), 1) << r.text;
}

// `memfit train --device cuda` end to end: the same losses as on the CPU (fp32, naive attention,
// which the nano model's head dimension of 16 needs on the GPU: auto picks it) and the
// device-memory line, whose prediction is within 2% of cudaMemGetInfo.
TEST(CudaCli, TrainMatchesTheCpuAndReportsDeviceMemory) {
    MF_REQUIRE_GPU();
    const std::string dir = prepared_dir("cli", 60000);
    auto train = [&](const std::string & device) {
        const std::string out = dir + "/" + device;
        const CliRun r = run_memfit("train --model nano --data " + dir +
                                    "/data --batch 4 --seq 32 --steps 4 --lr 1e-3 --warmup 1 --log-every 1 --sample 0 "
                                    "--progress plain --device " + device + " --out " + out);
        EXPECT_EQ(r.code, 0) << r.text;
        return std::make_pair(r.text, logged_losses(out));
    };
    const auto [gpu_log, gpu_losses] = train("cuda");
    const auto [cpu_log, cpu_losses] = train("cpu");
    ASSERT_EQ(gpu_losses.size(), 4u) << gpu_log;
    ASSERT_EQ(cpu_losses.size(), 4u) << cpu_log;
    for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(gpu_losses[i], cpu_losses[i], 1e-4 * cpu_losses[i]) << "step " << i + 1;
    EXPECT_NE(gpu_log.find("attention: naive (the CUDA flash-attention kernels take head dimensions"), std::string::npos)
        << gpu_log;
    EXPECT_LE(std::fabs(prediction_off_pct(gpu_log)), 2.0) << gpu_log;
    std::system(("rm -rf " + dir).c_str());
}

// QLoRA end to end on the device: a base trained and exported on the CPU, adapters trained on its
// nf4-packed weights with dropout (the CPU's losses, the device-memory line within 2%), and
// `memfit generate --device cuda --weights nf4` writing the CPU's greedy text, its device memory
// predicted within 2%.
TEST(CudaCli, QloraTrainAndGenerateOnTheGpu) {
    MF_REQUIRE_GPU();
    const std::string dir = prepared_dir("qlora", 40000);
    const std::string common = " --data " + dir + "/data --batch 4 --seq 32 --lr 1e-3 --warmup 1 --log-every 1 "
                               "--sample 0 --progress plain ";
    ASSERT_EQ(run_memfit("train --model nano --steps 6 --checkpoint-every 6" + common + "--out " + dir + "/base_run").code,
              0);
    ASSERT_EQ(run_memfit("export " + dir + "/base_run/checkpoints --out " + dir + "/base").code, 0);
    std::vector<double> losses[2];
    for (const int gpu : {0, 1}) {
        const std::string out = dir + (gpu ? "/qlora_cuda" : "/qlora_cpu");
        const CliRun r = run_memfit("train --model " + dir + "/base --steps 4 --lora-rank 4 --lora-targets all "
                                    "--base-weights nf4 --lora-dropout 0.1" + common + "--device " +
                                    (gpu ? "cuda" : "cpu") + " --out " + out);
        EXPECT_EQ(r.code, 0) << r.text;
        losses[gpu] = logged_losses(out);
        if (gpu) {
            EXPECT_LE(std::fabs(prediction_off_pct(r.text)), 2.0) << r.text;
        }
    }
    ASSERT_EQ(losses[0].size(), 4u);
    ASSERT_EQ(losses[1].size(), 4u);
    for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(losses[1][i], losses[0][i], 1e-3 * losses[0][i]) << "step " << i + 1;
    std::string text[2];
    for (const int gpu : {0, 1}) {
        const CliRun r = run_memfit("generate --model " + dir + "/base --prompt ROMEO: --max-new-tokens 24 "
                                    "--temperature 0 --weights nf4 --device " + std::string(gpu ? "cuda" : "cpu"));
        EXPECT_EQ(r.code, 0) << r.text;
        const size_t from = r.text.find("ROMEO:"), to = r.text.find("generate: ", from);   // the text alone
        ASSERT_NE(from, std::string::npos) << r.text;
        text[gpu] = r.text.substr(from, to - from);
        if (gpu) {
            EXPECT_LE(std::fabs(prediction_off_pct(r.text)), 2.0) << r.text;
        }
    }
    EXPECT_EQ(text[1], text[0]);
    EXPECT_GT(text[0].size(), std::string("ROMEO:").size() + 10) << text[0];
    std::system(("rm -rf " + dir).c_str());
}

// `memfit verify --device cuda`: the PyTorch reference fixtures (GPT-2 with either GELU, LLaMA,
// Llama 3.1's rope_scaling, Qwen2, Qwen3, Mistral's sliding window, Phi-3's fused projections, its
// partial rotary with LongRoPE, OLMo 2's norms after attention and the MLP, Gemma 3, GPT-NeoX, and
// the mixtures of experts Mixtral, Qwen3-MoE, OLMoE and Qwen2-MoE: routing, grouped matmuls, the
// aux loss, the shared expert)
// replayed on the GPU in fp32, every loss, logit, gradient and updated weight within 1e-4.
TEST(CudaCli, VerifyReplaysBothFixturesOnTheGpu) {
    MF_REQUIRE_GPU();
    for (const char * fixture : {"gpt2_tiny", "gpt2_gelu_tiny", "llama_tiny", "llama31_tiny", "qwen2_tiny",
                                 "qwen3_tiny", "mistral_tiny", "phi3_tiny", "phi3_longrope_tiny", "olmo2_tiny",
                                 "qwen2_yarn_tiny", "gemma3_tiny", "gpt_neox_tiny", "gpt_neox_sequential_tiny",
                                 "mixtral_tiny", "qwen3_moe_tiny", "olmoe_tiny", "qwen2_moe_tiny"}) {
        SCOPED_TRACE(fixture);
        const CliRun r = run_memfit("verify --device cuda " + test::env_or("MEMFIT_TEST_DATA", MEMFIT_TEST_DATA) + "/" +
                                    fixture + ".safetensors");
        EXPECT_EQ(r.code, 0) << r.text;
        EXPECT_NE(r.text.find("\"device\": \"cuda\""), std::string::npos) << r.text;
        EXPECT_NE(r.text.find("\"ok\": true"), std::string::npos) << r.text;
    }
}

// `memfit bench --device cuda` times the GPU (it once timed the CPU whatever --device said).
TEST(CudaCli, BenchTimesTheGpu) {
    MF_REQUIRE_GPU();
    const CliRun r = run_memfit("bench --model nano --batch 2 --seq 32 --steps 1 --warmup 0 --device cuda");
    EXPECT_EQ(r.code, 0) << r.text;
    EXPECT_NE(r.text.find("\"device\":\"cuda\""), std::string::npos) << r.text;
    EXPECT_NE(r.text.find("\"attention\":\"naive\""), std::string::npos) << r.text;   // head dim 16 on the GPU
    EXPECT_NE(r.text.find("\"device_used_bytes\":"), std::string::npos) << r.text;
}

// A device that cannot hold the plan (Llama 2 70B in bf16 on one GPU; the budget check passed
// by a huge --memory-budget): the cudaMalloc that fails ends the run with one line, and the
// plan's own picture of the step stays in report.html and trace.json, named in that line.
TEST(CudaCli, DeviceOutOfMemoryLeavesThePlansReport) {
    MF_REQUIRE_GPU();
    const std::string dir = std::string(::testing::TempDir()) + "memfit_cuda_oom." + std::to_string(getpid());
    const std::string prep = "rm -rf " + dir + " && mkdir -p " + dir + " && head -c 20000 " +
                             test::env_or("MEMFIT_DATA_DIR", MEMFIT_DATA_DIR) + "/tinyshakespeare.txt > " + dir +
                             "/text.txt && " + MEMFIT_BINARY + " prepare --tokenizer bytes --input " + dir +
                             "/text.txt --out " + dir + "/data > /dev/null";
    ASSERT_EQ(std::system(prep.c_str()), 0) << prep;
    const CliRun r = run_memfit("train --model llama2-70b --data " + dir + "/data --device cuda --precision bf16 "
                                "--seq 128 --micro-batch 1 --steps 1 --sample 0 --progress quiet --memory-budget 100TiB "
                                "--out " + dir + "/run");
    EXPECT_EQ(r.code, 1) << r.text;
    EXPECT_EQ(std::count(r.text.begin(), r.text.end(), '\n'), 1) << r.text;
    EXPECT_NE(r.text.find("memfit: error: out of GPU memory: cudaMalloc of "), std::string::npos) << r.text;
    EXPECT_NE(r.text.find("where it peaks: " + dir + "/run/report.html and " + dir + "/run/trace.json"),
              std::string::npos) << r.text;
    std::ifstream html(dir + "/run/report.html");
    const std::string page((std::istreambuf_iterator<char>(html)), std::istreambuf_iterator<char>());
    EXPECT_NE(page.find("<div class=\"failure\""), std::string::npos);
    EXPECT_NE(page.find("out of GPU memory"), std::string::npos);
}

}  // namespace
}  // namespace memfit
