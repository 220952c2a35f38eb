// The training job's side of preference tuning (model/preference.h): the reference before the
// first step, each batch's reference rows under --reference precompute, and TRL's metrics.
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "app/training_run.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/file_digest.h"
#include "data/prepare.h"

namespace memfit {

namespace fs = std::filesystem;

namespace {

constexpr char kRefMagic[8] = {'M', 'F', 'R', 'E', 'F', 'L', 'P', '1'};

// A stored table of `n` rows, or empty when the file is missing or not one (it is then made again).
std::vector<float> read_table(const std::string & path, size_t n) {
    std::ifstream f(path, std::ios::binary);
    char magic[8];
    uint64_t count = 0;
    if (!f.read(magic, 8) || std::memcmp(magic, kRefMagic, 8) != 0 || !f.read(reinterpret_cast<char *>(&count), 8) ||
        count != n)
        return {};
    std::vector<float> t(n);
    if (!f.read(reinterpret_cast<char *>(t.data()), std::streamsize(n * sizeof(float)))) return {};
    return t;
}

}  // namespace

// Preference data is what `memfit prepare --format preference` writes, in batches of whole pairs.
void check_preference_data(const std::string & train_path, int rows_per_rank) {
    const std::string meta = (fs::path(train_path).parent_path() / "meta.json").string();
    const std::string format = prepared_format(meta);
    if (format != "preference")
        throw ConfigError(fmt::format("--objective dpo trains on pairs of answers, and {} holds {} data; prepare it "
                                      "with `memfit prepare --format preference --input PAIRS.jsonl` (TRL's "
                                      "prompt/chosen/rejected records)",
                                      fs::path(train_path).parent_path().string(), format.empty() ? "other" : format));
    if (rows_per_rank % 2)
        throw ConfigError(fmt::format("--objective dpo: each rank's micro-batch of {} rows must hold whole pairs "
                                      "(chosen, rejected); use an even --micro-batch",
                                      rows_per_rank));
}

void TrainingRun::start_preference() {
    const PreferenceOptions & p = eo_.pref;
    if (p.copy()) engine_->reference_from_start();
    if (p.reference == Reference::precompute) {   // the tables are named by the starting weights' digest
        const std::vector<float> start = eo_.lora.enabled() ? engine_->base_weights() : engine_->full_params();
        const std::string key = bytes_digest(start.data(), start.size() * sizeof(float)).substr(0, 16);
        train_ref_ = reference_table(*train_data_, "train", key);
        if (val_data_) val_ref_ = reference_table(*val_data_, "val", key);
    }
    say(fmt::format("  dpo: {} loss, beta {:g}{}; reference {}{}; each micro-batch of {} rows holds {} pairs",
                    dpo_loss_name(p.loss), p.beta,
                    p.label_smoothing > 0 ? fmt::format(", label smoothing {:g}", p.label_smoothing) : "",
                    reference_name(p.reference),
                    p.copy() ? fmt::format(" ({} weights)", reference_weights_name(p.weights)) : "", eo_.B, eo_.B / 2));
}

// Every window's log-probability under the starting weights, kept beside the data and named by
// what it depends on (the weights, --seq, the split's file), so that a resumed run reads it back.
std::vector<float> TrainingRun::reference_table(const DataLoader & loader, const std::string & split,
                                                const std::string & key) {
    Engine & e = *engine_;
    const size_t W = loader.num_windows();
    const std::string path = (fs::path(loader.file().path()).parent_path() /
                              fmt::format("reference_logps-{}-seq{}-{}.bin", key, opt_.seq, split))
                                 .string();
    if (std::vector<float> t = read_table(path, W); !t.empty()) {
        say(fmt::format("  dpo: the reference's log-probabilities of {} {} rows from {}", W, split, path));
        return t;
    }
    const int B = e.options().B, T = opt_.seq;
    std::vector<int32_t> in(size_t(B) * T), tg(in.size()), ds(in.size());
    std::vector<float> table(W);
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t w0 = 0; w0 < W; w0 += size_t(B)) {
        const int n = int(std::min<size_t>(size_t(B), W - w0));
        loader.fill_windows(w0, n, in.data(), tg.data(), ds.data());
        if (n < B)   // the last batch's spare rows: copies of its first pair, left unread
            for (int r = n; r < B; ++r) {
                const size_t from = size_t(r % 2) * size_t(T), to = size_t(r) * size_t(T);
                std::copy_n(in.begin() + long(from), T, in.begin() + long(to));
                std::copy_n(tg.begin() + long(from), T, tg.begin() + long(to));
                std::copy_n(ds.begin() + long(from), T, ds.begin() + long(to));
            }
        const std::vector<float> lp = e.row_logps(in.data(), tg.data(), eo_.documents ? ds.data() : nullptr);
        std::copy_n(lp.begin(), n, table.begin() + long(w0));
    }
    std::string bytes(kRefMagic, 8);
    const uint64_t count = W;
    bytes.append(reinterpret_cast<const char *>(&count), 8);
    bytes.append(reinterpret_cast<const char *>(table.data()), W * sizeof(float));
    if (lead_) write_file_atomic(path, bytes);
    say(fmt::format("  dpo: the reference's log-probabilities of {} {} rows computed in {:.1f} s, kept in {}", W, split,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), path));
    return table;
}

// This rank's rows of the batch's reference log-probabilities, laid out as take_rows lays out
// the tokens (null without a table).
const float * TrainingRun::my_reference(const std::vector<float> & table, const std::vector<uint64_t> & windows,
                                        int rows, int groups) {
    if (table.empty()) return nullptr;
    const size_t mine = size_t(rows / ranks_);
    my_ref_.resize(mine * size_t(groups));
    for (int g = 0; g < groups; ++g)
        for (size_t i = 0; i < mine; ++i)
            my_ref_[size_t(g) * mine + i] = table[windows[size_t(g) * size_t(rows) + size_t(rank_) * mine + i]];
    return my_ref_.data();
}

// TRL's names: "rewards/chosen", ... for the step, "eval_rewards/chosen", ... for an evaluation.
void TrainingRun::add_preference_metrics(nlohmann::json & m, const StepResult & r, bool eval) const {
    for (const auto & [k, v] : r.pref.means()) m[k] = v;
    if (eval)
        for (const auto & [k, v] : val_pref_.means()) m["eval_" + k] = v;
}

}  // namespace memfit
