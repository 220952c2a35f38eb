// memfit quantize, eval: post-training quantization into a GPTQ folder, and a model's perplexity.
#include <cstdio>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "app/quantize.h"
#include "cli/commands.h"
#include "cli/validators.h"
#include "core/error.h"

namespace memfit::cli {

void add_quant_commands(CLI::App & app) {
    static QuantizeRequest q;
    static int group = 128;
    static bool asym = false;
    CLI::App * c = app.add_subcommand(
        "quantize", "post-training quantization into a GPTQ folder (AutoGPTQ's v1 format: transformers, PEFT and "
                    "vLLM load it; memfit generate, eval and train --lora-rank run it)");
    c->add_option("--model", q.model, "the model: a folder (config.json + model.safetensors) or a training checkpoint")
        ->required();
    c->add_option("--out", q.out, "output folder")->required()->check(kPath);
    c->add_option("--method", q.spec.method, "gptq (Frantar et al. 2022: each rounding error compensated through the "
                  "inverse Hessian of the layer's inputs; needs --calibration) or rtn (round to nearest, the baseline)")
        ->capture_default_str()->check(CLI::IsMember({"gptq", "rtn"}));
    c->add_option("--bits", q.spec.options.bits, "bits per weight")->capture_default_str()->check(CLI::IsMember({4, 8}));
    c->add_option("--group-size", group, "inputs sharing a scale and zero point (-1: a whole row)")
        ->capture_default_str();
    c->add_flag("--desc-act", q.spec.options.desc_act,
                "act-order: quantize inputs in order of decreasing Hessian diagonal (gptq only)");
    c->add_option("--true-sequential", q.spec.options.true_sequential,
                  "gptq: a block's projections in forward order, each calibrated on what the ones before it, "
                  "quantized, produce (AutoGPTQ's default); false: all four on the block's unquantized inputs")
        ->default_str("true");
    c->add_flag("--asym", asym, "asymmetric groups (a zero point per group); default symmetric, AutoGPTQ's sym=True");
    c->add_option("--damp-percent", q.spec.options.damp, "dampening added to the Hessian's diagonal, as a fraction "
                  "of its mean")->capture_default_str()->check(finite_range(0, 1));
    c->add_option("--calibration", q.calibration, "calibration tokens: a folder from memfit prepare (its train.bin), "
                  "prepared with the model's tokenizer");
    c->add_option("--nsamples", q.samples, "calibration windows (GPTQ's 128; fewer when the data holds fewer)")
        ->capture_default_str()->check(kPositive);
    c->add_option("--seq", q.seq, "tokens per calibration window (default 2048, at most the model's trained context)")
        ->check(kPositive);
    c->add_option("--calibration-batch", q.batch, "calibration windows per forward program (its memory: planned "
                  "and printed)")->capture_default_str()->check(kPositive);
    c->add_option("--seed", q.seed, "which calibration windows")->capture_default_str()->check(kSeed);
    c->add_option("--dtype", q.dtype, "the folder's unquantized weights (embeddings, norms, head): F16 (the Hub's "
                  "GPTQ folders), BF16 or F32")->capture_default_str()->check(CLI::IsMember({"F16", "BF16", "F32"}));
    c->callback([] {
        if (group == 0 || group < -1) throw ConfigError(fmt::format("--group-size {}: a positive size or -1", group));
        q.spec.options.group = group;
        q.spec.options.sym = !asym;
        if (q.spec.method == "rtn" && q.spec.options.desc_act)
            throw ConfigError("--desc-act orders GPTQ's columns; round-to-nearest has no order (drop --desc-act)");
        std::printf("%s\n", quantize_model(q, stderr).c_str());
    });

    static EvalRequest e;
    CLI::App * v = app.add_subcommand("eval", "validation loss and perplexity of a model folder, GPTQ folder or "
                                              "checkpoint, as one JSON line");
    v->add_option("--model", e.model, "a model folder (plain or GPTQ) or a training checkpoint")->required();
    v->add_option("--data", e.data, "a folder from memfit prepare (its val.bin; train.bin if it has none)")->required();
    v->add_option("--tokenizer", e.tokenizer, "the data's tokenizer when the folder does not say");
    v->add_option("--seq", e.seq, "tokens scored per window (default: 256, at most the trained context)")
        ->check(kPositive);
    v->add_option("--batch", e.batch, "windows per batch")->capture_default_str()->check(kPositive);
    v->add_option("--batches", e.batches, "batches scored (consecutive windows from the start)")
        ->capture_default_str()->check(kPositive);
    v->add_option("--weights", e.weights, "weight storage, as generate's --weights: fp32, bf16, int8 or nf4 (a GPTQ "
                  "folder computes with its own packed weights)")->capture_default_str();
    v->callback([] { std::printf("%s\n", evaluate_model(e).dump().c_str()); });
}

}  // namespace memfit::cli
