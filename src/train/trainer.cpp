#include "train/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/paths.h"
#include "core/units.h"
#include "memory/budget.h"
#include "report/memory_report.h"
#include "tokenizer/tokenizer.h"
#include "train/data_loader.h"
#include "train/engine.h"
#include "train/prepare.h"
#include "train/schedule.h"

namespace memfit {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

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
            std::printf("prepared %s: %llu train + %llu validation tokens (%s)\n", dir.c_str(), (unsigned long long) d.train_tokens,
                        (unsigned long long) d.val_tokens, tok.c_str());
        }
    }
    DataSource src;
    src.train_path = (fs::path(dir) / "train.bin").string();
    src.val_path = (fs::path(dir) / "val.bin").string();
    if (!fs::exists(src.train_path))
        throw IoError(fmt::format("{}: no train.bin here; run `memfit prepare --out {}` first", dir, dir));
    std::ifstream meta(fs::path(dir) / "meta.json");
    if (meta) {
        try {
            nlohmann::json j;
            meta >> j;
            src.tokenizer = j.value("tokenizer", "");
        } catch (const std::exception & e) {
            throw FormatError(fmt::format("{}/meta.json: not valid JSON ({})", dir, e.what()));
        }
    }
    TokenFile f(src.train_path);
    src.vocab_size = int(f.vocab_size());
    if (!fs::exists(src.val_path)) src.val_path.clear();
    return src;
}

namespace {

// Sampling: a fresh forward of the whole window per token (no KV cache in this issue).
std::vector<int32_t> sample_text(Engine & engine, std::vector<int32_t> ctx, int n, float temperature, uint64_t seed) {
    const int T = engine.step().T(), V = engine.config().vocab_size;
    std::mt19937_64 rng(seed);
    std::vector<int32_t> window(static_cast<size_t>(T), 0), out;
    for (int i = 0; i < n; ++i) {
        const size_t len = std::min(ctx.size(), size_t(T));
        std::fill(window.begin(), window.end(), 0);
        std::copy(ctx.end() - long(len), ctx.end(), window.begin());
        const std::vector<float> logits = engine.logits(window.data(), 1);
        const float * row = logits.data() + (len - 1) * size_t(V);
        float mx = row[0];
        for (int v = 1; v < V; ++v) mx = std::max(mx, row[v]);
        std::vector<double> p(static_cast<size_t>(V));
        double sum = 0;
        for (int v = 0; v < V; ++v) sum += p[size_t(v)] = std::exp(double(row[v] - mx) / temperature);
        std::uniform_real_distribution<double> u(0.0, sum);
        double r = u(rng), acc = 0;
        int next = V - 1;
        for (int v = 0; v < V; ++v) {
            acc += p[size_t(v)];
            if (r < acc) { next = v; break; }
        }
        ctx.push_back(next);
        out.push_back(next);
    }
    return out;
}

nlohmann::json bytes_json(const CategoryBytes & b) {
    nlohmann::json j = nlohmann::json::object();
    for (size_t c = 0; c < kCategoryCount; ++c) j[std::string(kCategoryNames[c])] = b.v[c];
    j["total"] = b.total();
    return j;
}

}  // namespace

