#include "app/run_checkpoints.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/file_digest.h"
#include "core/json_num.h"
#include "core/json_read.h"
#include "core/units.h"
#include "model/hf_weights.h"
#include "train/checkpoint.h"

namespace memfit {

namespace fs = std::filesystem;

namespace {
// The model as a checkpoint records it: its Hugging Face config plus the name.
nlohmann::json checkpoint_model(const ModelConfig & cfg) {
    nlohmann::json j = hf_config_json(cfg);
    j["name"] = cfg.name;
    return j;
}

// The range of the flat trainable buffer this rank's state covers: its ZeRO shard, or the whole.
std::pair<size_t, size_t> state_range(const Engine & engine) {
    // Tensor or pipeline parallel: export_state gathers the whole model's state.
    const EngineOptions & o = engine.options();
    if (o.zero == 0 || o.tensor_parallel > 1 || o.pipeline_parallel > 1 || o.expert_parallel > 1)
        return {0, engine.total_params()};
    const Engine::Shard sh = engine.shard();
    return {sh.lo, sh.hi};
}

}  // namespace

// What a checkpoint records besides the training state: where the run is and what it is.
nlohmann::json checkpoint_meta(int step, const ModelConfig & cfg, const TrainOptions & opt, int global_batch,
                               const DataLoader & train, const DataLoader * val, const LoraOptions & lora,
                               const std::string & base_digest) {
    nlohmann::json m = {{"step", step},
                        {"model", checkpoint_model(cfg)},
                        {"seq", opt.seq},
                        {"global_batch", global_batch},
                        {"seed", opt.seed},
                        {"precision", precision_name(opt.compute)},   // memfit export's default dtype
                        {"data", {{"train_epoch", train.epoch()}, {"train_cursor", train.cursor()}}}};
    // LoRA: the checkpoint holds the adapters; the base comes back from the model folder (or
    // from the seed's initialisation when there is none).
    if (lora.enabled()) {
        m["lora"] = lora_json(lora);
        m["lora"]["base_model"] = has_hf_weights(opt.model) ? fs::absolute(opt.model).string() : std::string();
        if (!base_digest.empty()) m["lora"][kBaseDigestKey] = base_digest;
    }
    if (opt.packing) m["packing"] = true;   // the rows (and so the data position) depend on it
    if (val) {
        m["data"]["val_epoch"] = val->epoch();
        m["data"]["val_cursor"] = val->cursor();
    }
    return m;
}

// Restores a checkpoint into the engine and the loaders; returns its step. Every rank reads the
// shard files overlapping its own range (whatever the number of ranks that wrote them).
namespace {

// Where a checkpoint's record and this run's differ: "n_layer 4 in the checkpoint, 6 in this
// run; ..." for objects (key by key), "512 in the checkpoint, 1024 in this run" otherwise.
std::string json_differences(const nlohmann::json & theirs, const nlohmann::json & ours) {
    auto show = [](const nlohmann::json & j, const std::string & k) {
        if (k.empty()) return j.dump();
        return j.contains(k) ? j[k].dump() : std::string("absent");
    };
    std::vector<std::string> keys;
    if (theirs.is_object() && ours.is_object()) {
        for (const auto & kv : theirs.items())
            if (!ours.contains(kv.key()) || ours[kv.key()] != kv.value()) keys.push_back(kv.key());
        for (const auto & kv : ours.items())
            if (!theirs.contains(kv.key())) keys.push_back(kv.key());
    } else {
        keys.push_back("");
    }
    std::string out;
    for (const auto & k : keys)
        out += fmt::format("{}{}{}{} in the checkpoint, {} in this run", out.empty() ? "" : "; ", k, k.empty() ? "" : " ",
                           show(theirs, k), show(ours, k));
    return out;
}

// The LoRA base a checkpoint's adapters were trained on and this run's: the same weights (by
// digest; checkpoints from before digests, by folder), or both the seed's initialisation.
void check_same_base(const std::string & path, const nlohmann::json & theirs, const nlohmann::json & ours) {
    const std::string their_dir = json_string_or(theirs, "base_model"), our_dir = json_string_or(ours, "base_model");
    const std::string their_digest = theirs.value(kBaseDigestKey, ""), our_digest = ours.value(kBaseDigestKey, "");
    auto name = [](const std::string & dir) { return dir.empty() ? std::string("the seed's initialisation") : dir; };
    const bool same = their_dir.empty() || our_dir.empty() ? their_dir == our_dir
                      : !their_digest.empty() && !our_digest.empty() ? their_digest == our_digest
                                                                     : their_dir == our_dir;
    if (!same)
        throw ConfigError(fmt::format("--resume {}: the checkpoint's adapters were trained on the base {}{}; this "
                                      "run's is {}{}: resume with --model set to the base the run trained on",
                                      path, name(their_dir),
                                      their_digest.empty() ? "" : fmt::format(" (weights digest {})", their_digest),
                                      name(our_dir),
                                      our_digest.empty() ? "" : fmt::format(" (weights digest {})", our_digest)));
}

int resume_checked(const std::string & path, const ModelConfig & cfg, const TrainOptions & opt, int global_batch,
                   Engine & engine, DataLoader & train, DataLoader * val, const std::string & base_digest) {
    const std::string dir = find_checkpoint(path);
    const nlohmann::json m = load_checkpoint_meta(dir);
    const nlohmann::json want =
        checkpoint_meta(0, cfg, opt, global_batch, train, val, engine.options().lora, base_digest);
    // What must agree. Not the model's name (the same model by another path), nor the trained
    // context (compared through "seq"; older checkpoints lack it), nor where the LoRA base lies
    // (check_same_base compares its weights).
    auto field = [](const nlohmann::json & j, const char * k) {
        nlohmann::json v = j.value(k, nlohmann::json());
        if (v.is_object())
            for (const char * drop : {kTrainedContextKey, "name", "base_model", kBaseDigestKey}) v.erase(drop);
        // LoRA records written before DoRA and rsLoRA were plain LoRA.
        if (v.is_object() && std::string_view(k) == "lora")
            for (const char * flag : {"use_dora", "use_rslora"})
                if (!v.contains(flag)) v[flag] = false;
        return v;
    };
    for (const char * k : {"model", "seq", "global_batch", "seed", "lora", "packing"})
        if (field(m, k) != field(want, k))
            throw ConfigError(fmt::format("--resume {}: the checkpoint's {} differs from this run's ({}); resume "
                                          "with the same model, --seq, global batch, --seed, --packing and LoRA "
                                          "options",
                                          path, k, json_differences(field(m, k), field(want, k))));
    if (m.contains("lora")) check_same_base(path, m["lora"], want["lora"]);
    const size_t total = checkpoint_total(dir, m);
    if (total != engine.total_params())
        throw FormatError(fmt::format("--resume {}: {} parameters, the model has {}", path, total,
                                      engine.total_params()));
    const int step = json_get_in<int>(m, "step", path, 1, (1 << 30));
    if (step >= opt.steps)
        throw ConfigError(fmt::format("--resume {}: the checkpoint is at step {}; --steps {} must be larger", path,
                                      step, opt.steps));
    const auto [lo, hi] = state_range(engine);
    engine.import_state(load_state_range(dir, m, lo, hi));
    if (!m.contains("data") || !m["data"].is_object())
        throw FormatError(fmt::format("--resume {}: meta.json has no \"data\" object (the data loaders' positions); "
                                      "it is not a memfit checkpoint's", path));
    const auto & d = m["data"];
    train.seek(json_get<uint64_t>(d, "train_epoch", path), json_get<size_t>(d, "train_cursor", path));
    if (val && d.contains("val_epoch"))
        val->seek(json_get<uint64_t>(d, "val_epoch", path), json_get<size_t>(d, "val_cursor", path));
    return step;
}

}  // namespace

int resume_from(const std::string & path, const ModelConfig & cfg, const TrainOptions & opt, int global_batch,
                Engine & engine, DataLoader & train, DataLoader * val, const std::string & base_digest) {
    try {
        return resume_checked(path, cfg, opt, global_batch, engine, train, val, base_digest);
    } catch (const nlohmann::json::exception & e) {   // a field of the wrong kind, or missing
        throw FormatError(fmt::format("--resume {}: meta.json is not a checkpoint's ({})", path, json_error_text(e.what())));
    }
}

std::set<std::pair<uint64_t, size_t>> read_skipped_batches(const std::string & dir) {
    const nlohmann::json m = load_checkpoint_meta(dir);
    std::set<std::pair<uint64_t, size_t>> out;
    if (!m.contains("skipped_batches")) return out;
    const std::string where = (fs::path(dir) / "meta.json").string();
    const nlohmann::json & list = m["skipped_batches"];
    if (!list.is_array()) throw FormatError(fmt::format("{}: \"skipped_batches\" is not a list", where));
    for (const auto & b : list) {
        const auto epoch = b.is_array() && b.size() == 2 ? json_number<uint64_t>(b[0]) : std::nullopt;
        const auto cursor = b.is_array() && b.size() == 2 ? json_number<size_t>(b[1]) : std::nullopt;
        if (!epoch || !cursor)
            throw FormatError(fmt::format("{}: \"skipped_batches\" holds {}, not [epoch, cursor]", where, b.dump()));
        out.insert({*epoch, *cursor});
    }
    return out;
}

// Preflight: the folder exists (or is made) and takes a file, before the first step, so that a
// run does not fail at its first checkpoint.
void check_writable(const std::string & dir, const char * flag) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    const fs::path probe = fs::path(dir) / ".memfit-write-test";
    std::FILE * f = ec ? nullptr : std::fopen(probe.c_str(), "w");
    if (!f) throw IoError(fmt::format("{} {}: cannot write there ({})", flag, dir,
                                      ec ? ec.message() : std::string("permission denied or not a folder")));
    std::fclose(f);
    fs::remove(probe, ec);
}

