#include "app/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/make_backend.h"
#include "backend/quant_format.h"
#include "comm/communicator.h"
#include "comm/device_communicator.h"
#include "comm/groups.h"
#include "model/tensor_parallel.h"
#include "core/error.h"
#include "core/json_num.h"
#include "core/paths.h"
#include "core/units.h"
#include "memory/budget.h"
#include "report/memory_report.h"
#include "report/progress.h"
#include "tokenizer/tokenizer.h"
#include "data/data_loader.h"
#include "train/engine.h"
#include "train/replan.h"
#include "train/checkpoint.h"
#include "infer/generate.h"
#include "model/hf_weights.h"
#include "data/prepare.h"
#include "app/report.h"
#include "report/chrome_trace.h"
#include "report/html_report.h"
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
            std::fprintf(stderr, "prepared %s: %llu train + %llu validation tokens (%s)\n", dir.c_str(), (unsigned long long) d.train_tokens,
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


ProgressMode progress_mode(const std::string & m) {
    if (m == "tty") return ProgressMode::tty;
    if (m == "plain") return ProgressMode::plain;
    if (m == "json") return ProgressMode::json;
    if (m == "quiet") return ProgressMode::quiet;
    if (m == "auto") return ProgressMode::auto_detect;
    throw ConfigError(fmt::format("--progress {}: expected auto, tty, plain, json or quiet", m));
}

}  // namespace

