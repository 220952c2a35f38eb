#include "run/deepspeed.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"

namespace memfit {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;
using Strings = std::vector<std::string>;

const std::string kPath = "runs/ds_config.json";

DeepSpeedTranslation translate(const std::string & text) {
    return translate_deepspeed(ordered_json::parse(text), kPath);
}

// The ConfigError's message for `text` ("" when it translates): one line, starting with the path.
std::string error_of(const std::string & text) {
    try {
        translate(text);
    } catch (const ConfigError & e) {
        const std::string msg = e.what();
        EXPECT_EQ(msg.rfind(kPath + ": ", 0), 0u) << msg;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
        return msg;
    }
    return "";
}

void expect_error(const std::string & text, const Strings & parts) {
    const std::string msg = error_of(text);
    ASSERT_FALSE(msg.empty()) << "no ConfigError for " << text;
    for (const std::string & p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

// The shape of the configs in DeepSpeed's and Hugging Face's ZeRO-2 examples, with values.
const char * kZero2Bf16 = R"({
    "train_batch_size": 64,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.0,
    "steps_per_print": 10,
    "bf16": {"enabled": true},
    "fp16": {"enabled": false, "loss_scale": 0, "hysteresis": 2},
    "zero_optimization": {
        "stage": 2,
        "overlap_comm": true,
        "contiguous_gradients": true,
        "reduce_bucket_size": 5e8,
        "allgather_bucket_size": "auto"
    },
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "scheduler": {
        "type": "WarmupCosineLR",
        "params": {"total_num_steps": 1000, "warmup_num_steps": 50, "cos_min_ratio": 0.1, "warmup_type": "linear"}
    },
    "wall_clock_breakdown": false,
    "flops_profiler": {"enabled": false, "profile_step": 1}
})";

TEST(DeepSpeedConfig, TypicalZero2Bf16ConfigTranslatesToExactFlags) {
    const DeepSpeedTranslation t = translate(kZero2Bf16);
    const json expected = {
        {"global-batch", 64},  {"micro-batch", 4},         {"grad-accum", 2},     {"clip", 1.0},
        {"log-every", 10},     {"precision", "bf16"},      {"zero", 2},           {"optimizer", "adamw"},
        {"lr", 3e-4},          {"adam-beta1", 0.9},        {"adam-beta2", 0.95},  {"adam-epsilon", 1e-8},
        {"weight-decay", 0.1}, {"lr-scheduler", "cosine"}, {"steps", 1000},       {"warmup", 50},
        {"min-lr-ratio", 0.1},
    };
    EXPECT_EQ(t.flags, expected) << t.flags.dump(2);
    EXPECT_EQ(t.ignored, (Strings{"zero_optimization.overlap_comm", "zero_optimization.contiguous_gradients",
                                  "zero_optimization.reduce_bucket_size", "wall_clock_breakdown", "flops_profiler"}));
    EXPECT_TRUE(t.flags["global-batch"].is_number_integer());
    EXPECT_TRUE(t.flags["zero"].is_number_integer());
}

TEST(DeepSpeedConfig, SortedJsonListsIgnoredKeysInItsOwnOrder) {
    // nlohmann::json keeps keys sorted: the same translation, the ignored keys in that order.
    const DeepSpeedTranslation sorted = translate_deepspeed(json::parse(kZero2Bf16), kPath);
    EXPECT_EQ(sorted.flags, translate(kZero2Bf16).flags);
    EXPECT_EQ(sorted.ignored, (Strings{"flops_profiler", "wall_clock_breakdown",
                                       "zero_optimization.contiguous_gradients", "zero_optimization.overlap_comm",
                                       "zero_optimization.reduce_bucket_size"}));
}

TEST(DeepSpeedConfig, Fp16LossScaleBlock) {
    const DeepSpeedTranslation t = translate(R"({"fp16": {
        "enabled": true, "auto_cast": false, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 500,
        "hysteresis": 2, "consecutive_hysteresis": false, "min_loss_scale": 1}})");
    const json expected = {{"precision", "fp16"}, {"loss-scale", 0.0}, {"initial-loss-scale", 65536.0},
                           {"loss-scale-window", 500}, {"min-loss-scale", 1.0}};
    EXPECT_EQ(t.flags, expected) << t.flags.dump();
    EXPECT_TRUE(t.flags["initial-loss-scale"].is_number());
    EXPECT_EQ(t.ignored, (Strings{"fp16.auto_cast", "fp16.hysteresis", "fp16.consecutive_hysteresis"}));

    // A static scale; the 2^32 Hugging Face's examples start from.
    EXPECT_EQ(translate(R"({"fp16": {"enabled": true, "loss_scale": 128}})").flags,
              json({{"precision", "fp16"}, {"loss-scale", 128.0}}));
    EXPECT_EQ(translate(R"({"fp16": {"enabled": true, "initial_scale_power": 32}})").flags["initial-loss-scale"],
              4294967296.0);
    expect_error(R"({"fp16": {"enabled": true, "initial_scale_power": 200}})",
                 {"\"fp16.initial_scale_power\" = 200", "from 0 to 127"});
    expect_error(R"({"fp16": {"enabled": true, "loss_scale": -1}})", {"\"fp16.loss_scale\" = -1", ">= 0"});
}

