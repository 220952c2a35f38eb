// The training job's identity and configuration, apart from running it (app/trainer.cpp): the data
// it reads, its run id and folder locks, the job as flags (summary.json's run_config) and the
// check that every rank runs the same one.
#include <fcntl.h>
#include <omp.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "app/trainer.h"
#include "app/training_run.h"
#include "core/error.h"
#include "core/json_num.h"
#include "core/json_read.h"
#include "core/paths.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "tokenizer/tokenizer.h"

namespace memfit {

namespace fs = std::filesystem;

DataSource resolve_data(const std::string & folder, const std::string & tokenizer, int model_vocab) {
    std::string tok = tokenizer.empty() ? (model_vocab > 0 && model_vocab != 256 ? "gpt2" : "bytes") : tokenizer;
    std::string dir = folder;
    if (dir.empty()) {
        dir = default_prepared_dir(tok);
        if (!fs::exists(fs::path(dir) / "train.bin")) {
            PrepareOptions p;
            p.input = data_dir() + "/tinyshakespeare.txt";
            p.out_dir = dir;
            p.tokenizer = tok;
            const PreparedData d = prepare_dataset(p);
            std::fprintf(stderr, "prepared %s: %llu train + %llu validation tokens (%s)\n", dir.c_str(), (unsigned long long) d.train_tokens,
                        (unsigned long long) d.val_tokens, tok.c_str());
        }
    }
    DataSource src;
    src.train_path = (fs::path(dir) / "train.bin").string();
    src.val_path = (fs::path(dir) / "val.bin").string();
    if (!fs::exists(src.train_path))
        throw IoError(fmt::format("{}: no train.bin here; run `memfit prepare --out {}` first", dir, dir));
    const fs::path meta = fs::path(dir) / "meta.json";
    if (fs::exists(meta)) {
        const nlohmann::json j = read_json_file(meta.string(), uint64_t(64) << 20);
        if (j.is_object() && j.contains("tokenizer") && j["tokenizer"].is_string())
            src.tokenizer = j["tokenizer"].get<std::string>();
    }
    TokenFile f(src.train_path);
    src.vocab_size = int(f.vocab_size());
    if (!fs::exists(src.val_path)) src.val_path.clear();
    else src.val_vocab_size = int(TokenFile(src.val_path).vocab_size());
    return src;
}

// A new run's identity: random, so that two runs never share one.
std::string new_run_id() {
    std::random_device rd;
    return fmt::format("{:08x}{:08x}", rd(), rd());
}

// One run at a time writes a folder: an exclusive lock on <dir>/.memfit.lock, held (the returned
// descriptor open) until the run ends; the operating system drops it if the process dies.
// An exclusive lock on a folder a run writes (--out, and a --checkpoint-dir outside it), held
// until the run ends: two runs never write one folder (they would race on its checkpoints'
// temporary names, and the loser would call the winner's checkpoint its own).
int lock_folder(const std::string & dir, const char * flag) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    const std::string path = (fs::path(dir) / ".memfit.lock").string();
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) throw IoError(fmt::format("{} {}: cannot create {}", flag, dir, path));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        ::close(fd);
        throw IoError(fmt::format("{} {}: another memfit run is writing there; wait for it to end or choose "
                                  "another {}", flag, dir, flag));
    }
    return fd;
}

// Whether `inner` is `outer` or a folder below it (so one lock covers both).
bool within(const std::string & inner, const std::string & outer) {
    std::error_code ec;
    const fs::path a = fs::weakly_canonical(inner, ec), b = fs::weakly_canonical(outer, ec);
    const auto [mismatch, rest] = std::mismatch(b.begin(), b.end(), a.begin(), a.end());
    return mismatch == b.end();
}


ProgressMode progress_mode(const std::string & m) {
    if (m == "tty") return ProgressMode::tty;
    if (m == "plain") return ProgressMode::plain;
    if (m == "json") return ProgressMode::json;
    if (m == "quiet") return ProgressMode::quiet;
    if (m == "auto") return ProgressMode::auto_detect;
    throw ConfigError(fmt::format("--progress {}: expected auto, tty, plain, json or quiet", m));
}


