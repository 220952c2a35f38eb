#include "train/checkpoint.h"

#include <atomic>
#include <cstdio>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include <fmt/format.h>

#include "comm/communicator.h"
#include "core/atomic_file.h"
#include "core/file_digest.h"
#include "core/error.h"
#include "core/json_read.h"
#include "core/finite.h"
#include "core/json_num.h"
#include "model/safetensors.h"

namespace fs = std::filesystem;

namespace memfit {

namespace {

constexpr const char * kFormat = "memfit-checkpoint-1";
constexpr const char * kStateFile = "state.safetensors";

// The step of a checkpoint folder name "step-000123", or -1.
long folder_step(const fs::path & p) {
    const std::string n = p.filename().string();
    if (!n.starts_with("step-") || n.size() < 6) return -1;
    const std::string digits = n.substr(5);
    if (!std::all_of(digits.begin(), digits.end(), ::isdigit) || digits.size() > 12) return -1;
    return std::stol(digits);
}

// Complete checkpoints under root, oldest first. A folder only gets its final name once every
// file in it is written, so meta.json there means complete.
std::vector<std::pair<long, fs::path>> complete_checkpoints(const fs::path & root) {
    std::vector<std::pair<long, fs::path>> out;
    std::error_code ec;
    for (const auto & e : fs::directory_iterator(root, ec)) {
        const long s = folder_step(e.path());
        if (s >= 0 && fs::exists(e.path() / "meta.json")) out.push_back({s, e.path()});
    }
    std::sort(out.begin(), out.end());
    return out;
}

fs::path tmp_folder(const std::string & root, long step) {
    return fs::path(root) / fmt::format(".step-{:06d}.tmp", step);
}

// meta.json's own fields: the format, the optimizer step and the loss scaler of `s`.
nlohmann::json with_state_fields(const nlohmann::json & meta, const TrainStateView & s) {
    nlohmann::json m = meta;
    m["format"] = kFormat;
    m["optimizer_step"] = s.t;
    m["loss_scaler"] = {{"scale", s.scaler.scale}, {"clean", s.scaler.clean}, {"skipped", s.scaler.skipped}};
    return m;
}

// Moves tmp to ROOT/step-NNNNNN (replacing one of an earlier run), fsyncs ROOT, prunes.
std::string install(const std::string & root, const fs::path & tmp, long step, int keep) {
    const fs::path dir = fs::path(root) / fmt::format("step-{:06d}", step);
    std::error_code ec;
    fsync_dir(tmp.string());
    fs::remove_all(dir, ec);   // a checkpoint of the same step from an earlier run
    fs::rename(tmp, dir, ec);
    if (ec) throw IoError(fmt::format("cannot rename {} to {}: {}", tmp.string(), dir.string(), ec.message()));
    fsync_dir(root);
    const auto all = complete_checkpoints(root);
    for (size_t i = 0; i + size_t(std::max(keep, 1)) < all.size(); ++i) fs::remove_all(all[i].second, ec);
    return dir.string();
}

void read_scaler(const nlohmann::json & meta, const std::string & meta_path, TrainState & s) {
    try {
        // Ranges a real run can reach (the next update is step t + 1; a scale is a positive float).
        s.t = json_get_in<int>(meta, "optimizer_step", meta_path, 0, (1 << 30));
        const auto & ls = meta.at("loss_scaler");
        s.scaler.scale = json_get_in<float>(ls, "scale", meta_path, 1e-30f, 3e38f);
        s.scaler.clean = json_get_in<int>(ls, "clean", meta_path, 0, (1 << 30));
        s.scaler.skipped = json_get_in<long long>(ls, "skipped", meta_path, 0, (1ll << 40));
    } catch (const Error &) {
        throw;
    } catch (const std::exception & e) {
        throw FormatError(fmt::format("{}: {}", meta_path, e.what()));
    }
}

// params, adamw.m, adamw.v of one file, checked to hold `count` elements each.
struct StateTensors {
    std::vector<float> params, m, v;
};
StateTensors read_state_tensors(const SafetensorsFile & f) {
    StateTensors t;
    t.params = f.read_f32("params");
    t.m = f.read_f32("adamw.m");
    t.v = f.read_f32("adamw.v");
    if (t.m.size() != t.params.size() || t.v.size() != t.params.size())
        throw FormatError(fmt::format("{}: params, adamw.m and adamw.v differ in size ({}, {}, {})", f.path(),
                                      t.params.size(), t.m.size(), t.v.size()));
    return t;
}

bool is_sharded(const nlohmann::json & meta) { return meta.contains("shards"); }

// The shard table of a sharded meta.json, checked to tile [0, total).
std::vector<std::pair<ShardRange, std::string>> shard_table(const nlohmann::json & meta, const std::string & meta_path,
                                                            size_t total) {
    std::vector<std::pair<ShardRange, std::string>> out;
    const auto & sh = meta.at("shards");
    if (!sh.is_array() || sh.empty()) throw FormatError(fmt::format("{}: \"shards\" is not a non-empty list", meta_path));
    size_t next = 0;
    for (const auto & e : sh) {
        ShardRange r;
        r.rank = json_get<int>(e, "rank", meta_path);
        r.offset = json_get<size_t>(e, "offset", meta_path);
        r.count = json_get<size_t>(e, "count", meta_path);
        if (!e.contains("file") || !e["file"].is_string())
            throw FormatError(fmt::format("{}: shard of rank {} has no \"file\"", meta_path, r.rank));
        const std::string file = e["file"].get<std::string>();
        if (file.find('/') != std::string::npos || file.starts_with("."))
            throw FormatError(fmt::format("{}: shard file name '{}' is not a plain file name", meta_path, file));
        if (r.offset != next)
            throw FormatError(fmt::format("{}: the shards do not tile the state: rank {}'s starts at {}, expected {}",
                                          meta_path, r.rank, r.offset, next));
        next = r.offset + r.count;
        out.push_back({r, file});
    }
    if (next != total)
        throw FormatError(fmt::format("{}: the shards cover {} elements, total is {}", meta_path, next, total));
    return out;
}

// One file with the whole state, its meta, moved into place.
std::string write_whole(const std::string & root, const fs::path & tmp, const TrainStateView & s,
                        const nlohmann::json & ckpt_meta, int keep, const std::function<void()> & between_files) {
    const long step = ckpt_meta.at("step").get<long>();
    auto tensor = [&](const char * name, const float * v) {
        return TensorToWrite{name, "F32", {int64_t(s.n)}, v, s.n * sizeof(float)};
    };
    write_safetensors((tmp / kStateFile).string(),
                      {tensor("params", s.params), tensor("adamw.m", s.m), tensor("adamw.v", s.v)});
    if (between_files) between_files();
    nlohmann::json meta = with_state_fields(ckpt_meta, s);
    meta["checksums"][kStateFile] = file_digest((tmp / kStateFile).string());
    meta["meta_digest"] = meta_digest(meta);
    write_file_atomic((tmp / "meta.json").string(), meta.dump(2) + "\n");
    return install(root, tmp, step, keep);
}

}  // namespace

std::string save_checkpoint(const std::string & root, const Checkpoint & ckpt, int keep,
                            const std::function<void()> & between_files) {
    MF_ASSERT(ckpt.state.m.size() == ckpt.state.params.size() && ckpt.state.v.size() == ckpt.state.params.size());
    return save_checkpoint(root, view_of(ckpt.state), ckpt.meta, keep, between_files);
}

std::string save_checkpoint(const std::string & root, const TrainStateView & state, const nlohmann::json & meta,
                            int keep, const std::function<void()> & between_files) {
    const long step = meta.at("step").get<long>();
    const fs::path tmp = begin_checkpoint(root, step);
    try {
        return write_whole(root, tmp, state, meta, keep, between_files);
    } catch (...) {   // a full disk, an I/O error: no partial folder stays behind
        std::error_code ec;
        fs::remove_all(tmp, ec);
        throw;
    }
}

std::string state_shard_file(int rank, int world) {
    return fmt::format("state-rank-{:05d}-of-{:05d}.safetensors", rank, world);
}

ShardRange even_shard(size_t total, int rank, int world) {
    MF_ASSERT(world >= 1 && rank >= 0 && rank < world);
    const size_t W = size_t(world), r = size_t(rank), base = total / W, extra = total % W;
    ShardRange s;
    s.rank = rank;
    s.offset = r * base + std::min(r, extra);
    s.count = base + (r < extra ? 1 : 0);
    return s;
}

std::string begin_checkpoint(const std::string & root, long step) {
    const fs::path tmp = tmp_folder(root, step);
    std::error_code ec;
    fs::create_directories(root, ec);
    if (ec) throw IoError(fmt::format("cannot create checkpoint folder {}: {}", root, ec.message()));
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp, ec);
    if (ec) throw IoError(fmt::format("cannot create {}: {}", tmp.string(), ec.message()));
    return tmp.string();
}

