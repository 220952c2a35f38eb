#include "app/quantize.h"

#include <chrono>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "app/export.h"
#include "app/model_source.h"
#include "app/trainer.h"
#include "backend/make_backend.h"
#include "backend/quant_format.h"
#include "core/error.h"
#include "core/units.h"
#include "data/data_loader.h"
#include "data/token_file.h"
#include "infer/calibration.h"
#include "infer/decoder.h"
#include "infer/gptq.h"
#include "model/param_layout.h"

namespace fs = std::filesystem;

namespace memfit {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// sum over rows of d H d^T for D [out, in], H [in, in]: ||D X||^2 when H = X^T X.
double weighted_square(const std::vector<float> & D, int64_t out, int64_t in, const std::vector<double> & H) {
    double total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static)
    for (int64_t r = 0; r < out; ++r) {
        const float * d = D.data() + r * in;
        for (int64_t i = 0; i < in; ++i) {
            double t = 0;
            for (int64_t j = 0; j < in; ++j) t += H[size_t(i * in + j)] * double(d[j]);
            total += double(d[i]) * t;
        }
    }
    return total;
}

// `samples` windows of seq tokens from the calibration folder's train.bin, in the seed's order.
std::vector<int32_t> calibration_tokens(const QuantizeRequest & r, const ModelConfig & cfg, int & samples) {
    const DataSource src = resolve_data(r.calibration, r.tokenizer, cfg.vocab_size);
    if (src.vocab_size > cfg.vocab_size)
        throw ConfigError(fmt::format("--calibration {}: its tokens come from a vocabulary of {}, the model has {}; "
                                      "prepare it with the model's tokenizer", r.calibration, src.vocab_size,
                                      cfg.vocab_size));
    DataLoader loader(src.train_path, 1, r.seq, r.seed);
    if (loader.num_windows() == 0)
        throw ConfigError(fmt::format("--calibration {}: no window of {} tokens; pass a smaller --seq",
                                      r.calibration, r.seq));
    samples = int(std::min<size_t>(size_t(r.samples), loader.num_windows()));
    samples = std::max(r.batch, samples / r.batch * r.batch);   // whole program runs
    std::vector<int32_t> tok(size_t(samples) * size_t(r.seq)), tgt(size_t(r.seq));
    for (int s = 0; s < samples; ++s) loader.next(tok.data() + size_t(s) * size_t(r.seq), tgt.data());
    return tok;
}

// One calibration batch (windows s .. s + batch - 1) through layer hs: tokens for layer 0, the
// residual stream the layer below produced after.
std::vector<float> run_block(LayerHessians & hs, const std::vector<int32_t> & calib, const std::vector<float> & hidden,
                             int s, const QuantizeRequest & r, int64_t C) {
    const size_t at = size_t(s) * size_t(r.seq);
    return hs.layer() == 0 ? hs.run(calib.data() + at) : hs.run(hidden.data() + at * size_t(C));
}

// Negative log-likelihood over scored targets, and how many windows were run.
struct Scored {
    double nll = 0;
    uint64_t tokens = 0, windows = 0;
};

// Tokens [b, e) of f through the decoder one at a time; each target t (b < t < e) adds
// -log softmax(logits)[token t] unless f is documents and t is not a trained target.
void score_window(Decoder & d, const TokenFile & f, uint64_t b, uint64_t e, int vocab, Scored & sc) {
    std::vector<int32_t> w(size_t(e - b));
    for (size_t i = 0; i < w.size(); ++i) {
        w[i] = f.token(b + i);
        if (w[i] < 0 || w[i] >= vocab)
            throw FormatError(fmt::format("{}: token {} is outside the model's vocabulary of {}", f.path(), w[i], vocab));
    }
    const float * logits = d.prefill({w[0]});
    for (size_t i = 0; i + 1 < w.size(); ++i) {
        if (i > 0) logits = d.step(w[i]);
        if (f.documents() && !f.trained(b + i + 1)) continue;
        double mx = logits[0];
        for (int v = 1; v < vocab; ++v) mx = std::max(mx, double(logits[v]));
        double s = 0;
        for (int v = 0; v < vocab; ++v) s += std::exp(double(logits[v]) - mx);
        sc.nll += mx + std::log(s) - double(logits[w[i + 1]]);
        ++sc.tokens;
    }
    ++sc.windows;
}

