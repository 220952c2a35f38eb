#include "plan/search.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"
#include "plan/lora_plan.h"
#include "plan/request_checks.h"
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
    // Ties: the activations on the device (offloading them is free only when hidden), then headroom.
    if (a.c.layout.offload_acts != b.c.layout.offload_acts) return !a.c.layout.offload_acts;
    return a.mem.total() < b.mem.total();
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

// The layouts (dp x tp x pp, ZeRO, offload, sp) the search covers for `r`. Tensor parallelism
// stays inside a node and must split the heads (and the KV heads, or be a multiple of them);
// pipeline stages must each get a layer; the data-parallel size must divide the global batch.
// Context-parallel sizes a layout of `cells` devices (tp x pp fixed) may take: 1, and from
// kCpSearchSeq positions on each power of two that divides the devices and whose 2 x cp chunks
// divide the sequence (shorter sequences gain nothing from splitting).
constexpr int kCpSearchSeq = 16384;
std::vector<int> context_sizes(const PlanRequest & r, int cells) {
    if (r.cp) return {*r.cp};
    std::vector<int> out{1};
    if (r.run.seq < kCpSearchSeq) return out;
    for (int c = 2; c <= cells && cells % c == 0; c *= 2)
        if (r.run.seq % (2 * c) == 0) out.push_back(c);
    return out;
}

// Expert-parallel sizes a layout of `ranks` data ranks may take (a mixture of experts): 1, and each
// power of two that divides the data ranks and the experts.
std::vector<int> expert_sizes(const PlanRequest & r, int ranks) {
    if (r.ep) return {*r.ep};
    std::vector<int> out{1};
    if (!r.cfg.moe.enabled()) return out;
    for (int e = 2; e <= ranks && ranks % e == 0 && r.cfg.moe.experts % e == 0; e *= 2) out.push_back(e);
    return out;
}

std::vector<Layout> searched_layouts(const PlanRequest & r) {
    const ModelConfig & cfg = r.cfg;
    std::vector<Layout> out;
    // On the `cpu` hardware the host memory is the device memory: offloading gains nothing.
    const bool gpu = r.hw.name != "cpu";
    for (int tp : fixed_or(r.tp, divisors(r.gpus, std::max(1, r.hw.per_node)))) {
        if (r.gpus % tp || cfg.n_head % tp || (cfg.kv_heads() % tp && tp % cfg.kv_heads())) continue;
        for (int pp : fixed_or(r.pp, divisors(r.gpus / tp, cfg.n_layer))) {
            if ((r.gpus / tp) % pp) continue;
            for (int cp : context_sizes(r, r.gpus / (tp * pp))) {
            if ((r.gpus / (tp * pp)) % cp) continue;
            const int dp = r.gpus / (tp * pp * cp);
            if (r.run.global_batch > 0 && r.run.global_batch % dp) continue;
            for (int zero : fixed_or(r.zero, dp > 1 ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{0})) {
                std::vector<Offload> offloads{Offload::none};
                if (gpu) offloads = {Offload::none, Offload::optimizer, Offload::optimizer_params};
                for (Offload off : fixed_or(r.offload, offloads)) {
                    // Parameter offload streams each layer from the ZeRO-3 shard (one device's: a
                    // shard of the whole); asked for with a lower --zero, it is listed, refused.
                    int z = zero;
                    if (off == Offload::optimizer_params && zero < 3 && !(r.offload && r.zero)) {
                        if (dp > 1 || r.zero) continue;
                        z = 3;
                    }
                    if (pp > 1 && z >= 2 && !r.zero) continue;   // ZeRO-2/3 with pipelines: not searched
                    // Activation offload: a program's own layers' (no pipeline); on GPUs only.
                    const std::vector<bool> acts_searched = gpu && pp == 1 ? std::vector<bool>{false, true}
                                                                           : std::vector<bool>{false};
                    for (bool sp : fixed_or(r.sp, tp > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false}))
                        for (bool acts : fixed_or(r.offload_acts, acts_searched))
                            for (int ep : expert_sizes(r, dp * cp)) {
                                Layout L;
                                L.dp = dp, L.tp = tp, L.pp = pp, L.zero = z, L.offload = off, L.sp = sp && tp > 1;
                                L.offload_acts = acts;
                                L.cp = cp;
                                L.ep = ep;
                                out.push_back(L);
                            }
                }
            }
            }
        }
    }
    return out;
}