namespace {

// The model as a checkpoint records it: its Hugging Face config plus the name.
nlohmann::json checkpoint_model(const ModelConfig & cfg) {
    nlohmann::json j = hf_config_json(cfg);
    j["name"] = cfg.name;
    return j;
}

// What a checkpoint records besides the training state: where the run is and what it is.
nlohmann::json checkpoint_meta(int step, const ModelConfig & cfg, const TrainOptions & opt, const DataLoader & train,
                               const DataLoader * val, const LoraOptions & lora) {
    nlohmann::json m = {{"step", step},
                        {"model", checkpoint_model(cfg)},
                        {"seq", opt.seq},
                        {"global_batch", opt.batch * opt.grad_accum},
                        {"seed", opt.seed},
                        {"data", {{"train_epoch", train.epoch()}, {"train_cursor", train.cursor()}}}};
    // LoRA: the checkpoint holds the adapters; the base comes back from the model folder (or
    // from the seed's initialisation when there is none).
    if (lora.enabled()) {
        m["lora"] = lora_json(lora);
        m["lora"]["base_model"] = has_hf_weights(opt.model) ? fs::absolute(opt.model).string() : std::string();
    }
    if (val) {
        m["data"]["val_epoch"] = val->epoch();
        m["data"]["val_cursor"] = val->cursor();
    }
    return m;
}

// The range of the flat trainable buffer this rank's state covers: its ZeRO shard, or the whole.
std::pair<size_t, size_t> state_range(const Engine & engine) {
    // Tensor parallel: export_state gathers the whole model's state.
    if (engine.options().zero == 0 || engine.options().tensor_parallel > 1) return {0, engine.total_params()};
    const Engine::Shard sh = engine.shard();
    return {sh.lo, sh.hi};
}

// Restores a checkpoint into the engine and the loaders; returns its step. Every rank reads the
// shard files overlapping its own range (whatever the number of ranks that wrote them).
int resume_from(const std::string & path, const ModelConfig & cfg, const TrainOptions & opt, Engine & engine,
                DataLoader & train, DataLoader * val) {
    const std::string dir = find_checkpoint(path);
    const nlohmann::json m = load_checkpoint_meta(dir);
    const nlohmann::json want = checkpoint_meta(0, cfg, opt, train, val, engine.options().lora);
    // The trained context is compared through "seq" (checkpoints before it was recorded lack it).
    auto field = [](nlohmann::json j, const char * k) {
        nlohmann::json v = j.value(k, nlohmann::json());
        if (v.is_object()) v.erase(kTrainedContextKey);
        return v;
    };
    for (const char * k : {"model", "seq", "global_batch", "seed", "lora"})
        if (field(m, k) != field(want, k))
            throw ConfigError(fmt::format("--resume {}: the checkpoint's {} is {}, this run's is {}; resume with the "
                                          "same model, --seq, global batch, --seed and LoRA options",
                                          path, k, m.value(k, nlohmann::json()).dump(), want.value(k, nlohmann::json()).dump()));
    const size_t total = checkpoint_total(dir, m);
    if (total != engine.total_params())
        throw FormatError(fmt::format("--resume {}: {} parameters, the model has {}", path, total,
                                      engine.total_params()));
    const int step = json_get<int>(m, "step", path);
    if (step >= opt.steps)
        throw ConfigError(fmt::format("--resume {}: the checkpoint is at step {}; --steps {} must be larger", path,
                                      step, opt.steps));
    const auto [lo, hi] = state_range(engine);
    engine.import_state(load_state_range(dir, m, lo, hi));
    const auto & d = m.at("data");
    train.seek(json_get<uint64_t>(d, "train_epoch", path), json_get<size_t>(d, "train_cursor", path));
    if (val && d.contains("val_epoch"))
        val->seek(json_get<uint64_t>(d, "val_epoch", path), json_get<size_t>(d, "val_cursor", path));
    return step;
}

// Writes a checkpoint: one file on one process; with N ranks every rank its range (its ZeRO
// shard, or without ZeRO an even 1/N of the state it holds whole) and rank 0 the meta.
std::string write_checkpoint(const std::string & root, Engine & engine, nlohmann::json meta, int keep,
                             Communicator & comm) {
    const EngineOptions & eo = engine.options();
    meta["world_size"] = comm.size();
    meta["zero"] = eo.zero;
    TrainState s = engine.export_state();
    const size_t total = engine.total_params();
    if (comm.size() == 1 && s.params.size() == total) {
        s.offset = 0;
        s.total = total;
        return save_checkpoint(root, Checkpoint{std::move(s), std::move(meta)}, keep);
    }
    if (s.params.size() == total) {   // the whole state: this rank writes its even share
        const ShardRange r = even_shard(total, comm.rank(), comm.size());
        auto cut = [&](std::vector<float> & v) {
            v.erase(v.begin() + long(r.offset + r.count), v.end());
            v.erase(v.begin(), v.begin() + long(r.offset));
        };
        cut(s.params);
        cut(s.m);
        cut(s.v);
        s.offset = r.offset;
    } else {
        s.offset = state_range(engine).first;
    }
    s.total = total;
    return save_checkpoint_sharded(root, Checkpoint{std::move(s), std::move(meta)}, keep, eo.zero, comm);
}

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

// Per-rank memory, gathered: what each rank's ledger measured.
struct RankMemory {
    std::vector<CategoryBytes> reserved, live;   // [rank]
    std::vector<uint64_t> rss;
};

RankMemory gather_memory(Communicator & comm, const Ledger & L, uint64_t rss) {
    const size_t N = size_t(comm.size());
    RankMemory r;
    r.reserved.resize(N);
    r.live.resize(N);
    const CategoryBytes rsv = L.reserved_peak(), live = L.live_peak();
    for (size_t c = 0; c < size_t(kCategoryCount); ++c) {
        const auto a = comm.all_gather_u64(rsv.v[c]);
        const auto b = comm.all_gather_u64(live.v[c]);
        for (size_t k = 0; k < N; ++k) {
            r.reserved[k].v[c] = a[k];
            r.live[k].v[c] = b[k];
        }
    }
    r.rss = comm.all_gather_u64(rss);
    return r;
}

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
                                {"peak_live", category_json(r.live[k])}, {"peak_rss_bytes", r.rss[k]}});
    return j;
}

}  // namespace

