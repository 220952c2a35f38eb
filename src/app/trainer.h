// The training loop behind `memfit train`: data, engine, schedule, progress, metrics, reports.
#pragma once

#include <cstdint>
#include <string>

#include "run/run_config.h"
#include "train/schedule.h"

namespace memfit {

// What runs (model, batch, techniques, layout) is the RunConfig (run/run_config.h); the rest
// is the training job: data, optimizer hyperparameters, schedule, outputs.
struct TrainOptions : RunConfig {
    std::string data;              // folder with train.bin/val.bin; empty: the bundled corpus
    std::string tokenizer;         // for preparing the bundled corpus; empty: bytes for small presets, else gpt2
    // 0 / -1: filled in by what the run is (app/train_defaults.h): pretraining or fine-tuning.
    int      steps = 0;            // optimizer steps; 0: from --epochs, else 1500
    double   epochs = 0;           // passes over the training rows (steps = ceil(epochs x rows / global batch))
    float    lr = 0;               // peak learning rate; 0: 3e-3 pretraining, 2e-5 full fine-tune, 2e-4 LoRA
    int      warmup = -1;          // linear warmup steps; -1: from warmup_ratio, else 100 pretraining, 3% fine-tuning
    double   warmup_ratio = -1;    // warmup as a share of the steps (Hugging Face's warmup_ratio); -1: unset
    float    min_lr_ratio = 0.1f;
    LrDecay  lr_decay = LrDecay::cosine;   // after the warmup, down to lr x min_lr_ratio at the last step
    float    weight_decay = 0.1f;
    float    beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
    float    momentum = 0.9f;      // --optimizer sgd
    int      galore_update_gap = 200;   // --optimizer galore-adamw[-8bit]: steps between projector refreshes
    float    galore_scale = 0.25f;      // and the projected update's scale (GaLore's alpha)
    int      eval_every = 250;     // 0: only at the end
    int      eval_batches = 8;
    int      log_every = 50;
    std::string out = "runs/train";
    std::string tensorboard;       // TensorBoard event files, one folder per rank (DIR/rank0, ...); "": none
    int      sample_tokens = 400;  // text sample at the end (0: none)
    bool     check_lifetimes = false;
    bool     check_leaks = false;  // compare live bytes op by op between steps 2 and 3; fail if they differ
    bool     profile = false;      // `memfit profile`: no evaluation, no sample; the report is the point
    std::string progress = "auto"; // auto | tty | plain | json | quiet
    std::string budget_file;       // control file polled before each step: a lower budget re-plans the run
    int      checkpoint_every = 0; // write a checkpoint every N steps; 0: never
    bool     save_final = true;    // a checkpoint at the end (and at a stop), as Trainer, torchtune and Unsloth save
    std::string checkpoint_dir;    // "": <out>/checkpoints
    int      keep_checkpoints = 3; // newest checkpoints kept
    std::string resume;            // checkpoint folder (or a folder of them: the newest) to continue from;
                                   // "auto": the newest in the checkpoint folder, or a fresh start
    std::string stop_signals = "TERM,INT,USR1";   // each asks the run to stop with a checkpoint ("none")
    double   stop_grace = 30;      // seconds from a stop signal to the SIGKILL expected after it
    double   comm_timeout = 600;   // seconds a collective may wait before every rank is ended (0: forever)
    std::string on_checkpoint_error = "stop";   // stop | continue (train on, retry at the next interval)
    double   skip_spikes = 0;      // z-score above which a step's loss or gradient norm is a spike (0: off)
    int      spike_rollback = 3;   // that many bad steps in a row: back to the last checkpoint (0: never)
};

// Runs a whole training job; throws memfit::Error on expected failures.
void run_training(const TrainOptions & opt);

// Resolved training data: token files and the tokenizer that made them.
struct DataSource {
    std::string train_path, val_path, tokenizer;
    int vocab_size = 0;
    int val_vocab_size = 0;   // val.bin's header (0: no val.bin)
};
// Finds (or, for the bundled corpus, prepares) the data for `model_vocab` (0: any).
DataSource resolve_data(const std::string & folder, const std::string & tokenizer, int model_vocab);

}  // namespace memfit