void write_state_shard(const std::string & tmp_dir, const TrainState & s, int rank, int world) {
    const size_t n = s.params.size(), total = s.total ? s.total : n;
    MF_ASSERT(s.m.size() == n && s.v.size() == n && s.offset + n <= total);
    auto tensor = [&](const char * name, const std::vector<float> & v) {
        return TensorToWrite{name, "F32", {int64_t(n)}, v.data(), n * sizeof(float)};
    };
    write_safetensors((fs::path(tmp_dir) / state_shard_file(rank, world)).string(),
                      {tensor("params", s.params), tensor("adamw.m", s.m), tensor("adamw.v", s.v)},
                      {{"format", kFormat},
                       {"rank", std::to_string(rank)},
                       {"world_size", std::to_string(world)},
                       {"offset", std::to_string(s.offset)},
                       {"total", std::to_string(total)}});
}

std::string commit_checkpoint(const std::string & root, const std::string & tmp_dir, const Checkpoint & ckpt,
                              const std::vector<ShardRange> & shards, int world, int zero, int keep) {
    const long step = ckpt.meta.at("step").get<long>();
    const size_t total = ckpt.state.total ? ckpt.state.total : ckpt.state.params.size();
    nlohmann::json table = nlohmann::json::array(), checksums = nlohmann::json::object();
    size_t next = 0;
    for (const ShardRange & r : shards) {
        if (r.offset != next)
            throw Error(fmt::format("checkpoint {}: rank {}'s range starts at {}, expected {} (the ranks' ranges "
                                    "must tile the state)", tmp_dir, r.rank, r.offset, next));
        next = r.offset + r.count;
        const std::string file = state_shard_file(r.rank, world);
        if (!fs::exists(fs::path(tmp_dir) / file))
            throw IoError(fmt::format("checkpoint {}: rank {} wrote no {}", tmp_dir, r.rank, file));
        table.push_back({{"rank", r.rank}, {"offset", r.offset}, {"count", r.count}, {"file", file}});
        checksums[file] = file_digest((fs::path(tmp_dir) / file).string());
    }
    if (next != total)
        throw Error(fmt::format("checkpoint {}: the ranks' ranges cover {} of {} elements", tmp_dir, next, total));
    nlohmann::json meta = with_state_fields(ckpt.meta, view_of(ckpt.state));
    meta["world_size"] = world;
    meta["zero"] = zero;
    meta["total"] = total;
    meta["shards"] = table;
    meta["checksums"] = checksums;
    meta["meta_digest"] = meta_digest(meta);
    write_file_atomic((fs::path(tmp_dir) / "meta.json").string(), meta.dump(2) + "\n");
    return install(root, tmp_dir, step, keep);
}