// DeepSpeed's TensorBoard monitor writes to output_path/job_name; --tensorboard puts its
// per-rank folders there. Disabled, it sets and reports nothing.
TEST(DeepSpeedConfig, TensorBoardBlock) {
    EXPECT_EQ(translate(R"({"tensorboard": {"enabled": true, "output_path": "out/ds_logs/", "job_name": "bert"}})").flags,
              json({{"tensorboard", "out/ds_logs/bert"}}));
    EXPECT_EQ(translate(R"({"tensorboard": {"enabled": true, "output_path": "logs", "job_name": "auto"}})").flags,
              json({{"tensorboard", "logs/DeepSpeedJobName"}}));
    setenv("HOME", "/home/someone", 1);
    EXPECT_EQ(translate(R"({"tensorboard": {"enabled": true}})").flags,
              json({{"tensorboard", "/home/someone/tensorboard/DeepSpeedJobName"}}));
    const DeepSpeedTranslation off = translate(R"({"tensorboard": {"enabled": false, "output_path": "x"}})");
    EXPECT_EQ(off.flags, json::object());
    EXPECT_TRUE(off.ignored.empty());
    EXPECT_EQ(translate(R"({"tensorboard": {"enabled": true, "output_path": "x", "flush": 1}})").ignored,
              (Strings{"tensorboard.flush"}));
    expect_error(R"({"tensorboard": {"enabled": true, "output_path": 3}})", {"\"tensorboard.output_path\" = 3"});
}

TEST(DeepSpeedConfig, DisabledPrecisionBlocksSetAndReportNothing) {
    for (const char * text : {R"({"fp16": {"enabled": false, "loss_scale": 128, "hysteresis": 2}})",
                              R"({"fp16": {"loss_scale": 128, "hysteresis": 2}})",
                              R"({"fp16": {"enabled": "auto", "loss_scale": 0}, "bf16": {"enabled": "auto"}})",
                              R"({"bf16": {"enabled": false, "immediate_grad_update": true}})"}) {
        const DeepSpeedTranslation t = translate(text);
        EXPECT_EQ(t.flags, json::object()) << text;
        EXPECT_TRUE(t.ignored.empty()) << text;
    }
}

TEST(DeepSpeedConfig, Bf16AndItsOldName) {
    DeepSpeedTranslation t = translate(R"({"bf16": {"enabled": true, "immediate_grad_update": false}})");
    EXPECT_EQ(t.flags, json({{"precision", "bf16"}}));
    EXPECT_EQ(t.ignored, Strings{"bf16.immediate_grad_update"});
    t = translate(R"({"bfloat16": {"enabled": true}})");
    EXPECT_EQ(t.flags, json({{"precision", "bf16"}}));
    EXPECT_TRUE(t.ignored.empty());

    expect_error(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})",
                 {"\"fp16.enabled\" = true", "\"bf16.enabled\" = true", "set one of them to false"});
    expect_error(R"({"bfloat16": {"enabled": true}, "fp16": {"enabled": true}})", {"bfloat16.enabled", "fp16.enabled"});
    expect_error(R"({"bf16": {"enabled": "yes"}})", {"\"bf16.enabled\" = \"yes\"", "expected true or false"});
}

