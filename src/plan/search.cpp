#include "plan/search.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"
#include "plan/lora_plan.h"
#include "run/compat.h"

namespace memfit {

namespace {

std::vector<int> divisors(int n, int cap) {
    std::vector<int> d;
    for (int i = 1; i <= std::min(n, cap); ++i)
        if (n % i == 0) d.push_back(i);
    return d;
}

template <class T>
std::vector<T> fixed_or(const std::optional<T> & fixed, std::vector<T> all) {
    return fixed ? std::vector<T>{*fixed} : all;
}

const char * schedule_name(const Layout & l) {
    return l.schedule == PipeSchedule::gpipe ? "GPipe" : l.schedule == PipeSchedule::one_f_one_b ? "1F1B" : "interleaved";
}

bool faster(const PlanResult & a, const PlanResult & b) {
    if (a.time.tokens_per_s != b.time.tokens_per_s) return a.time.tokens_per_s > b.time.tokens_per_s;
    return a.mem.total() < b.mem.total();   // ties: more headroom
}

// Keeps the `n` best of a stream without sorting everything.
void keep_best(std::vector<PlanResult> & v, PlanResult && r, size_t n) {
    if (v.size() < n) {
        v.push_back(std::move(r));
        std::sort(v.begin(), v.end(), faster);
        return;
    }
    if (!faster(r, v.back())) return;
    v.back() = std::move(r);
    std::sort(v.begin(), v.end(), faster);
}

std::string biggest(const CategoryBytes & b) {
    size_t top = 0;
    for (size_t c = 0; c < kCategoryCount; ++c)
        if (b.v[c] > b.v[top]) top = c;
    return fmt::format("{} {}", kCategoryNames[top], format_bytes(b.v[top]));
}

// Offloaded bytes of the devices of one node must fit that node's host memory.
bool host_fits(const PlanRequest & r, const DeviceMemory & m) {
    if (m.host == 0 || r.hw.host_memory == 0) return true;
    return m.host * uint64_t(std::min(r.gpus, std::max(1, r.hw.per_node))) <= r.hw.host_memory;
}

// Whether the engine's exact plan decides: the engine runs it (run/compat.h) and a sizing
// backend is known.
bool engine_runs(const PlanRequest & r, const Candidate & c, const ModelConfig & cfg) {
    return r.exact_sizing && !unsupported(candidate_run(c, r.seq), cfg, r.exact_sizing);
}

}  // namespace

std::string layout_name(const Layout & l) {
    std::string s = fmt::format("dp {} x tp {} x pp {}", l.dp, l.tp, l.pp);
    if (l.zero > 0) s += fmt::format(", ZeRO-{}", l.zero);
    if (l.offload == Offload::optimizer) s += ", offload optimizer";
    if (l.offload == Offload::optimizer_params) s += ", offload optimizer+params";
    if (l.sp) s += ", sp";
    if (l.pp > 1) {
        s += fmt::format(", {}", schedule_name(l));
        if (l.schedule == PipeSchedule::interleaved) s += fmt::format(":{}", l.virtual_stages);
    }
    return s;
}

std::string technique_name(const Candidate & c) {
    return fmt::format("micro-batch {} x {}, recompute {}, {}", c.micro_batch, c.grad_accum, c.recompute.name(),
                       c.flash() ? "flash" : "naive");
}

namespace {

// A bound, in double, on every byte count the memory models form for a candidate (the largest
// buffers of a layer times the layers and the micro-batches in flight, the logits, the model
// states): a candidate beyond it is rejected before the integer models could overflow.
double bytes_bound(const ModelConfig & cfg, const Candidate & c, int seq) {
    const Layout & L = c.layout;
    const double tokens = double(c.micro_batch) * seq, C = cfg.n_embd, m = c.grad_accum, P = L.pp;
    const double scores = c.flash() ? 0.0 : double(cfg.n_head) * seq;   // naive attention's probabilities
    const double per_layer = tokens * (scores + 16 * C + 3.0 * cfg.fc_dim() + 2.0 * cfg.qkv_dim()) * 4;
    // Micro-batches whose layers' activations are live at once (GPipe: all; 1F1B: at most P;
    // interleaved: at most 2P), the interleaved schedule's sends (a boundary activation each,
    // live until the step's end), and a pipeline's token, target and loss buffers (m of each).
    const double in_flight = P == 1 ? 1 : L.schedule == PipeSchedule::gpipe ? m : std::min(m, 2 * P);
    const double sends = L.schedule == PipeSchedule::interleaved ? 2.0 * L.virtual_stages * m * tokens * C * 4 : 0;
    return (cfg.n_layer + 4) * per_layer * (in_flight + 2) + sends + 12 * tokens * m + tokens * cfg.vocab_size * 4 +
           20.0 * double(cfg.num_params());
}

constexpr double kBytesBound = 0x1p60;   // 1 EiB: no device holds it, and sums of it cannot overflow

}  // namespace

SearchReport search_plans(const PlanRequest & r) {
    const auto t0 = std::chrono::steady_clock::now();
    const ModelConfig & cfg = r.cfg;
    if (r.gpus < 1 || r.seq < 1 || r.global_batch < 1)
        throw ConfigError(fmt::format("--gpus {}, --seq {}, --global-batch {}: each must be at least 1", r.gpus, r.seq,
                                      r.global_batch));
    if (r.gpus > kMaxPlannedDevices)
        throw ConfigError(fmt::format("--gpus {}: the planner models at most {} devices (the largest clusters have "
                                      "about 100,000)", r.gpus, kMaxPlannedDevices));
    if (r.seq > cfg.max_seq)
        throw ConfigError(fmt::format("--seq {} exceeds the model's {} positions", r.seq, cfg.max_seq));
    if (r.packing && (r.tp.value_or(1) > 1 || r.pp.value_or(1) > 1))
        throw ConfigError(fmt::format("--packing with --{} {}: packed documents run with data parallelism (and ZeRO) "
                                      "only for now; drop --packing or the {}",
                                      r.tp.value_or(1) > 1 ? "tp" : "pp", std::max(r.tp.value_or(1), r.pp.value_or(1)),
                                      r.tp.value_or(1) > 1 ? "tensor parallelism" : "pipeline"));
    if (r.distill && (r.tp.value_or(1) > 1 || r.pp.value_or(1) > 1))
        throw ConfigError(fmt::format("--teacher with --{} {}: the teacher runs whole beside each data-parallel rank; "
                                      "plan distillation with data parallelism (and ZeRO)",
                                      r.tp.value_or(1) > 1 ? "tp" : "pp", std::max(r.tp.value_or(1), r.pp.value_or(1))));
    const uint64_t capacity = r.hw.memory;
    // A packed LoRA base is neither sharded (ZeRO-3) nor offloaded: fixed, that is an error;
    // searched, those layouts are left out.
    const bool packed = r.lora && r.lora->quantized();
    if (packed) {
        Candidate fixed;
        fixed.lora_plan = r.lora;
        fixed.distill_plan = r.distill;
        fixed.layout.zero = r.zero.value_or(0);
        fixed.layout.offload = r.offload.value_or(Offload::none);
        check_lora_layout(fixed);
    }
    SearchReport rep;
    // What decides fit and is shown: the engine's own program where it runs the candidate
    // (exact), else the analytic model. Exact plans are recorded only for the candidates that
    // could be listed, in speed order, and each at most once.
    std::map<std::string, DeviceMemory> exact_cache;
    auto memory_of = [&](const Candidate & c, const DeviceMemory * analytic) -> DeviceMemory {
        if (!engine_runs(r, c, cfg)) return analytic ? *analytic : predict_memory(cfg, r.hw, c, r.seq);
        const std::string key = fmt::format("{}|{}|{}|{}|{}|{}", layout_name(c.layout), technique_name(c),
                                            dtype_name(c.compute), int(c.layout.schedule), c.layout.virtual_stages,
                                            static_cast<const void *>(c.lora_plan.get()));
        auto it = exact_cache.find(key);
        if (it == exact_cache.end()) {
            it = exact_cache.emplace(key, exact_memory(cfg, r.hw, c, r.seq, *r.exact_sizing)).first;
            ++rep.exact_recorded;
        }
        return it->second;
    };
    auto fits = [&](const DeviceMemory & m) { return m.total() <= capacity && host_fits(r, m); };
    auto why_not = [&](const DeviceMemory & m) {
        return m.total() > capacity
                   ? fmt::format("needs {} of {}: {}", format_bytes(m.total()), format_bytes(capacity), biggest(m.device))
                   : fmt::format("offloads {} per device: more than the node's {} of host memory holds",
                                 format_bytes(m.host), format_bytes(r.hw.host_memory));
    };
    // Flash attention unless the device's kernels refuse this head dimension (then naive).
    const bool flash_ok = !r.exact_sizing || r.exact_sizing->runs_flash_attention(cfg.head_dim());
    // Tensor parallelism stays inside a node and must split the heads (and the KV heads, or be
    // a multiple of them); pipeline stages must each get a layer.
    std::vector<int> tps;
    for (int t : fixed_or(r.tp, divisors(r.gpus, std::max(1, r.hw.per_node))))
        if (r.gpus % t == 0 && cfg.n_head % t == 0 && (cfg.kv_heads() % t == 0 || t % cfg.kv_heads() == 0)) tps.push_back(t);
    // On the `cpu` hardware the host memory is the device memory: offloading gains nothing.
    const std::vector<Offload> offloads = r.hw.name == "cpu" ? std::vector<Offload>{Offload::none}
                                                             : std::vector<Offload>{Offload::none, Offload::optimizer,
                                                                                    Offload::optimizer_params};
    std::vector<PlanResult> pool;   // fitting by the analytic model
    bool any_layout = false;
    for (int tp : tps)
        for (int pp : fixed_or(r.pp, divisors(r.gpus / tp, cfg.n_layer))) {
            if ((r.gpus / tp) % pp) continue;
            if (r.packing && (tp > 1 || pp > 1)) continue;
            if (cfg.share_layers > 1 && (tp > 1 || pp > 1)) continue;   // shared blocks: data parallel only
            if (r.distill && (tp > 1 || pp > 1)) continue;   // a teacher runs whole beside each data rank
            const int dp = r.gpus / (tp * pp);
            if (r.global_batch % dp) continue;
            any_layout = true;
            const int per_rank = r.global_batch / dp;
            for (int zero : fixed_or(r.zero, dp > 1 ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{0}))
                for (Offload off : fixed_or(r.offload, offloads)) {
                    if (off == Offload::optimizer_params && zero < 3 && !r.offload) continue;
                    if (pp > 1 && zero >= 2 && !r.zero) continue;   // ZeRO-2/3 with pipelines: not searched
                    if (packed && (zero >= 3 || off == Offload::optimizer_params)) continue;
                    for (bool sp : fixed_or(r.sp, tp > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false})) {
                        Layout L;
                        L.dp = dp, L.tp = tp, L.pp = pp, L.zero = zero, L.offload = off, L.sp = sp && tp > 1;
                        // Prune: the smallest footprint this layout can have (micro-batch 1, full recompute).
                        Candidate probe;
                        probe.layout = L;
                        probe.micro_batch = 1;
                        probe.grad_accum = per_rank;
                        probe.recompute = "full";
                        probe.set_flash(true);
                        probe.compute = r.compute;
                        probe.optimizer = r.optimizer;
                        probe.lora_plan = r.lora;
                        probe.distill_plan = r.distill;
                        probe.packing = r.packing;
                        probe.loss_chunk = r.loss_chunk;
                        probe.mlp_chunk = r.mlp_chunk;
                        if (pp > 1) probe.layout.schedule = PipeSchedule::one_f_one_b;
                        const double probe_bound = bytes_bound(cfg, probe, r.seq);
                        const DeviceMemory floor = probe_bound < kBytesBound ? predict_memory(cfg, r.hw, probe, r.seq)
                                                                             : DeviceMemory{};
                        if (probe_bound >= kBytesBound || floor.total() > capacity) {
                            ++rep.pruned_layouts;
                            PlanResult pr;
                            pr.c = probe;
                            pr.mem = floor;
                            pr.time = predict_step_time(cfg, r.hw, probe, r.seq, r.nodes);
                            pr.why = fmt::format("needs {} of {} even at micro-batch 1 with full recomputation: {}",
                                                 probe_bound >= kBytesBound ? "more than 1 EiB" : format_bytes(floor.total()),
                                                 format_bytes(capacity),
                                                 probe_bound >= kBytesBound ? "everything" : biggest(floor.device));
                            pr.hinted = true;
                            keep_best(rep.rejected, std::move(pr), r.top);
                            continue;
                        }
                        std::vector<PipeSchedule> scheds = {PipeSchedule::one_f_one_b};
                        if (pp > 1) {
                            if (r.schedule) scheds = {*r.schedule};
                            else if (cfg.n_layer % (pp * r.virtual_stages) == 0) scheds.push_back(PipeSchedule::interleaved);
                        }
                        for (PipeSchedule sch : scheds)
                            for (int mb : fixed_or(r.micro_batch, divisors(per_rank, 64))) {
                                if (per_rank % mb || (r.grad_accum && per_rank / mb != *r.grad_accum)) continue;
                                for (const std::string & rc : fixed_or(r.recompute, searched_recompute_policies()))
                                    for (bool flash : fixed_or(r.flash, {flash_ok})) {
                                        PlanResult pr;
                                        pr.c.layout = L;
                                        pr.c.layout.schedule = sch;
                                        pr.c.layout.virtual_stages = sch == PipeSchedule::interleaved ? r.virtual_stages : 1;
                                        pr.c.micro_batch = mb;
                                        pr.c.grad_accum = per_rank / mb;
                                        pr.c.recompute = rc;
                                        pr.c.set_flash(flash);
                                        pr.c.compute = r.compute;
                                        pr.c.optimizer = r.optimizer;
                                        pr.c.master_weights = r.master_weights;
                                        pr.c.packing = r.packing;
                                        pr.c.loss_chunk = r.loss_chunk;
                                        pr.c.mlp_chunk = r.mlp_chunk;
                                        if (L.offload == Offload::optimizer) {
                                            pr.c.offload_fraction = r.offload_fraction;
                                            pr.c.offload_dir = r.offload_dir;
                                        }
                                        pr.c.lora_plan = r.lora;
                                        pr.c.distill_plan = r.distill;
                                        ++rep.evaluated;
                                        pr.time = predict_step_time(cfg, r.hw, pr.c, r.seq, r.nodes);
                                        if (bytes_bound(cfg, pr.c, r.seq) >= kBytesBound) {
                                            pr.why = fmt::format("needs more than 1 EiB of {}", format_bytes(capacity));
                                            pr.hinted = true;
                                            keep_best(rep.rejected, std::move(pr), r.top);
                                            continue;
                                        }
                                        pr.mem = predict_memory(cfg, r.hw, pr.c, r.seq);
                                        if (fits(pr.mem)) {
                                            pool.push_back(std::move(pr));
                                        } else {
                                            pr.why = why_not(pr.mem);
                                            keep_best(rep.rejected, std::move(pr), r.top);
                                        }
                                    }
                            }
                    }
                }
        }
    if (!any_layout)
        throw ConfigError(fmt::format("no layout of {} devices divides the global batch of {} (data-parallel size must "
                                      "divide it); pick --global-batch a multiple of the data-parallel size",
                                      r.gpus, r.global_batch));
    // Fastest first; the exact plan decides for what the engine runs, so walk until `top` fit.
    std::sort(pool.begin(), pool.end(), faster);
    rep.fitting = pool.size();
    for (PlanResult & pr : pool) {
        if (rep.best.size() >= r.top) break;
        pr.mem = memory_of(pr.c, &pr.mem);
        pr.fits = fits(pr.mem);
        if (pr.fits) {
            rep.best.push_back(std::move(pr));
        } else {
            --rep.fitting;
            pr.why = why_not(pr.mem);
            keep_best(rep.rejected, std::move(pr), r.top);
        }
    }
    // What would make a rejected candidate fit: the first of these that does, judged as the
    // listing is (exact where the engine runs it). For every rejected one when explaining, else
    // for the closest only (the one line printed when nothing fits).
    for (size_t i = 0; i < rep.rejected.size() && (r.explain || i == 0); ++i) {
        PlanResult & pr = rep.rejected[i];
        if (pr.hinted) continue;
        auto try_fix = [&](Candidate alt, const std::string & what) {
            if (bytes_bound(cfg, alt, r.seq) >= kBytesBound || !fits(memory_of(alt, nullptr))) return false;
            pr.why += "; " + what + " would fit";
            return true;
        };
        Candidate a = pr.c;
        a.recompute = "selective";
        if (pr.c.recompute == "none" && try_fix(a, "selective recomputation")) continue;
        a.recompute = "full";
        if (!(pr.c.recompute == "full") && try_fix(a, "full recomputation")) continue;
        a = pr.c;
        a.micro_batch = 1;
        a.grad_accum = pr.c.micro_batch * pr.c.grad_accum;
        if (pr.c.micro_batch > 1 && try_fix(a, "micro-batch 1")) continue;
        a = pr.c;
        a.layout.zero = std::min(3, a.layout.zero + 1);
        if (pr.c.layout.dp > 1 && pr.c.layout.zero < 3 && !(packed && a.layout.zero >= 3))
            try_fix(a, fmt::format("ZeRO-{}", a.layout.zero));
    }
    rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return rep;
}

int min_gpus(PlanRequest r, int limit, SearchReport * report) {
    const int node = std::max(1, r.hw.per_node);
    std::vector<int> counts;
    for (int n = 1; n < node && n <= limit; n *= 2) counts.push_back(n);
    for (int n = node; n <= limit; n += node) counts.push_back(n);
    for (int n : counts) {
        r.gpus = n;
        r.nodes = (n + node - 1) / node;
        try {
            SearchReport rep = search_plans(r);
            if (!rep.best.empty()) {
                if (report) *report = std::move(rep);
                return n;
            }
        } catch (const ConfigError &) {
            // this count cannot divide the global batch: try the next
        }
    }
    return 0;
}

}  // namespace memfit