namespace {

// A job as flags: the run's (RunConfig) and the trainer's own; where its outputs go is not the run's.
nlohmann::json job_json(const TrainOptions & opt, const RunConfig & run) {
    nlohmann::json j = run_config_json(run);
    if (!opt.data.empty()) j["data"] = opt.data;
    if (!opt.tokenizer.empty()) j["tokenizer"] = opt.tokenizer;
    j["steps"] = opt.steps;
    j["lr"] = json_float(opt.lr);
    j["warmup"] = opt.warmup;
    j["min-lr-ratio"] = json_float(opt.min_lr_ratio);
    j["lr-scheduler"] = lr_decay_name(opt.lr_decay);
    j["weight-decay"] = json_float(opt.weight_decay);
    j["adam-beta1"] = json_float(opt.beta1);
    j["momentum"] = json_float(opt.momentum);
    j["galore-update-gap"] = opt.galore_update_gap;
    j["galore-scale"] = json_float(opt.galore_scale);
    j["adam-beta2"] = json_float(opt.beta2);
    j["adam-epsilon"] = json_float(opt.eps);
    j["eval-every"] = opt.eval_every;
    j["eval-batches"] = opt.eval_batches;
    j["log-every"] = opt.log_every;
    j["sample"] = opt.sample_tokens;
    j["checkpoint-every"] = opt.checkpoint_every;
    j["save-final"] = opt.save_final;
    j["keep-checkpoints"] = opt.keep_checkpoints;
    return j;
}

}  // namespace

// The run as flags, resolved (what --fit auto, the batch arithmetic and the memory budget came
// to), so that `memfit train --config summary.json` runs it again.
nlohmann::json resolved_config(const TrainOptions & opt, RunConfig run, const EngineOptions & eo, int ranks) {
    run.micro_batch = eo.B;
    run.grad_accum = eo.grad_accum;
    run.global_batch = eo.B * eo.grad_accum * ranks;
    run.batch = 0;
    run.compute = eo.compute;
    run.precision_auto = run.fit_auto = false;
    run.attention = eo.flash_attention ? Attention::flash : Attention::naive;
    run.recompute = Recompute(eo.recompute.name);   // budget: the same budget solves to the same plan
    run.loss_chunk = eo.loss_chunk;
    run.threads = omp_get_max_threads();
    // The budget decided the run only when something was fitted to it (else it was a check).
    if (opt.budget == 0 && !opt.fit_auto && opt.recompute.info().kind != RecomputePolicy::budget) run.budget = 0;
    return job_json(opt, run);
}


// A value every rank must share, by hash (gathered): all ranks stop with the same line naming
// `what` when one differs.
void check_same_on_ranks(Communicator & comm, const std::string & mine, const std::string & what,
                         const std::string & hint) {
    const std::vector<uint64_t> all = comm.all_gather_u64(std::hash<std::string>{}(mine));
    for (size_t r = 1; r < all.size(); ++r)
        if (all[r] != all[0])
            throw ConfigError(fmt::format("the ranks disagree on {}: rank 0 and rank {} differ (this rank, {}, has "
                                          "{}); {}", what, r, comm.rank(), mine, hint));
}

// Every rank must run the same job: the ranks compare each flag's value before the first
// collective of the run, and all stop with the first flag that differs.
void check_ranks_agree(Communicator & comm, const TrainOptions & opt) {
    if (comm.size() == 1) return;
    nlohmann::json j = job_json(opt, opt);
    j["out"] = opt.out;
    j["resume"] = opt.resume;
    j["checkpoint-dir"] = opt.checkpoint_dir;
    j["budget-file"] = opt.budget_file;
    for (const auto & [key, value] : j.items())
        check_same_on_ranks(comm, value.dump(), "--" + key, "give every rank the same flags");
}

}  // namespace memfit