TEST(DeepSpeedConfig, OffloadCpuNoneNvme) {
    DeepSpeedTranslation t = translate(R"({"zero_optimization": {"stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": true},
        "offload_param": {"device": "cpu", "pin_memory": true, "buffer_count": 5},
        "stage3_max_live_parameters": 1e9}})");
    EXPECT_EQ(t.flags, json({{"zero", 3}, {"offload", "optimizer+params"}}));
    EXPECT_EQ(t.ignored, (Strings{"zero_optimization.offload_optimizer.pin_memory",
                                  "zero_optimization.offload_param.pin_memory",
                                  "zero_optimization.offload_param.buffer_count",
                                  "zero_optimization.stage3_max_live_parameters"}));

    t = translate(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})");
    EXPECT_EQ(t.flags, json({{"zero", 2}, {"offload", "optimizer"}}));
    EXPECT_TRUE(t.ignored.empty());

    // No offload: nothing set, and the settings of an unused block are not worth a warning.
    t = translate(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "none", "pin_memory": true},
                                            "offload_param": {"device": "none"}}})");
    EXPECT_EQ(t.flags, json({{"zero", 3}}));
    EXPECT_TRUE(t.ignored.empty());

    // No stage: --zero decides, the offload is kept.
    t = translate(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu"},
                                            "offload_param": {"device": "cpu"}}})");
    EXPECT_EQ(t.flags, json({{"offload", "optimizer+params"}}));

    // DeepSpeed offloads parameters only under ZeRO-3: at stage 2 the block does nothing there either.
    t = translate(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"},
                                            "offload_param": {"device": "cpu", "pin_memory": true}}})");
    EXPECT_EQ(t.flags, json({{"zero", 2}, {"offload", "optimizer"}}));
    EXPECT_EQ(t.ignored, Strings{"zero_optimization.offload_param"});

    // ZeRO-Infinity's NVMe offload of the optimizer: --offload-dir; without a path, one error.
    t = translate(R"({"zero_optimization": {"stage": 1,
                                            "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme", "pin_memory": true}}})");
    EXPECT_EQ(t.flags, json({{"zero", 1}, {"offload", "optimizer"}, {"offload-dir", "/nvme"}}));
    EXPECT_EQ(t.ignored, Strings{"zero_optimization.offload_optimizer.pin_memory"});
    expect_error(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}})",
                 {"\"zero_optimization.offload_optimizer.device\" = \"nvme\"", "needs \"nvme_path\""});
    expect_error(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                           "offload_param": {"device": "nvme"}}})",
                 {"\"zero_optimization.offload_param.device\" = \"nvme\"", "needs \"nvme_path\""});
    expect_error(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                           "offload_param": {"device": "nvme", "nvme_path": "/nvme"}}})",
                 {"\"zero_optimization.offload_param.device\" = \"nvme\"", "same \"device\" and \"nvme_path\""});
    // ZeRO-Infinity's NVMe offload of both: one file under --offload-dir.
    t = translate(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"},
                                            "offload_param": {"device": "nvme", "nvme_path": "/nvme"}}})");
    EXPECT_EQ(t.flags, json({{"zero", 3}, {"offload", "optimizer+params"}, {"offload-dir", "/nvme"}}));
    expect_error(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})",
                 {"\"zero_optimization.offload_param.device\" = \"cpu\"", "offload_optimizer", "too"});
    expect_error(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                                           "offload_optimizer": {"device": "none"}}})",
                 {"zero_optimization.offload_param.device", "offload_optimizer"});
    expect_error(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "gpu"}}})",
                 {"\"zero_optimization.offload_optimizer.device\" = \"gpu\"", "\"cpu\", \"nvme\" or \"none\""});
    expect_error(R"({"zero_optimization": {"stage": 4}})", {"\"zero_optimization.stage\" = 4", "0, 1, 2 and 3"});
    expect_error(R"({"zero_optimization": {"stage": 2, "offload_optimizer": true}})",
                 {"\"zero_optimization.offload_optimizer\" = true", "expected an object"});
}

