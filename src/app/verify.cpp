#include "app/verify.h"

#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "backend/make_backend.h"
#include "core/error.h"
#include "core/json_read.h"
#include "core/json_num.h"
#include "model/hf_weights.h"
#include "model/safetensors.h"
#include "train/engine.h"

namespace memfit {

double relative_error(const float * a, const float * b, size_t n) {
    double diff = 0, ref = 0;
    for (size_t i = 0; i < n; ++i) {
        const double d = double(a[i]) - double(b[i]);
        diff += d * d;
        ref += double(b[i]) * double(b[i]);
    }
    return ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

namespace {

nlohmann::json parse_meta_json(const SafetensorsFile & f, const std::string & key) {
    auto it = f.metadata().find(key);
    if (it == f.metadata().end()) throw FormatError(fmt::format("{}: metadata has no '{}'", f.path(), key));
    return parse_json(it->second, fmt::format("{}: metadata '{}'", f.path(), key));
}

std::vector<float> expect(const SafetensorsFile & f, const std::string & name, size_t n) {
    std::vector<float> v = f.read_f32(name);
    if (v.size() != n)
        throw FormatError(fmt::format("{}: tensor '{}' has {} elements, expected {}", f.path(), name, v.size(), n));
    return v;
}

}  // namespace

VerifyReport verify_fixture(const std::string & path, double tolerance, bool checking, const std::string & device) {
    SafetensorsFile f = SafetensorsFile::open(path);
    const nlohmann::json cj = parse_meta_json(f, "config");
    const nlohmann::json aj = parse_meta_json(f, "adamw");
    const ModelConfig cfg = parse_hf_config(cj, path);
    const std::vector<int32_t> ids = f.read_i32("input_ids"), targets = f.read_i32("targets");
    const auto & shape = f.info("input_ids").shape;
    if (shape.size() != 2 || targets.size() != ids.size())
        throw FormatError(fmt::format("{}: input_ids must be [B, T] and match targets", path));
    const int B = int(shape[0]), T = int(shape[1]);

    const std::unique_ptr<Backend> backend_owner = make_backend(device);
    Backend & backend = *backend_owner;
    EngineOptions eo;
    eo.B = B;
    eo.T = T;
    eo.with_eval = false;
    eo.checking = checking;
    // A LoRA fixture (metadata "lora", a checkpoint's record: lora_json) trains its adapters on the
    // frozen base its other tensors hold.
    if (f.metadata().count("lora")) eo.lora = lora_from_json(parse_meta_json(f, "lora"), cfg, path + ": metadata 'lora'");
    Engine engine(cfg, backend, eo);
    engine.init_params(0);   // zero AdamW moments
    // The fixture's names are the checkpoint's (Phi-3's fused qkv_proj, gate_up_proj).
    // In memfit's form (model/hf_weights.h from_checkpoint: Gemma 3's norms, GPT-NeoX's q|k|v rows).
    auto read_all = [&](const ParamLayout & layout) {
        std::vector<float> full(layout.total);
        for (const auto & p : layout.params) {
            const std::vector<float> v = expect(f, p.name, p.numel);
            std::copy(v.begin(), v.end(), full.begin() + std::ptrdiff_t(p.offset));
            from_checkpoint(cfg, p, full.data() + p.offset);
        }
        return full;
    };
    if (eo.lora.enabled()) engine.set_base(read_all(checkpoint_layout(cfg, make_param_layout(cfg))).data());
    const ParamLayout layout = eo.lora.enabled() ? make_lora_layout(cfg, eo.lora) : checkpoint_layout(cfg, engine.step().layout());
    engine.set_params(read_all(layout).data());
    OptimHyper h;
    try {
        h.lr = json_get<float>(aj, "lr", path);
        h.beta1 = json_get<float>(aj, "beta1", path);
        h.beta2 = json_get<float>(aj, "beta2", path);
        h.eps = json_get<float>(aj, "eps", path);
        h.weight_decay = json_get<float>(aj, "weight_decay", path);
    } catch (const nlohmann::json::exception & e) {
        throw FormatError(fmt::format("{}: adamw metadata is missing a field ({})", path, json_error_text(e.what())));
    }

    nlohmann::json errors = nlohmann::json::object();
    double worst = 0;
    std::string worst_name;
    auto record = [&](const std::string & name, double e) {
        errors[name] = e;
        if (!(e <= worst)) { worst = std::isnan(e) ? INFINITY : e; worst_name = name; }
    };
    // Every parameter-sized tensor of the engine against expected.<what>.<name>, as the checkpoint
    // holds it (to_checkpoint).
    auto record_params = [&](const std::string & what, const float * engine_values) {
        for (const auto & p : layout.params) {
            const auto ref = expect(f, "expected." + what + "." + p.name, p.numel);
            std::vector<float> ours(engine_values + p.offset, engine_values + p.offset + p.numel);
            to_checkpoint(cfg, p, ours.data(), what == "grad");
            record(what + "." + p.name, relative_error(ours.data(), ref.data(), p.numel));
        }
    };
    const size_t V = size_t(cfg.vocab_size), BT = size_t(B) * size_t(T);
    {
        const std::vector<float> logits = engine.logits(ids.data(), B);
        const std::vector<float> ref = expect(f, "expected.logits", BT * V);
        record("logits", relative_error(logits.data(), ref.data(), ref.size()));
    }
    const StepResult r1 = engine.train_step(ids.data(), targets.data(), h);
    const float loss_ref = expect(f, "expected.loss", 1)[0];
    record("loss", relative_error(&r1.loss, &loss_ref, 1));
    record_params("grad", engine.grads());
    record_params("step1", engine.params());
    const StepResult r2 = engine.train_step(ids.data(), targets.data(), h);
    const float loss2_ref = expect(f, "expected.loss_step2", 1)[0];
    record("loss_step2", relative_error(&r2.loss, &loss2_ref, 1));
    record_params("step2", engine.params());
    VerifyReport rep;
    rep.ok = worst <= tolerance;
    rep.json = {{"fixture", path}, {"tolerance", tolerance}, {"max_error", worst}, {"worst", worst_name},
                {"errors", errors}, {"ok", rep.ok}, {"device", backend.name()}};
    return rep;
}

}  // namespace memfit
