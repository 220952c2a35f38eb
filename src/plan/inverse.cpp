#include "plan/inverse.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"

namespace memfit {

namespace {

// A search of `q` with hints off, when something fits.
std::optional<SearchReport> fitting(PlanRequest q, int * searches) {
    q.hint = false;
    q.explain = false;
    ++*searches;
    try {
        SearchReport rep = search_plans(q);
        if (!rep.best.empty()) return rep;
    } catch (const ConfigError &) {
        // a value no layout takes (a pipeline's micro-batches, a batch that does not divide): not a fit
    }
    return std::nullopt;
}

// The largest k in [1, hi] with at(k) fitting, assuming fitting is monotone (what fits at k fits
// below it): doubling from 1, then bisection. at(k) sets the value in the request.
Largest largest(const PlanRequest & r, int hi, const std::function<void(PlanRequest &, int)> & at,
                const std::function<int(int)> & value) {
    int searches = 0;
    auto probe = [&](int k) {
        PlanRequest q = r;
        at(q, k);
        return fitting(q, &searches).has_value();
    };
    if (!probe(1)) {
        Largest none;
        none.searches = searches;
        return none;
    }
    int lo = 1, bad = 0;
    for (int k = 2; k <= hi; k = std::min(hi, k * 2)) {   // lo fits, bad (if any) does not
        if (!probe(k)) {
            bad = k;
            break;
        }
        lo = k;
        if (k == hi) break;
    }
    while (bad && bad - lo > 1) {
        const int mid = lo + (bad - lo) / 2;
        if (probe(mid)) lo = mid;
        else bad = mid;
    }
    Largest found;   // the search at the answer (the last probe may have been above it), with its hints off
    found.request = r;
    at(found.request, lo);
    found.request.hint = false;
    found.report = search_plans(found.request);
    found.value = value(lo);
    found.next = bad ? value(bad) : 0;
    found.searches = searches + 1;
    return found;
}

}  // namespace

Largest largest_seq(const PlanRequest & r) {
    const int max = r.cfg.max_seq;
    const int step = max >= kSeqStep ? kSeqStep : 1;
    return largest(
        r, max / step, [step](PlanRequest & q, int k) { q.run.seq = k * step; }, [step](int k) { return k * step; });
}

Largest largest_micro_batch(const PlanRequest & r) {
    if (r.run.global_batch > 0)
        throw ConfigError(fmt::format("--max-micro-batch finds the micro-batch, and the global batch follows it "
                                      "(micro-batch x accumulation x data-parallel ranks): drop --global-batch {}",
                                      r.run.global_batch));
    const int step = r.run.pref.dpo() ? 2 : 1;   // preference pairs: micro-batches of whole pairs
    return largest(
        r, kMaxMicroBatch / step,
        [step](PlanRequest & q, int k) {
            q.micro_batch = k * step;
            q.grad_accum = q.grad_accum.value_or(1);
        },
        [step](int k) { return k * step; });
}

std::vector<std::string> model_family(const std::string & family) {
    std::vector<std::string> out;
    for (const std::string & n : preset_names())
        if (family.empty() || family == "presets" || n.starts_with(family)) out.push_back(n);
    if (out.empty())
        throw ConfigError(fmt::format("--max-model {}: no preset's name starts with it; give a family (gpt2, llama2, "
                                      "llama3, qwen2.5, qwen3, mistral, ...) or presets for all of them", family));
    return out;
}

LargestModel largest_model(const std::vector<std::string> & models,
                           const std::function<PlanRequest(const std::string &)> & make) {
    // Largest first, by parameters: the first that fits is the answer.
    std::vector<std::pair<int64_t, std::string>> by_size;
    for (const std::string & m : models) {
        ModelConfig cfg = resolve_model(m);
        if (cfg.vocab_size == 0) cfg.vocab_size = 256;   // the small presets: a byte vocabulary
        by_size.emplace_back(cfg.num_params(), m);
    }
    std::sort(by_size.begin(), by_size.end(), [](const auto & a, const auto & b) { return a.first > b.first; });
    LargestModel out;
    for (const auto & [params, m] : by_size) {
        try {
            PlanRequest q = make(m);
            q.hint = false;
            ++out.at.searches;
            SearchReport rep = search_plans(q);
            if (!rep.best.empty()) {
                out.model = m;
                out.at.value = 1;
                out.at.request = q;
                out.at.report = std::move(rep);
                out.tried.emplace_back(m, "");
                return out;
            }
            out.tried.emplace_back(m, rep.closest.empty() ? std::string("nothing fits") : rep.closest.front().why);
        } catch (const ConfigError & e) {
            out.tried.emplace_back(m, e.what());
        }
    }
    return out;
}

}  // namespace memfit
