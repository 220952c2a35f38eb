// Internal to src/app: the training job behind run_training() as a class, its phases in
// trainer.cpp, its stops (signals, roll-backs after spikes) and checkpoints in training_stops.cpp,
// its end (memory report, summary, report, sample) in training_finish.cpp.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/divergence.h"
#include "app/rank_report.h"
#include "app/spike_detector.h"
#include "app/trainer.h"
#include "app/train_defaults.h"
#include "comm/communicator.h"
#include "comm/groups.h"
#include "data/data_loader.h"
#include "memory/budget.h"
#include "memory/timeline.h"
#include "model/config.h"
#include "plan/fit.h"
#include "report/html_report.h"
#include "report/progress.h"
#include "report/report_data.h"
#include "report/tensorboard.h"
#include "train/engine.h"
#include "train/replan.h"
#include "train/schedule.h"

namespace memfit {

using Clock = std::chrono::steady_clock;

// The run as flags, resolved (summary.json's run_config: `--config` of it runs the run again).
nlohmann::json resolved_config(const TrainOptions & opt, RunConfig run, const EngineOptions & eo, int ranks);

// The job's identity and its checks before any work (app/training_job.cpp).
std::string new_run_id();   // random: two runs never share one
// An exclusive lock on <dir>/.memfit.lock, held while the returned descriptor is open (IoError
// naming `flag` when another run holds it).
int lock_folder(const std::string & dir, const char * flag);
bool within(const std::string & inner, const std::string & outer);   // inner is outer or below it
ProgressMode progress_mode(const std::string & m);
// A value every rank must share: all ranks stop with one line naming `what` when one differs.
void check_same_on_ranks(Communicator & comm, const std::string & mine, const std::string & what,
                         const std::string & hint);
void check_ranks_agree(Communicator & comm, const TrainOptions & opt);   // every flag, before any work

// Preference tuning: ConfigError unless `train_path` is `memfit prepare --format preference`'s
// and each rank's rows hold whole pairs (app/training_preference.cpp).
void check_preference_data(const std::string & train_path, int rows_per_rank);

// One training job, phase by phase (run_training calls them in order): every flag is checked and
// every configuration resolved before the first output is written.
class TrainingRun {
public:
    explicit TrainingRun(const TrainOptions & opt);
    ~TrainingRun() {
        if (metrics_) std::fclose(metrics_);
        if (lock_fd_ >= 0) ::close(lock_fd_);
        if (ckpt_lock_fd_ >= 0) ::close(ckpt_lock_fd_);
    }
    TrainingRun(const TrainingRun &) = delete;
    TrainingRun & operator=(const TrainingRun &) = delete;
    void load();           // the model, the device, the data, the memory budget
    void resolve();        // the configuration this rank runs, and the data loaders
    // Expert parallel (training_experts.cpp): the groups' communicators, made (collective) and
    // handed to the engine's options; the run's line about them.
    void make_expert_groups();
    void use_expert_groups();
    std::string expert_line(const ModelConfig & cfg) const;
    void announce();       // what will run
    void build();          // the engine, its plan, the weights (pre-trained, resumed)
    void train();          // the steps (until the last, or a stop signal)
    void finish();         // planned vs measured, summary.json, report.html, trace.json, the sample
    // --resume auto found the run's last step already checkpointed: nothing to do.
    bool complete() const { return complete_; }
    void check_complete();
    void warn_other_runs();
    void retire_other_runs();

private:
    void say(const std::string & text);
    void warn(const std::string & text);   // on stderr under --progress quiet
    void write_metrics(const nlohmann::json & line);
    void take_rows(int rows, int groups);
    void spoil_rows(int rows, int groups);   // MEMFIT_TEST_GRAD_SPIKES "STEP:batch"
    float evaluate();
    void step(int step);
    // Preference tuning (app/training_preference.cpp): the reference before the first step (a
    // copy's weights, or the precomputed log-probabilities of every row of both splits), each
    // batch's reference rows, and the metrics lines.
    void start_preference();
    std::vector<float> reference_table(const DataLoader & loader, const std::string & split, const std::string & key);
    const float * my_reference(const std::vector<float> & table, const std::vector<uint64_t> & windows, int rows,
                               int groups);
    void add_preference_metrics(nlohmann::json & m, const StepResult & r, bool eval) const;
    // A mixture of experts' routing (training_watch.cpp): moe/aux_loss, moe/z_loss, the busiest
    // expert's load over the mean (moe/max_load) and the tokens each expert received per sparse layer.
    void add_moe_metrics(nlohmann::json & m, const StepResult & r) const;
    bool stop_now();
    std::string note_spike(const StepResult & r, int step, const OptimHyper & h);
    int roll_back();
    bool abandon_step() const;
    void stopped(int last_done);
    void checkpoint(int step, bool log_point);
    std::string checkpoint_root() const;
    void report_memory(const RankMemory & rank_memory, uint64_t rss);
    std::pair<std::string, int> sample(const std::vector<float> & weights);
    // Watching the run (training_watch.cpp). Collective: run.json (each rank's plan) and the
    // TensorBoard files; every rank's memory at a log point, to TensorBoard and (rank 0's
    // return) metrics.jsonl's "ranks"; every rank's last step for the report.
    void start_watch();
    nlohmann::json watch(int step, const ProgressLine & pl, const StepResult & r);
    std::vector<RankView> gather_rank_views();
    // A step that failed out of memory: the report of `recorded` (up to the op that failed, when
    // that op was the training step's), then the error again, naming where the report is.
    [[noreturn]] void fail_out_of_memory(const OutOfMemory & e, int step, const Timeline & recorded);
    // A plan refused before it ran (the budget, the device's reservation, or nothing --fit auto
    // or --recompute budget tried fits): the report of the plan of `eo`.
    [[noreturn]] void fail_refused_plan(const OutOfMemory & e, const EngineOptions & eo);
    // report.html and trace.json (another rank: report-rankN.html, trace-rankN.json); "A and B".
    std::string write_failure_report(const ReportData & rep) const;
    nlohmann::json failure_config(int step, const EngineOptions & eo) const;