namespace {

// Every rank learns whether any failed at a phase of a sharded checkpoint (else those that did
// not would wait forever for those that did); on a failure rank 0 removes the partial folder.
void agree(Communicator & comm, const std::string & error, const std::string & tmp) {
    const auto failed = comm.all_gather_u64(error.empty() ? 0 : 1);
    for (size_t r = 0; r < failed.size(); ++r) {
        if (!failed[r]) continue;
        if (comm.rank() == 0) {
            std::error_code ec;
            fs::remove_all(tmp, ec);
        }
        throw IoError(!error.empty() ? error
                                     : fmt::format("checkpoint {}: rank {} could not write its part (its own error "
                                                   "says why)", tmp, r));
    }
}

}  // namespace

std::string save_checkpoint_sharded(const std::string & root, const Checkpoint & ckpt, int keep, int zero,
                                    Communicator & comm) {
    const int rank = comm.rank(), world = comm.size();
    const long step = ckpt.meta.at("step").get<long>();
    const std::string tmp = tmp_folder(root, step).string();
    auto attempt = [](const std::function<void()> & f) {
        try {
            f();
        } catch (const Error & e) {
            return std::string(e.what());
        }
        return std::string();
    };
    agree(comm, rank == 0 ? attempt([&] { begin_checkpoint(root, step); }) : std::string(), tmp);   // the folder
    agree(comm, attempt([&] { write_state_shard(tmp, ckpt.state, rank, world); }), tmp);
    // Every rank's range; all_gather returns on rank 0 only after every rank wrote (and fsynced)
    // its file.
    const auto offsets = comm.all_gather_u64(ckpt.state.offset);
    const auto counts = comm.all_gather_u64(ckpt.state.params.size());
    std::string dir = (fs::path(root) / fmt::format("step-{:06d}", step)).string();
    std::string committed;
    if (rank == 0) {
        std::vector<ShardRange> shards;
        for (int r = 0; r < world; ++r) shards.push_back({r, size_t(offsets[size_t(r)]), size_t(counts[size_t(r)])});
        committed = attempt([&] { dir = commit_checkpoint(root, tmp, ckpt, shards, world, zero, keep); });
    }
    agree(comm, committed, tmp);   // in place before any rank goes on (a later resume or save sees it)
    return dir;
}

