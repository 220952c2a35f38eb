// memfit train, profile, monitor, bench, verify.
#include <cstdio>
#include <cstdlib>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/run_flags.h"
#include "cli/validators.h"
#include "core/error.h"
#include "train/checkpoint.h"
#include "model/config.h"
#include "app/bench.h"
#include "app/calibrate.h"
#include "app/monitor.h"
#include "app/trainer.h"
#include "app/verify.h"

namespace memfit::cli {

namespace {

// Flags shared by `memfit train` and `memfit profile`.
void add_train_flags(CLI::App * train, TrainOptions & t) {
    add_run_flags(train, t);
    train->add_option("--data", t.data, "folder with train.bin/val.bin from `memfit prepare` (default: the bundled corpus)")->check(kPath);
    train->add_option("--tokenizer", t.tokenizer,
                      "tokenizer when preparing the bundled corpus: gpt2|bytes|PATH/tokenizer.json (Hugging Face)|"
                      "PATH/tokenizer.model (SentencePiece); "
                      "with --data, it must be the one the data was prepared with");
    train->add_option("--steps", t.steps, "optimizer steps (default 1500, or from --epochs)")->check(kPositive);
    train->add_option("--epochs", t.epochs, "passes over the training rows: steps = ceil(epochs x rows / global "
                      "batch), printed at the start (instead of --steps)")->check(kPositive);
    train->add_option("--lr", t.lr, "peak learning rate (default by the run: 3e-3 pretraining; 2e-5 full fine-tune "
                      "and 2e-4 LoRA/QLoRA when --model is a folder with weights)")->check(kPositive);
    train->add_option("--warmup", t.warmup, "linear warmup steps (default: 100 pretraining, 3% of the steps "
                      "fine-tuning)")->check(kNonNegative);
    train->add_option("--warmup-ratio", t.warmup_ratio, "warmup as a share of the steps (Hugging Face's "
                      "warmup_ratio; --warmup wins when both are given)")->check(kFraction);
    train->add_option("--min-lr-ratio", t.min_lr_ratio, "the decay's floor at the last step, as a fraction of --lr")
        ->capture_default_str()->check(kFraction);
    train->add_option_function<std::string>(
              "--lr-scheduler",
              [&t](const std::string & v) {
                  if (v == "cosine") t.lr_decay = LrDecay::cosine;
                  else if (v == "linear") t.lr_decay = LrDecay::linear;
                  else if (v == "constant") t.lr_decay = LrDecay::constant;
                  else throw ConfigError(fmt::format("--lr-scheduler '{}': expected cosine, linear or constant", v));
              },
              "after the linear warmup: cosine or linear decay to --lr x --min-lr-ratio at the last step, or "
              "constant (--lr)")
        ->default_str(lr_decay_name(t.lr_decay));
    train->add_option("--momentum", t.momentum, "--optimizer sgd: the momentum (PyTorch's SGD: no dampening, "
                                                "weight decay added to the gradient)")
        ->capture_default_str()->check(finite_range(0.0, 0.999999));
    train->add_option("--galore-update-gap", t.galore_update_gap,
                      "--optimizer galore-adamw[-8bit]: steps between refreshes of each matrix's projector (GaLore's "
                      "update_proj_gap: on steps 1, T + 1, ...; the moments carry over)")
        ->capture_default_str()->check(kPositive);
    train->add_option("--galore-scale", t.galore_scale,
                      "--optimizer galore-adamw[-8bit]: the projected update's scale (GaLore's alpha)")
        ->capture_default_str()->check(finite_range(0.0, 1e6));
    train->add_option("--weight-decay", t.weight_decay, "AdamW's decoupled weight decay, SGD's L2 term (tensors "
                                                        "with >= 2 dims)")
        ->capture_default_str()->check(kNonNegative);
    train->add_option("--adam-beta1", t.beta1, "AdamW's first-moment decay")->capture_default_str()
        ->check(finite_range(0.0, 0.999999));
    train->add_option("--adam-beta2", t.beta2, "AdamW's second-moment decay")->capture_default_str()
        ->check(finite_range(0.0, 0.999999));
    train->add_option("--adam-epsilon", t.eps, "AdamW's epsilon")->capture_default_str()->check(kPositive);
    train->add_option("--eval-every", t.eval_every, "validation interval in steps (0: at the end only)")
        ->capture_default_str()->check(kNonNegative);
    train->add_option("--eval-batches", t.eval_batches, "validation batches per evaluation")
        ->capture_default_str()->check(kPositive);
    train->add_option("--log-every", t.log_every, "status line interval in steps")->capture_default_str()
        ->check(kPositive);
    train->add_option("--out", t.out, "output folder (metrics.jsonl, summary.json, run.json; `memfit monitor` "
                                      "watches it)")->capture_default_str()->check(kPath);
    train->add_option("--tensorboard", t.tensorboard,
                      "also write TensorBoard event files, one run folder per rank (DIR/rank0, DIR/rank1, ...): loss, "
                      "validation loss, learning rate, gradient norm, tokens/s, loss scale, and live and peak bytes "
                      "per memory category at every log step (tensorboard --logdir DIR)");
    train->add_option("--sample", t.sample_tokens, "tokens of text to sample at the end (0: none)")
        ->capture_default_str()->check(kNonNegative);
    train->add_flag("--check-lifetimes", t.check_lifetimes,
                    "give every buffer its own allocation, poisoned after its declared last use (slow; for testing)");
    train->add_option("--budget-file", t.budget_file,
                      "control file polled before every step; writing a smaller size into it (e.g. 300MiB) makes "
                      "the run re-plan to a smaller micro-batch with more accumulation (same global batch)");
    train->add_option("--checkpoint-every", t.checkpoint_every,
                      "write a checkpoint (weights, AdamW state, step, data position) every N steps")
        ->check(kNonNegative);
    train->add_option_function<std::string>(
              "--save-final",
              [&t](const std::string & v) {
                  if (v == "true" || v == "1" || v == "yes" || v == "on") t.save_final = true;
                  else if (v == "false" || v == "0" || v == "no" || v == "off") t.save_final = false;
                  else throw ConfigError(fmt::format("--save-final {}: expected true or false", v));
              },
              "true (default): write a checkpoint at the end of the run (and at a stop), for memfit export and "
              "--resume; false: none unless --checkpoint-every says so");
    train->add_option("--checkpoint-dir", t.checkpoint_dir, "where checkpoints go (default: <out>/checkpoints)")->check(kPath);
    train->add_option("--keep-checkpoints", t.keep_checkpoints, "newest checkpoints kept")->capture_default_str()
        ->check(kPositive);
    train->add_flag_callback("--allow-unverified", [] { set_unverified_checkpoints_allowed(true); },
                             "load a checkpoint that records no content digests (an older memfit's, or an edited "
                             "one) with a warning, instead of refusing it");
    train->add_option("--resume", t.resume,
                      "continue from a checkpoint folder (or the newest in a checkpoints folder), bit for bit; auto: "
                      "the newest in the checkpoint folder, or a fresh start when there is none (a restarted job)");
    train->add_option("--comm-timeout", t.comm_timeout,
                      "mpirun: a collective or pipeline exchange that has not completed after this many seconds "
                      "ends every rank with one line naming it, the step and the ranks that did not arrive (0: "
                      "wait forever)")
        ->capture_default_str()->check(kNonNegative);
    train->add_option("--on-checkpoint-error", t.on_checkpoint_error,
                      "a checkpoint that cannot be written (full disk, I/O error) leaves the previous one intact and "
                      "removes its partial folder; then stop: end the run with one line; continue: train on and try "
                      "again at the next interval")
        ->capture_default_str()->check(CLI::IsMember({"stop", "continue"}));
    train->add_option("--skip-spikes", t.skip_spikes,
                      "Z: a step whose loss or gradient norm is more than Z standard deviations above the last "
                      "128 accepted steps' (or is not finite) is not applied, and is logged as a bad step (0: "
                      "off; llm.c's outlier detector)")
        ->capture_default_str()->check(kNonNegative);
    train->add_option("--spike-rollback", t.spike_rollback,
                      "with --skip-spikes: this many bad steps in a row roll the run back to its last checkpoint "
                      "and skip those steps' batches from then on (recorded in checkpoints, so a resume skips "
                      "them too; 0: never)")
        ->capture_default_str()->check(kNonNegative);
    train->add_option("--stop-signals", t.stop_signals,
                      "signals that stop the run at a step boundary with a checkpoint, summary and report, exit 0 "
                      "(a second one exits at once): TERM, INT, USR1, USR2, HUP, QUIT, XCPU, comma-separated, or "
                      "none; under mpirun send USR1 (mpirun forwards it)")
        ->capture_default_str();
    train->add_option("--stop-grace", t.stop_grace,
                      "seconds between a stop signal and the kill that follows (a spot VM's notice): one process "
                      "abandons the step in flight when finishing it and checkpointing would not fit")
        ->capture_default_str()->check(kNonNegative);
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
        o.save_final = false;   // a look at the step, not a model to keep
        return o;
    }();
    CLI::App * profile = app.add_subcommand(
        "profile", "run a few steps and write report.html (memory over the step, by category) and trace.json");
    add_train_flags(profile, prof);
    profile->callback([] { run_training(prof); });

