// The report of a real engine step: the SVG's numbers are the ledger's, op by op, and the trace
// carries the same bytes.
#include <gtest/gtest.h>

#include <sstream>

#include "backend/cpu/cpu_backend.h"
#include "report/chrome_trace.h"
#include "report/html_report.h"
#include "train/engine.h"
#include "app/report.h"

using namespace memfit;

namespace {

std::vector<uint64_t> parse_values(const std::string & html, const std::string & category) {
    const std::string key = "class=\"series\" data-category=\"" + category + "\" data-values=\"";
    const size_t at = html.find(key);
    if (at == std::string::npos) return {};
    const size_t start = at + key.size(), end = html.find('"', start);
    std::vector<uint64_t> v;
    std::stringstream ss(html.substr(start, end - start));
    std::string item;
    while (std::getline(ss, item, ',')) v.push_back(std::stoull(item));
    return v;
}

}  // namespace

TEST(ReportIntegration, SvgAndTraceCarryTheLedgersBytes) {
    ModelConfig cfg;
    cfg.name = "report-test";
    cfg.vocab_size = 128;
    cfg.n_embd = 32;
    cfg.n_layer = 2;
    cfg.n_head = 2;
    cfg.max_seq = 32;
    CpuBackend backend;
    EngineOptions eo;
    eo.B = 4;
    eo.T = 32;
    eo.with_eval = false;
    Engine e(cfg, backend, eo);
    e.init_params(5);
    std::vector<int32_t> in(128, 3), tg(128, 7);
    Timeline tl;
    e.set_timeline(&tl);
    e.train_step(in.data(), tg.data(), OptimHyper{});
    e.set_timeline(nullptr);

    const ReportData r = build_report(e, tl, "test", nlohmann::json{{"batch", 4}}, 0);
    EXPECT_EQ(r.peak_op, e.plan().peak_op);
    ASSERT_FALSE(r.live_at_peak.empty());
    uint64_t at_peak = 0;
    for (const auto & b : r.live_at_peak) at_peak += b.bytes;
    EXPECT_EQ(at_peak, e.ledger().live_total_peak());   // the buffers listed at the peak add up
    EXPECT_LE(r.largest.size(), 10u);
    uint64_t biggest = 0;
    for (const auto & b : e.step().program().buffers()) biggest = std::max<uint64_t>(biggest, b.bytes);
    EXPECT_EQ(r.largest.front().bytes, biggest);
    for (size_t i = 1; i < r.largest.size(); ++i) EXPECT_GE(r.largest[i - 1].bytes, r.largest[i].bytes);
    EXPECT_FALSE(r.hints.empty());

    const std::string html = render_html_report(r);
    for (size_t c = 0; c < kCategoryCount; ++c) {
        const std::string name(kCategoryNames[c]);
        std::vector<uint64_t> expect;
        bool any = false;
        for (const auto & ev : tl.events) {
            expect.push_back(ev.live.v[c]);
            any |= ev.live.v[c] != 0;
        }
        const std::vector<uint64_t> got = parse_values(html, name);
        if (any) EXPECT_EQ(got, expect) << name;
        else EXPECT_TRUE(got.empty()) << name;
    }
    EXPECT_NE(html.find("data-peak-total=\"" + std::to_string(e.ledger().live_total_peak()) + "\""), std::string::npos);

    const nlohmann::json trace = chrome_trace(r);
    int slices = 0;
    for (const auto & ev : trace["traceEvents"]) {
        if (ev["ph"] == "X") ++slices;
        if (ev["ph"] == "C" && ev["name"] == "memory" && ev["args"].contains("activations")) {
            EXPECT_LE(ev["args"]["activations"].get<uint64_t>(), e.ledger().live_peak()[Category::activations]);
        }
    }
    EXPECT_EQ(slices, e.step().program().num_ops());
}