TEST(DeepSpeedConfig, Optimizers) {
    // DeepSpeed's Adam is AdamW unless adam_w_mode is false.
    DeepSpeedTranslation t =
        translate(R"({"optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": true}}})");
    EXPECT_EQ(t.flags, json({{"optimizer", "adamw"}, {"lr", 1e-3}}));
    EXPECT_EQ(t.ignored, Strings{"optimizer.params.torch_adam"});
    t = translate(R"({"optimizer": {"type": "adam", "params": {"adam_w_mode": true, "weight_decay": 0.01}}})");
    EXPECT_EQ(t.flags, json({{"optimizer", "adamw"}, {"weight-decay", 0.01}}));
    EXPECT_TRUE(t.ignored.empty());
    expect_error(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false, "weight_decay": 0.01}}})",
                 {"\"optimizer.params.adam_w_mode\" = false", "decouples weight decay", "\"adam_w_mode\": true"});
    expect_error(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})",
                 {"optimizer.params.adam_w_mode"});
    // Coupled decay of 0 is no decay at all: the same update as AdamW's.
    t = translate(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false, "weight_decay": 0}}})");
    EXPECT_EQ(t.flags, json({{"optimizer", "adamw"}, {"weight-decay", 0.0}}));

    t = translate(R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}})");
    EXPECT_EQ(t.flags, json({{"optimizer", "sgd"}, {"lr", 0.1}, {"momentum", 0.9}}));   // --momentum
    EXPECT_TRUE(t.ignored.empty());

    expect_error(R"({"optimizer": {"type": "Lamb", "params": {"lr": 1e-3}}})",
                 {"\"optimizer.type\" = \"Lamb\"", "Adam", "AdamW", "SGD"});
    expect_error(R"({"optimizer": {"type": "OneBitAdam"}})", {"\"optimizer.type\" = \"OneBitAdam\""});
    expect_error(R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}})",
                 {"\"optimizer.params.betas\" = [0.9]", "[beta1, beta2]"});
    expect_error(R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9, "0.99"]}}})", {"optimizer.params.betas"});
    expect_error(R"({"optimizer": {"type": "AdamW", "params": {"lr": "3e-4"}}})",
                 {"\"optimizer.params.lr\" = \"3e-4\"", "expected a number > 0"});
    expect_error(R"({"optimizer": {"type": "AdamW", "params": [1]}})", {"\"optimizer.params\" = [1]", "an object"});
    expect_error(R"({"optimizer": 3})", {"\"optimizer\" = 3", "expected an object"});
}

TEST(DeepSpeedConfig, Schedulers) {
    DeepSpeedTranslation t = translate(R"({"scheduler": {"type": "WarmupLR",
        "params": {"warmup_min_lr": 0, "warmup_max_lr": 5e-4, "warmup_num_steps": 100, "warmup_type": "linear"}}})");
    EXPECT_EQ(t.flags, json({{"lr", 5e-4}, {"warmup", 100}, {"lr-scheduler", "constant"}}));
    EXPECT_TRUE(t.ignored.empty());

    t = translate(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 2000,
        "warmup_max_lr": 1e-3, "warmup_num_steps": 10, "warmup_type": "linear", "last_batch_iteration": -1}}})");
    EXPECT_EQ(t.flags, json({{"lr", 1e-3}, {"warmup", 10}, {"steps", 2000}, {"lr-scheduler", "linear"},
                             {"min-lr-ratio", 0.0}}));
    EXPECT_EQ(t.ignored, Strings{"scheduler.params.last_batch_iteration"});

    // cos_min_ratio absent: DeepSpeed's default. warmup_type absent: DeepSpeed's log warmup, reported.
    t = translate(R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 500}}})");
    EXPECT_EQ(t.flags, json({{"steps", 500}, {"lr-scheduler", "cosine"}, {"min-lr-ratio", 0.0001}}));
    EXPECT_EQ(t.ignored, Strings{"scheduler.params.warmup_type"});

    // WarmupLR and WarmupDecayLR set the learning rate: DeepSpeed trains with the scheduler's.
    t = translate(R"({"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
                      "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 2e-4, "warmup_type": "linear"}}})");
    EXPECT_EQ(t.flags["lr"], 2e-4);
    t = translate(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 2e-4, "warmup_type": "linear"}},
                      "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}})");
    EXPECT_EQ(t.flags["lr"], 2e-4);

    expect_error(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-6}}})",
                 {"\"scheduler.params.warmup_min_lr\" = 1e-06", "from 0", "\"warmup_min_lr\": 0"});
    expect_error(R"({"scheduler": {"type": "WarmupCosineLR", "params": {"warmup_min_ratio": 0.1}}})",
                 {"\"scheduler.params.warmup_min_ratio\" = 0.1", "\"warmup_min_ratio\": 0"});
    expect_error(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_type": "log"}}})",
                 {"\"scheduler.params.warmup_type\" = \"log\"", "linearly", "\"warmup_type\": \"linear\""});
    expect_error(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0}}})",
                 {"\"scheduler.type\" = \"OneCycle\"", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"});
    expect_error(R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 0}}})",
                 {"\"scheduler.params.total_num_steps\" = 0", ">= 1"});
    expect_error(R"({"scheduler": {"type": "WarmupCosineLR", "params": {"cos_min_ratio": 2}}})",
                 {"\"scheduler.params.cos_min_ratio\" = 2", "<= 1"});
}

