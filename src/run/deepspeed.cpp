// DeepSpeed config keys as memfit flags; the mapping and why each refusal is one is in
// docs/deepspeed.md.
#include "run/deepspeed.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "core/error.h"

namespace memfit {

namespace {

constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();  // memfit's counts are int flags

// The top-level keys translate() reads values from.
constexpr std::string_view kTranslated[] = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
    "steps_per_print", "fp16", "bf16", "bfloat16", "zero_optimization", "optimizer", "scheduler",
    "activation_checkpointing", "tensorboard", "tensor_parallel",
};

// DeepSpeed's other top-level keys: monitors, profilers, communication tuning, compression,
// elasticity, ... Memfit has no counterpart for any, so each is reported once, whatever it holds.
constexpr std::string_view kUnimplemented[] = {
    "wall_clock_breakdown", "memory_breakdown", "dump_state", "prescale_gradients", "gradient_predivide_factor",
    "sparse_gradients", "communication_data_type", "seq_parallel_communication_data_type",
    "seq_parallel_comm_data_type", "disable_allgather", "amp", "torch_autocast", "flops_profiler",
    "wandb", "csv_monitor", "comet", "comms_logger", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
    "elasticity", "compression_training", "quantize_training", "data_efficiency", "curriculum_learning",
    "checkpoint", "aio", "nebula", "autotuning", "sparse_attention", "pipeline", "data_types",
    "gradient_checkpointing", "eigenvalue", "progressive_layer_drop", "hybrid_engine",
    "expert_parallel", "sequence_parallel_size", "compile", "timers", "graph_harvesting", "dataloader_drop_last",
    "use_data_before_expert_parallelism", "vocabulary_size",
};

bool listed(std::string_view key, const auto & keys) {
    return std::find(std::begin(keys), std::end(keys), key) != std::end(keys);
}

// "optimizer" is also memfit's own flag: a string there (--optimizer adamw) is memfit's, anything
// else is DeepSpeed's block.
template <class Json>
bool is_deepspeed_key(const std::string & key, const Json & v) {
    if (key == "optimizer") return !v.is_string();
    return listed(key, kTranslated) || listed(key, kUnimplemented);
}

// Hugging Face's Trainer writes "auto" for the values it fills in from its own arguments.
template <class Json>
bool is_auto(const Json & v) {
    return v.is_string() && v.template get_ref<const std::string &>() == "auto";
}

std::string lower(std::string s) {
    for (char & c : s) c = (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c;
    return s;
}

// A value for an error line: ASCII-escaped (so it can be cut anywhere) and cut short.
template <class Json>
std::string brief(const Json & v) {
    std::string s = v.dump(-1, ' ', true);
    if (s.size() > 60) s = s.substr(0, 57) + "...";
    return s;
}

// memfit's flags as the conflict check compares them (--batch is not an alias of --micro-batch:
// it counts every data-parallel rank's sequences, and resolve_batch checks the two agree).
std::string canonical_flag(const std::string & key) { return key; }

template <class Json>
class Translator {
public:
    Translator(const Json & j, const std::string & path) : j_(j), path_(path) {}

    DeepSpeedTranslation run() {
        if (!j_.is_object())
            throw ConfigError(fmt::format("{}: expected a JSON object of flags, got {}", path_, brief(j_)));
        for (const auto & [key, v] : j_.items()) {
            if (!is_deepspeed_key(key, v) || is_auto(v)) continue;
            if (key == "train_batch_size") batch_[0] = count(key, v, "global-batch");
            else if (key == "train_micro_batch_size_per_gpu") batch_[1] = count(key, v, "micro-batch");
            else if (key == "gradient_accumulation_steps") batch_[2] = count(key, v, "grad-accum");
            else if (key == "steps_per_print") count(key, v, "log-every");
            else if (key == "gradient_clipping") {
                if (const auto x = number(key, v, 0)) set("clip", *x, source(key, v));
            } else if (key == "fp16") fp16(key, v);
            else if (key == "bf16" || key == "bfloat16") bf16(key, v);
            else if (key == "zero_optimization") zero(key, v);
            else if (key == "optimizer") optimizer(key, v);
            else if (key == "scheduler") scheduler(key, v);
            else if (key == "activation_checkpointing") activation_checkpointing(key, v);
            else if (key == "tensorboard") tensorboard(key, v);
            else if (key == "tensor_parallel") tensor_parallel(key, v);
            else ignore(key);
        }
        finish();
        return merge();
    }

private:
    const Json & j_;
    const std::string & path_;
    nlohmann::json flags_ = nlohmann::json::object();
    std::map<std::string, std::string> sources_;  // flag -> the DeepSpeed key that set it, for conflict messages
    std::vector<std::string> ignored_;
    std::optional<int64_t> batch_[3];             // train_batch_size, micro batch, accumulation
    std::string fp16_on_, bf16_on_;               // the "enabled": true keys
    std::string cpu_checkpointing_;               // activation_checkpointing.cpu_checkpointing = true
    std::optional<double> optimizer_lr_, scheduler_lr_;
    std::string optimizer_lr_source_, scheduler_lr_source_;

    [[noreturn]] void fail(const std::string & key, const Json & v, const std::string & what) const {
        throw ConfigError(fmt::format("{}: \"{}\" = {}: {}", path_, key, brief(v), what));
    }

    static std::string source(const std::string & key, const Json & v) {
        return fmt::format("\"{}\" = {}", key, brief(v));
    }

    void ignore(const std::string & key) { ignored_.push_back(key); }

    void set(const std::string & flag, nlohmann::json value, std::string from) {
        const auto it = flags_.find(flag);
        if (it != flags_.end() && *it != value)
            throw ConfigError(fmt::format("{}: {} and {} set memfit's {} to different values; make them agree",
                                          path_, sources_[flag], from, flag));
        flags_[flag] = std::move(value);
        sources_[flag] = std::move(from);
    }

    // --- typed reads; "auto" reads as absent -------------------------------------------------

    std::optional<int64_t> whole(const std::string & key, const Json & v, int64_t lo, int64_t hi,
                                 const std::string & hint = "") const {
        if (is_auto(v)) return std::nullopt;
        std::optional<int64_t> x;
        if (v.is_number_unsigned()) {
            if (v.template get<uint64_t>() <= uint64_t(kMaxInt)) x = int64_t(v.template get<uint64_t>());
        } else if (v.is_number_integer()) {
            x = v.template get<int64_t>();
        } else if (v.is_number_float()) {
            // 1e3 and 16.0 are whole numbers too (hjson and Python write them so).
            const double d = v.template get<double>();
            if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) <= double(kMaxInt)) x = int64_t(d);
        }
        if (x && *x >= lo && *x <= hi) return x;
        if (!hint.empty()) fail(key, v, hint);
        std::string want = hi == kMaxInt ? fmt::format(">= {}", lo) : fmt::format("from {} to {}", lo, hi);
        if (hi == kMaxInt && v.is_number() && v.template get<double>() > double(kMaxInt))
            want += fmt::format(" and <= {}", kMaxInt);
        fail(key, v, "expected a whole number " + want);
    }