// Checkpoints of another run in the folder would be pruned by this one's (the newest step
// numbers are kept, whichever run wrote them): refuse before the first step.
void check_own_checkpoints(const std::string & root, const std::string & run_id) {
    std::string newest;
    try {
        newest = find_checkpoint(root);
    } catch (const IoError &) {
        return;   // none yet
    }
    const std::string theirs = json_string_or(load_checkpoint_meta(newest), "run_id");
    if (theirs != run_id)
        throw ConfigError(fmt::format("{} holds the checkpoints of another run (newest {}): --resume {} continues it; "
                                      "a new run needs another --out or --checkpoint-dir (or remove them)",
                                      root, fs::path(newest).filename().string(), root));
}

std::vector<std::string> other_runs_checkpoints(const std::string & root, const std::string & run_id) {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto & e : fs::directory_iterator(root, ec)) {
        const std::string name = e.path().filename().string();
        if (!name.starts_with("step-") || !e.is_directory(ec)) continue;
        std::string theirs;
        try {
            theirs = json_string_or(load_checkpoint_meta(e.path().string()), "run_id");
        } catch (const Error &) {
            continue;   // incomplete or damaged: not this run's to judge
        }
        if (theirs != run_id) out.push_back(e.path().string());
    }
    std::sort(out.begin(), out.end());
    return out;
}

