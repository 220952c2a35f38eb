#include "plan/launch.h"

#include <algorithm>

#include <fmt/format.h>

#include "run/run_config.h"

namespace memfit {

namespace {

// Shown whatever train's defaults are: they say what the row is.
constexpr const char * kAlways[] = {"model", "seq", "micro-batch", "grad-accum", "global-batch", "precision",
                                    "attention", "recompute"};
// Then these in this order when they differ from the defaults, then any other that differs.
constexpr const char * kLayout[] = {"device", "zero", "tp", "cp", "ep", "pp", "sp", "schedule", "offload", "offload-fraction",
                                    "offload-dir", "master-weights", "optimizer", "optimizer-in-backward", "loss-chunk",
                                    "mlp-chunk"};

std::string quoted(const std::string & s) {
    const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               std::string_view("-_.:,/=+@").find(c) != std::string_view::npos;
    });
    if (plain) return s;
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

}  // namespace

nlohmann::ordered_json train_flags(const PlanRequest & r, const PlanResult & p) {
    RunConfig run = planned_train_run(r, p.c);
    run.batch = 0;
    const nlohmann::json all = run_config_json(run), defaults = run_config_json(RunConfig{});
    nlohmann::ordered_json out;
    auto differs = [&](const std::string & k) { return !defaults.contains(k) || defaults.at(k) != all.at(k); };
    for (const char * k : kAlways)
        if (all.contains(k)) out[k] = all.at(k);
    for (const char * k : kLayout)
        if (all.contains(k) && differs(k)) out[k] = all.at(k);
    if (p.c.layout.pp <= 1) out.erase("schedule");
    for (const auto & [k, v] : all.items())
        if (!out.contains(k) && differs(k) && k != "schedule") out[k] = v;
    return out;
}

std::string launch_command(const PlanRequest & r, const PlanResult & p) {
    std::string flags;
    const nlohmann::ordered_json all = train_flags(r, p);
    for (const auto & [k, v] : all.items()) {
        if (v.is_boolean()) {   // a flag; a default-true option (--nf4-double-quant) is written out when false
            flags += " --" + k + (v.get<bool>() ? "" : " false");
            continue;
        }
        flags += " --" + k + " " + quoted(v.is_string() ? v.get<std::string>() : v.dump());
    }
    const int n = p.c.layout.devices(), node = std::max(1, r.hw.per_node);
    if (n == 1) return "memfit train" + flags;
    if (r.hw.name == "cpu" || n <= node) return fmt::format("mpirun -np {} memfit train{}", n, flags);
    return fmt::format("srun --mpi=pmix --nodes {} --ntasks-per-node {} --gpus-per-node {} memfit train{}",
                       (n + node - 1) / node, node, node, flags);
}

nlohmann::ordered_json deepspeed_config(const PlanResult & p, std::vector<std::string> * unexpressed) {
    const Candidate & c = p.c;
    const Layout & L = c.layout;
    std::vector<std::string> missing;
    nlohmann::ordered_json ds;
    ds["train_batch_size"] = c.micro_batch * c.grad_accum * L.dp;
    ds["train_micro_batch_size_per_gpu"] = c.micro_batch;
    ds["gradient_accumulation_steps"] = c.grad_accum;
    if (c.compute == DType::bf16) ds["bf16"] = {{"enabled", true}};
    if (c.compute == DType::f16) ds["fp16"] = {{"enabled", true}, {"loss_scale", c.loss_scale}};
    nlohmann::ordered_json zero;
    zero["stage"] = L.zero;
    if (L.offload != Offload::none) {
        zero["offload_optimizer"] = c.offload_dir.empty() ? nlohmann::ordered_json{{"device", "cpu"}}
                                                          : nlohmann::ordered_json{{"device", "nvme"}, {"nvme_path", c.offload_dir}};
        if (c.offload_fraction != 1) missing.push_back(fmt::format("--offload-fraction {:g} (DeepSpeed offloads all of the states)", c.offload_fraction));
    }
    if (L.offload == Offload::optimizer_params)
        zero["offload_param"] = c.offload_dir.empty() ? nlohmann::ordered_json{{"device", "cpu"}}
                                                      : nlohmann::ordered_json{{"device", "nvme"}, {"nvme_path", c.offload_dir}};
    ds["zero_optimization"] = zero;
    const OptimizerRow & row = optimizer_row(c.optimizer);
    ds["optimizer"] = {{"type", row.deepspeed ? row.deepspeed : "AdamW"}};
    if (!row.deepspeed)
        missing.push_back(fmt::format("--optimizer {} (DeepSpeed's file names no such optimizer: pass the optimizer "
                                      "object, e.g. bitsandbytes', to deepspeed.initialize)",
                                      row.name));
    if (L.cp > 1)
        missing.push_back(fmt::format("--cp {} (DeepSpeed's file has no context parallelism: DeepSpeed-Ulysses' sequence "
                                      "parallel group is set in the model code)", L.cp));
    if (c.optimizer_in_backward)
        missing.push_back("--optimizer-in-backward (DeepSpeed's file has no fused step: register per-parameter "
                          "post-accumulate-grad hooks, as torchtune's optimizer_in_bwd does)");
    if (c.clip > 0) ds["gradient_clipping"] = c.clip;
    if (c.recompute == "full") ds["activation_checkpointing"] = {{"partition_activations", false}};
    else if (!(c.recompute == "none"))
        missing.push_back(fmt::format("--recompute {} (DeepSpeed checkpoints whole layers: Megatron's "
                                      "--recompute-granularity selective)", c.recompute.name()));
    if (L.tp > 1) ds["tensor_parallel"] = {{"autotp_size", L.tp}};
    if (L.sp) missing.push_back("--sp (Megatron's --sequence-parallel; DeepSpeed's sequence_parallel_size is Ulysses)");
    if (L.pp > 1)
        missing.push_back(fmt::format("--pp {} --schedule {} (deepspeed.pipe.PipelineModule(num_stages={}) in the "
                                      "model code; DeepSpeed's schedule is 1F1B)", L.pp, schedule_spelling(L), L.pp));
    if (c.lora_plan || c.distill_plan || c.loss_chunk > 0 || c.mlp_chunk > 0)
        missing.push_back("LoRA, distillation, --loss-chunk and --mlp-chunk (the training script's, not the config's)");
    if (unexpressed) *unexpressed = std::move(missing);
    return ds;
}

}  // namespace memfit