// Entry e of m quantized in place (m.packed, and m.params dequantized), by GPTQ on hs's Hessian of
// its inputs or by round-to-nearest; with hs, its weighted errors ||(W - W')X||^2 and ||WX||^2 are
// added to err and ref.
void quantize_entry(GptqModel & m, const ParamLayout & all, const QuantEntry & e, bool gptq, const LayerHessians * hs,
                    double & err, double & ref) {
    const std::vector<float> W = gather_quant_entry(m.cfg, all, e, m.params.data());
    const std::vector<double> H = hs ? hs->hessian(int(e.proj)) : std::vector<double>{};
    const GptqCodes c = gptq ? gptq_quantize(W.data(), e.q.out, e.q.in, H, m.spec.options)
                             : rtn_quantize(W.data(), e.q.out, e.q.in, m.spec.options);
    const std::vector<uint8_t> bytes = pack_gptq(c);
    MF_ASSERT(bytes.size() == quant_bytes(e.q));
    std::copy(bytes.begin(), bytes.end(), m.packed.begin() + ptrdiff_t(e.offset));
    const std::vector<float> Wq = c.dequantize();
    if (hs) {
        std::vector<float> D(W.size());
        for (size_t i = 0; i < D.size(); ++i) D[i] = W[i] - Wq[i];
        err += weighted_square(D, e.q.out, e.q.in, H);
        ref += weighted_square(W, e.q.out, e.q.in, H);
    }
    scatter_quant_entry(m.cfg, all, e, Wq.data(), m.params.data());
}

double projection_elems(const QuantLayout & q) {
    double n = 0;
    for (const auto & e : q.entries) n += double(e.q.out) * double(e.q.in);
    return n;
}

void copy_tokenizer_files(const std::string & tokenizer, const std::string & out) {
    if (tokenizer.empty() || !fs::is_regular_file(tokenizer)) return;
    const fs::path dir = fs::path(tokenizer).parent_path();
    std::error_code ec;
    fs::copy_file(tokenizer, fs::path(out) / fs::path(tokenizer).filename(), fs::copy_options::overwrite_existing, ec);
    for (const char * n : {"tokenizer_config.json", "chat_template.jinja", "generation_config.json"})
        if (fs::is_regular_file(dir / n)) fs::copy_file(dir / n, fs::path(out) / n, fs::copy_options::overwrite_existing, ec);
    if (ec) throw IoError(fmt::format("copying the tokenizer {} into {}: {}", tokenizer, out, ec.message()));
}

}  // namespace