    TrainOptions opt_;   // the user's, with the defaults filled in (train_defaults.h)
    std::unique_ptr<Communicator> comm_;
    int world_ = 1;
    bool lead_ = true;
    ParallelLayout layout_;
    std::unique_ptr<ProcessGroups> groups_;
    int ranks_ = 1, rank_ = 0;   // the data-parallel ones (the world without tensor and pipeline parallelism)
    // Context parallel: the ranks sharing this rank's sequences (1: none) and its place among them;
    // ranks_ and rank_ then count groups of sequences (the data group spans ranks_ x cp_ ranks).
    int cp_ = 1, cp_rank_ = 0;
    Communicator * data_comm_ = nullptr;
    RunConfig run_;              // the batch resolved for the data-parallel ranks; the budget
    Progress progress_;
    ModelConfig cfg_;
    std::unique_ptr<Backend> backend_;
    // On a device backend (NCCL), each group's device communicator: data, tensor, pipeline and
    // the tied embedding's (null where the group is one rank or the backend computes on the host).
    std::unique_ptr<Communicator> device_comm_, device_tp_, device_pp_, device_emb_, device_cp_;
    // Expert parallel (--ep E, model/expert_parallel.h): the expert group (E consecutive data
    // ranks) and the expert-data group (the ranks holding the same experts), host and device.
    std::unique_ptr<Communicator> ep_host_, edp_host_, device_ep_, device_edp_;
    DataSource data_;
    EngineOptions eo_;
    std::vector<std::string> notes_;   // what --fit auto / --recompute budget chose
    int batch_ = 0, accum_ = 0;  // the global micro-batch and accumulation the engine runs (its B x ranks)
    std::unique_ptr<DataLoader> train_data_, val_data_;
    std::unique_ptr<Engine> engine_;
    int first_step_ = 1;
    int last_step_ = 0;          // the last step completed (0: none yet in this process)
    std::string resume_;         // the checkpoint --resume names (auto: the newest in the folder, or none)
    ResumedLoss resumed_;        // and the loss it recorded, which the first steps should continue
    bool complete_ = false;
    ScheduleChoice schedule_;   // steps, lr and warmup as filled in, and why (announce prints them)
    bool abandoned_ = false;     // a stop signal abandoned the step in flight
    Clock::time_point step_t0_;
    double step_seconds_ = 0;    // the last step's wall time, and a checkpoint's (predicted, then measured)
    double checkpoint_seconds_ = 0;
    int checkpoint_errors_ = 0;  // --on-checkpoint-error continue: the checkpoints that failed
    // --skip-spikes: the detector, the bad steps in a row (with their batches' positions), the
    // batches never to train on again (after a roll-back), counts for the summary.
    SpikeDetector spikes_;
    std::vector<std::pair<int, std::pair<uint64_t, size_t>>> bad_streak_;
    std::set<std::pair<uint64_t, size_t>> skip_batches_;
    std::pair<uint64_t, size_t> batch_at_{0, 0};
    int spikes_skipped_ = 0, spikes_loss_ = 0, rollbacks_ = 0;
    bool roll_back_now_ = false;
    std::map<int, float> injected_;   // MEMFIT_TEST_GRAD_SPIKES (tests): step -> loss-gradient factor
    std::set<int> bad_batches_;       // and the steps whose batch it spoils
    std::string metrics_path_;
    int metrics_lost_ = 0;            // lines that could not be written
    std::FILE * metrics_ = nullptr;
    std::string base_digest_;    // LoRA: the base weights' digest (a model folder's; "" when initialised)
    std::string run_id_;         // this run's identity, recorded in its checkpoints (resumed: theirs)
    int lock_fd_ = -1;           // the lock on --out, held until the run ends
    int ckpt_lock_fd_ = -1;      // and on --checkpoint-dir, when it is outside --out
    std::vector<int32_t> in_, tg_, my_in_, my_tg_;   // the global batch; this rank's rows of it
    std::vector<int32_t> ds_, my_ds_;                // packed documents: each token's document start
    const int32_t * my_starts() const { return eo_.documents ? my_ds_.data() : nullptr; }
    LrSchedule sched_;
    BudgetFile budget_file_;
    std::vector<std::string> replans_;
    double total_time_ = 0, wall_ = 0;
    long long total_tokens_ = 0;
    long long trained_tokens_ = 0;   // the targets the loss counted (all ranks)
    float last_loss_ = 0, last_val_ = NAN;
    double last_grad_norm_ = 0;
    int skipped_in_a_row_ = 0;   // fp16 steps the loss scaler skipped, consecutively
    static constexpr int kMaxSkippedInARow = 10;
    Timeline timeline_;          // the last step, op by op, for the report
    Timeline leak_a_, leak_b_;   // --check-leaks: steps 2 and 3
    Timeline flight_;            // every other step, for the report of a step that fails
    std::unique_ptr<TensorBoardWriter> tensorboard_;   // --tensorboard: this rank's files
    bool tensorboard_warned_ = false;  // a write failed (warned once)
    nlohmann::json ranks_memory_;      // every rank's memory at the last log point (metrics.jsonl)
    std::set<std::string> op_names_;   // names of the ops other ranks' timelines hold (gather_rank_views)
    std::vector<CurvePoint> loss_curve_, val_curve_, tps_curve_, margins_curve_, accuracy_curve_;
    std::vector<CurvePoint> aux_curve_, load_curve_;     // a mixture of experts' routing
    std::vector<std::vector<double>> expert_tokens_;     // its last step's tokens per expert
    // Preference tuning: each window's reference log-probability (--reference precompute; empty
    // otherwise), the windows of the batch in hand, this rank's rows of their references, and
    // the last evaluation's metrics.
    std::vector<float> train_ref_, val_ref_, my_ref_;
    std::vector<uint64_t> windows_;
    PreferenceMetrics val_pref_;
};

}  // namespace memfit