void run_training(const TrainOptions & opt) {
    if (opt.steps < 1) throw ConfigError(fmt::format("--steps {}: must be at least 1", opt.steps));
    if (opt.threads > 0) omp_set_num_threads(opt.threads);
    ModelConfig cfg = resolve_model(opt.model);
    const DataSource data = resolve_data(opt.data, opt.tokenizer, cfg.vocab_size);
    if (cfg.vocab_size == 0) cfg.vocab_size = data.vocab_size;
    if (data.vocab_size > cfg.vocab_size)
        throw ConfigError(fmt::format("the data's vocabulary ({} tokens, {}) is larger than the model's ({}); "
                                      "use a model with a larger vocab_size or other data",
                                      data.vocab_size, data.tokenizer, cfg.vocab_size));
    cfg.validate();

    CpuBackend backend;
    EngineOptions eo;
    eo.B = opt.batch;
    eo.T = opt.seq;
    eo.with_eval = !data.val_path.empty();
    eo.checking = opt.check_lifetimes;
    // Without --memory-budget the plan must still fit the memory this process can have.
    eo.budget = opt.memory_budget.empty() ? available_memory() : parse_bytes(opt.memory_budget);
    DataLoader train_data(data.train_path, opt.batch, opt.seq, opt.seed);
    std::unique_ptr<DataLoader> val_data;
    if (eo.with_eval) val_data = std::make_unique<DataLoader>(data.val_path, opt.batch, opt.seq, opt.seed + 1);

    std::printf("memfit train: model %s (%d layers, %d channels, %d heads, vocab %d, %.2fM parameters)\n",
                cfg.name.c_str(), cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.vocab_size, double(cfg.num_params()) / 1e6);
    std::printf("  data %s (%s), batch %d x seq %d = %d tokens/step, %d steps, %d threads\n", data.train_path.c_str(),
                data.tokenizer.c_str(), opt.batch, opt.seq, opt.batch * opt.seq, opt.steps, omp_get_max_threads());
    Engine engine(cfg, backend, eo);
    const CategoryBytes plan_live = engine.planned_peak_live(), plan_rsv = engine.planned_reserved();
    std::printf("memory plan (%d ops, fp32, peak at op %d '%s'):\n%s", engine.step().program().num_ops(),
                engine.plan().peak_op, engine.step().program().ops()[size_t(engine.plan().peak_op)].name,
                format_plan_table(plan_live, plan_rsv).c_str());
    if (eo.budget)
        std::printf("  budget %s (%s): fits\n", format_bytes(eo.budget).c_str(),
                    opt.memory_budget.empty() ? "available memory" : "--memory-budget");
    engine.init_params(opt.seed);

    fs::create_directories(opt.out);
    const std::string metrics_path = (fs::path(opt.out) / "metrics.jsonl").string();
    std::FILE * metrics = std::fopen(metrics_path.c_str(), "w");
    if (!metrics) throw IoError(fmt::format("{}: cannot write metrics", metrics_path));

    const int BT = opt.batch * opt.seq;
    std::vector<int32_t> in(static_cast<size_t>(BT)), tg(static_cast<size_t>(BT));
    LrSchedule sched{opt.lr, opt.warmup, opt.steps, opt.min_lr_ratio};
    auto evaluate = [&]() {
        double s = 0;
        for (int i = 0; i < opt.eval_batches; ++i) {
            val_data->next(in.data(), tg.data());
            s += engine.eval_loss(in.data(), tg.data());
        }
        return float(s / opt.eval_batches);
    };
    double total_time = 0;
    long long total_tokens = 0;
    float last_loss = 0, last_val = NAN;
    std::vector<double> step_ms;
    const auto t_start = Clock::now();
    for (int step = 1; step <= opt.steps; ++step) {
        train_data.next(in.data(), tg.data());
        AdamWHyper h{sched.at(step), opt.beta1, opt.beta2, opt.eps, opt.weight_decay, step};
        const auto t0 = Clock::now();
        const StepResult r = engine.train_step(in.data(), tg.data(), h);
        const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
        if (!std::isfinite(r.loss))
            throw Error(fmt::format("loss became {} at step {}; hint: lower --lr (now {})", r.loss, step, opt.lr));
        total_time += dt;
        total_tokens += BT;
        step_ms.push_back(dt * 1e3);
        last_loss = r.loss;
        const bool do_eval = eo.with_eval && ((opt.eval_every > 0 && step % opt.eval_every == 0) || step == opt.steps);
        if (do_eval) last_val = evaluate();
        if (step % opt.log_every == 0 || step == 1 || step == opt.steps || do_eval) {
            const double tps = double(BT) / dt;
            const auto & L = engine.ledger();
            std::string val = do_eval ? fmt::format(" | val {:.4f}", last_val) : "";
            std::printf("step %5d/%d | loss %.4f%s | lr %.2e | norm %.3f | %8.0f tok/s | %7.1f ms | mem %s live / %s peak%s\n",
                        step, opt.steps, r.loss, val.c_str(), h.lr, r.grad_norm, tps, dt * 1e3,
                        format_bytes(L.live_total()).c_str(), format_bytes(L.live_total_peak()).c_str(),
                        (" / " + format_bytes(eo.budget) + " budget").c_str());
            std::fflush(stdout);
            nlohmann::json m = {{"step", step}, {"loss", r.loss}, {"lr", h.lr}, {"grad_norm", r.grad_norm},
                                {"tokens_per_s", tps}, {"ms", dt * 1e3}, {"live_bytes", L.live_total()},
                                {"peak_bytes", L.live_total_peak()}};
            if (do_eval) m["val_loss"] = last_val;
            std::fprintf(metrics, "%s\n", m.dump().c_str());
            std::fflush(metrics);
        }
    }
    std::fclose(metrics);
    const double wall = std::chrono::duration<double>(Clock::now() - t_start).count();

    const Ledger & L = engine.ledger();
    const uint64_t rss = peak_rss_bytes();
    const double tps = double(total_tokens) / total_time;
    std::printf("\nmemory: planned vs measured (measured = bytes the engine acquired and obtained while running)\n%s",
                format_plan_vs_measured(plan_live, L.live_peak(), plan_rsv, L.reserved_peak()).c_str());
    std::printf("  peak RSS %s (planned reserved %s + code, libraries, data loader)\n", format_bytes(rss).c_str(),
                format_bytes(plan_rsv.total()).c_str());
    std::printf("done: %d steps in %.1f s, %.0f tokens/s, final loss %.4f", opt.steps, wall, tps, last_loss);
    if (!std::isnan(last_val)) std::printf(", validation loss %.4f", last_val);
    std::printf("\n");

    nlohmann::json summary = {
        {"config", {{"model", cfg.name}, {"n_layer", cfg.n_layer}, {"n_embd", cfg.n_embd}, {"n_head", cfg.n_head},
                    {"vocab_size", cfg.vocab_size}, {"params", cfg.num_params()}, {"batch", opt.batch},
                    {"seq", opt.seq}, {"steps", opt.steps}, {"lr", opt.lr}, {"weight_decay", opt.weight_decay},
                    {"seed", opt.seed}, {"threads", omp_get_max_threads()}, {"precision", "fp32"},
                    {"data", data.train_path}, {"tokenizer", data.tokenizer}}},
        {"planned", {{"peak_live", bytes_json(plan_live)}, {"reserved", bytes_json(plan_rsv)}}},
        {"measured", {{"peak_live", bytes_json(L.live_peak())}, {"reserved", bytes_json(L.reserved_peak())},
                      {"peak_live_total", L.live_total_peak()}}},
        {"peak_rss_bytes", rss},
        {"tokens_per_s", tps},
        {"final_loss", last_loss},
        {"wall_s", wall}};
    if (!std::isnan(last_val)) summary["final_val_loss"] = last_val;

    if (opt.sample_tokens > 0 && !data.tokenizer.empty()) {
        auto tok = make_tokenizer(data.tokenizer, data_dir());
        std::vector<int32_t> prompt = tok->encode("\n");
        const auto ids = sample_text(engine, prompt, opt.sample_tokens, 0.8f, opt.seed);
        const std::string text = tok->decode(ids);
        std::printf("\nsample (temperature 0.8):\n%s\n", text.c_str());
        summary["sample"] = text;
    }
    const std::string summary_path = (fs::path(opt.out) / "summary.json").string();
    std::ofstream so(summary_path);
    so << summary.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    if (!so) throw IoError(fmt::format("{}: cannot write summary", summary_path));
    std::printf("wrote %s and %s\n", metrics_path.c_str(), summary_path.c_str());
}

}  // namespace memfit
