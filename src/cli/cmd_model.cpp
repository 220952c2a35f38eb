// memfit export: a checkpoint's weights as a model folder in Hugging Face's layout.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "app/export.h"
#include "app/model_source.h"
#include "backend/make_backend.h"
#include "backend/quant_format.h"
#include "cli/commands.h"
#include "cli/validators.h"
#include "core/error.h"
#include "core/json_num.h"
#include "core/paths.h"
#include "core/text.h"
#include "core/units.h"
#include "infer/decoder.h"
#include "data/instruct.h"
#include "infer/generate.h"
#include "model/config.h"
#include "model/hf_weights.h"
#include "model/param_layout.h"
#include "report/memory_report.h"
#include "run/run_config.h"
#include "tokenizer/tokenizer.h"
#include "train/checkpoint.h"

namespace memfit::cli {


void add_model_commands(CLI::App & app) {
    static std::string ckpt, export_out, export_base, export_shard = "5GB";
    static bool merge_lora_flag = false, adapter_only = false;
    static ExportFormat export_format;
    CLI::App * exp = app.add_subcommand(
        "export", "write a checkpoint's weights as a Hugging Face folder (config.json + model.safetensors)");
    exp->add_option("checkpoint", ckpt, "checkpoint folder, or a folder of them (the newest)")->required();
    exp->add_option("--out", export_out, "output folder")->required()->check(kPath);
    exp->add_flag_callback("--allow-unverified", [] { set_unverified_checkpoints_allowed(true); },
                           "export a checkpoint that records no content digests, with a warning, instead of refusing "
                           "it");
    exp->add_flag("--merge-lora", merge_lora_flag,
                  "LoRA checkpoint: fold the adapters into the base and write a plain Hugging Face folder");
    exp->add_flag("--adapter-only", adapter_only,
                  "LoRA checkpoint: write PEFT's adapter folder (adapter_config.json + adapter_model.safetensors)");
    exp->add_option("--base-model", export_base,
                    "LoRA checkpoint: the Hugging Face folder the run trained from, when it has moved (default: the "
                    "path the checkpoint records)");
    exp->add_option("--dtype", export_format.dtype, "weights in the model folder: fp32, bf16 or fp16 (default: the "
                    "run's --precision, as the checkpoint records it; fp32 for checkpoints that do not say)")
        ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
    exp->add_option("--max-shard-size", export_shard, "above this the weights are split into "
                    "model-0000K-of-0000N.safetensors with model.safetensors.index.json, as save_pretrained does "
                    "(5GB, 500MB, 2GiB, ...)")->capture_default_str();
    exp->callback([] {
        export_format.max_shard_bytes = parse_bytes(export_shard);
        if (export_format.max_shard_bytes == 0)
            throw ConfigError("--max-shard-size 0: a shard must hold at least one byte (e.g. 5GB)");
        if (merge_lora_flag && adapter_only)
            throw ConfigError("--merge-lora and --adapter-only: pick one (a merged model folder, or PEFT's adapter "
                              "folder)");
        const ExportMode mode = merge_lora_flag ? ExportMode::merge_lora
                                : adapter_only  ? ExportMode::adapter_only
                                                : ExportMode::plain;
        std::printf("%s\n", export_checkpoint(ckpt, export_out, mode, export_base, export_format).c_str());
    });

}

}  // namespace memfit::cli