std::string quantize_model(const QuantizeRequest & r, std::FILE * progress) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool gptq = r.spec.method == "gptq";
    if (!gptq && r.spec.method != "rtn")
        throw ConfigError(fmt::format("--method {}: expected gptq or rtn", r.spec.method));
    if (gptq && r.calibration.empty())
        throw ConfigError("--method gptq needs --calibration DATA (a folder from memfit prepare); --method rtn needs "
                          "none");
    LoadedModel src = read_model_weights(r.model);
    if (!src.quant.entries.empty())
        throw ConfigError(fmt::format("{} is already quantized: quantize its fp16/fp32 source", r.model));
    GptqModel m;
    m.cfg = src.cfg;
    m.spec = r.spec;
    if (!gptq) m.spec.options.desc_act = m.spec.options.true_sequential = false;   // no order to keep
    m.layout = gptq_layout(m.cfg, m.spec);   // the shapes checked before any work
    m.packed.assign(m.layout.bytes, 0);
    m.params = std::move(src.params);
    QuantizeRequest req = r;
    if (req.seq <= 0 || req.seq > m.cfg.trained_context()) req.seq = std::min(2048, m.cfg.trained_context());
    int samples = 0;
    const std::vector<int32_t> calib = r.calibration.empty() ? std::vector<int32_t>{}
                                                            : calibration_tokens(req, m.cfg, samples);
    const std::unique_ptr<Backend> backend = make_backend("cpu");
    const ParamLayout all = make_param_layout(m.cfg);
    uint64_t planned = 0, measured = 0;
    const int64_t C = m.cfg.n_embd;
    std::vector<float> hidden(calib.size() * size_t(C));   // the residual stream between layers
    double err_sum = 0, ref_sum = 0;
    for (int l = 0; l < m.cfg.n_layer; ++l) {
        const auto tl = std::chrono::steady_clock::now();
        std::unique_ptr<LayerHessians> hs;
        if (!calib.empty()) hs = std::make_unique<LayerHessians>(m.cfg, *backend, l, req.batch, req.seq);
        auto calibrate = [&] {   // the Hessians on the layer's current weights (its outputs not kept)
            hs->reset();
            hs->set_weights(m.params.data());
            for (int s = 0; s < samples; s += req.batch) run_block(*hs, calib, hidden, s, req, C);
        };
        double err = 0, ref = 0;
        if (hs && !m.spec.options.true_sequential) calibrate();
        for (const QuantEntry & e : m.layout.entries) {
            if (e.layer != l) continue;
            if (hs && m.spec.options.true_sequential) calibrate();   // after the projections before it
            quantize_entry(m, all, e, gptq, hs.get(), err, ref);
        }
        if (hs) {   // the quantized layer's outputs: the next layer's calibration inputs
            hs->set_weights(m.params.data());
            for (int s = 0; s < samples; s += req.batch) {
                const std::vector<float> out = run_block(*hs, calib, hidden, s, req, C);
                std::copy(out.begin(), out.end(), hidden.begin() + ptrdiff_t(size_t(s) * size_t(req.seq) * size_t(C)));
            }
            planned = std::max(planned, hs->planned_peak_live().total());
            measured = std::max(measured, hs->ledger().live_peak().total());
        }
        err_sum += err, ref_sum += ref;
        if (progress)
            std::fprintf(progress, "quantize: layer %d/%d (%s, %d-bit): %s%.1f s\n", l + 1, m.cfg.n_layer,
                         m.spec.method.c_str(), m.spec.options.bits,
                         hs ? fmt::format("relative output error {:.3e} on {} calibration tokens; ", err / std::max(ref, 1e-300),
                                          int64_t(samples) * req.seq).c_str() : "",
                         seconds_since(tl));
    }
    const nlohmann::json ids = tokenizer_token_ids(src.tokenizer.empty() ? (m.cfg.vocab_size == 50257 ? "gpt2" : "")
                                                                          : src.tokenizer);
    const uint64_t bytes = write_gptq_folder(r.out, m, r.dtype, ids);
    copy_tokenizer_files(src.tokenizer, r.out);
    std::string line = fmt::format("quantize: wrote {} ({}, {}-bit, groups of {}{}{}): {} of tensors, the projections {} "
                                   "({:.1f}% of bf16) in {:.1f} s",
                                   r.out, m.spec.method, m.spec.options.bits,
                                   m.spec.options.group > 0 ? std::to_string(m.spec.options.group) : "a whole row",
                                   std::string(m.spec.options.desc_act ? ", act-order" : "") +
                                       (m.spec.options.true_sequential ? ", true-sequential" : ""),
                                   m.spec.options.sym ? "" : ", asymmetric",
                                   format_bytes(bytes), format_bytes(m.layout.bytes),
                                   100.0 * double(m.layout.bytes) / (2.0 * projection_elems(m.layout)),
                                   seconds_since(t0));
    if (!calib.empty())
        line += fmt::format("; relative output error {:.3e} over all layers; calibration: {} windows of {} tokens, "
                            "memory planned {}, measured {}",
                            err_sum / std::max(ref_sum, 1e-300), samples, req.seq, format_bytes(planned),
                            format_bytes(measured));
    return line;
}