TEST(DeepSpeedConfig, ActivationCheckpointing) {
    DeepSpeedTranslation t = translate(R"({"activation_checkpointing": {"partition_activations": false,
        "cpu_checkpointing": false, "contiguous_memory_optimization": false, "number_checkpoints": null}})");
    EXPECT_EQ(t.flags, json({{"recompute", "full"}}));
    EXPECT_EQ(t.ignored, (Strings{"activation_checkpointing.partition_activations",
                                  "activation_checkpointing.contiguous_memory_optimization",
                                  "activation_checkpointing.number_checkpoints"}));
    EXPECT_EQ(translate(R"({"activation_checkpointing": {}})").flags, json({{"recompute", "full"}}));
    // cpu_checkpointing: the checkpoints to host memory, memfit's --offload activations, beside
    // what the ZeRO block offloads (either order).
    EXPECT_EQ(translate(R"({"activation_checkpointing": {"cpu_checkpointing": true}})").flags,
              json({{"recompute", "full"}, {"offload", "activations"}}));
    EXPECT_EQ(translate(R"({"activation_checkpointing": {"cpu_checkpointing": true}, "zero_optimization": {"stage": 3,
        "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}})").flags["offload"],
              "optimizer+params+activations");
    EXPECT_EQ(translate(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
        "activation_checkpointing": {"cpu_checkpointing": true}})").flags["offload"], "optimizer+activations");
}

TEST(DeepSpeedConfig, WrongTypesNameKeyValueAndType) {
    expect_error(R"({"train_batch_size": "32"})", {"\"train_batch_size\" = \"32\"", "expected a whole number >= 1"});
    expect_error(R"({"train_micro_batch_size_per_gpu": -4})",
                 {"\"train_micro_batch_size_per_gpu\" = -4", "whole number >= 1"});
    expect_error(R"({"gradient_accumulation_steps": 2.5})", {"\"gradient_accumulation_steps\" = 2.5", "whole number"});
    expect_error(R"({"steps_per_print": 1e12})", {"\"steps_per_print\" = 1000000000000.0", "<= 2147483647"});
    expect_error(R"({"gradient_clipping": -1.0})", {"\"gradient_clipping\" = -1.0", "expected a number >= 0"});
    expect_error(R"({"gradient_clipping": true})", {"\"gradient_clipping\" = true"});
    expect_error(R"({"zero_optimization": 2})", {"\"zero_optimization\" = 2", "expected an object"});
    expect_error(R"({"fp16": true})", {"\"fp16\" = true", "expected an object"});
    expect_error(R"({"scheduler": "WarmupLR"})", {"\"scheduler\" = \"WarmupLR\"", "expected an object"});
    expect_error(R"([1, 2])", {"expected a JSON object"});
    // Whole numbers written as floats are whole numbers.
    EXPECT_EQ(translate(R"({"train_batch_size": 1e3, "steps_per_print": 5.0})").flags,
              json({{"global-batch", 1000}, {"log-every", 5}}));
}

