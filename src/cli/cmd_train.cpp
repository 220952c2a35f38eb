// memfit train, bench, verify.
#include <cstdio>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/lora_flags.h"
#include "cli/validators.h"
#include "core/error.h"
#include "model/config.h"
#include "app/bench.h"
#include "app/calibrate.h"
#include "app/trainer.h"
#include "app/verify.h"

namespace memfit::cli {

namespace {

void add_shape_flags(CLI::App * c, RunShape & o) {
    c->add_option("--model", o.model, "preset (" + fmt::format("{}", fmt::join(preset_names(), ", ")) +
                                          "), a Hugging Face config.json (GPT-2 or LLaMA), or a folder holding one and its weights")->capture_default_str();
    c->add_option("--batch,--micro-batch", o.batch, "sequences per forward/backward (the micro-batch); under mpirun the global micro-batch, split evenly "
                  "over the ranks")
        ->capture_default_str()->check(kPositive);
    c->add_option("--seq", o.seq, "tokens per sequence")->capture_default_str()->check(kPositive);
    c->add_option("--threads", o.threads, "CPU threads (0: all cores)")->check(kNonNegative);
    c->add_option("--device", o.device,
                  "cpu, or cuda (NVIDIA GPU; under mpirun each rank takes the GPU of its local rank, and gradients "
                  "move over NCCL)")
        ->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
    c->add_option("--seed", o.seed, "random seed")->capture_default_str();
    c->add_option("--loss-chunk", o.loss_chunk,
                  "tokens per LM-head + cross-entropy chunk: the B*T*V logits are never stored whole (0: unchunked)")
        ->capture_default_str()->check(kNonNegative);
    c->add_option("--attention", o.attention,
                  "flash (tiled, saves one log-sum-exp per query), naive (saves the T x T probabilities), or auto: "
                  "flash where the device's kernels take the model's head dimension (the CUDA ones: 32, 64, 96, "
                  "128), else naive")
        ->capture_default_str()->check(CLI::IsMember({"auto", "naive", "flash"}));
    c->add_option("--recompute", o.recompute,
                  "activation recomputation: none, full (keep each layer's input), every:K (keep every K-th), sqrt, "
                  "selective (recompute norms, GELU, attention probabilities), budget (least recompute that fits "
                  "--memory-budget)")
        ->capture_default_str();
    c->add_option("--grad-accum", o.grad_accum,
                  "micro-batches accumulated per optimizer step (the step's batch is their sum)")
        ->capture_default_str()->check(kPositive);
    c->add_option("--precision", o.precision,
                  "fp32, bf16 or fp16 (16-bit weights and activations, fp32 master weights and AdamW moments; fp16 "
                  "adds dynamic loss scaling); auto lets --fit auto choose")
        ->capture_default_str()->check(CLI::IsMember({"fp32", "bf16", "fp16", "auto"}));
    c->add_option("--fit", o.fit,
                  "auto: choose micro-batch, accumulation (keeping the global batch), attention, recomputation, "
                  "loss chunk and (with --precision auto) precision for the highest predicted throughput that fits "
                  "--memory-budget")
        ->capture_default_str()->check(CLI::IsMember({"off", "auto"}));
    c->add_option("--clip", o.clip, "clip gradients to this global L2 norm before AdamW (0: off)")
        ->capture_default_str()->check(kNonNegative);
    c->add_option("--memory-budget", o.memory_budget,
                  "refuse to start unless the plan fits in this many bytes (e.g. 512MiB, 2GiB; default: the memory available)");
    add_lora_flags(c, o);
}


// Flags shared by `memfit train` and `memfit profile`.
void add_train_flags(CLI::App * train, TrainOptions & t) {
    add_shape_flags(train, t);
    // Checked by the trainer (one clear line before any work), not by CLI11.
    train->add_option("--zero", t.zero,
                      "data parallel (mpirun -np N memfit train ...): ZeRO stage 0 (every rank holds everything), 1 "
                      "(shard fp32 master weights and AdamW moments over the ranks), 2 (also gradients), 3 (also "
                      "the parameters); --batch is then the global micro-batch, split evenly over the N ranks")
        ->capture_default_str();
    train->add_option("--tp", t.tp,
                      "tensor parallel (Megatron-LM): split every block's heads and MLP width, the embedding and "
                      "the LM head over groups of this many consecutive ranks (mpirun -np N: data parallel over "
                      "the N / tp groups); the heads, KV heads and MLP width must divide by it")
        ->capture_default_str();
    train->add_flag("--sp", t.sp,
                    "sequence parallel (with --tp): norms and residual adds run on 1/tp of the tokens, with "
                    "all-gathers and reduce-scatters in place of the all-reduces, so those activations divide by tp "
                    "(Korthikanti et al. 2022)");
    train->add_option("--pp", t.pp,
                      "pipeline parallel: split the blocks into this many stages (embedding with the first, LM "
                      "head with the last, balanced by cost); each step's --grad-accum micro-batches flow through "
                      "them; mpirun -np N with N a multiple of tp x pp")
        ->capture_default_str();
    train->add_option("--schedule", t.schedule,
                      "pipeline schedule: gpipe (every forward, then every backward: all micro-batches' activations "
                      "live at once), 1f1b (at most P - s micro-batches in flight on stage s) or interleaved:V (V "
                      "model chunks per stage, a smaller bubble; --grad-accum a multiple of --pp)")
        ->capture_default_str();
    train->add_option("--bucket-mb", t.bucket_mb,
                      "data parallel: gradients are reduced in buckets of at least this many MiB of adjacent "
                      "blocks (0: one bucket per transformer block)")
        ->capture_default_str();
    train->add_option("--data", t.data, "folder with train.bin/val.bin from `memfit prepare` (default: the bundled corpus)");
    train->add_option("--tokenizer", t.tokenizer,
                      "tokenizer when preparing the bundled corpus: gpt2|bytes|PATH/tokenizer.model (SentencePiece)");
    train->add_option("--steps", t.steps, "optimizer steps")->capture_default_str()->check(kPositive);
    train->add_option("--lr", t.lr, "peak learning rate")->capture_default_str()->check(kPositive);
    train->add_option("--warmup", t.warmup, "linear warmup steps")->capture_default_str()->check(kNonNegative);
    train->add_option("--min-lr-ratio", t.min_lr_ratio, "cosine decay floor as a fraction of --lr")
        ->capture_default_str()->check(CLI::Range(0.0, 1.0));
    train->add_option("--weight-decay", t.weight_decay, "AdamW decoupled weight decay (tensors with >= 2 dims)")
        ->capture_default_str()->check(kNonNegative);
    train->add_option("--eval-every", t.eval_every, "validation interval in steps (0: at the end only)")
        ->capture_default_str()->check(kNonNegative);
    train->add_option("--eval-batches", t.eval_batches, "validation batches per evaluation")
        ->capture_default_str()->check(kPositive);
    train->add_option("--log-every", t.log_every, "status line interval in steps")->capture_default_str()
        ->check(kPositive);
    train->add_option("--out", t.out, "output folder (metrics.jsonl, summary.json)")->capture_default_str();
    train->add_option("--sample", t.sample_tokens, "tokens of text to sample at the end (0: none)")
        ->capture_default_str()->check(kNonNegative);
    train->add_flag("--check-lifetimes", t.check_lifetimes,
                    "give every buffer its own allocation, poisoned after its declared last use (slow; for testing)");
    train->add_option("--budget-file", t.budget_file,
                      "control file polled before every step; writing a smaller size into it (e.g. 300MiB) makes "
                      "the run re-plan to a smaller micro-batch with more accumulation (same global batch)");
    train->add_option("--checkpoint-every", t.checkpoint_every,
                      "write a checkpoint (weights, AdamW state, step, data position) every N steps and at the end")
        ->check(kNonNegative);
    train->add_option("--checkpoint-dir", t.checkpoint_dir, "where checkpoints go (default: <out>/checkpoints)");
    train->add_option("--keep-checkpoints", t.keep_checkpoints, "newest checkpoints kept")->capture_default_str()
        ->check(kPositive);
    train->add_option("--resume", t.resume,
                      "continue from a checkpoint folder (or the newest in a checkpoints folder), bit for bit");
    train->add_flag("--check-leaks", t.check_leaks,
                    "compare live bytes per category at every op of steps 2 and 3; fail if any differ");
    train->add_option("--progress", t.progress, "status display: auto (a live line on a terminal), tty, plain, json, quiet")
        ->capture_default_str()->check(CLI::IsMember({"auto", "tty", "plain", "json", "quiet"}));
    train->add_flag_callback("--quiet", [&t] { t.progress = "quiet"; }, "no status lines (same as --progress quiet)");
    train->add_flag_callback("--json", [&t] { t.progress = "json"; }, "one JSON object per status line (--progress json)");
}

}  // namespace

void add_train_commands(CLI::App & app) {
    static TrainOptions t;
    CLI::App * train = app.add_subcommand("train", "train a model (default: a small GPT on the bundled Shakespeare)");
    add_train_flags(train, t);
    train->callback([] { run_training(t); });

    static TrainOptions prof = [] {
        TrainOptions o;
        o.profile = true;
        o.steps = 3;
        o.out = "runs/profile";
        o.log_every = 1;
        o.sample_tokens = 0;
        return o;
    }();
    CLI::App * profile = app.add_subcommand(
        "profile", "run a few steps and write report.html (memory over the step, by category) and trace.json");
    add_train_flags(profile, prof);
    profile->callback([] { run_training(prof); });

    static BenchOptions b;
    CLI::App * bench = app.add_subcommand("bench", "time training steps; print one JSON line (tokens/s, MFU, memory)");
    add_shape_flags(bench, b);
    bench->add_option("--steps", b.steps, "timed steps (median reported)")->capture_default_str()
        ->check(kPositive);
    bench->add_option("--warmup", b.warmup, "untimed steps first")->capture_default_str()
        ->check(kNonNegative);
    bench->add_flag("--timeline", b.timeline,
                    "also time steps that record the op timeline (interleaved) and report the overhead");
    static CalibrateOptions cal;
    static bool calibrate = false;
    CLI::Option * calibrate_flag = bench->add_flag(
        "--calibrate", calibrate,
        "instead of timing steps, measure this machine's fp32 matmul rate and memory bandwidth (a few seconds) and "
        "save them for `memfit plan`'s cpu entry");
    bench->add_option("--calibration", cal.path, "the file --calibrate writes")->capture_default_str()
        ->needs(calibrate_flag);
    bench->callback([] {
        if (!calibrate) {
            std::printf("%s\n", run_bench(b).dump().c_str());
            return;
        }
        cal.threads = b.threads;
        std::printf("%s\n", run_calibration(cal).dump().c_str());
    });

    static std::string fixture;
    static double tolerance = 1e-4;
    static bool check = false;
    static std::string verify_device = "cpu";
    CLI::App * verify = app.add_subcommand("verify", "replay a reference fixture; print max relative errors as JSON");
    verify->add_option("fixture", fixture, "fixture .safetensors (tests/data/*.safetensors; the format is in src/train/verify.h)")->required();
    verify->add_option("--tolerance", tolerance, "largest relative error accepted")->capture_default_str();
    verify->add_flag("--check-lifetimes", check, "run with per-buffer allocations poisoned after last use");
    verify->add_option("--device", verify_device, "cpu or cuda (the GPU, in fp32)")
        ->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
    verify->callback([] {
        const VerifyReport r = verify_fixture(fixture, tolerance, check, verify_device);
        std::printf("%s\n", r.json.dump(2).c_str());
        if (!r.ok) throw Error(fmt::format("verify: max relative error {:.3g} ({}) exceeds {:.1g}",
                                           r.json["max_error"].get<double>(), r.json["worst"].get<std::string>(),
                                           tolerance));
    });
}

}  // namespace memfit::cli
