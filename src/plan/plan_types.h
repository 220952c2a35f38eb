// The vocabulary of `memfit plan`: a device kind (the hardware catalog), a parallel layout, and
// one candidate configuration of a training run on a cluster.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "run/run_config.h"

namespace memfit {

struct LoraPlan;      // plan/lora_plan.h
struct DistillPlan;   // plan/distill_plan.h

// The time model's efficiencies where a catalog entry does not state its own: H100's, fitted
// on the published runs of docs/plan.md (hardware.json's notes say where each comes from).
constexpr double kDefaultMatmulEfficiency = 0.66;
constexpr double kDefaultAttentionEfficiency = 0.18;
constexpr double kDefaultBandwidthEfficiency = 0.20;

// One device kind of the catalog (data/hardware.json). Rates are dense (no sparsity), per device.
struct Hardware {
    std::string name;            // "h100-80g"
    std::string description;     // "NVIDIA H100 SXM5 80 GB"
    std::string source;          // the datasheet the numbers come from
    uint64_t memory = 0;         // bytes of device memory
    uint64_t usable = 0;         // bytes left after the runtime's context and library handles
    double   bf16_flops = 0;     // FLOP/s, dense
    double   fp16_flops = 0;
    double   fp32_flops = 0;     // plain fp32 (no TF32)
    double   mem_bw = 0;         // bytes/s, device memory
    int      per_node = 8;       // devices per node
    double   intra_bw = 0;       // bytes/s per device, one direction, inside a node (NVLink, xGMI, PCIe)
    double   intra_latency = 0;  // seconds per message
    double   inter_bw = 0;       // bytes/s per device, one direction, between nodes (InfiniBand, Ethernet)
    double   inter_latency = 0;
    double   host_bw = 0;        // bytes/s between device and host memory (offload)
    uint64_t host_memory = 0;    // bytes of host memory per node (offload targets)
    // The fractions of the peaks training reaches on this kind (calibrated: time_model.h).
    double   matmul_eff = kDefaultMatmulEfficiency;        // gemms, of the dense peak
    double   attention_eff = kDefaultAttentionEfficiency;  // flash attention, on the FLOPs it performs
    double   bandwidth_eff = kDefaultBandwidthEfficiency;  // elementwise kernels, of mem_bw
    // The kind whose runs the efficiencies were fitted on when this one has none of its own
    // (empty: its own, or memfit's measurements for `cpu`).
    std::string efficiencies_from;

    double flops(DType compute) const {
        return compute == DType::bf16 ? bf16_flops : compute == DType::f16 ? fp16_flops : fp32_flops;
    }
};

// One gradient bucket, bytes (PyTorch DDP's default): the memory model holds two (one moving,
// one filling), the time model pays a collective's latency per bucket.
constexpr double kBucketBytes = 25e6;

// Layout, Offload and Optimizer: run/run_config.h.
// One configuration the search considers: a run (per data-parallel rank: micro_batch,
// grad_accum in flight for a pipeline) with the planner's LoRA sizes. device is empty: a plan
// is for the hardware entry, not a device this process has.
struct Candidate : RunConfig {
    Candidate() {
        device.clear();
        micro_batch = 1;
        grad_accum = 1;
        compute = DType::bf16;
        attention = Attention::flash;
    }
    // The request's run, its searched fields to be set by the search.
    explicit Candidate(const RunConfig & run) : RunConfig(run) {}
    bool flash() const { return attention != Attention::naive; }
    void set_flash(bool f) { attention = f ? Attention::flash : Attention::naive; }
    // LoRA / QLoRA (plan/lora_plan.h): only the adapters train, the base is frozen (and maybe
    // packed). Null: every parameter trains. The search copies the request's choice into every
    // candidate and never changes it.
    std::shared_ptr<const LoraPlan> lora_plan;
    // Distillation (plan/distill_plan.h): the frozen teacher, fixed like lora_plan. Null: none.
    std::shared_ptr<const DistillPlan> distill_plan;
    // Time only: the engine overlaps tensor-parallel collectives with the gemms next to them
    // (Megatron-Core's --tp-comm-overlap, with sequence parallelism). memfit train does not:
    // off unless `memfit plan --tp-comm-overlap` asks to predict such an engine.
    bool tp_comm_overlap = false;
};

}  // namespace memfit