    std::optional<double> number(const std::string & key, const Json & v, double lo, double hi = HUGE_VAL,
                                 bool open_lo = false) const {
        if (is_auto(v)) return std::nullopt;
        if (v.is_number()) {
            const double x = v.template get<double>();
            if (std::isfinite(x) && (open_lo ? x > lo : x >= lo) && x <= hi) return x;
        }
        const char * op = open_lo ? ">" : ">=";
        fail(key, v, std::isinf(hi) ? fmt::format("expected a number {} {}", op, lo)
                                    : fmt::format("expected a number {} {} and <= {}", op, lo, hi));
    }

    std::optional<bool> boolean(const std::string & key, const Json & v) const {
        if (is_auto(v)) return std::nullopt;
        if (!v.is_boolean()) fail(key, v, "expected true or false");
        return v.template get<bool>();
    }

    std::optional<std::string> text(const std::string & key, const Json & v, const std::string & hint) const {
        if (is_auto(v)) return std::nullopt;
        if (!v.is_string()) fail(key, v, hint);
        return v.template get<std::string>();
    }

    void expect_object(const std::string & key, const Json & v, const std::string & example) const {
        if (!v.is_object()) fail(key, v, "expected an object such as " + example);
    }

    // The member `name` of `block` (which is an object), or nullptr when absent or "auto".
    static const Json * member(const Json & block, const char * name) {
        const auto it = block.find(name);
        return it == block.end() || is_auto(*it) ? nullptr : &*it;
    }