std::string find_checkpoint(const std::string & path) {
    const fs::path dir = path;
    if (!fs::is_directory(dir)) throw IoError(fmt::format("{}: no such checkpoint folder", path));
    if (fs::exists(dir / "meta.json")) return dir.string();
    const auto all = complete_checkpoints(dir);
    if (all.empty())
        throw IoError(fmt::format("{}: holds no complete checkpoint (step-NNNNNN/ with meta.json)", path));
    return all.back().second.string();
}

std::string newest_checkpoint(const std::string & root) {
    const auto all = complete_checkpoints(root);
    return all.empty() ? std::string() : all.back().second.string();
}

namespace {
std::atomic<bool> g_unverified_allowed{false};
}  // namespace

void set_unverified_checkpoints_allowed(bool allowed) { g_unverified_allowed = allowed; }
bool unverified_checkpoints_allowed() { return g_unverified_allowed; }

std::string meta_digest(const nlohmann::json & meta) {
    nlohmann::json rest = meta;
    rest.erase("meta_digest");
    const std::string text = rest.dump();
    return bytes_digest(text.data(), text.size());
}

nlohmann::json load_checkpoint_meta(const std::string & dir) {
    const std::string meta_path = (fs::path(dir) / "meta.json").string();
    nlohmann::json meta;
    try {
        meta = read_json_file(meta_path, uint64_t(64) << 20);
    } catch (const IoError & e) {
        throw FormatError(e.what());
    }
    if (!meta.is_object() || !meta.contains("format") || !meta["format"].is_string() || meta["format"] != kFormat ||
        !meta.contains("step"))
        throw FormatError(fmt::format("{}: not a {} file", meta_path, kFormat));
    // The layout it was written by: in range whether or not the state is sharded.
    if (meta.contains("world_size")) json_get_in<int>(meta, "world_size", meta_path, 1, 1 << 20);
    if (meta.contains("zero")) json_get_in<int>(meta, "zero", meta_path, 0, 3);
    if (!meta.contains("meta_digest") || !meta.contains("checksums")) {
        if (!unverified_checkpoints_allowed())
            throw FormatError(fmt::format("{}: the checkpoint records no digests (written by an older memfit, or "
                                          "edited), so its files cannot be checked; pass --allow-unverified to load "
                                          "it anyway", meta_path));
        static std::atomic<bool> warned{false};
        if (!warned.exchange(true))
            std::fprintf(stderr, "memfit: warning: %s records no digests: loaded unverified (--allow-unverified)\n",
                         meta_path.c_str());
        return meta;
    }
    const std::string want = meta["meta_digest"].is_string() ? meta["meta_digest"].get<std::string>() : "";
    if (const std::string got = meta_digest(meta); got != want)
        throw FormatError(fmt::format("{}: its digest is {}, it records {}: meta.json changed after the checkpoint "
                                      "was written; resume from an earlier checkpoint", meta_path, got, want));
    return meta;
}

