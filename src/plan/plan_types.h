// The vocabulary of `memfit plan`: a device kind (the hardware catalog), a parallel layout, and
// one candidate configuration of a training run on a cluster.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"

namespace memfit {

struct LoraPlan;   // plan/lora_plan.h

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

    double flops(DType compute) const {
        return compute == DType::bf16 ? bf16_flops : compute == DType::f16 ? fp16_flops : fp32_flops;
    }
};

// One gradient bucket, bytes (PyTorch DDP's default): the memory model holds two (one moving,
// one filling), the time model pays a collective's latency per bucket.
constexpr double kBucketBytes = 25e6;

enum class Offload { none, optimizer, optimizer_params };
enum class Schedule { gpipe, one_f_one_b, interleaved };
enum class Optimizer { adamw, sgd, adamw_8bit };

// How N = dp * tp * pp devices split the run (tensor parallel innermost: the ranks of one node
// share a tensor group).
struct Layout {
    int dp = 1, tp = 1, pp = 1;
    int zero = 0;                  // 0..3: what is partitioned over the data-parallel group
    Offload offload = Offload::none;
    bool sp = false;               // sequence parallel (with tp > 1)
    Schedule schedule = Schedule::one_f_one_b;
    int virtual_stages = 1;        // interleaved: model chunks per device
    int devices() const { return dp * tp * pp; }
};

// One configuration the search considers.
struct Candidate {
    Layout layout;
    int micro_batch = 1;           // sequences per micro-batch per data-parallel rank
    int accum = 1;                 // micro-batches per optimizer step per rank (pipeline: in flight)
    std::string recompute = "none";// none | selective | full (the engine's policies)
    bool flash = true;
    DType compute = DType::bf16;
    Optimizer optimizer = Optimizer::adamw;
    // LoRA / QLoRA (plan/lora_plan.h): only the adapters train, the base is frozen (and maybe
    // packed). Null: every parameter trains. The search copies the request's choice into every
    // candidate and never changes it.
    std::shared_ptr<const LoraPlan> lora;
};

}  // namespace memfit