    std::optional<int64_t> count(const std::string & key, const Json & v, const char * flag) {
        const auto x = whole(key, v, 1, kMaxInt);
        if (x) set(flag, *x, source(key, v));
        return x;
    }

    // --- blocks ---------------------------------------------------------------------------

    // DeepSpeed's TensorBoard monitor writes to output_path/job_name (output_path "" is
    // ~/tensorboard, job_name "" is DeepSpeedJobName); --tensorboard puts a folder per rank there.
    void tensorboard(const std::string & key, const Json & b) {
        expect_object(key, b, "{\"enabled\": true, \"output_path\": \"logs/\", \"job_name\": \"run1\"}");
        const Json * en = member(b, "enabled");
        if (!en || !*boolean(key + ".enabled", *en)) return;
        std::string path, job = "DeepSpeedJobName";
        for (const auto & [name, v] : b.items()) {
            const std::string k = key + "." + name;
            if (name == "enabled") continue;
            const std::optional<std::string> t = name == "output_path" || name == "job_name"
                                                     ? text(k, v, "expected a string") : std::nullopt;
            if (name == "output_path") path = t.value_or(path);
            else if (name == "job_name") job = t.value_or(job);
            else ignore(k);
        }
        if (path.empty()) {
            const char * home = std::getenv("HOME");
            path = std::string(home && *home ? home : ".") + "/tensorboard";
        }
        if (path.back() != '/') path += '/';
        set("tensorboard", path + job, fmt::format("\"{}\"", key));
    }

    // AutoTP training (DeepSpeed 0.16.4+): autotp_size ranks per tensor group, memfit's --tp.
    void tensor_parallel(const std::string & key, const Json & b) {
        expect_object(key, b, "{\"autotp_size\": 2}");
        for (const auto & [name, v] : b.items()) {
            const std::string k = key + "." + name;
            if (is_auto(v)) continue;
            if (name == "autotp_size") set("tp", *whole(k, v, 1, 4096), source(k, v));
            else ignore(k);
        }
    }

    void fp16(const std::string & key, const Json & b) {
        expect_object(key, b, "{\"enabled\": true, \"loss_scale\": 0}");
        // Disabled (DeepSpeed's default): nothing in the block takes effect, so nothing is reported.
        const Json * en = member(b, "enabled");
        if (!en || !*boolean(key + ".enabled", *en)) return;
        fp16_on_ = key + ".enabled";
        for (const auto & [name, v] : b.items()) {
            const std::string k = key + "." + name;
            if (name == "enabled" || is_auto(v)) continue;
            if (name == "loss_scale") {  // 0: dynamic
                set("loss-scale", *number(k, v, 0), source(k, v));
            } else if (name == "initial_scale_power") {
                // 2^p must be a finite fp32 loss scale.
                const int64_t p = *whole(k, v, 0, 127);
                const double scale = std::ldexp(1.0, int(p));
                set("initial-loss-scale", scale, fmt::format("{} (a loss scale of {})", source(k, v), scale));
            } else if (name == "loss_scale_window") {
                set("loss-scale-window", *whole(k, v, 1, kMaxInt), source(k, v));
            } else if (name == "min_loss_scale") {
                set("min-loss-scale", *number(k, v, 0), source(k, v));
            } else {
                ignore(k);  // hysteresis, consecutive_hysteresis, auto_cast, fused_mode, ...
            }
        }
    }