size_t checkpoint_total(const std::string & dir, const nlohmann::json & meta) {
    if (is_sharded(meta)) return json_get<size_t>(meta, "total", (fs::path(dir) / "meta.json").string());
    const SafetensorsFile f = SafetensorsFile::open((fs::path(dir) / kStateFile).string());
    const auto & shape = f.info("params").shape;
    size_t n = 1;
    for (int64_t d : shape) n *= size_t(d);
    return n;
}

// The file's digest against the one meta.json recorded when it was written (checkpoints from
// before digests were recorded have no "checksums"; one that has them has every file's).
static void check_digest(const nlohmann::json & meta, const std::string & dir, const std::string & file) {
    if (!meta.contains("checksums") && unverified_checkpoints_allowed()) return;   // warned when meta.json was read
    const std::string path = (fs::path(dir) / file).string();
    const nlohmann::json & sums = meta["checksums"];
    if (!sums.is_object() || !sums.contains(file) || !sums[file].is_string())
        throw FormatError(fmt::format("{}/meta.json: \"checksums\" records no digest string for {}: the checkpoint's "
                                      "record is damaged; resume from an earlier checkpoint", dir, file));
    const std::string got = file_digest(path), want = sums[file].get<std::string>();
    if (got != want)
        throw FormatError(fmt::format("{}: its content digest is {}, meta.json recorded {}: the file changed after "
                                      "the checkpoint was written; resume from an earlier checkpoint", path, got,
                                      want));
}