uint64_t checkpoint_bytes(const Engine & engine, int world) {
    const auto [lo, hi] = state_range(engine);
    // The whole state on every rank: each writes an even share of it (write_checkpoint).
    const size_t n = hi - lo == engine.total_params() ? (hi - lo) / size_t(std::max(world, 1)) : hi - lo;
    return uint64_t(n) * 3 * sizeof(float) + 4096;   // the tensors and the safetensors header
}

void check_free_space(const std::string & root, uint64_t bytes, int keep,
                      const std::function<void(const std::string &)> & warn) {
    std::error_code ec;
    const fs::space_info sp = fs::space(root, ec);
    if (ec) return;   // unknown (not every filesystem says): the write itself will tell
    const uint64_t need_all = bytes * uint64_t(std::max(keep, 1) + 1);
    // The checkpoints already there are part of what keep + 1 needs.
    uint64_t have = 0;
    for (const auto & e : fs::recursive_directory_iterator(root, ec))
        if (e.is_regular_file(ec)) have += e.file_size(ec);
    if (sp.available < bytes)
        throw ConfigError(fmt::format("--checkpoint-dir {}: {} free, a checkpoint needs {}; free space there or "
                                      "choose another folder", root, format_bytes(sp.available),
                                      format_bytes(bytes)));
    if (sp.available + have < need_all)
        warn(fmt::format("--checkpoint-dir {}: {} free; --keep-checkpoints {} needs room for {} checkpoints of {} "
                         "({}): a later one may fail", root, format_bytes(sp.available), keep, keep + 1,
                         format_bytes(bytes), format_bytes(need_all)));
}

CheckpointCost predict_checkpoint_cost(const std::string & dir, uint64_t bytes) {
    // Up to 16 MiB: long enough to leave the page cache's first burst, short next to a run.
    const size_t n = size_t(std::clamp<uint64_t>(bytes, 1 << 20, 16 << 20));
    const std::string probe = (fs::path(dir) / ".memfit.probe").string();
    std::vector<char> data(n);
    for (size_t i = 0; i < n; ++i) data[i] = char(i * 2654435761u >> 24);
    using Clock = std::chrono::steady_clock;
    CheckpointCost c;
    c.bytes = bytes;
    const auto t0 = Clock::now();
    try {
        write_file_atomic(probe, std::string_view(data.data(), n));
    } catch (const Error & e) {   // the first checkpoint would fail the same way: say so now
        c.error = e.what();
        return c;
    }
    const auto t1 = Clock::now();
    file_digest(probe);
    const auto t2 = Clock::now();
    std::error_code ec;
    fs::remove(probe, ec);
    c.write_bytes_per_s = double(n) / std::max(1e-6, std::chrono::duration<double>(t1 - t0).count());
    c.digest_bytes_per_s = double(n) / std::max(1e-6, std::chrono::duration<double>(t2 - t1).count());
    c.seconds = double(bytes) / c.write_bytes_per_s + double(bytes) / c.digest_bytes_per_s;
    return c;
}

// Writes a checkpoint: one file on one process; with N ranks every rank its range (its ZeRO
// shard, or without ZeRO an even 1/N of the state it holds whole) and rank 0 the meta.
std::string write_checkpoint(const std::string & root, Engine & engine, nlohmann::json meta, int keep,
                             Communicator & comm) {
    const EngineOptions & eo = engine.options();
    meta["world_size"] = comm.size();
    meta["zero"] = eo.zero;
    const size_t total = engine.total_params();
    if (comm.size() == 1)   // the engine's own buffers, when it holds them as host fp32: no copy
        if (std::optional<TrainStateView> v = engine.state_view(); v && v->n == total) {
            v->offset = 0;
            v->total = total;
            return save_checkpoint(root, *v, meta, keep);
        }
    TrainState s = engine.export_state();
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

}  // namespace memfit