void run_training(const TrainOptions & opt) {
    if (opt.steps < 1) throw ConfigError(fmt::format("--steps {}: must be at least 1", opt.steps));
    if (opt.check_leaks && opt.steps < 4)
        throw ConfigError(fmt::format("--check-leaks compares steps 2 and 3: needs --steps 4 or more (got {})", opt.steps));
    check_data_parallel_flags(opt);
    const ProgressMode mode = progress_mode(opt.progress);
    // Data parallel (`mpirun -np N memfit train ...`): --batch is the global micro-batch; every
    // rank runs B/N of its sequences. Rank 0 alone prints and writes outputs.
    // Tensor parallel (--tp T): groups of T consecutive ranks share each micro-batch; pipeline
    // parallel (--pp P): P stages; data parallel runs over the N / (T P) copies of the model.
    const std::unique_ptr<Communicator> comm = make_communicator();
    const int world = comm->size();
    const bool lead = comm->rank() == 0;
    const ParallelLayout layout = derive_layout(world, opt.tp, opt.pp);
    std::unique_ptr<ProcessGroups> pgroups;
    if (layout.tp > 1 || layout.pp > 1) pgroups = std::make_unique<ProcessGroups>(*comm, layout);
    // `ranks` and `rank`: the data-parallel ones (the world without tensor parallelism).
    const int ranks = layout.dp, rank = pgroups ? pgroups->coords.dp : comm->rank();
    Communicator * data_comm = pgroups ? pgroups->dp.get() : comm.get();
    if (opt.batch % ranks)
        throw ConfigError(fmt::format("--batch {} is not divisible by the {} data-parallel ranks; --batch is the global "
                                      "micro-batch, split evenly over them: use a multiple of {} (e.g. --batch {})",
                                      opt.batch, ranks, ranks, (opt.batch / ranks + 1) * ranks));
    if (world > 1 && !opt.budget_file.empty())
        throw ConfigError(fmt::format("--budget-file re-plans one process's run mid-training; it is not supported with "
                                      "{} ranks: set --memory-budget (per rank) instead", world));
    Progress progress(lead ? mode : ProgressMode::quiet);
    // Everything but the status line goes through the progress display, so a terminal's live
    // line stays intact, --json keeps stdout JSON Lines and --quiet keeps it empty.
    auto say = [&](const std::string & text) {
        size_t start = 0;
        while (start < text.size()) {
            size_t end = text.find('\n', start);
            if (end == std::string::npos) end = text.size();
            progress.message(text.substr(start, end - start));
            start = end + 1;
        }
    };
    if (opt.threads > 0) omp_set_num_threads(opt.threads);
    // Validate every flag before doing any work.
    const uint64_t budget_flag = opt.memory_budget.empty() ? 0 : parse_bytes(opt.memory_budget);
    ModelConfig cfg = resolve_model(opt.model);
    // The positions this run trains (checkpoints and exports record them; generation stays
    // inside): a fresh model's are --seq's, a pre-trained folder's what it records plus --seq's
    // (a folder that records none, from the Hub, was trained on all of them).
    if (!has_hf_weights(opt.model)) cfg.trained_seq = opt.seq;
    else if (cfg.trained_seq > 0) cfg.trained_seq = std::max(cfg.trained_seq, opt.seq);
    // --device cuda, before any work (no device: one error line): each rank takes the GPU of its
    // local rank; gradients go over NCCL.
    const char * local_rank = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    const std::unique_ptr<Backend> backend_owner =
        make_backend(opt.device, local_rank ? std::atoi(local_rank) : 0);
    Backend & backend = *backend_owner;
    if (!backend.host_memory() && (opt.tp > 1 || opt.pp > 1))
        throw ConfigError(fmt::format("--device {}: --tp and --pp run on the CPU only for now", opt.device));
    const std::unique_ptr<Communicator> device_comm = make_device_communicator(*comm, backend);
    if (device_comm) data_comm = device_comm.get();
    // A Hugging Face folder with a tokenizer.model tokenizes the corpus with it unless told otherwise.
    const std::string tokenizer =
        opt.tokenizer.empty() && fs::is_directory(opt.model) ? tokenizer_for_folder(opt.model) : opt.tokenizer;
    // Rank 0 prepares the bundled corpus (if needed) before the others look for it.
    if (!lead) comm->barrier();
    const DataSource data = resolve_data(opt.data, tokenizer, cfg.vocab_size);
    if (lead && world > 1) comm->barrier();
    if (cfg.vocab_size == 0) cfg.vocab_size = data.vocab_size;
    if (data.vocab_size > cfg.vocab_size)
        throw ConfigError(fmt::format("the data's vocabulary ({} tokens, {}) is larger than the model's ({}); "
                                      "use a model with a larger vocab_size or other data",
                                      data.vocab_size, data.tokenizer, cfg.vocab_size));
    cfg.validate();

    // Without --memory-budget the plan must still fit the memory this process can have; ranks on
    // one machine share it (and every rank plans with the same number: the smallest). A GPU's:
    // what is free on it once the runtime has started.
    uint64_t budget = budget_flag;
    if (!budget) {
        const char * local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
        const uint64_t per_host = local ? std::max<uint64_t>(1, std::strtoull(local, nullptr, 10)) : 1;
        budget = backend.host_memory() ? available_memory() / std::min<uint64_t>(per_host, uint64_t(world))
                                       : backend.device_free();
        if (world > 1) {
            const auto all = comm->all_gather_u64(budget);
            budget = *std::min_element(all.begin(), all.end());
        }
    }
    // The engine plans this rank's share: B/N sequences per micro-batch.
    RunShape shape = opt;
    shape.batch = opt.batch / ranks;
    shape.data_parallel = ranks;
    shape.tp_rank = 0;
    shape.pp_rank = pgroups ? pgroups->coords.pp : 0;   // the stages' programs differ: each plans its own
    // Every rank resolves the flags as rank 0 would (every rank's program has the same buffers,
    // so --fit auto and --recompute budget make the same choice on all); then each builds its own.
    shape.rank = 0;
    const ResolvedRun run = resolve_run(shape, cfg, backend, !data.val_path.empty() && !opt.profile, budget);
    EngineOptions eo = run.eo;
    eo.rank = rank;
    eo.checking = opt.check_lifetimes;
    eo.comm = data_comm;
    eo.tp_comm = pgroups ? pgroups->tp.get() : nullptr;
    eo.tp_rank = pgroups ? pgroups->coords.tp : 0;
    eo.pp_comm = pgroups ? pgroups->pp.get() : nullptr;
    eo.emb_comm = pgroups ? pgroups->emb.get() : nullptr;
    for (const auto & n : run.notes) say(n);
    // batch, accum: the global micro-batch and accumulation the engine runs (its B x ranks).
    const int batch = eo.B * ranks, accum = eo.grad_accum;
    // The loader yields the whole global batch per step, so a run-time re-plan to a smaller
    // micro-batch sees the same sequences; every rank reads it and keeps its rows of each of the
    // flags' micro-batches (rows r*B/N .. (r+1)*B/N-1 of each B).
    DataLoader train_data(data.train_path, batch * accum, opt.seq, opt.seed);
    std::unique_ptr<DataLoader> val_data;
    if (eo.with_eval) val_data = std::make_unique<DataLoader>(data.val_path, batch, opt.seq, opt.seed + 1);

    say(fmt::format("memfit {}: model {} ({}, vocab {}, {:.2f}M parameters)", opt.profile ? "profile" : "train",
                    cfg.name, cfg.describe(), cfg.vocab_size, double(cfg.num_params()) / 1e6));
    say(fmt::format("  data {} ({}), batch {} x seq {}{} = {} tokens/step, {} steps, {} threads{}", data.train_path,
                    data.tokenizer, batch, opt.seq,
                    accum > 1 ? fmt::format(" x {} accumulated micro-batches", accum) : "",
                    batch * opt.seq * accum, opt.steps, omp_get_max_threads(), ranks > 1 ? " per rank" : ""));
    if (ranks > 1 || eo.zero > 0)
        say(fmt::format("  data parallel: {} rank{} ({}), micro-batch {} per rank, ZeRO stage {}, gradient buckets {}",
                        ranks, ranks > 1 ? "s" : "", data_comm->name(), eo.B, eo.zero,
                        eo.bucket_bytes ? format_bytes(eo.bucket_bytes) : std::string("one per block")));
    if (layout.tp > 1) {
        const ModelConfig slice = tp_local_config(cfg, layout.tp);
        say(fmt::format("  tensor parallel: {} ranks per group, each {} of {} heads ({} of {} KV), MLP {} of {}, "
                        "vocabulary rows {} of {}", layout.tp, slice.n_head, cfg.n_head, slice.kv_heads(),
                        cfg.kv_heads(), slice.ffn_dim(), cfg.ffn_dim(), slice.vocab_size, cfg.vocab_size));
    }
    if (layout.pp > 1) {
        std::string stages;
        const int V = eo.schedule == PipeSchedule::interleaved ? eo.virtual_stages : 1;
        for (const auto & r : pipeline_stages(tp_local_config(cfg, layout.tp), layout.pp * V, opt.seq))
            stages += fmt::format("{}[{}, {})", stages.empty() ? "" : " ", r.begin, r.end);
        say(fmt::format("  pipeline parallel: {} stages, blocks {}{}, schedule {}, {} micro-batches of {} per step",
                        layout.pp, stages, V > 1 ? fmt::format(" (virtual stage v on stage v mod {})", layout.pp) : "",
                        V > 1 ? opt.schedule : schedule_name(eo.schedule), accum, eo.B));
    }
    if (eo.lora.enabled()) {
        const size_t A = lora_param_count(cfg, eo.lora);
        say(fmt::format("  LoRA rank {} alpha {:g} on {}: {:.3f}M trainable parameters ({:.2f}% of the model); base "
                        "frozen{}",
                        eo.lora.rank, eo.lora.alpha, fmt::join(eo.lora.targets, ","), double(A) / 1e6,
                        100.0 * double(A) / double(cfg.num_params()),
                        eo.lora.quantized() ? fmt::format(", projections {}", quant_format_name(eo.lora.format()))
                                            : fmt::format(" in {}", precision_name(eo.compute))));
    }
    auto engine = std::make_unique<Engine>(cfg, backend, eo);
    CategoryBytes plan_live = engine->planned_peak_live(), plan_rsv = engine->planned_reserved();
    say(fmt::format("memory plan{} ({} ops, {}{}, peak at op {} '{}'):\n{}",
                    layout.tp * layout.pp > 1 ? " of rank 0 (every rank's: at the end)" : world > 1 ? " per rank" : "", engine->step().program().num_ops(),
                    precision_name(eo.compute),
                    eo.compute == DType::f32 ? ""
                        : fmt::format(" with fp32 master weights, {} gradients{}", precision_name(eo.grad_dtype()),
                                      accum > 1 ? " (accumulated over micro-batches)" : ""),
                    engine->plan().peak_op, engine->step().program().ops()[size_t(engine->plan().peak_op)].name,
                    format_plan_table(plan_live, plan_rsv)));
    if (eo.budget)
        say(fmt::format("  budget {} ({}): fits", format_bytes(eo.budget),
                        opt.memory_budget.empty() ? "available memory" : "--memory-budget"));
    engine->init_params(opt.seed);
    if (has_hf_weights(opt.model)) {
        if (eo.lora.enabled()) {
            std::vector<float> full(size_t(cfg.num_params()));
            load_hf_weights(opt.model, cfg, make_param_layout(cfg), full.data());
            engine->set_base(full.data());
        } else if (layout.tp > 1 || layout.pp > 1) {   // the whole model; each rank keeps its part
            std::vector<float> full(size_t(cfg.num_params()));
            load_hf_weights(opt.model, cfg, make_param_layout(cfg), full.data());
            engine->set_params(full.data());
        } else {
            load_hf_weights(opt.model, cfg, engine->step().layout(), engine->params());
            engine->params_changed();
        }
        say(fmt::format("  weights from {}", opt.model));
    }
    int first_step = 1;
    if (!opt.resume.empty()) first_step = resume_from(opt.resume, cfg, opt, *engine, train_data, val_data.get()) + 1;

    const std::string metrics_path = (fs::path(opt.out) / "metrics.jsonl").string();
    std::FILE * metrics = nullptr;
    if (lead) {
        fs::create_directories(opt.out);
        metrics = std::fopen(metrics_path.c_str(), "w");
        if (!metrics) throw IoError(fmt::format("{}: cannot write metrics", metrics_path));
    }

    const int micro = batch * opt.seq, BT = micro * accum;   // tokens per global micro-batch, per step
    std::vector<int32_t> in(static_cast<size_t>(BT)), tg(static_cast<size_t>(BT));
    // This rank's rows: of every `rows`-sequence group of the global batch, the r-th 1/N.
    std::vector<int32_t> my_in(static_cast<size_t>(BT / ranks)), my_tg(static_cast<size_t>(BT / ranks));
    auto take_rows = [&](int rows, int groups) {
        const size_t mine = size_t(rows / ranks) * size_t(opt.seq), whole = size_t(rows) * size_t(opt.seq);
        for (int g = 0; g < groups; ++g) {
            const size_t src = size_t(g) * whole + size_t(rank) * mine, dst = size_t(g) * mine;
            std::copy_n(in.begin() + long(src), mine, my_in.begin() + long(dst));
            std::copy_n(tg.begin() + long(src), mine, my_tg.begin() + long(dst));
        }
    };
    LrSchedule sched{opt.lr, opt.warmup, opt.steps, opt.min_lr_ratio};
    auto evaluate = [&]() {
        // Batches of the starting micro-batch (this rank's rows), run in pieces of the engine's
        // current one; eval_loss sums over the ranks.
        const int b = engine->options().B, local = batch / ranks, pieces = local / b;
        double s = 0;
        for (int i = 0; i < opt.eval_batches; ++i) {
            val_data->next(in.data(), tg.data());
            take_rows(batch, 1);
            for (int k = 0; k < pieces; ++k) {
                const size_t off = size_t(k) * size_t(b) * size_t(opt.seq);
                s += engine->eval_loss(my_in.data() + off, my_tg.data() + off);
            }
        }
        return float(s / (opt.eval_batches * pieces));
    };
    std::vector<std::string> replans;
    BudgetFile budget_file(opt.budget_file);
    double total_time = 0;
    long long total_tokens = 0;
    float last_loss = 0, last_val = NAN;
    std::vector<double> step_ms;
    Timeline timeline;   // the last step, op by op, for the report
    Timeline leak_a, leak_b;   // --check-leaks: steps 2 and 3
    std::vector<CurvePoint> loss_curve, val_curve, tps_curve;
    const auto t_start = Clock::now();
    for (int step = first_step; step <= opt.steps; ++step) {
        train_data.next(in.data(), tg.data());
        // The flags' micro-batches (opt.batch sequences each) split over the ranks; --fit auto may
        // regroup this rank's rows into other micro-batches (the same global batch).
        take_rows(opt.batch, opt.grad_accum);
        if (const auto b = budget_file.poll()) shrink_to_budget(engine, cfg, backend, *b, replans);
        AdamWHyper h{sched.at(step), opt.beta1, opt.beta2, opt.eps, opt.weight_decay, step, opt.clip};
        if (step == opt.steps) engine->set_timeline(&timeline);
        else if (opt.check_leaks && step == 2) engine->set_timeline(&leak_a);
        else if (opt.check_leaks && step == 3) engine->set_timeline(&leak_b);
        const auto t0 = Clock::now();
        const StepResult r = resilient_step(engine, cfg, backend, my_in.data(), my_tg.data(), h, replans);
        for (const auto & n : replans) say(n);
        replans.clear();
        const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
        engine->set_timeline(nullptr);
        if (opt.check_leaks && step == 3) {
            const std::string diff = compare_live_bytes(leak_a, leak_b);
            if (!diff.empty()) throw Error("leak check failed: " + diff);
            say(fmt::format("leak check: live bytes identical at all {} ops of steps 2 and 3", leak_b.events.size()));
        }
        loss_curve.push_back({step, r.loss});
        tps_curve.push_back({step, double(BT) / dt});
        if (!std::isfinite(r.loss))
            throw Error(fmt::format("loss became {} at step {}; hint: lower --lr (now {})", r.loss, step, opt.lr));
        total_time += dt;
        total_tokens += BT;
        step_ms.push_back(dt * 1e3);
        last_loss = r.loss;
        const bool do_eval = eo.with_eval && ((opt.eval_every > 0 && step % opt.eval_every == 0) || step == opt.steps);
        if (do_eval) {
            last_val = evaluate();
            val_curve.push_back({step, last_val});
        }
        const auto & L = engine->ledger();
        const bool log_point = step % opt.log_every == 0 || step == 1 || step == opt.steps || do_eval;
        ProgressLine pl;
        pl.step = step;
        pl.total_steps = opt.steps;
        pl.loss = r.loss;
        pl.val_loss = do_eval ? double(last_val) : NAN;
        pl.lr = h.lr;
        pl.grad_norm = r.grad_norm;
        pl.tokens_per_s = double(BT) / dt;
        pl.ms_per_step = dt * 1e3;
        pl.eta_s = total_time / step * (opt.steps - step);
        pl.live = L.live_total();
        pl.peak = L.live_total_peak();
        pl.budget = eo.budget;
        progress.update(pl, log_point);
        if (opt.checkpoint_every > 0 && (step % opt.checkpoint_every == 0 || step == opt.steps)) {
            const std::string root = opt.checkpoint_dir.empty() ? (fs::path(opt.out) / "checkpoints").string()
                                                                 : opt.checkpoint_dir;
            const std::string dir =
                write_checkpoint(root, *engine, checkpoint_meta(step, cfg, opt, train_data, val_data.get(), eo.lora),
                                 opt.keep_checkpoints, *comm);
            if (log_point) say(fmt::format("  checkpoint {}", dir));
        }
        if (log_point && lead) {
            const double tps = double(BT) / dt;
            nlohmann::json m = {{"step", step}, {"loss", r.loss}, {"lr", h.lr}, {"grad_norm", r.grad_norm},
                                {"tokens_per_s", tps}, {"ms", dt * 1e3}, {"live_bytes", L.live_total()},
                                {"peak_bytes", L.live_total_peak()}};
            if (do_eval) m["val_loss"] = last_val;
            if (eo.compute == DType::f16) {
                m["loss_scale"] = r.loss_scale;
                m["skipped_steps"] = engine->loss_scaler().skipped;
            }
            std::fprintf(metrics, "%s\n", m.dump().c_str());
            std::fflush(metrics);
        }
    }
    if (metrics) std::fclose(metrics);
    progress.finish();
    const double wall = std::chrono::duration<double>(Clock::now() - t_start).count();

    const Ledger & L = engine->ledger();
    plan_live = engine->planned_peak_live();
    plan_rsv = engine->planned_reserved();
    const uint64_t rss = peak_rss_bytes();
    const double tps = double(total_tokens) / total_time;
    // Every rank's measured memory, for the min/max over ranks (a collective: before rank 0 goes
    // its own way).
    const RankMemory rank_memory = gather_memory(*comm, L, rss);
    const std::string bubble = layout.pp > 1 ? pipeline_idle(*comm, layout, timeline, accum) : std::string();
    // Tensor and pipeline ranks run different programs: each rank's plan beside its measurement.
    const std::vector<uint64_t> planned_by_rank = comm->all_gather_u64(plan_live.total());
    // The whole model's weights for the sample (collective under ZeRO).
    const bool want_sample = opt.sample_tokens > 0 && !data.tokenizer.empty() && !opt.profile;
    std::vector<float> sample_weights;
    if (want_sample && (lead || eo.zero > 0 || layout.tp > 1 || layout.pp > 1)) sample_weights = engine->merged_weights();
    if (!lead) return;
    if (opt.check_lifetimes)
        say("  (--check-lifetimes: every buffer had its own allocation, so reserved bytes are not the plan's regions)");
    say(fmt::format("memory: planned vs measured (measured = bytes the engine acquired and obtained while running)\n{}",
                    format_plan_vs_measured(plan_live, L.live_peak(), plan_rsv, L.reserved_peak())));
    say(fmt::format("  peak RSS {} (planned reserved {} + code, libraries, data loader)", format_bytes(rss),
                    format_bytes(plan_rsv.total())));
    if (!backend.host_memory())
        say(opt.check_lifetimes ? "  device memory: not compared with the plan under --check-lifetimes (per-buffer "
                                  "allocations, freed after last use)"
                                : format_device_memory(plan_rsv.total(), backend.runtime_bytes(),
                                                       backend.device_used_delta()));
    if (world > 1) say(format_rank_memory(rank_memory));
    if (layout.tp > 1 || layout.pp > 1) {
        std::string lines = "per rank: planned vs measured peak live";
        for (int k = 0; k < world; ++k) {
            const RankCoords rc = rank_coords(layout, k);
            const uint64_t measured = rank_memory.live[size_t(k)].total();
            lines += fmt::format("\n  rank {} (tp {}, pp {}, dp {}): planned {}, measured {}{}", k, rc.tp, rc.pp, rc.dp,
                                 format_bytes(planned_by_rank[size_t(k)]), format_bytes(measured),
                                 measured == planned_by_rank[size_t(k)] ? " (equal)" : "");
        }
        say(lines);
    }
    if (!bubble.empty()) say(bubble);
    say(fmt::format("done: {} steps in {:.1f} s, {:.0f} tokens/s, final loss {:.4f}{}", opt.steps, wall, tps, last_loss,
                    std::isnan(last_val) ? std::string() : fmt::format(", validation loss {:.4f}", last_val)));

    nlohmann::json summary = {
        {"config", {{"model", cfg.name}, {"family", cfg.family}, {"n_layer", cfg.n_layer}, {"n_embd", cfg.n_embd},
                    {"n_head", cfg.n_head}, {"n_kv_head", cfg.kv_heads()}, {"ffn", cfg.ffn_dim()},
                    {"vocab_size", cfg.vocab_size}, {"params", cfg.num_params()}, {"batch", batch},
                    {"grad_accum", accum}, {"attention", eo.flash_attention ? "flash" : "naive"},
                    {"recompute", eo.recompute.name}, {"loss_chunk", eo.loss_chunk},
                    {"seq", opt.seq}, {"steps", opt.steps}, {"data_parallel", ranks}, {"tensor_parallel", layout.tp}, {"pipeline_parallel", layout.pp}, {"zero", eo.zero},
                    {"bucket_bytes", eo.bucket_bytes}, {"lr", opt.lr}, {"weight_decay", opt.weight_decay},
                    {"seed", opt.seed}, {"threads", omp_get_max_threads()}, {"precision", precision_name(eo.compute)},
                    {"data", data.train_path}, {"tokenizer", data.tokenizer},
                    {"trainable_params", engine->total_params()}}},
        {"planned", {{"peak_live", category_json(plan_live)}, {"reserved", category_json(plan_rsv)}}},
        {"measured", {{"peak_live", category_json(L.live_peak())}, {"reserved", category_json(L.reserved_peak())},
                      {"peak_live_total", L.live_total_peak()}}},
        {"peak_rss_bytes", rss},
        {"device", {{"name", backend.name()}, {"runtime_bytes", backend.runtime_bytes()},
                    {"used_delta_bytes", backend.device_used_delta()}}},
        {"per_rank", rank_memory_json(rank_memory)},
        {"tokens_per_s", tps},
        {"final_loss", last_loss},
        {"wall_s", wall}};
    if (!std::isnan(last_val)) summary["final_val_loss"] = last_val;
    if (eo.compute == DType::f16) {
        summary["loss_scale"] = engine->loss_scaler().scale;
        summary["skipped_steps"] = engine->loss_scaler().skipped;
        say(fmt::format("  fp16 loss scaling: {} skipped steps, scale now {:g}", engine->loss_scaler().skipped,
                        engine->loss_scaler().scale));
    }

    // The memory report of the last step (and the training curves).
    nlohmann::json flat = summary["config"];
    flat["tokens_per_s"] = std::round(tps);
    const std::string title = fmt::format("memfit {}: {}, batch {} x seq {}", opt.profile ? "profile" : "train",
                                          cfg.name, batch, opt.seq);
    ReportData rep = build_report(*engine, timeline, title, flat, eo.budget);
    if (!opt.profile) {
        rep.loss = loss_curve;
        rep.val_loss = val_curve;
        rep.tokens_per_s = tps_curve;
    }
    const std::string html_path = (fs::path(opt.out) / "report.html").string();
    const std::string trace_path = (fs::path(opt.out) / "trace.json").string();
    write_html_report(html_path, rep);
    write_chrome_trace(trace_path, rep);
    for (const auto & hnt : rep.hints) say("  hint: " + hnt);

    if (want_sample) {
        auto tok = make_tokenizer(data.tokenizer, data_dir());
        std::vector<int32_t> prompt = tok->encode("\n");
        SampleOptions so;
        so.max_new_tokens = opt.sample_tokens;
        so.seed = opt.seed;
        // The decoder computes on host memory: a device run samples from its weights on the CPU.
        const std::unique_ptr<Backend> host_backend = backend.host_memory() ? nullptr : make_backend("cpu");
        // Inside the trained context: when the cache fills, the last half is re-run (generate.h).
        Decoder decoder(cfg, host_backend ? *host_backend : backend,
                        std::min(cfg.trained_context(), int(prompt.size()) + so.max_new_tokens));
        decoder.set_weights(sample_weights.data());
        const auto ids = generate(decoder, prompt, so);
        const std::string text = tok->decode(ids);
        say("sample (temperature 0.8):\n" + text);
        summary["sample"] = text;
        summary["sample_positions"] = decoder.capacity();   // at most the trained context
    }
    const std::string summary_path = (fs::path(opt.out) / "summary.json").string();
    std::ofstream so(summary_path);
    so << summary.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    if (!so) throw IoError(fmt::format("{}: cannot write summary", summary_path));
    say(fmt::format("wrote {}, {}, {} and {}", html_path, trace_path, metrics_path, summary_path));
}

}  // namespace memfit