    void bf16(const std::string & key, const Json & b) {
        expect_object(key, b, "{\"enabled\": true}");
        const Json * en = member(b, "enabled");
        if (!en || !*boolean(key + ".enabled", *en)) return;
        bf16_on_ = key + ".enabled";
        for (const auto & [name, v] : b.items())
            if (name != "enabled" && !is_auto(v)) ignore(key + "." + name);
    }

    // Whether an offload block moves its states to host memory ("device": "cpu"; "none" is the
    // default). Its other keys (pin_memory, buffer_count, ...) are reported only when it does.
    // `effective` false: DeepSpeed does not use the block at the given stage, so neither does
    // memfit (one report for the whole block).
    // The optimizer's block may also say "nvme" with an "nvme_path" (ZeRO-Infinity): memfit's
    // --offload-dir, returned in *nvme_dir (null: the parameters' block, host memory only).
    bool offload(const std::string & key, const Json & b, bool effective, std::string * nvme_dir = nullptr) {
        expect_object(key, b, "{\"device\": \"cpu\"}");
        if (!effective) {
            ignore(key);
            return false;
        }
        const Json * dv = member(b, "device");
        const std::string dk = key + ".device";
        const std::string device = dv ? lower(*text(dk, *dv, "expected \"cpu\" or \"none\"")) : "none";
        if (device == "none") return false;  // DeepSpeed's default
        if (device == "nvme" && !nvme_dir)
            fail(dk, *dv, "memfit offloads the parameters to host memory only: write \"device\": \"cpu\"");
        if (device == "nvme") {
            const Json * path = member(b, "nvme_path");
            const std::optional<std::string> dir = path ? text(key + ".nvme_path", *path, "expected a directory")
                                                        : std::nullopt;
            if (!dir) fail(dk, *dv, "\"device\": \"nvme\" needs \"nvme_path\": the directory for the states' file");
            *nvme_dir = *dir;
        } else if (device != "cpu") {
            fail(dk, *dv, "expected \"cpu\", \"nvme\" or \"none\"");
        }
        for (const auto & [name, v] : b.items())
            if (name != "device" && name != "nvme_path" && !is_auto(v)) ignore(key + "." + name);
        return true;
    }

    void zero(const std::string & key, const Json & b) {
        expect_object(key, b, "{\"stage\": 2}");
        // Offload takes effect in DeepSpeed only under ZeRO (offload_optimizer, stages 1-3) and for
        // parameters only under ZeRO-3 (offload_param); with no stage here the flag --zero decides.
        std::optional<int64_t> stage;
        if (const Json * s = member(b, "stage"))
            stage = whole(key + ".stage", *s, 0, 3, "memfit's ZeRO stages are 0, 1, 2 and 3: write one of them");
        if (stage) set("zero", *stage, source(key + ".stage", b.at("stage")));

        bool opt_cpu = false, param_cpu = false;
        std::string nvme, param_nvme;
        for (const auto & [name, v] : b.items()) {
            const std::string k = key + "." + name;
            if (name == "stage" || is_auto(v)) continue;
            if (name == "offload_optimizer") opt_cpu = offload(k, v, !stage || *stage >= 1, &nvme);
            else if (name == "offload_param") param_cpu = offload(k, v, !stage || *stage == 3, &param_nvme);
            else ignore(k);  // overlap_comm, contiguous_gradients, bucket sizes, stage3_*, ...
        }
        const std::string pk = key + ".offload_param.device", ok = key + ".offload_optimizer.device";
        if (param_cpu && !opt_cpu)
            fail(pk, b.at("offload_param").at("device"),
                 "memfit offloads parameters only together with the optimizer states: set "
                 "\"offload_optimizer\": {\"device\": \"cpu\"} too");
        // One store holds both (host memory, or one file under --offload-dir).
        if (param_cpu && param_nvme != nvme)
            fail(pk, b.at("offload_param").at("device"),
                 param_nvme.empty() ? "memfit keeps the parameters where the optimizer states go (nvme here): write "
                                      "the same \"device\" and \"nvme_path\" for both"
                                    : "memfit keeps the parameters where the optimizer states go: write the same "
                                      "\"device\" and \"nvme_path\" in offload_optimizer");
        if (param_cpu) set("offload", "optimizer+params", source(pk, b.at("offload_param").at("device")));
        else if (opt_cpu) set("offload", "optimizer", source(ok, b.at("offload_optimizer").at("device")));
        if (!nvme.empty())
            set("offload-dir", nvme, source(key + ".offload_optimizer.nvme_path", b.at("offload_optimizer").at("nvme_path")));
    }