namespace {

TrainState read_state_range(const std::string & dir, const nlohmann::json & meta, size_t lo, size_t hi) {
    const std::string meta_path = (fs::path(dir) / "meta.json").string();
    TrainState s;
    read_scaler(meta, meta_path, s);
    s.offset = lo;
    if (!is_sharded(meta)) {
        check_digest(meta, dir, kStateFile);
        const SafetensorsFile f = SafetensorsFile::open((fs::path(dir) / kStateFile).string());
        StateTensors t = read_state_tensors(f);
        const size_t total = t.params.size();
        if (lo > hi || hi > total)
            throw FormatError(fmt::format("{}: holds {} parameters, elements [{}, {}) were asked for", f.path(), total,
                                          lo, hi));
        s.total = total;
        if (lo == 0 && hi == total) {
            s.params = std::move(t.params);
            s.m = std::move(t.m);
            s.v = std::move(t.v);
        } else {
            s.params.assign(t.params.begin() + long(lo), t.params.begin() + long(hi));
            s.m.assign(t.m.begin() + long(lo), t.m.begin() + long(hi));
            s.v.assign(t.v.begin() + long(lo), t.v.begin() + long(hi));
        }
        return s;
    }
    const size_t total = json_get<size_t>(meta, "total", meta_path);
    const int world = json_get<int>(meta, "world_size", meta_path);
    if (lo > hi || hi > total)
        throw FormatError(fmt::format("{}: holds {} parameters, elements [{}, {}) were asked for", meta_path, total,
                                      lo, hi));
    s.total = total;
    s.params.resize(hi - lo);
    s.m.resize(hi - lo);
    s.v.resize(hi - lo);
    for (const auto & [r, file] : shard_table(meta, meta_path, total)) {
        const size_t a = std::max(lo, r.offset), b = std::min(hi, r.offset + r.count);
        if (a >= b) continue;   // no overlap with the range
        const std::string path = (fs::path(dir) / file).string();
        if (!fs::exists(path))
            throw IoError(fmt::format("{}: shard file of rank {} of {} is missing (the checkpoint is incomplete; "
                                      "resume from an earlier one)", path, r.rank, world));
        const SafetensorsFile f = SafetensorsFile::open(path);
        auto md = [&](const char * k) -> std::string {
            const auto it = f.metadata().find(k);
            return it == f.metadata().end() ? std::string() : it->second;
        };
        if (md("offset") != std::to_string(r.offset) || md("total") != std::to_string(total))
            throw FormatError(fmt::format("{}: holds elements from offset {} of {}, meta.json says offset {} of {} "
                                          "(a shard of another checkpoint?)",
                                          path, md("offset"), md("total"), r.offset, total));
        check_digest(meta, dir, file);
        const StateTensors t = read_state_tensors(f);
        if (t.params.size() != r.count)
            throw FormatError(fmt::format("{}: {} elements, meta.json says {}", path, t.params.size(), r.count));
        const size_t n = b - a, src = a - r.offset, dst = a - lo;
        std::copy_n(t.params.begin() + long(src), n, s.params.begin() + long(dst));
        std::copy_n(t.m.begin() + long(src), n, s.m.begin() + long(dst));
        std::copy_n(t.v.begin() + long(src), n, s.v.begin() + long(dst));
    }
    return s;
}

}  // namespace

TrainState load_state_range(const std::string & dir, const nlohmann::json & meta, size_t lo, size_t hi) {
    TrainState s = read_state_range(dir, meta, lo, hi);
    // A state its digests vouch for can still hold what a diverged run wrote (or come from before
    // digests): AdamW would turn it into NaN weights at the first update. The bounds are far past
    // what training leaves (weights of order 1, moments of the gradients' size) and catch a flipped
    // exponent bit: 1e8 for a weight, 1e10 for a first moment, 1e20 (its square) for a second.
    struct Part { const char * what; const std::vector<float> * v; bool non_negative; float limit; };
    const Part parts[] = {{"parameters", &s.params, false, 1e8f}, {"first moments", &s.m, false, 1e10f},
                          {"second moments", &s.v, true, 1e20f}};
    for (const Part & p : parts) {
        NonFinite bad = find_non_finite(p.v->data(), p.v->size(), p.non_negative, p.limit);
        bad.first += lo;   // an element of the whole state
        if (bad) {
            const std::string kind = fmt::format("implausible (non-finite{} or above {:g})",
                                                 p.non_negative ? ", negative" : "", p.limit);
            throw FormatError(fmt::format("{}: the {} hold {}; the run had diverged when it was written, or it is "
                                          "corrupt: resume from an earlier checkpoint",
                                          dir, p.what, bad.describe(kind.c_str())));
        }
    }
    return s;
}

Checkpoint load_checkpoint(const std::string & path) {
    const std::string dir = find_checkpoint(path);
    Checkpoint c;
    c.meta = load_checkpoint_meta(dir);
    const size_t total = checkpoint_total(dir, c.meta);
    c.state = load_state_range(dir, c.meta, 0, total);
    return c;
}

}  // namespace memfit
