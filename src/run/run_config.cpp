#include "run/run_config.h"

#include "core/json_num.h"

#include <charconv>

#include <fmt/format.h>

#include "core/error.h"

namespace memfit {

namespace {

// One table per vocabulary: the spelling and the value.
template <class T>
struct Name { const char * text; T value; };

template <class T, size_t N>
T parse_name(const char * flag, std::string_view v, const Name<T> (&names)[N]) {
    std::string all;
    for (const auto & n : names) {
        if (v == n.text) return n.value;
        all += fmt::format("{}{}", all.empty() ? "" : ", ", n.text);
    }
    throw ConfigError(fmt::format("{} '{}': expected one of {}", flag, v, all));
}

template <class T, size_t N>
const char * name_of(T value, const Name<T> (&names)[N]) {
    for (const auto & n : names)
        if (n.value == value) return n.text;
    return "?";
}

constexpr Name<DType> kPrecisions[] = {{"fp32", DType::f32}, {"bf16", DType::bf16}, {"fp16", DType::f16}};
constexpr Name<Attention> kAttentions[] = {
    {"auto", Attention::auto_}, {"flash", Attention::flash}, {"naive", Attention::naive}};
constexpr Name<MasterWeights> kMasterWeights[] = {{"fp32", MasterWeights::fp32}, {"bf16-sr", MasterWeights::bf16_sr}};
constexpr Name<Offload> kOffloads[] = {
    {"none", Offload::none}, {"optimizer", Offload::optimizer}, {"optimizer+params", Offload::optimizer_params}};

}  // namespace

DType parse_precision(std::string_view p) {
    for (const auto & n : kPrecisions)
        if (p == n.text) return n.value;
    throw ConfigError(fmt::format("--precision '{}': expected fp32, bf16 or fp16 (auto only with --fit auto)", p));
}
std::string precision_name(DType compute) { return name_of(compute, kPrecisions); }
Attention parse_attention(std::string_view a) { return parse_name("--attention", a, kAttentions); }
const char * attention_name(Attention a) { return name_of(a, kAttentions); }
int parse_loss_chunk(std::string_view v) {
    if (v == "auto") return -1;
    int n = 0;
    const auto [end, err] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (v.empty() || err != std::errc() || end != v.data() + v.size() || n < 0)
        throw ConfigError(fmt::format("--loss-chunk '{}': expected auto, 0 (unchunked) or a number of tokens", v));
    return n;
}
Offload parse_offload(std::string_view o) { return parse_name("--offload", o, kOffloads); }
const char * offload_name(Offload o) { return name_of(o, kOffloads); }
void parse_offload_flag(std::string_view v, Layout & L) {
    constexpr std::string_view acts = "activations", joined = "+activations";
    L.offload_acts = false;
    if (v == acts) {
        L.offload_acts = true;
        v = "none";
    } else if (v.size() > joined.size() && v.substr(v.size() - joined.size()) == joined) {
        L.offload_acts = true;
        v.remove_suffix(joined.size());
        if (v == "none") throw ConfigError("--offload none+activations: write --offload activations");
    }
    try {
        L.offload = parse_offload(v);
    } catch (const ConfigError &) {
        throw ConfigError(fmt::format("--offload '{}': expected none, optimizer, optimizer+params, activations, "
                                      "optimizer+activations or optimizer+params+activations",
                                      std::string(v) + (L.offload_acts ? "+activations" : "")));
    }
}
std::string offload_flag(const Layout & L) {
    if (!L.offload_acts) return offload_name(L.offload);
    return L.offload == Offload::none ? std::string("activations") : std::string(offload_name(L.offload)) + "+activations";
}
MasterWeights parse_master_weights(std::string_view m) { return parse_name("--master-weights", m, kMasterWeights); }
const char * master_weights_name(MasterWeights m) { return name_of(m, kMasterWeights); }

std::string schedule_spelling(const Layout & l) {
    return l.schedule == PipeSchedule::interleaved ? fmt::format("interleaved:{}", l.virtual_stages)
                                                   : std::string(schedule_name(l.schedule));
}

nlohmann::json run_config_json(const RunConfig & r) {
    nlohmann::json j = {{"model", r.model},
                        {"device", r.device},
                        {"seq", r.seq},
                        {"packing", r.packing},
                        {"precision", r.precision_auto ? std::string("auto") : precision_name(r.compute)},
                        {"attention", attention_name(r.attention)},
                        {"recompute", r.recompute.name()},
                        {"loss-chunk", r.loss_chunk < 0 ? nlohmann::json("auto") : nlohmann::json(r.loss_chunk)},
                        {"attention-window", r.attention_window},
                        {"moe-aux-loss-coeff", json_float(r.moe_aux_loss_coeff)},
                        {"moe-z-loss-coeff", json_float(r.moe_z_loss_coeff)},
                        {"share-layers", r.share_layers},
                        {"sparsity", r.sparsity.name()},
                        {"sparsity-start", r.sparsity.start},
                        {"mlp-chunk", r.mlp_chunk},
                        {"optimizer", optimizer_name(r.optimizer)},
                        {"optimizer-in-backward", r.optimizer_in_backward},
                        {"galore-rank", r.galore_rank},
                        {"adafactor-beta1", json_float(r.adafactor_beta1)},
                        {"master-weights", master_weights_name(r.master_weights)},
                        {"clip", json_float(r.clip)},
                        {"loss-scale", json_float(r.loss_scale)},
                        {"initial-loss-scale", json_float(r.initial_loss_scale)},
                        {"loss-scale-window", r.loss_scale_window},
                        {"min-loss-scale", json_float(r.min_loss_scale)},
                        {"zero", r.layout.zero},
                        {"tp", r.layout.tp},
                        {"cp", r.layout.cp},
                        {"cp-comm-type", r.cp_comm_type},
                        {"ep", r.layout.ep},
                        {"moe-capacity-factor", json_float(r.moe_capacity_factor)},
                        {"moe-token-drop-policy", r.moe_token_drop_policy},
                        {"pp", r.layout.pp},
                        {"sp", r.layout.sp},
                        {"schedule", schedule_spelling(r.layout)},
                        {"offload", offload_flag(r.layout)},
                        {"offload-activations-layers", r.offload_activation_layers},
                        {"offload-fraction", r.offload_fraction},
                        {"offload-dir", r.offload_dir},
                        {"bucket-mb", r.bucket_mb},
                        {"fit", r.fit_auto ? "auto" : "off"},
                        {"lora-rank", r.lora.rank},
                        {"lora-alpha", json_float(r.lora.alpha)},
                        {"lora-targets", r.lora.targets},
                        {"lora-dropout", json_float(r.lora.dropout)},
                        {"lora-variant", r.lora.variant},
                        {"use-rslora", r.lora.rslora},
                        {"base-weights", r.lora.base_weights},
                        {"nf4-double-quant", r.lora.nf4_double_quant},
                        {"teacher", r.distill.teacher},
                        {"distill-alpha", json_float(r.distill.alpha)},
                        {"distill-temperature", json_float(r.distill.temperature)},
                        {"teacher-weights", r.distill.weights},
                        {"objective", r.pref.objective},
                        {"dpo-beta", json_float(r.pref.beta)},
                        {"dpo-loss", r.pref.loss},
                        {"dpo-label-smoothing", json_float(r.pref.label_smoothing)},
                        {"reference", r.pref.reference},
                        {"reference-weights", r.pref.weights},
                        {"seed", r.seed},
                        {"threads", r.threads}};
    if (r.micro_batch > 0) j["micro-batch"] = r.micro_batch;
    if (r.grad_accum > 0) j["grad-accum"] = r.grad_accum;
    if (r.global_batch > 0) j["global-batch"] = r.global_batch;
    if (r.budget > 0) j["memory-budget"] = std::to_string(r.budget);
    return j;
}

void resolve_batch(RunConfig & r, int dp) {
    MF_ASSERT(dp >= 1);
    for (auto [flag, v] : {std::pair{"--micro-batch", r.micro_batch}, std::pair{"--grad-accum", r.grad_accum},
                           std::pair{"--global-batch", r.global_batch}, std::pair{"--batch", r.batch}})
        if (v < 0) throw ConfigError(fmt::format("{} {}: must be at least 1", flag, v));
    if (r.batch > 0) {
        if (r.micro_batch > 0 && r.micro_batch * dp != r.batch)
            throw ConfigError(fmt::format("--batch {} (sequences per micro-step over all {} data-parallel ranks) and "
                                          "--micro-batch {} (per rank) disagree; give one of them", r.batch, dp,
                                          r.micro_batch));
        if (r.batch % dp)
            throw ConfigError(fmt::format("--batch {} is not divisible by the {} data-parallel ranks; --batch is the "
                                          "global micro-batch, split evenly over them: use a multiple of {} (e.g. "
                                          "--batch {}), or give --micro-batch per rank", r.batch, dp, dp,
                                          (r.batch / dp + 1) * dp));
        r.micro_batch = r.batch / dp;
    }
    const int64_t m = r.micro_batch, a = r.grad_accum, g = r.global_batch;
    auto fail = [&](const std::string & what) {
        throw ConfigError(fmt::format("{}: the global batch is micro-batch x accumulation x {} data-parallel "
                                      "rank{} (give any two of --micro-batch, --grad-accum, --global-batch)", what,
                                      dp, dp > 1 ? "s" : ""));
    };
    if (g > 0) {
        if (m > 0 && a > 0 && m * a * dp != g)
            fail(fmt::format("--micro-batch {} x --grad-accum {} x {} = {}, not --global-batch {}", m, a, dp,
                             m * a * dp, g));
        if (m > 0 && a == 0) {
            if (g % (m * dp))
                fail(fmt::format("--global-batch {} does not divide into micro-batches of {} on {} rank{}", g, m, dp,
                                 dp > 1 ? "s" : ""));
            r.grad_accum = int(g / (m * dp));
        } else if (m == 0) {
            const int64_t acc = a > 0 ? a : 1;
            if (g % (acc * dp))
                fail(fmt::format("--global-batch {} does not divide by {} accumulation step{} x {} rank{}", g, acc,
                                 acc > 1 ? "s" : "", dp, dp > 1 ? "s" : ""));
            r.micro_batch = int(g / (acc * dp));
            r.grad_accum = int(acc);
        }
    } else {
        if (r.micro_batch == 0) r.micro_batch = 8;
        if (r.grad_accum == 0) r.grad_accum = 1;
        const int64_t total = int64_t(r.micro_batch) * r.grad_accum * dp;
        if (total > (int64_t(1) << 31) - 1) fail(fmt::format("a global batch of {} sequences", total));
        r.global_batch = int(total);
    }
    r.batch = r.micro_batch * dp;
}

}  // namespace memfit