// Sequences per step on each data-parallel rank of a layout with `dp` ranks.
int per_rank_batch(const PlanRequest & r, int dp) {
    return r.run.global_batch > 0 ? r.run.global_batch / dp : r.micro_batch.value_or(1) * r.grad_accum.value_or(1);
}

Candidate make_candidate(const PlanRequest & r, const Layout & L, int mb, int per_rank) {
    Candidate c(r.run);
    c.device.clear();
    c.layout = L;
    c.micro_batch = mb;
    c.grad_accum = per_rank / mb;
    c.global_batch = per_rank * L.dp;
    c.batch = 0;
    if (L.offload != Offload::optimizer) c.offload_fraction = 1;   // parameter offload takes all the states
    if (L.offload == Offload::none && !L.offload_acts) c.offload_dir.clear();   // where any offload goes
    if (!L.offload_acts) c.offload_activation_layers = 0;
    c.lora_plan = r.lora;
    c.distill_plan = r.distill;
    c.tp_comm_overlap = r.tp_comm_overlap;
    return c;
}

// What the analytic model does not cover, in one line (empty: it does); the search leaves these
// layouts out whatever train says: a packed LoRA base streamed from host memory, and the data-parallel
// techniques (packing, distillation, shared blocks) split by tensor or pipeline parallelism.
std::string analytic_gap(const PlanRequest & r, const Candidate & c) {
    try {
        check_lora_layout(c);
    } catch (const ConfigError & e) {
        return e.what();
    }
    const Layout & L = c.layout;
    if ((L.tp > 1 || L.pp > 1) && (r.run.packing || r.distill || r.cfg.share_layers > 1))
        return unsupported(planned_train_run(r, c), r.cfg, r.exact_sizing).value_or("not modelled");
    return "";
}

}  // namespace

RunConfig PlanRequest::planned_run() {
    RunConfig r;
    r.device.clear();
    r.seq = 1024;
    r.global_batch = 8;
    r.compute = DType::bf16;
    return r;
}

std::string planned_device(const Hardware & hw) { return hw.name == "cpu" ? "cpu" : "cuda"; }

RunConfig planned_train_run(const PlanRequest & r, const Candidate & c) {
    RunConfig run = candidate_run(c, r.run.seq);
    run.device = planned_device(r.hw);
    return run;
}

