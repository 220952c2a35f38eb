#include "model/config.h"

#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace memfit {

namespace {

struct Preset { const char * name; int vocab, max_seq, C, L, NH; const char * what; };

// vocab 0: the small demo models take the vocabulary of the data they train on.
constexpr Preset kPresets[] = {
    {"nano",        0,     256,  64,   2,  4,  "2 layers, 64 channels: tests and smoke runs"},
    {"micro",       0,     256,  128,  4,  4,  "4 layers, 128 channels: the quick CPU demo"},
    {"mini",        0,     512,  256,  6,  8,  "6 layers, 256 channels: a longer CPU demo"},
    {"gpt2-6l",     50257, 1024, 384,  6,  6,  "6 layers, 384 channels, GPT-2 vocabulary: the CPU benchmark"},
    {"gpt2",        50257, 1024, 768,  12, 12, "GPT-2 124M"},
    {"gpt2-medium", 50257, 1024, 1024, 24, 16, "GPT-2 350M"},
    {"gpt2-large",  50257, 1024, 1280, 36, 20, "GPT-2 774M"},
    {"gpt2-xl",     50257, 1024, 1600, 48, 25, "GPT-2 1.5B"},
};

}  // namespace

int64_t ModelConfig::num_params() const {
    const int64_t C = n_embd, L = n_layer, V = vocab_size, P = max_seq;
    const int64_t per_layer = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C);
    return V * C + P * C + L * per_layer + 2 * C;
}

void ModelConfig::validate() const {
    auto bad = [&](const std::string & what) {
        throw ConfigError(fmt::format("model '{}': {}", name, what));
    };
    if (family != "gpt2") bad(fmt::format("family '{}' is not supported yet (supported: gpt2)", family));
    if (n_layer < 1) bad(fmt::format("n_layer = {}, must be at least 1", n_layer));
    if (n_embd < 1 || n_head < 1) bad(fmt::format("n_embd = {}, n_head = {}: both must be positive", n_embd, n_head));
    if (n_embd % n_head != 0)
        bad(fmt::format("n_embd = {} is not divisible by n_head = {}", n_embd, n_head));
    if (max_seq < 1) bad(fmt::format("n_positions = {}, must be positive", max_seq));
    if (vocab_size < 0) bad(fmt::format("vocab_size = {}, must be positive", vocab_size));
    if (!(ln_eps > 0)) bad(fmt::format("layer_norm_epsilon = {}, must be positive", ln_eps));
}

std::vector<std::string> preset_names() {
    std::vector<std::string> out;
    for (const auto & p : kPresets) out.push_back(p.name);
    return out;
}

ModelConfig model_preset(const std::string & name) {
    for (const auto & p : kPresets) {
        if (name != p.name) continue;
        ModelConfig c;
        c.name = p.name;
        c.vocab_size = p.vocab;
        c.max_seq = p.max_seq;
        c.n_embd = p.C;
        c.n_layer = p.L;
        c.n_head = p.NH;
        return c;
    }
    throw ConfigError(fmt::format("unknown model '{}': use a preset ({}) or a path to a Hugging Face config.json",
                                  name, fmt::join(preset_names(), ", ")));
}

ModelConfig load_hf_config(const std::string & path) {
    std::ifstream in(path);
    if (!in) throw IoError(fmt::format("{}: cannot open model config", path));
    nlohmann::json j;
    try {
        in >> j;
    } catch (const std::exception & e) {
        throw ConfigError(fmt::format("{}: not valid JSON ({})", path, e.what()));
    }
    if (!j.is_object()) throw ConfigError(fmt::format("{}: expected a JSON object", path));
    ModelConfig c;
    c.name = path;
    try {
        const std::string type = j.value("model_type", "gpt2");
        if (type != "gpt2")
            throw ConfigError(fmt::format("{}: model_type '{}' is not supported yet (supported: gpt2)", path, type));
        c.vocab_size = j.at("vocab_size").get<int>();
        c.max_seq = j.value("n_positions", j.value("n_ctx", 1024));
        c.n_embd = j.at("n_embd").get<int>();
        c.n_layer = j.at("n_layer").get<int>();
        c.n_head = j.at("n_head").get<int>();
        c.ln_eps = j.value("layer_norm_epsilon", 1e-5f);
        c.tied_head = j.value("tie_word_embeddings", true);
        if (j.contains("activation_function") && j["activation_function"] != "gelu_new")
            throw ConfigError(fmt::format("{}: activation_function {} is not supported (supported: gelu_new)", path,
                                          j["activation_function"].dump()));
    } catch (const nlohmann::json::exception & e) {
        throw ConfigError(fmt::format("{}: missing or malformed field ({})", path, e.what()));
    }
    if (!c.tied_head) throw ConfigError(fmt::format("{}: untied GPT-2 heads are not supported yet", path));
    if (c.vocab_size < 1) throw ConfigError(fmt::format("{}: vocab_size = {}, must be positive", path, c.vocab_size));
    c.validate();
    return c;
}

ModelConfig resolve_model(const std::string & name_or_path) {
    namespace fs = std::filesystem;
    if (name_or_path.find('/') != std::string::npos || name_or_path.ends_with(".json")) {
        fs::path p(name_or_path);
        if (fs::is_directory(p)) p /= "config.json";
        return load_hf_config(p.string());
    }
    return model_preset(name_or_path);
}

}  // namespace memfit