TEST(DeepSpeedConfig, AutoValuesAreSkipped) {
    // Hugging Face's zero2 example: the Trainer fills the "auto" values from its own arguments.
    const DeepSpeedTranslation t = translate(R"({
        "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16, "hysteresis": 2},
        "bf16": {"enabled": "auto"},
        "optimizer": {"type": "AdamW",
                      "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                           "warmup_num_steps": "auto", "total_num_steps": "auto"}},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true},
                              "allgather_partitions": true, "reduce_bucket_size": "auto"},
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "steps_per_print": 2000,
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "wall_clock_breakdown": false
    })");
    const json expected = {{"optimizer", "adamw"}, {"lr-scheduler", "linear"}, {"min-lr-ratio", 0.0},
                           {"zero", 2},            {"offload", "optimizer"},   {"log-every", 2000}};
    EXPECT_EQ(t.flags, expected) << t.flags.dump();
    EXPECT_EQ(t.ignored, (Strings{"scheduler.params.warmup_type", "zero_optimization.offload_optimizer.pin_memory",
                                  "zero_optimization.allgather_partitions", "wall_clock_breakdown"}));
}

TEST(DeepSpeedConfig, MemfitKeysPassThroughUnchanged) {
    const ordered_json own = ordered_json::parse(R"({"model": "nano", "micro-batch": 4, "steps": 20,
        "precision": "auto", "optimizer": "adamw", "lr": 0.001, "check-leaks": true})");
    const DeepSpeedTranslation t = translate_deepspeed(own, kPath);
    EXPECT_EQ(t.flags, json(own));
    EXPECT_TRUE(t.ignored.empty());

    // A mix: memfit's keys next to DeepSpeed's.
    const DeepSpeedTranslation mix = translate(R"({"model": "llama-nano", "seq": 128,
        "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true}, "wandb": {"enabled": true}})");
    EXPECT_EQ(mix.flags, json({{"model", "llama-nano"}, {"seq", 128}, {"micro-batch", 2}, {"precision", "bf16"}}));
    EXPECT_EQ(mix.ignored, Strings{"wandb"});
}

TEST(DeepSpeedConfig, ConflictsBetweenDeepSpeedAndMemfitKeys) {
    expect_error(R"({"micro-batch": 8, "train_micro_batch_size_per_gpu": 4})",
                 {"\"micro-batch\" = 8", "\"train_micro_batch_size_per_gpu\" = 4", "keep one of them"});
    expect_error(R"({"precision": "fp32", "bf16": {"enabled": true}})",
                 {"\"precision\" = \"fp32\"", "\"bf16.enabled\" = true"});
    expect_error(R"({"lr": 0.01, "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.001}}})",
                 {"\"lr\" = 0.01", "scheduler.params.warmup_max_lr"});
    expect_error(R"({"initial-loss-scale": 1024, "fp16": {"enabled": true, "initial_scale_power": 16}})",
                 {"\"initial-loss-scale\" = 1024", "fp16.initial_scale_power", "65536"});
    // A DeepSpeed default that is set counts as set.
    expect_error(R"({"min-lr-ratio": 0.1, "scheduler": {"type": "WarmupCosineLR"}})",
                 {"\"min-lr-ratio\" = 0.1", "cos_min_ratio", "0.0001"});

    // Equal values agree (an integer and the same float too).
    DeepSpeedTranslation t = translate(R"({"micro-batch": 4, "train_micro_batch_size_per_gpu": 4.0, "lr": 3e-4,
                                           "optimizer": {"type": "AdamW", "params": {"lr": 0.0003}}})");
    EXPECT_EQ(t.flags, json({{"micro-batch", 4}, {"lr", 3e-4}, {"optimizer", "adamw"}}));
    // --batch counts every data-parallel rank's sequences: both go through, resolve_batch judges them.
    t = translate(R"({"batch": 8, "train_micro_batch_size_per_gpu": 4})");
    EXPECT_EQ(t.flags, json({{"batch", 8}, {"micro-batch", 4}}));
}

TEST(DeepSpeedConfig, TrainBatchSizeIsAMultipleOfMicroBatchTimesAccumulation) {
    expect_error(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})",
                 {"\"train_batch_size\" = 30", "multiple of 8"});
    EXPECT_EQ(translate(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
                            "gradient_accumulation_steps": 2})").flags,
              json({{"global-batch", 32}, {"micro-batch", 4}, {"grad-accum", 2}}));
}

