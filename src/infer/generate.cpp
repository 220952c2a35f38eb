#include "infer/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "core/error.h"
#include "core/finite.h"

namespace memfit {

int32_t sample_token(const float * logits, int V, const SampleOptions & o, std::mt19937_64 & rng) {
    MF_ASSERT(V > 0);
    const int argmax = int(std::max_element(logits, logits + V) - logits);
    if (!(o.temperature > 0) || o.top_k == 1) return argmax;
    // Candidates by descending logit; probabilities at the temperature, relative to the max.
    std::vector<int> idx(static_cast<size_t>(V));
    std::iota(idx.begin(), idx.end(), 0);
    const size_t k = o.top_k > 0 ? std::min<size_t>(size_t(o.top_k), idx.size()) : idx.size();
    std::partial_sort(idx.begin(), idx.begin() + long(k), idx.end(),
                      [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    idx.resize(k);
    std::vector<double> p(k);
    double sum = 0;
    for (size_t i = 0; i < k; ++i) sum += p[i] = std::exp(double(logits[idx[i]] - logits[argmax]) / o.temperature);
    // Nucleus: the shortest prefix whose mass reaches top_p.
    size_t keep = k;
    if (o.top_p < 1.0f) {
        double acc = 0;
        for (size_t i = 0; i < k; ++i) {
            acc += p[i] / sum;
            if (acc >= double(o.top_p)) {
                keep = i + 1;
                break;
            }
        }
        sum = std::accumulate(p.begin(), p.begin() + long(keep), 0.0);
    }
    std::uniform_real_distribution<double> u(0.0, sum);
    const double r = u(rng);
    double acc = 0;
    for (size_t i = 0; i < keep; ++i) {
        acc += p[i];
        if (r < acc) return idx[i];
    }
    return idx[keep - 1];
}

std::vector<int32_t> generate(Decoder & decoder, std::vector<int32_t> context, const SampleOptions & o,
                              const std::function<void(int32_t)> & on_token) {
    const int cap = decoder.capacity(), V = decoder.config().vocab_size;
    std::mt19937_64 rng(o.seed);
    std::vector<int32_t> out;
    if (context.empty()) context.push_back(0);
    // The last `keep` tokens of the context, run from position 0.
    auto refill = [&](size_t keep) {
        keep = std::min(keep, context.size());
        return decoder.prefill(std::vector<int32_t>(context.end() - long(keep), context.end()));
    };
    const float * logits = refill(size_t(cap));
    for (int i = 0; i < o.max_new_tokens; ++i) {
        // Finite weights can still overflow (or a quantized storage lose them): no garbage text.
        if (const NonFinite bad = find_non_finite(logits, size_t(V)))
            throw Error(fmt::format("generate: the logits after {} tokens hold {} of {}; the model overflows in "
                                    "this weight storage (try --weights fp32)", context.size(), bad.describe(), V));
        const int32_t next = sample_token(logits, V, o, rng);
        if (std::find(o.stop.begin(), o.stop.end(), next) != o.stop.end()) break;
        context.push_back(next);
        out.push_back(next);
        if (on_token) on_token(next);
        if (i + 1 == o.max_new_tokens) break;
        logits = decoder.position() < cap ? decoder.step(next) : refill(size_t(std::max(1, cap / 2)));
    }
    return out;
}

}  // namespace memfit
