// libFuzzer target: a checkpoint's meta.json (train/checkpoint.h) on arbitrary bytes, written as
// DIR/meta.json in a per-process folder with no state files. A JSON object that has a
// "meta_digest" gets its correct digest first (a fuzzer would rarely find one), so the checks
// past the digest run; other bytes are written as they are. Then what --resume runs on the meta:
// load_checkpoint_meta (format, world_size, zero, digest), the step's range, checkpoint_total,
// load_state_range over a small range (the loss scaler, the shard table's tiling, then the
// missing shard file), and the data loaders' positions. Unverified checkpoints are allowed, so
// a meta without digests reaches them too. Every input must pass or throw memfit::Error.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fuzz_file.h"
#include "core/json_num.h"
#include "core/json_read.h"
#include "train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    memfit::set_unverified_checkpoints_allowed(true);
    std::string text(reinterpret_cast<const char *>(data), size);
    if (auto j = memfit::try_parse_json(text); j && j->is_object() && j->contains("meta_digest")) {
        (*j)["meta_digest"] = memfit::meta_digest(*j);
        text = j->dump();
    }
    const std::string path = write_fuzz_input("meta", "meta.json", text.data(), text.size());
    if (path.empty()) return 0;
    const std::string dir = std::filesystem::path(path).parent_path().string();
    try {
        const nlohmann::json m = memfit::load_checkpoint_meta(dir);
        (void) memfit::json_get_in<int>(m, "step", dir, 1, 1 << 30);
        const size_t total = memfit::checkpoint_total(dir, m);
        (void) memfit::load_state_range(dir, m, 0, std::min<size_t>(total, 4096));
    } catch (const memfit::Error &) {}
    try {   // resume_from's loader positions (run_checkpoints.cpp), on a meta that loads
        const nlohmann::json m = memfit::load_checkpoint_meta(dir);
        const nlohmann::json d = m.value("data", nlohmann::json());
        (void) memfit::json_get<uint64_t>(d, "train_epoch", dir);
        (void) memfit::json_get<size_t>(d, "train_cursor", dir);
    } catch (const memfit::Error &) {}
    return 0;
}