TEST(DeepSpeedConfig, BlocksWithoutATypeAreReportedWhole) {
    const DeepSpeedTranslation t = translate(R"({"optimizer": {"params": {"lr": 1e-3}},
                                                 "scheduler": {"params": {"warmup_num_steps": 10}}})");
    EXPECT_EQ(t.flags, json::object());
    EXPECT_EQ(t.ignored, (Strings{"optimizer", "scheduler"}));
}

TEST(DeepSpeedConfig, TheExampleOfTheDocs) {
    // docs/deepspeed.md, "Example".
    const DeepSpeedTranslation t = translate(R"({
        "train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0, "bf16": {"enabled": true},
        "zero_optimization": {"stage": 2, "overlap_comm": true, "reduce_bucket_size": 5e8},
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 1000, "warmup_num_steps": 50}}
    })");
    const json expected = {
        {"global-batch", 64}, {"micro-batch", 4},     {"grad-accum", 2},          {"clip", 1.0},
        {"precision", "bf16"}, {"zero", 2},           {"optimizer", "adamw"},     {"lr", 3e-4},
        {"adam-beta1", 0.9},  {"adam-beta2", 0.95},   {"weight-decay", 0.1},      {"lr-scheduler", "cosine"},
        {"steps", 1000},      {"warmup", 50},         {"min-lr-ratio", 0.0001},
    };
    EXPECT_EQ(t.flags, expected) << t.flags.dump(2);
    EXPECT_EQ(t.ignored, (Strings{"zero_optimization.overlap_comm", "zero_optimization.reduce_bucket_size",
                                  "scheduler.params.warmup_type"}));
}

TEST(DeepSpeedConfig, HasDeepSpeedKeys) {
    EXPECT_TRUE(has_deepspeed_keys(json::parse(R"({"train_batch_size": 8})")));
    EXPECT_TRUE(has_deepspeed_keys(json::parse(R"({"model": "nano", "zero_optimization": {"stage": 1}})")));
    EXPECT_TRUE(has_deepspeed_keys(json::parse(R"({"wall_clock_breakdown": false})")));
    EXPECT_TRUE(has_deepspeed_keys(json::parse(R"({"train_micro_batch_size_per_gpu": "auto"})")));
    EXPECT_TRUE(has_deepspeed_keys(json::parse(R"({"optimizer": {"type": "AdamW"}})")));
    EXPECT_TRUE(has_deepspeed_keys(ordered_json::parse(kZero2Bf16)));
    EXPECT_FALSE(has_deepspeed_keys(json::parse(R"({"model": "nano", "micro-batch": 4, "steps": 20})")));
    EXPECT_FALSE(has_deepspeed_keys(json::parse(R"({"optimizer": "sgd"})")));  // memfit's --optimizer
    EXPECT_FALSE(has_deepspeed_keys(json::object()));
    EXPECT_FALSE(has_deepspeed_keys(json::parse("[1, 2]")));
}

}  // namespace
}  // namespace memfit

namespace memfit {
namespace {

// AutoTP's size (what `memfit plan --emit-deepspeed` writes for a tensor-parallel row) is --tp;
// the block's other keys are reported, a size out of range refused.
TEST(DeepSpeedConfig, AutoTpSizeIsTensorParallel) {
    const DeepSpeedTranslation t = translate_deepspeed(
        nlohmann::ordered_json::parse(R"({"tensor_parallel": {"autotp_size": 4, "partition_config": {}}})"), "ds.json");
    EXPECT_EQ(t.flags["tp"], 4);
    EXPECT_EQ(t.ignored, (std::vector<std::string>{"tensor_parallel.partition_config"}));
    EXPECT_THROW(translate_deepspeed(nlohmann::ordered_json::parse(R"({"tensor_parallel": {"autotp_size": 0}})"),
                                     "ds.json"),
                 ConfigError);
    EXPECT_THROW(translate_deepspeed(nlohmann::ordered_json::parse(R"({"tensor_parallel": 2})"), "ds.json"), ConfigError);
}

}  // namespace
}  // namespace memfit