    static MonitorOptions mon;
    CLI::App * monitor = app.add_subcommand(
        "monitor", "watch a running `memfit train` (its --out folder): step, loss, tokens/s, and per rank the live and "
                   "peak bytes by category against the plan and the budget; exits when the run ends");
    monitor->add_option("run_dir", mon.run_dir, "the run's --out folder")->required();
    monitor->add_option("--interval", mon.interval, "seconds between looks at the run's files")->capture_default_str()
        ->check(kPositive);
    monitor->add_option("--wait", mon.wait, "seconds to wait for the run to start (its run.json; 0: forever)")
        ->capture_default_str()->check(kNonNegative);
    monitor->add_flag("--once", mon.once, "print the view once and exit");
    monitor->callback([] { std::exit(run_monitor(mon)); });

    static BenchOptions b;
    CLI::App * bench = app.add_subcommand("bench", "time training steps; print one JSON line (tokens/s, MFU, memory)");
    add_run_flags(bench, b, RunFlagSet{.execution = true, .layout = false});
    bench->add_option("--steps", b.steps, "timed steps (median reported)")->capture_default_str()
        ->check(kPositive);
    bench->add_option("--warmup", b.warmup, "untimed steps first")->capture_default_str()
        ->check(kNonNegative);
    bench->add_flag("--timeline", b.timeline,
                    "also time steps that record the op timeline (interleaved): report its overhead and, per op "
                    "(the LM head's gemms apart), wall ms a step, share of the ops' time, GFLOP/s and MFU against "
                    "the precision's matmul peak (op_classes, costliest first)");
    static CalibrateOptions cal;
    static bool calibrate = false;
    CLI::Option * calibrate_flag = bench->add_flag(
        "--calibrate", calibrate,
        "instead of timing steps, measure this machine's fp32 matmul rate, memory bandwidth and the round trip of "
        "--offload optimizer's files (under --offload-dir, default the calibration's folder; a few seconds) and "
        "save them for `memfit plan`'s cpu entry");
    bench->add_option("--calibration", cal.path, "the file --calibrate writes")->capture_default_str()
        ->needs(calibrate_flag);
    bench->add_option("--offload-dir", cal.offload_dir,
                      "with --calibrate: the folder whose file round trip is measured, as --offload optimizer "
                      "--offload-dir would use it (default: the calibration file's folder)")
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
    verify->add_option("fixture", fixture, "fixture .safetensors (tests/data/*.safetensors; the format is in src/app/verify.h)")->required();
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
