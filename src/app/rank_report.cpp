#include "app/rank_report.h"

#include <fmt/format.h>

#include "core/units.h"
#include "report/memory_report.h"

namespace memfit {

namespace {

// min/max over ranks of f(rank) with the ranks that hold them.
struct MinMax { uint64_t min = 0, max = 0; int min_rank = 0, max_rank = 0; };
template <class F> MinMax min_max(size_t N, F f) {
    MinMax m{f(0), f(0), 0, 0};
    for (size_t k = 1; k < N; ++k) {
        const uint64_t x = f(k);
        if (x < m.min) m.min = x, m.min_rank = int(k);
        if (x > m.max) m.max = x, m.max_rank = int(k);
    }
    return m;
}
nlohmann::json min_max_json(const MinMax & m) {
    return {{"min", m.min}, {"min_rank", m.min_rank}, {"max", m.max}, {"max_rank", m.max_rank}};
}

}  // namespace

// Pipeline: each stage's time in transfers (pp_exchange: waiting for a neighbour, plus the copy)
// over the last step, against the schedule's ideal bubble (P - 1) / (m + P - 1). Collective.
std::string pipeline_idle(Communicator & comm, const ParallelLayout & l, const Timeline & t, int m) {
    double idle = 0, begin = 0, end = 0;
    uint64_t exchanges = 0;
    for (const auto & e : t.events)
        if (std::string_view(e.name) == "pp_exchange") idle += e.end_us - e.begin_us, ++exchanges;
    if (!t.events.empty()) begin = t.events.front().begin_us, end = t.events.back().end_us;
    const auto idle_ns = comm.all_gather_u64(uint64_t(idle * 1e3)), step_ns = comm.all_gather_u64(uint64_t((end - begin) * 1e3));
    const auto counts = comm.all_gather_u64(exchanges);
    std::string out = fmt::format("pipeline idle per stage (last step; time in transfers / step time; ideal bubble "
                                  "(P-1)/(m+P-1) = {:.1f}% for P = {}, m = {}):", 100.0 * (l.pp - 1) / (m + l.pp - 1),
                                  l.pp, m);
    for (int s = 0; s < l.pp; ++s) {
        const int r = world_rank_of(l, RankCoords{0, s, 0});
        out += fmt::format("\n  stage {} (rank {}): idle {:.1f}% of {:.1f} ms, {} exchanges, {} forwards and {} "
                           "backwards", s, r, 100.0 * double(idle_ns[size_t(r)]) / double(std::max<uint64_t>(1, step_ns[size_t(r)])),
                           double(step_ns[size_t(r)]) / 1e6, counts[size_t(r)], m, m);
    }
    return out;
}

std::string rank_label(const ParallelLayout & l, int rank) {
    if (l.tp == 1 && l.pp == 1) return fmt::format("rank {}", rank);
    const RankCoords c = rank_coords(l, rank);
    return fmt::format("rank {} (tp {}, pp {}, dp {})", rank, c.tp, c.pp, c.dp);
}

RankMemory gather_memory(Communicator & comm, const Ledger & L, uint64_t rss, const CategoryBytes & planned_live,
                         const CategoryBytes & planned_reserved) {
    const size_t N = size_t(comm.size());
    RankMemory r;
    auto gather = [&](const CategoryBytes & mine, std::vector<CategoryBytes> & all) {
        all.resize(N);
        for (size_t c = 0; c < size_t(kCategoryCount); ++c) {
            const auto a = comm.all_gather_u64(mine.v[c]);
            for (size_t k = 0; k < N; ++k) all[k].v[c] = a[k];
        }
    };
    gather(L.reserved_peak(), r.reserved);
    gather(L.live_peak(), r.live);
    gather(planned_reserved, r.planned_reserved);
    gather(planned_live, r.planned_live);
    r.rss = comm.all_gather_u64(rss);
    return r;
}

// "memory per rank (4 ranks): reserved min .. (rank i) max .. (rank j); ..." and per category.
std::string format_rank_memory(const RankMemory & r) {
    const size_t N = r.reserved.size();
    const MinMax rsv = min_max(N, [&](size_t k) { return r.reserved[k].total(); });
    const MinMax live = min_max(N, [&](size_t k) { return r.live[k].total(); });
    const MinMax rss = min_max(N, [&](size_t k) { return r.rss[k]; });
    std::string out = fmt::format(
        "memory per rank ({} ranks): reserved min {} (rank {}) max {} (rank {}); peak live min {} (rank {}) max {} "
        "(rank {}); peak RSS min {} (rank {}) max {} (rank {})",
        N, format_bytes(rsv.min), rsv.min_rank, format_bytes(rsv.max), rsv.max_rank, format_bytes(live.min),
        live.min_rank, format_bytes(live.max), live.max_rank, format_bytes(rss.min), rss.min_rank,
        format_bytes(rss.max), rss.max_rank);
    for (size_t c = 0; c < size_t(kCategoryCount); ++c) {
        const MinMax a = min_max(N, [&](size_t k) { return r.reserved[k].v[c]; });
        const MinMax b = min_max(N, [&](size_t k) { return r.live[k].v[c]; });
        if (a.max == 0 && b.max == 0) continue;
        out += fmt::format("\n  {:<17} reserved {} .. {}, peak live {} .. {}", category_name(Category(c)),
                           format_bytes(a.min), format_bytes(a.max), format_bytes(b.min), format_bytes(b.max));
    }
    return out;
}

nlohmann::json rank_memory_json(const RankMemory & r) {
    const size_t N = r.reserved.size();
    nlohmann::json j = {{"ranks", N},
                        {"reserved_total", min_max_json(min_max(N, [&](size_t k) { return r.reserved[k].total(); }))},
                        {"peak_live_total", min_max_json(min_max(N, [&](size_t k) { return r.live[k].total(); }))},
                        {"peak_rss", min_max_json(min_max(N, [&](size_t k) { return r.rss[k]; }))},
                        {"reserved", nlohmann::json::object()},
                        {"peak_live", nlohmann::json::object()},
                        {"by_rank", nlohmann::json::array()}};
    for (size_t c = 0; c < size_t(kCategoryCount); ++c) {
        j["reserved"][std::string(category_name(Category(c)))] = min_max_json(min_max(N, [&](size_t k) { return r.reserved[k].v[c]; }));
        j["peak_live"][std::string(category_name(Category(c)))] = min_max_json(min_max(N, [&](size_t k) { return r.live[k].v[c]; }));
    }
    for (size_t k = 0; k < N; ++k)
        j["by_rank"].push_back({{"rank", k}, {"reserved", category_json(r.reserved[k])},
                                {"peak_live", category_json(r.live[k])}, {"peak_rss_bytes", r.rss[k]},
                                {"planned", {{"peak_live", category_json(r.planned_live[k])},
                                             {"reserved", category_json(r.planned_reserved[k])}}}});
    return j;
}

}  // namespace memfit
