// A TrainingRun's last phase: planned against measured memory (every rank's), the summary,
// the report and trace, and the text sample.
#include "app/trainer.h"
#include "app/training_run.h"
#include <fcntl.h>
#include <omp.h>
#include <sys/file.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include "app/divergence.h"
#include "core/text.h"
#include "app/rank_report.h"
#include "app/spike_detector.h"
#include "app/stop_request.h"
#include "app/report.h"
#include "app/run_checkpoints.h"
#include "backend/make_backend.h"
#include "backend/quant_format.h"
#include "comm/communicator.h"
#include "comm/device_communicator.h"
#include "comm/groups.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/file_digest.h"
#include "core/json_num.h"
#include "core/paths.h"
#include "core/units.h"
#include "data/data_loader.h"
#include "data/instruct.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "infer/generate.h"
#include "memory/budget.h"
#include "model/hf_weights.h"
#include "model/tensor_parallel.h"
#include "plan/fit.h"
#include "report/chrome_trace.h"
#include "report/html_report.h"
#include "report/memory_report.h"
#include "report/progress.h"
#include "run/compat.h"
#include "tokenizer/tokenizer.h"
#include "train/checkpoint.h"
#include "train/engine.h"
#include "train/replan.h"
#include "train/schedule.h"

namespace memfit {

namespace fs = std::filesystem;

// Planned against measured: this rank's categories, RSS, the device, every rank's.
void TrainingRun::report_memory(const RankMemory & rank_memory, uint64_t rss) {
    const Ledger & L = engine_->ledger();
    const CategoryBytes plan_live = engine_->planned_peak_live(), plan_rsv = engine_->planned_reserved();
    if (opt_.check_lifetimes)
        say("  (--check-lifetimes: every buffer had its own allocation, so reserved bytes are not the plan's regions)");
    say(fmt::format("memory: planned vs measured (measured = bytes the engine acquired and obtained while running)\n{}",
                    format_plan_vs_measured(plan_live, L.live_peak(), plan_rsv, L.reserved_peak())));
    say(fmt::format("  peak RSS {} (planned reserved {} + code, libraries, data loader)", format_bytes(rss),
                    format_bytes(plan_rsv.total())));
    if (!backend_->host_memory())
        say(opt_.check_lifetimes ? "  device memory: not compared with the plan under --check-lifetimes (per-buffer "
                                  "allocations, freed after last use)"
                                : format_device_memory(plan_rsv.total(), backend_->runtime_bytes(),
                                                       backend_->device_used_delta()));
    if (world_ > 1) say(format_rank_memory(rank_memory));
    if (world_ > 1) {   // each rank's own program's plan (tensor and pipeline ranks run different ones)
        std::string lines = "per rank: planned vs measured peak live (equal: every category's peak live and reserved)";
        for (size_t k = 0; k < size_t(world_); ++k) {
            const bool equal = rank_memory.live[k].v == rank_memory.planned_live[k].v &&
                               rank_memory.reserved[k].v == rank_memory.planned_reserved[k].v;
            lines += fmt::format("\n  {}: planned {}, measured {}{}", rank_label(layout_, int(k)),
                                 format_bytes(rank_memory.planned_live[k].total()),
                                 format_bytes(rank_memory.live[k].total()), equal ? " (equal)" : "");
        }
        say(lines);
    }
}

namespace {

// Instruction data's sample is a turn: the first validation conversation (else the first training
// one) up to its first trained token (its system and user turns and the generation prompt, as
// the template rendered them), continued until the template's end-of-turn or end-of-text token.
struct ChatSample {
    std::vector<int32_t> prompt, stop;
};
std::optional<ChatSample> chat_sample(const DataSource & data, const Tokenizer & tok, int vocab) {
    const TokenFile f(data.val_path.empty() ? data.train_path : data.val_path);
    if (!f.documents() || f.num_docs() == 0) return std::nullopt;
    const uint64_t begin = f.doc_begin(0), end = f.doc_end(0);
    ChatSample s;
    for (uint64_t i = begin; i < end && !f.trained(i); ++i) {
        if (f.token(i) < 0 || f.token(i) >= vocab) return std::nullopt;
        s.prompt.push_back(f.token(i));
    }
    if (s.prompt.empty() || s.prompt.size() == end - begin) return std::nullopt;
    try {
        const ChatFormat chat = load_chat_format(data.tokenizer, tok, "auto");
        for (const int32_t id : {chat.end_of_turn_id, chat.eos_id})
            if (id >= 0) s.stop.push_back(id);
    } catch (const Error &) {
        // no template beside the tokenizer: its end-of-text token alone
    }
    if (s.stop.empty() && tok.eot_id() >= 0) s.stop.push_back(tok.eot_id());
    return s;
}

}  // namespace

// A text sample from the trained weights (the whole model's), with the positions it used.
std::pair<std::string, int> TrainingRun::sample(const std::vector<float> & weights) {
    auto tok = make_tokenizer(data_.tokenizer, data_dir());
    std::vector<int32_t> prompt = tok->encode("\n");
    SampleOptions so;
    so.max_new_tokens = opt_.sample_tokens;
    so.seed = opt_.seed;
    std::string head = "sample (temperature 0.8):\n";
    if (const auto chat = chat_sample(data_, *tok, cfg_.vocab_size)) {
        prompt = chat->prompt;
        so.stop = chat->stop;
        head = fmt::format("sample (a turn of the {} split's first conversation, temperature 0.8):\n{}",
                           data_.val_path.empty() ? "training" : "validation", printable_text(tok->decode(prompt)));
    }
    // The decoder computes on host memory: a device run samples from its weights on the CPU.
    const std::unique_ptr<Backend> host_backend = backend_->host_memory() ? nullptr : make_backend("cpu");
    // Inside the trained context: when the cache fills, the last half is re-run (generate.h).
    Decoder decoder(cfg_, host_backend ? *host_backend : *backend_,
                    std::min(cfg_.trained_context(), int(prompt.size()) + so.max_new_tokens));
    decoder.set_weights(weights.data());
    const auto ids = generate(decoder, prompt, so);
    const std::string text = tok->decode(ids);
    say(head + printable_text(text));
    return {text, decoder.capacity()};
}

void TrainingRun::finish() {
    const Ledger & L = engine_->ledger();
    const CategoryBytes plan_live = engine_->planned_peak_live(), plan_rsv = engine_->planned_reserved();
    const uint64_t rss = peak_rss_bytes();
    const double tps = total_time_ > 0 ? double(total_tokens_) / total_time_ : 0.0;
    // Every rank's measured memory, for the min/max over ranks (a collective: before rank 0 goes
    // its own way).
    const RankMemory rank_memory = gather_memory(*comm_, L, rss, plan_live, plan_rsv);
    const std::string bubble = layout_.pp > 1 ? pipeline_idle(*comm_, layout_, timeline_, accum_) : std::string();
    // The whole model's weights for the sample (collective under ZeRO).
    const bool want_sample = opt_.sample_tokens > 0 && !data_.tokenizer.empty() && !opt_.profile;
    std::vector<float> sample_weights;
    if (want_sample && (lead_ || eo_.zero > 0 || layout_.tp > 1 || layout_.pp > 1 || eo_.expert_parallel > 1))
        sample_weights = engine_->merged_weights();
    std::vector<RankView> rank_views;
    if (world_ > 1) rank_views = gather_rank_views();
    if (!lead_) return;
    report_memory(rank_memory, rss);
    if (!bubble.empty()) say(bubble);
    say(fmt::format("done: {} steps in {:.1f} s, {:.0f} tokens/s, final loss {:.4f}{}", last_step_, wall_, tps, last_loss_,
                    std::isnan(last_val_) ? std::string() : fmt::format(", validation loss {:.4f}", last_val_)));

    nlohmann::json summary = {
        {"config", {{"model", cfg_.name}, {"family", cfg_.family}, {"n_layer", cfg_.n_layer}, {"n_embd", cfg_.n_embd},
                    {"n_head", cfg_.n_head}, {"n_kv_head", cfg_.kv_heads()}, {"ffn", cfg_.ffn_dim()},
                    {"vocab_size", cfg_.vocab_size}, {"params", cfg_.num_params()}, {"batch", batch_},
                    {"grad_accum", accum_}, {"attention", eo_.flash_attention ? "flash" : "naive"},
                    {"recompute", eo_.recompute.name}, {"loss_chunk", eo_.loss_chunk},
                    {"seq", opt_.seq}, {"steps", opt_.steps}, {"data_parallel", ranks_}, {"tensor_parallel", layout_.tp}, {"pipeline_parallel", layout_.pp},
                    {"expert_parallel", eo_.expert_parallel}, {"zero", eo_.zero},
                    {"bucket_bytes", eo_.bucket_bytes}, {"lr", json_float(opt_.lr)}, {"weight_decay", json_float(opt_.weight_decay)},
                    {"seed", opt_.seed}, {"threads", omp_get_max_threads()}, {"precision", precision_name(eo_.compute)},
                    {"data", data_.train_path}, {"tokenizer", data_.tokenizer},
                    {"trainable_params", engine_->total_params()}}},
        {"planned", {{"peak_live", category_json(plan_live)}, {"reserved", category_json(plan_rsv)}}},
        {"measured", {{"peak_live", category_json(L.live_peak())}, {"reserved", category_json(L.reserved_peak())},
                      {"peak_live_total", L.live_total_peak()}}},
        {"peak_rss_bytes", rss},
        {"device", {{"name", backend_->name()}, {"runtime_bytes", backend_->runtime_bytes()},
                    {"used_delta_bytes", backend_->device_used_delta()}}},
        {"per_rank", rank_memory_json(rank_memory)},
        {"tokens_per_s", tps},
        {"trained_tokens", trained_tokens_},
        {"trained_tokens_per_s", total_time_ > 0 ? double(trained_tokens_) / total_time_ : 0.0},
        {"final_loss", last_loss_},
        {"steps_done", last_step_},
        {"wall_s", wall_}};
    if (last_step_ < opt_.steps) summary["stopped_by"] = stop_signal_name();
    if (checkpoint_errors_ > 0) summary["checkpoint_errors"] = checkpoint_errors_;
    if (spikes_.enabled())
        summary["spikes"] = {{"skipped", spikes_skipped_}, {"loss_outliers", spikes_loss_}, {"rollbacks", rollbacks_},
                             {"batches_left_out", skip_batches_.size()}};
    if (!std::isnan(last_val_)) summary["final_val_loss"] = last_val_;
    summary[kRunConfigKey] = resolved_config(opt_, run_, eo_, ranks_);
    if (eo_.compute == DType::f16) {
        summary["loss_scale"] = engine_->loss_scaler().scale;
        summary["skipped_steps"] = engine_->loss_scaler().skipped;
        say(fmt::format("  fp16 loss scaling: {} skipped steps, scale now {:g}", engine_->loss_scaler().skipped,
                        engine_->loss_scaler().scale));
    }

    // The memory report of the last step (and the training curves).
    nlohmann::json flat = summary["config"];
    flat["tokens_per_s"] = std::round(tps);
    flat["trained_tokens"] = trained_tokens_;
    const std::string title = fmt::format("memfit {}: {}, batch {} x seq {}", opt_.profile ? "profile" : "train",
                                          cfg_.name, batch_, opt_.seq);
    ReportData rep = build_report(*engine_, timeline_, title, flat, eo_.budget);
    rep.ranks = std::move(rank_views);
    if (!opt_.profile) {
        rep.loss = loss_curve_;
        rep.val_loss = val_curve_;
        rep.tokens_per_s = tps_curve_;
        rep.margins = margins_curve_;
        rep.accuracies = accuracy_curve_;
        rep.aux_loss = aux_curve_;
        rep.max_load = load_curve_;
        rep.expert_tokens = expert_tokens_;
    }
    const std::string html_path = (fs::path(opt_.out) / "report.html").string();
    const std::string trace_path = (fs::path(opt_.out) / "trace.json").string();
    // A report that cannot be written costs neither the summary nor the run's exit status: a warning.
    std::string report_error;
    try {
        write_html_report(html_path, rep);
        write_chrome_trace(trace_path, rep);
    } catch (const Error & e) {
        report_error = e.what();
    }
    for (const auto & hnt : rep.hints) say("  hint: " + hnt);

    if (want_sample) {
        // The sample needs only the merged weights: the engine's memory goes back first, so that
        // the decoder's weights and cache do not add to the run's peak RSS.
        engine_.reset();
        const auto [text, positions] = sample(sample_weights);
        summary["sample"] = text;
        summary["sample_positions"] = positions;   // at most the trained context
    }
    const std::string summary_path = (fs::path(opt_.out) / "summary.json").string();
    if (metrics_lost_ > 0) summary["metrics_lines_lost"] = metrics_lost_;
    // Atomic: a resumed run's summary that cannot be written leaves the earlier one whole.
    write_file_atomic(summary_path, summary.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    if (!report_error.empty()) {
        warn(fmt::format("{}; {} and {} were written", report_error, metrics_path_, summary_path));
        return;
    }
    say(fmt::format("wrote {}, {}, {} and {}", html_path, trace_path, metrics_path_, summary_path));
}

}  // namespace memfit