nlohmann::json evaluate_model(const EvalRequest & r) {
    LoadedModel src = read_model_weights(r.model);
    const ModelConfig & cfg = src.cfg;
    const int seq = r.seq > 0 ? r.seq : std::min(256, cfg.trained_context());
    if (seq + 1 > cfg.max_seq + 1 || seq < 1)
        throw ConfigError(fmt::format("--seq {}: the model holds {} positions", seq, cfg.max_seq));
    const DataSource data = resolve_data(r.data, r.tokenizer.empty() ? src.tokenizer : r.tokenizer, cfg.vocab_size);
    const TokenFile f(data.val_path.empty() ? data.train_path : data.val_path);
    const uint64_t windows = f.size() > 0 ? (f.size() - 1) / uint64_t(seq) : 0;
    const uint64_t want = uint64_t(r.batch) * uint64_t(r.batches);
    if (!f.documents() && windows == 0)
        throw ConfigError(fmt::format("{}: {} tokens, not one window of {}; pass a smaller --seq", f.path(), f.size(),
                                      seq + 1));
    const std::unique_ptr<Backend> backend = make_backend("cpu");
    std::unique_ptr<Decoder> d;
    if (!src.quant.entries.empty()) {
        if (r.weights != "fp32" && r.weights != "gptq")
            throw ConfigError(fmt::format("--weights {}: {} is a GPTQ folder; its projections compute as stored",
                                          r.weights, r.model));
        d = std::make_unique<Decoder>(cfg, *backend, seq, DType::f32, src.quant);
        d->set_weights(src.params.data(), &src.packed);
    } else {
        DType dt = DType::f32;
        std::optional<QuantFormat> q;
        if (r.weights == "bf16") dt = DType::bf16;
        else if (r.weights == "int8") q = QuantFormat::int8;
        else if (r.weights == "nf4") q = QuantFormat::nf4_dq;
        else if (r.weights != "fp32")
            throw ConfigError(fmt::format("--weights {}: expected fp32, bf16, int8 or nf4", r.weights));
        d = std::make_unique<Decoder>(cfg, *backend, seq, dt, q);
        d->set_weights(src.params.data());
    }
    // Text: consecutive windows of seq + 1 tokens. Documents (prepared conversations or
    // preference data): each document's first seq + 1 tokens, its trained targets scored (the
    // loss training computes).
    Scored sc;
    const uint64_t units = f.documents() ? f.num_docs() : windows;
    for (uint64_t k = 0; k < units && sc.windows < want; ++k) {
        const uint64_t b = f.documents() ? f.doc_begin(k) : k * uint64_t(seq);
        const uint64_t e = f.documents() ? std::min(f.doc_end(k), b + uint64_t(seq) + 1) : b + uint64_t(seq) + 1;
        if (e - b >= 2) score_window(*d, f, b, e, cfg.vocab_size, sc);
    }
    if (sc.tokens == 0)
        throw ConfigError(fmt::format("{}: no trained target in the windows scored", f.path()));
    const double nll = sc.nll;
    const uint64_t tokens = sc.tokens;
    const double loss = nll / double(tokens);
    return {{"val_loss", loss}, {"perplexity", std::exp(loss)}, {"tokens", tokens},
            {"weights_bytes", d->weight_bytes()}, {"peak_bytes", d->ledger().live_peak().total()},
            {"planned_peak_bytes", d->planned_peak_live().total()}};
}

}  // namespace memfit