    void optimizer(const std::string & key, const Json & b) {
        expect_object(key, b, "{\"type\": \"AdamW\", \"params\": {\"lr\": 3e-4}}");
        const Json * type = member(b, "type");
        // DeepSpeed builds no optimizer from a block without a type (the script brings its own).
        if (!type) {
            ignore(key);
            return;
        }
        const std::string tk = key + ".type";
        const std::string list = "memfit trains with Adam, AdamW or SGD: write one of them";
        const std::string t = lower(*text(tk, *type, list));
        if (t != "adam" && t != "adamw" && t != "sgd") fail(tk, *type, list);
        const bool adam = t != "sgd";

        std::optional<bool> adam_w_mode;
        std::optional<double> weight_decay;
        const Json * awm = nullptr;
        for (const auto & [name, v] : b.items()) {
            if (name == "type" || is_auto(v)) continue;
            if (name != "params") {
                ignore(key + "." + name);  // legacy_fusion, ...; DeepSpeed reads the rest from params
                continue;
            }
            expect_object(key + ".params", v, "{\"lr\": 3e-4, \"weight_decay\": 0.1}");
            for (const auto & [pname, pv] : v.items()) {
                const std::string k = key + ".params." + pname;
                if (is_auto(pv)) continue;
                if (pname == "lr") {
                    optimizer_lr_ = number(k, pv, 0, HUGE_VAL, true);
                    optimizer_lr_source_ = source(k, pv);
                } else if (pname == "weight_decay") {
                    weight_decay = number(k, pv, 0);
                    set("weight-decay", *weight_decay, source(k, pv));
                } else if (adam && pname == "betas") {
                    betas(k, pv);
                } else if (adam && pname == "eps") {
                    set("adam-epsilon", *number(k, pv, 0), source(k, pv));
                } else if (!adam && pname == "momentum") {
                    set("momentum", *number(k, pv, 0, 0.999999), source(k, pv));
                } else if (adam && pname == "adam_w_mode") {
                    adam_w_mode = boolean(k, pv);
                    awm = &pv;
                } else {
                    ignore(k);  // torch_adam, fused, bias_correction, amsgrad, momentum, ...
                }
            }
        }
        // DeepSpeed's Adam decouples weight decay unless adam_w_mode is false (its AdamW always
        // does); coupled (L2) decay only equals memfit's AdamW when the decay is 0.
        if (t == "adam" && adam_w_mode == false && weight_decay != 0.0)
            fail(key + ".params.adam_w_mode", *awm,
                 "memfit's Adam decouples weight decay (AdamW): write \"adam_w_mode\": true, or \"weight_decay\": 0");
        set("optimizer", adam ? "adamw" : "sgd", source(tk, *type));
    }

