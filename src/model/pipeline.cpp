#include "model/pipeline.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <unordered_map>

#include <fmt/format.h>

#include "core/error.h"

namespace memfit {

PipeSchedule parse_schedule(const std::string & s, int * virtual_stages) {
    if (virtual_stages) *virtual_stages = 1;
    if (s == "gpipe") return PipeSchedule::gpipe;
    if (s == "1f1b") return PipeSchedule::one_f_one_b;
    if (s.starts_with("interleaved:")) {
        const std::string v = s.substr(12);
        if (!v.empty() && v.size() < 4 && std::all_of(v.begin(), v.end(), ::isdigit) && std::stoi(v) >= 2) {
            if (virtual_stages) *virtual_stages = std::stoi(v);
            return PipeSchedule::interleaved;
        }
    }
    throw ConfigError(fmt::format("--schedule '{}': expected gpipe, 1f1b or interleaved:V (V >= 2 chunks per stage)",
                                  s));
}

const char * schedule_name(PipeSchedule s) {
    return s == PipeSchedule::gpipe ? "gpipe" : s == PipeSchedule::one_f_one_b ? "1f1b" : "interleaved";
}

std::vector<StageRange> pipeline_stages(const ModelConfig & cfg, int stages, int seq) {
    const int L = cfg.n_layer;
    if (stages < 1 || stages > L)
        throw ConfigError(fmt::format("--pp {}: the model has {} blocks; every stage needs at least one (use --pp "
                                      "between 1 and {})", stages, L, L));
    // Per token: a block's matmuls (2 x 3 passes x weights) and attention; the head's matmul.
    const double C = cfg.n_embd, block = 6.0 * (C * cfg.qkv_dim() + double(cfg.attn_dim()) * C +
                                                C * cfg.fc_dim() + double(cfg.ffn_dim()) * C) +
                                         12.0 * cfg.attn_dim() * double(seq) / 2.0;
    const double head = 6.0 * C * cfg.vocab_size;
    // Minimise the largest stage's cost over contiguous cuts (L and P are small: exhaustive DP).
    // best[p][l]: the least largest cost of layers [0, l) in p stages.
    const double inf = 1e300;
    std::vector<std::vector<double>> best(size_t(stages) + 1, std::vector<double>(size_t(L) + 1, inf));
    std::vector<std::vector<int>> cut(size_t(stages) + 1, std::vector<int>(size_t(L) + 1, 0));
    best[0][0] = 0;
    for (int p = 1; p <= stages; ++p)
        for (int l = p; l <= L; ++l)
            for (int k = p - 1; k < l; ++k) {
                const double cost = (l - k) * block + (p == stages && l == L ? head : 0.0);
                const double worst = std::max(best[size_t(p) - 1][size_t(k)], cost);
                if (worst < best[size_t(p)][size_t(l)]) best[size_t(p)][size_t(l)] = worst, cut[size_t(p)][size_t(l)] = k;
            }
    std::vector<StageRange> out(static_cast<size_t>(stages));
    for (int p = stages, l = L; p >= 1; --p) {
        const int k = cut[size_t(p)][size_t(l)];
        out[size_t(p) - 1] = {k, l};
        l = k;
    }
    return out;
}

namespace {
// The block a parameter belongs to, or -1 (embedding, final norm, head).
int block_of(const std::string & name) {
    size_t at = std::string::npos;
    if (const size_t p = name.find("layers."); p != std::string::npos) at = p + 7;
    else if (name.starts_with("h.")) at = 2;
    if (at == std::string::npos || at >= name.size() || !std::isdigit(static_cast<unsigned char>(name[at]))) return -1;
    return std::atoi(name.c_str() + at);
}
bool is_embedding(const std::string & n) { return n == "wte.weight" || n == "wpe.weight" || n == "model.embed_tokens.weight"; }
}  // namespace

bool holds_tied_copy(const ModelConfig & cfg, bool first, bool last) { return cfg.tied_head && last && !first; }

void check_pipeline(const ModelConfig & cfg, int P, int V) {
    if (V > 1 && P * V > cfg.n_layer)
        throw ConfigError(fmt::format("--pp {} with --schedule interleaved:{} needs {} chunks of blocks, the model has "
                                      "{} blocks; lower V or --pp", P, V, P * V, cfg.n_layer));
    if (P * V < 1 || P * V > cfg.n_layer)   // pipeline_stages' own refusal, without its cuts
        throw ConfigError(fmt::format("--pp {}: the model has {} blocks; every stage needs at least one (use --pp "
                                      "between 1 and {})", P * V, cfg.n_layer, cfg.n_layer));
}

std::vector<StageRange> stage_chunks(const ModelConfig & cfg, const PipelineParallel & pp, int seq) {
    const int P = pp.stages, V = pp.schedule == PipeSchedule::interleaved ? pp.virtual_stages : 1;
    check_pipeline(cfg, P, V);
    const std::vector<StageRange> all = pipeline_stages(cfg, P * V, seq);
    std::vector<StageRange> out;
    for (int j = 0; j < V; ++j) out.push_back(all[size_t(j * P + pp.stage)]);
    return out;
}

ParamLayout stage_layout(const ModelConfig & cfg, const std::vector<StageRange> & chunks, bool first, bool last) {
    ParamLayout out;
    for (const auto & p : make_param_layout(cfg).params) {
        const int l = block_of(p.name);
        bool keep = false;
        for (const auto & r : chunks) keep = keep || (l >= r.begin && l < r.end);
        if (l < 0) {
            const bool token_table = p.name == "wte.weight" || p.name == "model.embed_tokens.weight";
            keep = is_embedding(p.name) ? first || (token_table && holds_tied_copy(cfg, first, last)) : last;
        }
        if (!keep) continue;
        ParamInfo q = p;
        q.offset = out.total;
        out.total += q.numel;
        out.params.push_back(std::move(q));
    }
    return out;
}

namespace {
bool in_chunks(int block, const std::vector<StageRange> & chunks) {
    for (const auto & r : chunks)
        if (block >= r.begin && block < r.end) return true;
    return false;
}
}  // namespace

ParamLayout keep_blocks(const ParamLayout & layout, const std::vector<StageRange> & chunks) {
    ParamLayout out;
    for (ParamInfo p : layout.params) {
        if (!in_chunks(param_block(p.name), chunks)) continue;
        p.offset = out.total;
        out.total += p.numel;
        out.params.push_back(std::move(p));
    }
    return out;
}

QuantLayout keep_blocks(const QuantLayout & q, const std::vector<StageRange> & chunks) {
    QuantLayout out;
    for (size_t i = 0; i < q.entries.size(); ++i) {
        if (!in_chunks(q.entries[i].layer, chunks)) continue;
        QuantEntry e = q.entries[i];
        const size_t bytes = (i + 1 < q.entries.size() ? q.entries[i + 1].offset : q.bytes) - e.offset;
        e.offset = out.bytes;
        out.bytes += bytes;
        out.entries.push_back(std::move(e));
    }
    return out;
}

std::vector<PipeAction> pipeline_schedule(PipeSchedule kind, int stages, int stage, int m, int V) {
    std::vector<PipeAction> out;
    if (kind == PipeSchedule::interleaved) {
        MF_ASSERT(V >= 1 && m % stages == 0);
        // Forward step k: micro-batch (k / PV) P + k % P through chunk (k / P) % V; backward
        // step k the same micro-batch through chunk V - 1 - (k / P) % V.
        const int P = stages, total = m * V;
        auto mb = [&](int k) { return (k / (P * V)) * P + k % P; };
        auto chunk = [&](int k) { return (k / P) % V; };
        const int warmup = m == P ? total : std::min(total, 2 * (P - stage - 1) + (V - 1) * P);
        for (int k = 0; k < warmup; ++k) out.push_back({true, mb(k), chunk(k)});
        for (int k = 0; k < total - warmup; ++k) {
            out.push_back({true, mb(warmup + k), chunk(warmup + k)});
            out.push_back({false, mb(k), V - 1 - chunk(k)});
        }
        for (int k = total - warmup; k < total; ++k) out.push_back({false, mb(k), V - 1 - chunk(k)});
        return out;
    }
    if (kind == PipeSchedule::gpipe) {
        for (int i = 0; i < m; ++i) out.push_back({true, i});
        for (int i = 0; i < m; ++i) out.push_back({false, i});
        return out;
    }
    const int warmup = std::min(stages - stage - 1, m);
    for (int i = 0; i < warmup; ++i) out.push_back({true, i});
    for (int i = 0; i < m - warmup; ++i) {
        out.push_back({true, warmup + i});
        out.push_back({false, i});
    }
    for (int i = m - warmup; i < m; ++i) out.push_back({false, i});
    return out;
}

int pipe_tag(bool gradient, int mb, int v, int stages, int virtual_stages) {
    return (mb * (stages * virtual_stages) + v) * 2 + (gradient ? 1 : 0);
}

std::vector<PipeMessage> interleaved_messages(int P, int s, int m, int V) {
    const std::vector<PipeAction> order = pipeline_schedule(PipeSchedule::interleaved, P, s, m, V);
    const int last = P * V - 1, up = (s + 1) % P, down = (s + P - 1) % P;
    std::vector<PipeMessage> out;
    for (size_t j = 0; j < order.size(); ++j) {
        const PipeAction & a = order[j];
        const int v = a.chunk * P + s, i = int(j);
        if (a.fwd) {
            if (v > 0) out.push_back({i, false, down, pipe_tag(false, a.mb, v - 1, P, V)});
            if (v < last) out.push_back({i, true, up, pipe_tag(false, a.mb, v, P, V)});
        } else {
            if (v < last) out.push_back({i, false, up, pipe_tag(true, a.mb, v + 1, P, V)});
            if (v > 0) out.push_back({i, true, down, pipe_tag(true, a.mb, v, P, V)});
        }
    }
    return out;
}

namespace {
// interleaved_send_waits, for the stage's messages already made.
std::vector<int> send_waits(int P, int s, int m, int V, const std::vector<PipeMessage> & mine) {
    // Where this stage receives each tag (tags are unique per step).
    std::unordered_map<int, int> received;
    for (size_t r = 0; r < mine.size(); ++r)
        if (!mine[r].send) received[mine[r].tag] = int(r);
    std::vector<int> at(mine.size(), -1);
    std::vector<int> neighbours = {(s + 1) % P};
    if ((s + P - 1) % P != neighbours[0]) neighbours.push_back((s + P - 1) % P);
    for (const int q : neighbours) {
        const std::vector<PipeMessage> theirs = interleaved_messages(P, q, m, V);
        // From each of the peer's messages on, its next send to this stage (-1: none).
        std::vector<int> next_back(theirs.size() + 1, -1);
        for (size_t k = theirs.size(); k-- > 0;)
            next_back[k] = theirs[k].send && theirs[k].peer == s ? int(k) : next_back[k + 1];
        std::unordered_map<int, int> their_recv;
        for (size_t k = 0; k < theirs.size(); ++k)
            if (!theirs[k].send) their_recv[theirs[k].tag] = int(k);
        for (size_t i = 0; i < mine.size(); ++i) {
            if (!mine[i].send || mine[i].peer != q) continue;
            const auto got = their_recv.find(mine[i].tag);
            MF_ASSERT(got != their_recv.end() && "a pipeline send nobody receives");
            const int back = next_back[size_t(got->second)];
            if (back < 0) continue;
            at[i] = received.at(theirs[size_t(back)].tag);
            MF_ASSERT(at[i] > int(i) && "a message back received before the send it answers");
        }
    }
    return at;
}
}  // namespace

std::vector<int> interleaved_send_waits(int P, int s, int m, int V) {
    return send_waits(P, s, m, V, interleaved_messages(P, s, m, V));
}

int interleaved_pending_sends(int P, int s, int m, int V) {
    const std::vector<PipeMessage> mine = interleaved_messages(P, s, m, V);
    const std::vector<int> at = send_waits(P, s, m, V, mine);
    std::vector<int> done(mine.size() + 1, 0);   // sends completed just after message r
    for (size_t i = 0; i < mine.size(); ++i)
        if (mine[i].send && at[i] >= 0) ++done[size_t(at[i])];
    int pending = 0, most = 0;
    for (size_t i = 0; i < mine.size(); ++i) {
        if (mine[i].send) most = std::max(most, ++pending);
        pending -= done[i];
    }
    return most;
}

}  // namespace memfit
