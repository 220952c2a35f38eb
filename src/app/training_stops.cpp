// A TrainingRun's stops and checkpoints: a stop signal at a step boundary (every rank at the
// same one) or in flight, the checkpoint it and the periodic ones write, the bad steps of
// --skip-spikes and --spike-rollback's return to the last checkpoint.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "app/export.h"
#include "app/run_checkpoints.h"
#include "app/stop_request.h"
#include "core/json_num.h"
#include "app/training_run.h"
#include "core/error.h"
#include "train/checkpoint.h"

namespace memfit {

namespace fs = std::filesystem;

// A stop signal is acted on at a step boundary, by every rank at the same one: a rank that got
// it tells the others (mpirun forwards SIGUSR1 to each rank, not necessarily between the same
// two steps).
bool TrainingRun::stop_now() {
    if (world_ == 1) return stop_requested();
    return comm_->all_reduce_sum(stop_requested() ? 1.0 : 0.0) > 0;
}

// Whether the step in flight would end, and its checkpoint be written, within the grace time
// left; if not, it is abandoned (its update has not begun) and the previous step checkpointed.
bool TrainingRun::abandon_step() const {
    const double left = opt_.stop_grace - seconds_since_stop_request();
    const double in_step = std::chrono::duration<double>(Clock::now() - step_t0_).count();
    return std::max(0.0, step_seconds_ - in_step) + checkpoint_seconds_ > left;
}

// After a stop signal: the last completed step's checkpoint (unless it was just written), then
// finish() writes the summary and the report as for a whole run.
void TrainingRun::stopped(int last_done) {
    std::string where = first_step_ > 1 ? "no step ran in this process: the checkpoint it resumed from stands"
                                        : "before the first step: nothing to save";
    if (last_done >= first_step_) {
        const bool written = opt_.checkpoint_every > 0 && last_done % opt_.checkpoint_every == 0;
        if (!written) {
            // Without --checkpoint-every the folder was not checked before the first step: rank 0
            // checks it now and every rank learns the outcome (the checkpoint is collective).
            std::string problem;
            if (lead_ && opt_.checkpoint_every == 0 && !opt_.save_final) {
                try {
                    check_writable(checkpoint_root(), "--checkpoint-dir");
                    check_own_checkpoints(checkpoint_root(), run_id_);
                } catch (const Error & e) {
                    problem = e.what();
                }
            }
            const bool refused = world_ > 1 ? comm_->all_reduce_sum(problem.empty() ? 0.0 : 1.0) > 0 : !problem.empty();
            if (refused)
                throw Error(fmt::format("stopped by {} at step {}, but no checkpoint was written: {}",
                                        stop_signal_name(), last_done, lead_ ? problem : "rank 0 could not"));
            checkpoint(last_done, false);
            retire_other_runs();
        }
        where = fmt::format("checkpoint {}/step-{:06d}", checkpoint_root(), last_done);
    }
    // On stderr whatever --progress says, as an error would be: a scheduler's log shows it.
    progress_.finish();
    if (lead_)
        std::fprintf(stderr, "memfit: stopped by %s at step %d of %d (%s; %s); rerun with --resume auto to continue\n",
                     stop_signal_name().c_str(), last_done, opt_.steps,
                     abandoned_ ? fmt::format("step {} was abandoned to fit --stop-grace {:g} s", last_done + 1,
                                              opt_.stop_grace).c_str()
                                : "at a step boundary",
                     where.c_str());
}

// --spike-rollback: back to the newest checkpoint (written before the bad steps began), with
// the bad steps' batches left out from now on. Returns the checkpoint's step.
int TrainingRun::roll_back() {
    roll_back_now_ = false;
    std::string dir = newest_checkpoint(checkpoint_root());
    // Only this run's own (another run's, left for --save-final to replace, is not a roll-back).
    if (!dir.empty() && json_string_or(load_checkpoint_meta(dir), "run_id") != run_id_) dir.clear();
    const int first = bad_streak_.front().first, last = bad_streak_.back().first;
    if (dir.empty())
        throw Error(fmt::format("--skip-spikes: steps {} to {} were all bad ({} in a row) and there is no checkpoint "
                                "to roll back to; hint: --checkpoint-every N", first, last, bad_streak_.size()));
    for (const auto & b : bad_streak_) skip_batches_.insert(b.second);
    const int at = resume_from(dir, cfg_, opt_, run_.global_batch, *engine_, *train_data_, val_data_.get(),
                               base_digest_);
    ++rollbacks_;
    say(fmt::format("  roll-back: steps {} to {} were bad; back to {} (step {}), their {} batches left out", first,
                    last, dir, at, bad_streak_.size()));
    if (lead_) {
        // The batches' positions in the data ([epoch, first token]), as the checkpoints record them.
        nlohmann::json left_out = nlohmann::json::array();
        for (const auto & b : bad_streak_) left_out.push_back({b.second.first, b.second.second});
        write_metrics({{"step", last}, {"event", "rollback"}, {"to_step", at}, {"skipped_batches", left_out}});
    }
    bad_streak_.clear();
    return at;
}

// --save-final without --checkpoint-every: another run's checkpoints in the folder are replaced
// by this run's final one (as a new run replaces metrics.jsonl and summary.json in --out), said
// before the first step.
void TrainingRun::warn_other_runs() {
    const std::vector<std::string> others = other_runs_checkpoints(checkpoint_root(), run_id_);
    if (others.empty()) return;
    warn(fmt::format("{} holds {} checkpoint{} of another run (newest {}); this run's final checkpoint replaces them "
                     "once it is written (--resume {} continues that run instead; --out DIR keeps both; "
                     "--save-final false writes none)",
                     checkpoint_root(), others.size(), others.size() == 1 ? "" : "s",
                     fs::path(others.back()).filename().string(), checkpoint_root()));
}

// After this run's checkpoint is written (and only then): the other runs' go.
void TrainingRun::retire_other_runs() {
    if (!lead_ || !opt_.save_final || opt_.checkpoint_every > 0 || checkpoint_errors_ > 0) return;
    std::error_code ec;
    for (const std::string & dir : other_runs_checkpoints(checkpoint_root(), run_id_)) fs::remove_all(dir, ec);
}

std::string TrainingRun::checkpoint_root() const {
    return opt_.checkpoint_dir.empty() ? (fs::path(opt_.out) / "checkpoints").string() : opt_.checkpoint_dir;
}

void TrainingRun::checkpoint(int step, bool log_point) {
    const std::string root = checkpoint_root();
    nlohmann::json meta = checkpoint_meta(step, cfg_, opt_, run_.global_batch, *train_data_, val_data_.get(), eo_.lora,
                                          base_digest_);
    meta["run_id"] = run_id_;
    if (last_step_ > 0 && std::isfinite(last_loss_)) meta["loss"] = last_loss_;   // the resume's yardstick
    if (!data_.tokenizer.empty()) {   // memfit export copies its files, if they are still these
        meta["tokenizer"] = data_.tokenizer;
        meta["tokenizer_files"] = tokenizer_file_digests(data_.tokenizer);
    }
    if (!skip_batches_.empty()) meta["skipped_batches"] = skip_batches_;
    const auto t0 = Clock::now();
    std::string dir;
    try {
        dir = write_checkpoint(root, *engine_, meta, opt_.keep_checkpoints, *comm_);
    } catch (const Error & e) {   // every rank sees it (a sharded write agrees on failure)
        const std::string previous = newest_checkpoint(root);
        const std::string kept = previous.empty() ? std::string("there is no earlier one")
                                                  : fmt::format("{} is intact", previous);
        if (opt_.on_checkpoint_error != "continue")
            throw IoError(fmt::format("the checkpoint of step {} failed ({}): {}; hint: free space, or "
                                      "--on-checkpoint-error continue to train on", step, kept, e.what()));
        ++checkpoint_errors_;
        if (lead_)
            std::fprintf(stderr, "memfit: warning: the checkpoint of step %d failed (%s): %s; training goes on "
                         "(--on-checkpoint-error continue)\n", step, kept.c_str(), e.what());
        return;
    }
    checkpoint_seconds_ = std::chrono::duration<double>(Clock::now() - t0).count();
    if (log_point) say(fmt::format("  checkpoint {} ({:.2f} s)", dir, checkpoint_seconds_));
}

// --skip-spikes: a step left out (its loss or gradient norm above the limit, or not finite) is
// a bad step; enough of them in a row roll the run back (train()). Returns what the step's
// metrics line says of it ("" for a good step).
std::string TrainingRun::note_spike(const StepResult & r, int step, const OptimHyper & h) {
    if (!spikes_.enabled()) return "";
    const TrainOptions & opt = opt_;
    const bool fp16_overflow = eo_.compute == DType::f16 && !std::isfinite(r.grad_norm) && !r.loss_outlier;
    if (fp16_overflow) return "";   // the loss scaler's: neither a bad step nor a good one
    if (!r.skipped) {
        spikes_.accept(r.loss, r.grad_norm);
        bad_streak_.clear();
        return "";
    }
    const double norm_limit = std::sqrt(double(h.skip_above_norm_sq));
    std::string spike;
    if (r.loss_outlier)
        spike = std::isfinite(r.loss) ? fmt::format("loss {:.4g} above {:.4g} (z > {:g}): not applied", r.loss,
                                                    h.skip_above_loss, opt.skip_spikes)
                                      : fmt::format("loss {}: not applied", r.loss);
    else
        spike = std::isfinite(r.grad_norm) ? fmt::format("gradient norm {:.4g} above {:.4g} (z > {:g}): not applied",
                                                         r.grad_norm, norm_limit, opt.skip_spikes)
                                           : fmt::format("gradient norm {}: not applied", r.grad_norm);
    ++spikes_skipped_;
    if (r.loss_outlier) ++spikes_loss_;
    bad_streak_.push_back({step, batch_at_});
    say(fmt::format("  spike at step {}: {}", step, spike));
    roll_back_now_ = opt.spike_rollback > 0 && int(bad_streak_.size()) >= opt.spike_rollback;
    return spike;
}

}  // namespace memfit