    void betas(const std::string & key, const Json & v) {
        const std::string hint = "expected [beta1, beta2], two numbers >= 0 and < 1, e.g. [0.9, 0.999]";
        if (!v.is_array() || v.size() != 2) fail(key, v, hint);
        for (int i = 0; i < 2; i++) {
            const Json & b = v[size_t(i)];
            if (!b.is_number() || !(b.template get<double>() >= 0 && b.template get<double>() < 1)) fail(key, v, hint);
            set(i == 0 ? "adam-beta1" : "adam-beta2", b.template get<double>(), source(key, v));
        }
    }

    void scheduler(const std::string & key, const Json & b) {
        expect_object(key, b, "{\"type\": \"WarmupCosineLR\", \"params\": {\"total_num_steps\": 1000}}");
        const Json * type = member(b, "type");
        if (!type) {  // no type: DeepSpeed builds no scheduler
            ignore(key);
            return;
        }
        const std::string tk = key + ".type";
        const std::string list = "memfit's schedules are WarmupLR, WarmupDecayLR and WarmupCosineLR: write one of them";
        const std::string t = lower(*text(tk, *type, list));
        if (t != "warmuplr" && t != "warmupdecaylr" && t != "warmupcosinelr") fail(tk, *type, list);
        const bool cosine = t == "warmupcosinelr", decay = t == "warmupdecaylr";

        bool warmup_type = false, cos_min_ratio = false;
        for (const auto & [name, v] : b.items()) {
            if (name == "type" || is_auto(v)) continue;
            if (name != "params") {
                ignore(key + "." + name);
                continue;
            }
            expect_object(key + ".params", v, "{\"warmup_num_steps\": 100}");
            for (const auto & [pname, pv] : v.items()) {
                const std::string k = key + ".params." + pname;
                if (is_auto(pv)) continue;
                if (pname == "warmup_num_steps") {
                    set("warmup", *whole(k, pv, 0, kMaxInt), source(k, pv));
                } else if (pname == "warmup_type") {
                    const std::string hint = "memfit warms up linearly: write \"warmup_type\": \"linear\"";
                    if (*text(k, pv, hint) != "linear") fail(k, pv, hint);
                    warmup_type = true;
                } else if (!cosine && pname == "warmup_min_lr") {
                    if (*number(k, pv, 0) != 0) fail(k, pv, "memfit warms up from 0: write \"warmup_min_lr\": 0");
                } else if (!cosine && pname == "warmup_max_lr") {
                    scheduler_lr_ = number(k, pv, 0, HUGE_VAL, true);
                    scheduler_lr_source_ = source(k, pv);
                } else if ((cosine || decay) && pname == "total_num_steps") {
                    set("steps", *whole(k, pv, 1, kMaxInt), source(k, pv));
                } else if (cosine && pname == "cos_min_ratio") {
                    set("min-lr-ratio", *number(k, pv, 0, 1), source(k, pv));
                    cos_min_ratio = true;
                } else if (cosine && pname == "warmup_min_ratio") {
                    if (*number(k, pv, 0, 1) != 0)
                        fail(k, pv, "memfit warms up from 0: write \"warmup_min_ratio\": 0");
                } else {
                    ignore(k);  // last_batch_iteration, ...
                }
            }
        }
        // DeepSpeed's default warmup is logarithmic; reported so the difference is seen.
        if (!warmup_type) ignore(key + ".params.warmup_type");
        const std::string from = source(tk, *type);
        set("lr-scheduler", cosine ? "cosine" : decay ? "linear" : "constant", from);
        if (decay) set("min-lr-ratio", 0.0, from + " (decays to 0)");
        if (cosine && !cos_min_ratio)
            set("min-lr-ratio", 0.0001, "\"" + key + ".params.cos_min_ratio\" (absent: DeepSpeed's default 0.0001)");
    }

    void activation_checkpointing(const std::string & key, const Json & b) {
        expect_object(key, b, "{\"partition_activations\": false}");
        set("recompute", "full", "\"" + key + "\"");
        for (const auto & [name, v] : b.items()) {
            const std::string k = key + "." + name;
            if (is_auto(v)) continue;
            if (name == "cpu_checkpointing") {   // the checkpoints to host memory: --offload activations
                if (*boolean(k, v)) cpu_checkpointing_ = "\"" + k + "\"";
            } else {
                ignore(k);  // partition_activations, contiguous_memory_optimization, number_checkpoints, ...
            }
        }
    }

