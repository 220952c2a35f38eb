// Watching a TrainingRun while it goes (and when it fails): run.json, what `memfit monitor`
// compares against (each rank's plan, the budget, the steps); every rank's memory at the log
// points, into metrics.jsonl's "ranks" and each rank's TensorBoard files; the report of a step
// that ran out of memory, up to the op that failed; every rank's last step for report.html's
// per-rank view and trace.json's one process per rank.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <initializer_list>
#include <set>

#include <fmt/format.h>

#include "app/monitor.h"
#include <nlohmann/json.hpp>

#include "app/report.h"
#include "app/training_run.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "report/chrome_trace.h"
#include "report/html_report.h"
#include "report/memory_report.h"

namespace memfit {

namespace fs = std::filesystem;

namespace {

// The bytes of every category that has any, as an object (the metrics lines stay short).
nlohmann::json nonzero_json(const CategoryBytes & b) {
    nlohmann::json j = nlohmann::json::object();
    for (size_t c = 0; c < kCategoryCount; ++c)
        if (b.v[c]) j[std::string(kCategoryNames[c])] = b.v[c];
    return j;
}

// Every rank's categories of each of `parts` then its `extra` values, rank after rank (host
// values over the world communicator): one all-gather.
std::vector<uint64_t> gather(Communicator & comm, std::initializer_list<CategoryBytes> parts,
                             std::initializer_list<uint64_t> extra) {
    std::vector<uint64_t> mine;
    for (const CategoryBytes & b : parts) mine.insert(mine.end(), b.v.begin(), b.v.end());
    mine.insert(mine.end(), extra);
    std::vector<uint64_t> all(mine.size() * size_t(comm.size()));
    comm.all_gather(mine.data(), all.data(), mine.size() * sizeof(uint64_t));
    return all;
}

CategoryBytes slice(const std::vector<uint64_t> & all, size_t at) {
    CategoryBytes b;
    for (size_t c = 0; c < kCategoryCount; ++c) b.v[c] = all[at + c];
    return b;
}

// One timeline as bytes (names spelled out: tensor and pipeline ranks run other programs).
struct Packed {
    int32_t op, layer;
    uint8_t phase;
    uint64_t live[kCategoryCount];
    double begin_us, end_us;
};

std::vector<uint8_t> pack(const Timeline & t) {
    std::vector<uint8_t> out(sizeof(double) + sizeof(int32_t));
    std::memcpy(out.data(), &t.origin_s, sizeof(double));
    std::memcpy(out.data() + sizeof(double), &t.failed_op, sizeof(int32_t));
    for (const auto & e : t.events) {
        Packed p{};
        p.op = e.op;
        p.layer = e.layer;
        p.phase = uint8_t(e.phase);
        for (size_t c = 0; c < kCategoryCount; ++c) p.live[c] = e.live.v[c];
        p.begin_us = e.begin_us;
        p.end_us = e.end_us;
        const uint16_t n = uint16_t(std::min<size_t>(std::strlen(e.name), 65535));
        const size_t at = out.size();
        out.resize(at + sizeof p + sizeof n + n);
        std::memcpy(out.data() + at, &p, sizeof p);
        std::memcpy(out.data() + at + sizeof p, &n, sizeof n);
        std::memcpy(out.data() + at + sizeof p + sizeof n, e.name, n);
    }
    return out;
}

Timeline unpack(const std::vector<uint8_t> & in, std::set<std::string> & names) {
    Timeline t;
    t.program = "train";
    std::memcpy(&t.origin_s, in.data(), sizeof(double));
    std::memcpy(&t.failed_op, in.data() + sizeof(double), sizeof(int32_t));
    for (size_t at = sizeof(double) + sizeof(int32_t); at + sizeof(Packed) + sizeof(uint16_t) <= in.size();) {
        Packed p;
        uint16_t n;
        std::memcpy(&p, in.data() + at, sizeof p);
        std::memcpy(&n, in.data() + at + sizeof p, sizeof n);
        const auto * name = reinterpret_cast<const char *>(in.data() + at + sizeof p + sizeof n);
        at += sizeof p + sizeof n + n;
        TimelineEvent e;
        e.op = p.op;
        e.layer = p.layer;
        e.phase = Phase(p.phase);
        for (size_t c = 0; c < kCategoryCount; ++c) e.live.v[c] = p.live[c];
        e.begin_us = p.begin_us;
        e.end_us = p.end_us;
        e.name = names.insert(std::string(name, n)).first->c_str();
        t.events.push_back(e);
    }
    return t;
}

constexpr int kTimelineTag = 7301;

}  // namespace

void TrainingRun::start_watch() {
    const std::vector<uint64_t> planned = gather(*comm_, {engine_->planned_peak_live()}, {});
    const std::vector<uint64_t> reserved = comm_->all_gather_u64(engine_->planned_reserved().total());
    if (!opt_.tensorboard.empty()) {
        tensorboard_ = std::make_unique<TensorBoardWriter>(
            (fs::path(opt_.tensorboard) / fmt::format("rank{}", comm_->rank())).string());
        // A resumed run: its steps replace those an earlier process logged from there on.
        if (first_step_ > 1 && !tensorboard_->session_start(first_step_))
            throw IoError(fmt::format("{}: cannot write ({})", tensorboard_->path(), tensorboard_->error()));
    }
    if (!lead_) return;
    nlohmann::json j = {{"pid", ::getpid()}, {"pid_start", process_start_ticks(::getpid())},
                        {"started", std::time(nullptr)}, {"model", cfg_.name},
                        {"steps", opt_.steps}, {"first_step", first_step_}, {"world", world_},
                        {"budget", eo_.budget}, {"device", backend_->name()}, {"ranks", nlohmann::json::array()}};
    if (!opt_.tensorboard.empty()) j["tensorboard"] = opt_.tensorboard;
    for (int k = 0; k < world_; ++k) {
        const CategoryBytes p = slice(planned, size_t(k) * kCategoryCount);
        j["ranks"].push_back({{"rank", k}, {"label", rank_label(layout_, k)}, {"planned_peak", nonzero_json(p)},
                              {"planned_peak_total", p.total()}, {"planned_reserved_total", reserved[size_t(k)]}});
    }
    write_file_atomic((fs::path(opt_.out) / "run.json").string(), j.dump(2) + "\n");
}

void TrainingRun::add_moe_metrics(nlohmann::json & m, const StepResult & r) const {
    if (r.expert_tokens.empty()) return;
    const size_t E = size_t(cfg_.moe.experts), L = r.expert_tokens.size() / E;
    nlohmann::json layers = nlohmann::json::array();
    double worst = 0;
    for (size_t l = 0; l < L; ++l) {
        std::vector<double> row(r.expert_tokens.begin() + std::ptrdiff_t(l * E),
                                r.expert_tokens.begin() + std::ptrdiff_t((l + 1) * E));
        double sum = 0, most = 0;
        for (double v : row) sum += v, most = std::max(most, v);
        if (sum > 0) worst = std::max(worst, most * double(E) / sum);
        layers.push_back(row);
    }
    m["moe/aux_loss"] = r.aux_loss;
    m["moe/z_loss"] = r.z_loss;
    m["moe/max_load"] = worst;
    m["moe/tokens_per_expert"] = layers;
    if (eo_.expert_parallel > 1) m["moe/dropped"] = r.moe_dropped;   // past --moe-capacity-factor
}

// Every rank at every log point (a collective): its memory to its TensorBoard files; rank 0
// gets every rank's for metrics.jsonl.
nlohmann::json TrainingRun::watch(int step, const ProgressLine & pl, const StepResult & r) {
    const Ledger & L = engine_->ledger();
    const uint64_t rss = current_rss_bytes();
    const std::vector<uint64_t> all = gather(*comm_, {L.live(), L.live_peak()}, {rss, peak_rss_bytes()});
    if (tensorboard_) {
        std::vector<std::pair<std::string, double>> s = {
            {"train/loss", pl.loss}, {"train/lr", pl.lr}, {"train/grad_norm", pl.grad_norm},
            {"train/tokens_per_s", pl.tokens_per_s}, {"train/ms_per_step", pl.ms_per_step}};
        if (!std::isnan(pl.val_loss)) s.push_back({"train/val_loss", pl.val_loss});
        if (!std::isnan(pl.trained_per_s)) s.push_back({"train/trained_tokens_per_s", pl.trained_per_s});
        if (eo_.compute == DType::f16) s.push_back({"train/loss_scale", r.loss_scale});
        for (const auto & [k, v] : r.pref.means()) s.push_back({"train/" + k, v});
        if (!r.expert_tokens.empty()) {
            nlohmann::json moe;
            add_moe_metrics(moe, r);
            for (const char * k : {"moe/aux_loss", "moe/z_loss", "moe/max_load"}) s.push_back({k, moe[k].get<double>()});
        }
        if (!std::isnan(pl.val_loss))
            for (const auto & [k, v] : val_pref_.means()) s.push_back({"eval/" + k, v});
        for (size_t c = 0; c < kCategoryCount; ++c) {
            s.push_back({fmt::format("memory/live/{}", kCategoryNames[c]), double(L.live().v[c])});
            s.push_back({fmt::format("memory/peak/{}", kCategoryNames[c]), double(L.live_peak().v[c])});
        }
        s.push_back({"memory/live_total", double(L.live_total())});
        s.push_back({"memory/peak_total", double(L.live_total_peak())});
        s.push_back({"memory/rss", double(rss)});
        // A file that cannot be written (a full disk) costs its lines, not the run: one warning per rank.
        if (!tensorboard_->write(step, s) && !tensorboard_warned_) {
            tensorboard_warned_ = true;
            const std::string w = fmt::format("{}: cannot write step {} ({}); training goes on, and later steps are "
                                              "tried again", tensorboard_->path(), step, tensorboard_->error());
            if (lead_) warn(w);
            else std::fprintf(stderr, "memfit: warning: rank %d: %s\n", comm_->rank(), w.c_str());
        }
    }
    nlohmann::json ranks = nlohmann::json::array();
    if (!lead_) return ranks;
    const size_t n = all.size() / size_t(world_);
    for (int k = 0; k < world_; ++k) {
        const size_t at = size_t(k) * n;
        ranks.push_back({{"rank", k}, {"live", nonzero_json(slice(all, at))},
                         {"peak", nonzero_json(slice(all, at + kCategoryCount))},
                         {"rss", all[at + 2 * kCategoryCount]}, {"peak_rss", all[at + 2 * kCategoryCount + 1]}});
    }
    return ranks;
}

// Every rank's plan, measurement and last step, gathered by rank 0 (a collective; rank 0's
// result only).
std::vector<RankView> TrainingRun::gather_rank_views() {
    const Ledger & L = engine_->ledger();
    const std::vector<uint64_t> all = gather(*comm_, {engine_->planned_peak_live(), L.live_peak()}, {peak_rss_bytes()});
    const std::vector<uint8_t> packed = pack(timeline_);
    const std::vector<uint64_t> sizes = comm_->all_gather_u64(packed.size());
    std::vector<RankView> views;
    if (!lead_) {
        comm_->send(packed.data(), packed.size(), 0, kTimelineTag);
        return views;
    }
    for (int k = 0; k < world_; ++k) {
        const size_t at = size_t(k) * (all.size() / size_t(world_));
        RankView v;
        v.rank = k;
        v.label = rank_label(layout_, k);
        v.planned_peak = slice(all, at);
        v.measured_peak = slice(all, at + kCategoryCount);
        v.peak_rss = all[at + 2 * kCategoryCount];
        if (k == 0) {
            v.timeline = timeline_;
        } else {
            std::vector<uint8_t> in(sizes[size_t(k)]);
            comm_->recv(in.data(), in.size(), k, kTimelineTag);
            v.timeline = unpack(in, op_names_);
        }
        views.push_back(std::move(v));
    }
    return views;
}

// A failing rank's report: rank 0's where the run's report goes, another rank's beside it.
std::string TrainingRun::write_failure_report(const ReportData & rep) const {
    const std::string tag = lead_ ? std::string() : fmt::format("-rank{}", comm_->rank());
    const std::string html = (fs::path(opt_.out) / ("report" + tag + ".html")).string();
    const std::string trace = (fs::path(opt_.out) / ("trace" + tag + ".json")).string();
    fs::create_directories(opt_.out);   // another host's rank may not have the folder yet
    write_html_report(html, rep);
    write_chrome_trace(trace, rep);
    return html + " and " + trace;
}

nlohmann::json TrainingRun::failure_config(int step, const EngineOptions & eo) const {
    nlohmann::json c = {{"model", cfg_.name}, {"micro_batch", eo.B}, {"grad_accum", eo.grad_accum},
                        {"seq", opt_.seq}, {"rank", comm_->rank()}, {"precision", precision_name(eo.compute)},
                        {"recompute", eo.recompute.name}, {"zero", eo.zero}};
    if (step > 0) c["step"] = step;
    return c;
}

void TrainingRun::fail_out_of_memory(const OutOfMemory & e, int step, const Timeline & recorded) {
    std::string where;
    try {
        const std::string files = write_failure_report(build_failure_report(
            *engine_, recorded, fmt::format("memfit train: {} out of memory at step {}{}", cfg_.name, step,
                                            world_ > 1 ? fmt::format(", rank {}", comm_->rank()) : ""),
            failure_config(step, eo_), eo_.budget, e.what()));
        where = recorded.failed_op >= 0 && !recorded.events.empty()
                    ? fmt::format("; step {}'s memory up to op {} ({}), where it failed: {}", step,
                                  recorded.failed_op, recorded.events.back().name, files)
                    : fmt::format("; step {}'s memory (the failure came in its evaluation): {}", step, files);
    } catch (const std::exception & report_error) {
        where = fmt::format(" (the report of the failing step could not be written: {})", report_error.what());
    }
    throw OutOfMemory(e.what() + where);
}

void TrainingRun::fail_refused_plan(const OutOfMemory & e, const EngineOptions & eo) {
    std::string where;
    try {
        const StepPlans plans(cfg_, *backend_, eo);
        const ReportData rep = build_refused_plan_report(
            plans, fmt::format("memfit train: {}, the plan that was refused{}", cfg_.name,
                               world_ > 1 ? fmt::format(" (rank {})", comm_->rank()) : ""),
            failure_config(0, eo), run_.budget, e.what());
        const std::string files = write_failure_report(rep);
        const TimelineEvent & at = rep.timeline.events.back();
        where = fmt::format("; the plan's step up to op {} ({}), where {}: {}", at.op, at.name,
                            run_.budget && at.live.total() > run_.budget ? "its live bytes pass the budget" : "it peaks",
                            files);
    } catch (const std::exception & report_error) {
        where = fmt::format(" (the plan's report could not be written: {})", report_error.what());
    }
    throw OutOfMemory(e.what() + where);
}

}  // namespace memfit
