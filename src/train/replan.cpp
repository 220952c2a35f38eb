#include "train/replan.h"

#include <cctype>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

#include "core/units.h"
#include "memory/budget.h"

namespace memfit {

std::optional<EngineOptions> halve_micro_batch(const EngineOptions & eo) {
    if (eo.B < 2 || eo.B % 2) return std::nullopt;
    if (eo.pref.enabled() && eo.B / 2 % 2) return std::nullopt;   // preference pairs stay whole
    EngineOptions s = eo;
    s.B = eo.B / 2;
    s.grad_accum = eo.grad_accum * 2;
    return s;
}

void rebuild_engine(std::unique_ptr<Engine> & engine, const ModelConfig & cfg, Backend & backend,
                    const EngineOptions & eo) {
    const TrainState state = engine->export_state();
    const std::vector<uint8_t> frozen = engine->export_frozen();
    engine.reset();
    EngineOptions o = eo;
    for (;;) {
        try {
            engine = std::make_unique<Engine>(cfg, backend, o);
            break;
        } catch (const OutOfMemory &) {
            const auto smaller = halve_micro_batch(o);
            if (!smaller) throw;
            o = *smaller;
        }
    }
    engine->import_state(state);
    engine->import_frozen(frozen);
}

void shrink_to_budget(std::unique_ptr<Engine> & engine, const ModelConfig & cfg, Backend & backend,
                      uint64_t budget, std::vector<std::string> & notes) {
    EngineOptions eo = engine->options();
    const uint64_t before = engine->planned_reserved().total();
    eo.budget = budget;
    if (before <= budget) return;
    CategoryBytes need = engine->planned_reserved();
    while (need.total() > budget) {
        const auto smaller = halve_micro_batch(eo);
        if (!smaller)
            check_budget(need, budget,
                         fmt::format("micro-batch {} cannot be halved further; raise the budget or lower --seq", eo.B));
        eo = *smaller;
        need = StepPlans(cfg, backend, eo).reserved();
    }
    notes.push_back(fmt::format("budget lowered to {}: re-planned to micro-batch {} x {} accumulated ({} -> {})",
                                format_bytes(budget), eo.B, eo.grad_accum, format_bytes(before),
                                format_bytes(need.total())));
    rebuild_engine(engine, cfg, backend, eo);
}

StepResult resilient_step(std::unique_ptr<Engine> & engine, const ModelConfig & cfg, Backend & backend,
                          const int32_t * inputs, const int32_t * targets, const OptimHyper & h,
                          std::vector<std::string> & notes, const int32_t * doc_start, const float * ref_logps) {
    for (;;) {
        try {
            return engine->train_step(inputs, targets, h, doc_start, ref_logps);
        } catch (const OutOfMemory & e) {
            // Data parallel: the other ranks are inside this step's collectives, and a re-plan
            // would have to happen on every rank at once; this rank fails (and mpirun stops the rest).
            if (engine->options().data_parallel > 1 || engine->options().tensor_parallel > 1 ||
                engine->options().pipeline_parallel > 1)
                throw OutOfMemory(fmt::format("{}; rank {} of {}: a data-parallel run cannot re-plan mid-step; "
                                              "restart with a smaller --batch, more --grad-accum, a higher --zero "
                                              "or a larger --memory-budget",
                                              e.what(), engine->options().rank, engine->options().data_parallel));
            const auto smaller = halve_micro_batch(engine->options());
            if (!smaller) throw;
            notes.push_back(fmt::format("{}; re-planned to micro-batch {} x {} accumulated and redid step {}",
                                        e.what(), smaller->B, smaller->grad_accum, engine->steps_done() + 1));
            Timeline * recording = engine->timeline();   // the redone step is recorded as the failed one was
            rebuild_engine(engine, cfg, backend, *smaller);
            engine->set_timeline(recording);
        }
    }
}

std::optional<uint64_t> BudgetFile::poll(std::string * warning) {
    if (path_.empty()) return std::nullopt;
    std::ifstream f(path_);
    if (!f) return std::nullopt;
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    if (text.empty() || text == last_) return std::nullopt;
    last_ = text;
    try {
        return parse_bytes(text);
    } catch (const Error & e) {
        const std::string why = fmt::format("--budget-file {}: {}; the budget stays as it was", path_, e.what());
        if (!warning) throw ConfigError(why);
        *warning = why;
        return std::nullopt;
    }
}

}  // namespace memfit