    // --- what depends on more than one block ----------------------------------------------

    void finish() {
        if (!cpu_checkpointing_.empty()) {   // beside what zero_optimization offloads
            const auto it = flags_.find("offload");
            const std::string with = it == flags_.end() ? "activations" : it->get<std::string>() + "+activations";
            const std::string from = it == flags_.end() ? cpu_checkpointing_ : sources_["offload"] + " and " + cpu_checkpointing_;
            flags_.erase("offload");
            set("offload", with, from);
        }
        if (!fp16_on_.empty() && !bf16_on_.empty())
            throw ConfigError(fmt::format("{}: \"{}\" = true and \"{}\" = true: memfit trains in one 16-bit format; "
                                          "set one of them to false", path_, fp16_on_, bf16_on_));
        if (!fp16_on_.empty()) set("precision", "fp16", "\"" + fp16_on_ + "\" = true");
        if (!bf16_on_.empty()) set("precision", "bf16", "\"" + bf16_on_ + "\" = true");

        // WarmupLR and WarmupDecayLR set the learning rate themselves: DeepSpeed trains with
        // warmup_max_lr, whatever the optimizer's lr.
        if (scheduler_lr_) set("lr", *scheduler_lr_, scheduler_lr_source_);
        else if (optimizer_lr_) set("lr", *optimizer_lr_, optimizer_lr_source_);

        // DeepSpeed's train_batch_size = micro-batch x accumulation x data-parallel ranks.
        if (batch_[0] && batch_[1] && batch_[2] && *batch_[0] % (*batch_[1] * *batch_[2]) != 0)
            throw ConfigError(fmt::format(
                "{}: \"train_batch_size\" = {} is not a multiple of train_micro_batch_size_per_gpu x "
                "gradient_accumulation_steps = {} x {}: it is that product times the data-parallel ranks; write a "
                "multiple of {}", path_, *batch_[0], *batch_[1], *batch_[2], *batch_[1] * *batch_[2]));
    }

    // memfit's own keys join the translated ones; one that sets a translated flag must agree.
    DeepSpeedTranslation merge() {
        DeepSpeedTranslation out;
        out.flags = flags_;
        for (const auto & [key, v] : j_.items()) {
            if (is_deepspeed_key(key, v)) continue;
            const nlohmann::json value(v);
            const std::string flag = canonical_flag(key);
            if (const auto it = flags_.find(flag); it != flags_.end()) {
                if (*it != value)
                    throw ConfigError(fmt::format("{}: \"{}\" = {} conflicts with {}, which sets memfit's {} to {}; "
                                                  "keep one of them or make them equal", path_, key, brief(value),
                                                  sources_[flag], flag, it->dump()));
                if (flag != key) out.flags.erase(flag);
            }
            out.flags[key] = value;
        }
        out.ignored = std::move(ignored_);
        return out;
    }
};

template <class Json>
bool has_keys(const Json & j) {
    if (!j.is_object()) return false;
    for (const auto & [key, v] : j.items())
        if (is_deepspeed_key(key, v)) return true;
    return false;
}

}  // namespace

bool has_deepspeed_keys(const nlohmann::json & j) { return has_keys(j); }
bool has_deepspeed_keys(const nlohmann::ordered_json & j) { return has_keys(j); }

DeepSpeedTranslation translate_deepspeed(const nlohmann::json & j, const std::string & path) {
    return Translator<nlohmann::json>(j, path).run();
}

DeepSpeedTranslation translate_deepspeed(const nlohmann::ordered_json & j, const std::string & path) {
    return Translator<nlohmann::ordered_json>(j, path).run();
}

}  // namespace memfit