std::string layout_name(const Layout & l) {
    std::string s = fmt::format("dp {} x tp {} x pp {}", l.dp, l.tp, l.pp);
    if (l.cp > 1) s += fmt::format(", cp {}", l.cp);
    if (l.ep > 1) s += fmt::format(", ep {}", l.ep);
    if (l.zero > 0) s += fmt::format(", ZeRO-{}", l.zero);
    if (l.offload != Offload::none || l.offload_acts) s += ", offload " + offload_flag(l);
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

// One search's state: the request, the report it fills, and the exact plans recorded so far.
class Search {
public:
    explicit Search(const PlanRequest & r) : r_(with_nodes(r)), cfg_(r_.cfg) {}
    SearchReport run();

private:
    void layout(const Layout & L);
    void candidate(PlanResult && pr);
    void walk();
    void prefetch_exact(size_t from);
    static std::string exact_key(const Candidate & c);
    void explain_rejected();
    void explain(PlanResult & pr);
    void reject(PlanResult && pr);   // into `rejected` (the fastest) and `closest` (the smallest)
    DeviceMemory memory_of(const Candidate & c, const DeviceMemory * analytic);
    bool fits(const DeviceMemory & m) const { return m.total() <= r_.hw.memory && host_fits(r_, m); }
    bool recordable(const Candidate & c) const {
        return r_.exact_sizing && !unsupported(candidate_run(c, r_.run.seq), cfg_, r_.exact_sizing);
    }
    // The filter before the exact plans: the analytic bytes `m` may still fit. Where the engine's
    // program decides (recordable), up to kAnalyticSlack over the device: the analytic model
    // exceeds the program by less than that (PlanMemory.AnalyticModelIsWithinTheSlack), so the
    // filter never rejects what the program fits.
    bool may_fit(const Candidate & c, const DeviceMemory & m) const {
        if (fits(m)) return true;
        return host_fits(r_, m) && double(m.total()) <= kAnalyticSlack * double(r_.hw.memory) && recordable(c);
    }
    std::string why_not(const DeviceMemory & m) const;
    std::string refusal(const Candidate & c);

    static PlanRequest with_nodes(PlanRequest r) {
        const int node = std::max(1, r.hw.per_node);
        if (r.nodes == 0) r.nodes = (r.gpus + node - 1) / node;
        return r;
    }

    const PlanRequest r_;
    const ModelConfig & cfg_;
    SearchReport rep_;
    std::vector<PlanResult> pool_;   // fitting by the analytic model, to be ranked
    std::map<std::string, DeviceMemory> exact_;
    std::map<std::string, std::string> refusals_;
    std::string first_refusal_;
    size_t runnable_ = 0;
};

std::string Search::why_not(const DeviceMemory & m) const {
    const uint64_t cap = r_.hw.memory;
    return m.total() > cap ? fmt::format("needs {} of {}: {}", format_bytes(m.total()), format_bytes(cap), biggest(m.device))
                           : fmt::format("offloads {} per device: more than the node's {} of host memory holds",
                                         format_bytes(m.host), format_bytes(r_.hw.host_memory));
}

// train's verdict (run/compat.h) at the hardware's device; the rules look at the layout, the
// micro-batch's tokens and the pipeline's micro-batches only, so one answer serves many.
std::string Search::refusal(const Candidate & c) {
    const std::string key = fmt::format("{}|{}|{}|{}|{}", layout_name(c.layout), c.micro_batch, c.grad_accum,
                                        c.flash(), c.recompute.name());
    auto it = refusals_.find(key);
    if (it == refusals_.end()) {
        const auto why = unsupported(planned_train_run(r_, c), cfg_, r_.exact_sizing);
        it = refusals_.emplace(key, why.value_or("")).first;
    }
    return it->second;
}

// What decides fit and is shown: the engine's own program where it can be recorded (exact),
// else the analytic model. Exact plans are recorded only for the candidates that could be
// listed, in speed order, and each at most once.
DeviceMemory Search::memory_of(const Candidate & c, const DeviceMemory * analytic) {
    if (!recordable(c)) return analytic ? *analytic : predict_memory(cfg_, r_.hw, c, r_.run.seq);
    const std::string key = exact_key(c);
    auto it = exact_.find(key);
    if (it == exact_.end()) {
        it = exact_.emplace(key, exact_memory(cfg_, r_.hw, c, r_.run.seq, *r_.exact_sizing)).first;
        ++rep_.exact_recorded;
    }
    return it->second;
}

void Search::candidate(PlanResult && pr) {
    ++rep_.evaluated;
    const int seq = r_.run.seq;
    pr.refused = refusal(pr.c);
    if (pr.runnable()) ++runnable_;
    else if (first_refusal_.empty()) first_refusal_ = pr.refused;
    pr.time = predict_step_time(cfg_, r_.hw, pr.c, seq, r_.nodes);
    if (bytes_bound(cfg_, pr.c, seq) >= kBytesBound) {
        pr.why = fmt::format("needs more than 1 EiB of {}", format_bytes(r_.hw.memory));
        pr.hinted = true;
        reject(std::move(pr));
        return;
    }
    pr.mem = predict_memory(cfg_, r_.hw, pr.c, seq);
    if (!may_fit(pr.c, pr.mem)) {
        pr.why = why_not(pr.mem);
        if (pr.runnable() || r_.include_plan_only) reject(std::move(pr));
        return;
    }
    if (pr.runnable() || r_.include_plan_only) {
        pool_.push_back(std::move(pr));
        return;
    }
    if (!fits(pr.mem)) return;   // within the slack only: its exact plan is not recorded here
    ++rep_.plan_only;
    pr.fits = true;
    keep_best(rep_.plan_only_best, std::move(pr), 3);
}

void Search::layout(const Layout & L) {
    const int seq = r_.run.seq;
    const int per_rank = per_rank_batch(r_, L.dp);
    // Prune: the smallest footprint this layout can have (micro-batch 1, full recompute).
    Candidate probe = make_candidate(r_, L, 1, per_rank);
    probe.recompute = "full";
    probe.set_flash(true);
    if (L.pp > 1) probe.layout.schedule = PipeSchedule::one_f_one_b;
    if (refusal(probe).empty()) ++runnable_;   // train runs this layout, whether or not it fits
    const double probe_bound = bytes_bound(cfg_, probe, seq);
    const DeviceMemory floor = probe_bound < kBytesBound ? predict_memory(cfg_, r_.hw, probe, seq) : DeviceMemory{};
    if (probe_bound >= kBytesBound || !may_fit(probe, floor)) {
        ++rep_.pruned_layouts;
        PlanResult pr;
        pr.c = probe;
        pr.mem = floor;
        pr.time = predict_step_time(cfg_, r_.hw, probe, seq, r_.nodes);
        pr.why = fmt::format("needs {} of {} even at micro-batch 1 with full recomputation: {}",
                             probe_bound >= kBytesBound ? "more than 1 EiB" : format_bytes(floor.total()),
                             format_bytes(r_.hw.memory), probe_bound >= kBytesBound ? "everything" : biggest(floor.device));
        pr.hinted = true;
        reject(std::move(pr));
        return;
    }
    // Flash attention unless the device's kernels refuse this head dimension (then naive).
    const bool flash_ok = !r_.exact_sizing || r_.exact_sizing->runs_flash_attention(cfg_.head_dim());
    std::vector<PipeSchedule> scheds = {PipeSchedule::one_f_one_b};
    if (L.pp > 1) {
        if (r_.schedule) scheds = {*r_.schedule};
        else if (cfg_.n_layer % (L.pp * r_.virtual_stages) == 0) scheds.push_back(PipeSchedule::interleaved);
    }
    for (PipeSchedule sch : scheds)
        for (int mb : fixed_or(r_.micro_batch, divisors(per_rank, 64))) {
            if (per_rank % mb || (r_.grad_accum && per_rank / mb != *r_.grad_accum)) continue;
            for (const std::string & rc : fixed_or(r_.recompute, searched_recompute_policies()))
                for (bool flash : fixed_or(r_.flash, {flash_ok})) {
                    PlanResult pr;
                    pr.c = make_candidate(r_, L, mb, per_rank);
                    pr.c.layout.schedule = sch;
                    pr.c.layout.virtual_stages = sch == PipeSchedule::interleaved ? r_.virtual_stages : 1;
                    pr.c.recompute = rc;
                    pr.c.set_flash(flash);
                    candidate(std::move(pr));
                }
        }
}

// The exact plans of the next candidates the walk will need from `from` on (as many as rows are
// still to list, and a few more), recorded at once on the machine's threads, each taking the next
// from a shared count, when the sizing backend allows (Backend::pure_sizing); memory_of then finds
// them recorded. Each is recorded once, so the plans and the listing are the same as one
// thread's; a few go unused when candidates do not fit or the walk stops.
void Search::prefetch_exact(size_t from) {
    const size_t threads = std::min<size_t>(8, std::max(1u, std::thread::hardware_concurrency()));
    if (!r_.exact_sizing || !r_.exact_sizing->pure_sizing() || threads < 2) return;
    const size_t want = std::min(4 * threads, r_.top - rep_.best.size() + threads - 1);
    std::vector<std::pair<std::string, const Candidate *>> todo;
    for (size_t i = from; i < pool_.size() && todo.size() < want; ++i) {
        const Candidate & c = pool_[i].c;
        if (!recordable(c)) continue;
        const std::string key = exact_key(c);
        if (!exact_.count(key) && std::none_of(todo.begin(), todo.end(), [&](const auto & t) { return t.first == key; }))
            todo.emplace_back(key, &c);
    }
    if (todo.size() < 2) return;
    std::vector<std::optional<DeviceMemory>> got(todo.size());
    std::atomic<size_t> next{0};
    std::vector<std::thread> workers;
    for (size_t t = 0; t < std::min(threads, todo.size()); ++t)
        workers.emplace_back([&] {
            for (size_t k = next++; k < todo.size(); k = next++) {
                try {
                    got[k] = exact_memory(cfg_, r_.hw, *todo[k].second, r_.run.seq, *r_.exact_sizing);
                } catch (const std::exception &) {
                    // left to memory_of, which records it again in order and reports what it throws
                }
            }
        });
    for (std::thread & t : workers) t.join();
    for (size_t k = 0; k < todo.size(); ++k)
        if (got[k]) exact_.emplace(todo[k].first, std::move(*got[k])), ++rep_.exact_recorded;
}

std::string Search::exact_key(const Candidate & c) {
    return fmt::format("{}|{}|{}|{}|{}|{}", layout_name(c.layout), technique_name(c), dtype_name(c.compute),
                       int(c.layout.schedule), c.layout.virtual_stages, static_cast<const void *>(c.lora_plan.get()));
}

// Fastest first; the exact plan decides where the engine records one, so walk until `top` fit.
void Search::walk() {
    std::sort(pool_.begin(), pool_.end(), faster);
    rep_.fitting = size_t(std::count_if(pool_.begin(), pool_.end(), [&](const PlanResult & p) { return fits(p.mem); }));
    for (size_t i = 0; i < pool_.size(); ++i) {
        PlanResult & pr = pool_[i];
        if (rep_.best.size() >= r_.top) break;
        if (!exact_.count(exact_key(pr.c))) prefetch_exact(i);
        const bool analytic_fit = fits(pr.mem);
        pr.mem = memory_of(pr.c, &pr.mem);
        pr.fits = fits(pr.mem);
        if (pr.fits) {
            if (!analytic_fit) ++rep_.fitting;   // let through by the slack, fitted by its program
            rep_.best.push_back(std::move(pr));
        } else {
            if (analytic_fit) --rep_.fitting;
            pr.why = why_not(pr.mem);
            reject(std::move(pr));
        }
    }
}

void Search::reject(PlanResult && pr) {
    auto need = [](const PlanResult & x) { return x.mem.total() > 0 ? double(x.mem.total()) : 1e300; };
    if (rep_.closest.empty()) rep_.closest.push_back(pr);
    else if (need(pr) < need(rep_.closest.front())) rep_.closest.front() = pr;
    keep_best(rep_.rejected, std::move(pr), r_.top);
}

// What would make a rejected candidate fit: the first of these that does, judged as the listing
// is (exact where the engine records it). For the closest (the one line printed when nothing
// fits), and for every rejected one when explaining.
void Search::explain_rejected() {
    for (PlanResult & pr : rep_.closest) explain(pr);
    for (size_t i = 0; r_.explain && i < rep_.rejected.size(); ++i) explain(rep_.rejected[i]);
}

void Search::explain(PlanResult & pr) {
    if (pr.hinted) return;
    pr.hinted = true;
    auto try_fix = [&](Candidate alt, const std::string & what) {
        if (bytes_bound(cfg_, alt, r_.run.seq) >= kBytesBound || !fits(memory_of(alt, nullptr))) return false;
        pr.why += "; " + what + " would fit";
        return true;
    };
    Candidate a = pr.c;
    a.recompute = "selective";
    if (pr.c.recompute == "none" && try_fix(a, "selective recomputation")) return;
    a.recompute = "full";
    if (!(pr.c.recompute == "full") && try_fix(a, "full recomputation")) return;
    a = pr.c;
    a.micro_batch = pr.c.pref.dpo() ? 2 : 1;   // preference pairs stay whole
    a.grad_accum = pr.c.micro_batch * pr.c.grad_accum / a.micro_batch;
    if (pr.c.micro_batch > a.micro_batch && try_fix(a, fmt::format("micro-batch {}", a.micro_batch))) return;
    a = pr.c;
    a.layout.zero = std::min(3, a.layout.zero + 1);
    if (pr.c.layout.dp > 1 && pr.c.layout.zero < 3) try_fix(a, fmt::format("ZeRO-{}", a.layout.zero));
}

SearchReport Search::run() {
    const auto t0 = std::chrono::steady_clock::now();
    check_request(r_);
    const std::vector<Layout> layouts = searched_layouts(r_);
    if (layouts.empty()) throw ConfigError(no_layout_message(r_));
    std::string gap;
    for (const Layout & L : layouts) {
        const std::string g = analytic_gap(r_, make_candidate(r_, L, 1, per_rank_batch(r_, L.dp)));
        if (g.empty()) layout(L);
        else if (gap.empty()) gap = g;
    }
    // Everything asked for is a layout the model does not cover, or one train refuses and none
    // fits anyway: that reason, not "nothing fits".
    if (rep_.evaluated == 0 && rep_.pruned_layouts == 0 && !gap.empty()) throw ConfigError(gap);
    if (!r_.include_plan_only && runnable_ == 0 && rep_.plan_only == 0 && !first_refusal_.empty())
        throw ConfigError(first_refusal_);
    walk();
    explain_rejected();
    if (rep_.best.empty() && r_.hint) rep_.hint = nothing_fits_hint(r_, rep_);
    rep_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return std::move(rep_);
}

}  // namespace

SearchReport search_plans(const PlanRequest & r) { return Search(r).run(); }

int min_gpus(PlanRequest r, int limit, SearchReport * report) {
    const int node = std::max(1, r.hw.per_node);
    std::vector<int> counts;
    for (int n = 1; n < node && n <= limit; n *= 2) counts.push_back(n);
    for (int n = node; n <= limit; n += node) counts.push_back(n);
    r.hint = false;
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
            // this count cannot divide the global batch (or fix the layout asked for): try the next
        }
    }
    return 0;
}

}  // namespace memfit
