// GPTQ: the solver against a float64 reference written from the paper's Algorithm 1
// (tests/data/make_gptq_fixture.py: the same integer codes, scales, zero points and group
// indices); the packing against the published v1 layout, unpacked here from its description;
// the calibration's Hessians against X^T X computed by hand; a GPTQ folder written and read back
// bit for bit, and a decoder on its packed weights giving the logits of its dequantized weights.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/quant_format.h"
#include "core/dtype.h"
#include "core/error.h"
#include "infer/calibration.h"
#include "infer/decoder.h"
#include "infer/gptq.h"
#include "model/gptq_folder.h"
#include "model/param_layout.h"
#include "model/safetensors.h"
#include "train/engine.h"
#include "test_util.h"

using namespace memfit;
namespace fs = std::filesystem;

namespace {

std::string fixture() { return std::string(MEMFIT_TEST_DATA) + "/gptq_tiny.safetensors"; }

fs::path temp_dir(const std::string & name) {
    const fs::path p = fs::temp_directory_path() / ("memfit_gptq_test." + std::to_string(getpid())) / name;
    fs::remove_all(p);
    return p;
}

// The fixture's cases (make_gptq_fixture.py's CASES).
struct Case { int bits, group; bool sym, desc_act; };
constexpr Case kCases[] = {{4, 16, true, false}, {4, 16, false, true}, {4, -1, true, false}, {8, 32, true, false}};

ModelConfig llama_tiny() {
    ModelConfig c = memfit::test::small_family(true, 61, 32, 2, 4, 40, 24);
    c.n_kv_head = 2;
    return c;
}

std::vector<float> random_params(const ModelConfig & cfg, uint64_t seed) {
    CpuBackend backend;
    EngineOptions eo;
    eo.B = 1, eo.T = 8, eo.with_eval = false;
    Engine e(cfg, backend, eo);
    e.init_params(seed);
    return e.full_params();
}

}  // namespace

TEST(Gptq, SolverMatchesTheFloat64Reference) {
    const SafetensorsFile f = SafetensorsFile::open(fixture());
    const std::vector<float> W = f.read_f32("W"), Hf = f.read_f32("H");
    const std::vector<double> H(Hf.begin(), Hf.end());
    for (size_t k = 0; k < std::size(kCases); ++k) {
        SCOPED_TRACE("case " + std::to_string(k));
        GptqOptions o;
        o.bits = kCases[k].bits, o.group = kCases[k].group, o.sym = kCases[k].sym, o.desc_act = kCases[k].desc_act;
        const GptqCodes c = gptq_quantize(W.data(), 16, 64, H, o);
        const std::string p = "case" + std::to_string(k) + ".";
        const std::vector<int32_t> codes = f.read_i32(p + "codes"), zeros = f.read_i32(p + "zeros"),
                                   g_idx = f.read_i32(p + "g_idx");
        const std::vector<float> scales = f.read_f32(p + "scales");
        ASSERT_EQ(c.q.size(), codes.size());
        int differ = 0;
        for (size_t i = 0; i < codes.size(); ++i) differ += int(c.q[i]) != codes[i];
        EXPECT_EQ(differ, 0) << "codes differing from the reference";
        ASSERT_EQ(c.scales.size(), scales.size());
        for (size_t i = 0; i < scales.size(); ++i) EXPECT_EQ(f16_to_f32(c.scales[i]), scales[i]) << "scale " << i;
        EXPECT_EQ(c.zeros, zeros);
        EXPECT_EQ(c.g_idx, g_idx);
        // The dead input (37) quantizes to zero.
        for (int r = 0; r < 16; ++r) {
            const int g = c.g_idx[37];
            EXPECT_EQ(int(c.q[size_t(r * 64 + 37)]), c.zeros[size_t(g * 16 + r)]);
        }
    }
}

TEST(Gptq, BeatsRoundToNearestOnItsObjective) {
    const SafetensorsFile f = SafetensorsFile::open(fixture());
    const std::vector<float> W = f.read_f32("W"), Hf = f.read_f32("H");
    const std::vector<double> H(Hf.begin(), Hf.end());
    GptqOptions o;
    o.group = 16;
    auto objective = [&](const GptqCodes & c) {   // tr((W - W') H (W - W')^T)
        const std::vector<float> q = c.dequantize();
        double t = 0;
        for (int r = 0; r < 16; ++r)
            for (int i = 0; i < 64; ++i)
                for (int j = 0; j < 64; ++j)
                    t += double(W[size_t(r * 64 + i)] - q[size_t(r * 64 + i)]) * H[size_t(i * 64 + j)] *
                         double(W[size_t(r * 64 + j)] - q[size_t(r * 64 + j)]);
        return t;
    };
    const double g = objective(gptq_quantize(W.data(), 16, 64, H, o)), r = objective(rtn_quantize(W.data(), 16, 64, o));
    EXPECT_LT(g, 0.8 * r) << "gptq " << g << " rtn " << r;
}

// The v1 layout as the GPTQ format describes it, read independently of pack_gptq's code:
// qweight[i / p][o] >> (bits * (i % p)), qzeros[g][o / p] >> (bits * (o % p)) plus one.
TEST(Gptq, PackingIsThePublishedLayout) {
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (const int bits : {4, 8}) {
        const int64_t out = 24, in = 64, p = 32 / bits;
        std::vector<float> W(size_t(out * in));
        for (auto & x : W) x = nd(rng);
        GptqOptions o;
        o.bits = bits, o.group = 16, o.sym = false;
        std::vector<double> H(size_t(in * in), 0.0);
        for (int64_t i = 0; i < in; ++i) H[size_t(i * in + i)] = 1.0 + double(i % 7);
        o.desc_act = true;
        const GptqCodes c = gptq_quantize(W.data(), out, in, H, o);
        const std::vector<uint8_t> b = pack_gptq(c);
        const QuantDesc d = gptq_desc(out, in, o);
        ASSERT_EQ(b.size(), quant_bytes(d));
        auto word = [&](size_t byte) { uint32_t w; std::memcpy(&w, b.data() + byte, 4); return w; };
        const uint32_t mask = (1u << bits) - 1;
        const int64_t G = in / 16;
        const size_t zeros_at = size_t(in / p * out * 4), scales_at = zeros_at + size_t(G * out / p * 4),
                     g_at = scales_at + size_t(G * out * 2);
        for (int64_t o2 = 0; o2 < out; ++o2)
            for (int64_t i = 0; i < in; ++i) {
                int32_t g;
                std::memcpy(&g, b.data() + g_at + size_t(i) * 4, 4);
                ASSERT_EQ(g, c.g_idx[size_t(i)]);
                const uint32_t code = (word(size_t((i / p) * out + o2) * 4) >> (bits * (i % p))) & mask;
                const uint32_t zero = ((word(zeros_at + size_t(g * (out / p) + o2 / p) * 4) >> (bits * (o2 % p))) & mask) + 1;
                uint16_t h;
                std::memcpy(&h, b.data() + scales_at + size_t(g * out + o2) * 2, 2);
                ASSERT_EQ(code, c.q[size_t(o2 * in + i)]);
                ASSERT_EQ(int(zero), c.zeros[size_t(g * out + o2)]);
                ASSERT_EQ(h, c.scales[size_t(g * out + o2)]);
            }
        // The backend's dequantizer reads the same values, and unpack_gptq is pack_gptq's inverse.
        std::vector<float> rows(size_t(5 * in));
        GptqQuant{out, in, bits, 16}.dequantize_rows(rows.data(), b.data(), 7, 5);
        const std::vector<float> all = c.dequantize();
        for (size_t k = 0; k < rows.size(); ++k) ASSERT_EQ(rows[k], all[size_t(7 * in) + k]);
        EXPECT_EQ(pack_gptq(unpack_gptq(d, b.data())), b);
    }
}

TEST(Gptq, CalibrationHessianIsXtX) {
    const ModelConfig cfg = llama_tiny();
    const std::vector<float> params = random_params(cfg, 4);
    CpuBackend backend;
    const int B = 2, T = 6;
    std::vector<int32_t> tok(size_t(B * T));
    for (size_t i = 0; i < tok.size(); ++i) tok[i] = int32_t((i * 13 + 2) % 61);
    LayerHessians h0(cfg, backend, 0, B, T);   // layer 0 from tokens: layer 1's input
    h0.set_weights(params.data());
    const std::vector<float> hidden = h0.run(tok.data());
    ASSERT_EQ(hidden.size(), size_t(B * T * 32));
    EXPECT_EQ(h0.ledger().live_peak().total(), h0.planned_peak_live().total());
    LayerHessians h(cfg, backend, 1, B, T);
    h.set_weights(params.data());
    const std::vector<float> out = h.run(hidden.data());
    EXPECT_EQ(h.run(hidden.data()), out);   // the same input, the same output
    EXPECT_EQ(h.rows(), 2 * B * T);
    EXPECT_EQ(h.ledger().live_peak().total(), h.planned_peak_live().total());
    // Layer 1's qkv input is its first norm of layer 0's output: X^T X is symmetric and positive
    // on the diagonal, doubled by the second run; the MLP's down input has the ffn's width. The
    // residual stream moves on: layer 1's output differs from its input.
    EXPECT_NE(out, hidden);
    const std::vector<double> qkv = h.hessian(int(Proj::qkv)), down = h.hessian(int(Proj::down));
    ASSERT_EQ(qkv.size(), size_t(32 * 32));
    ASSERT_EQ(down.size(), size_t(40 * 40));
    for (int i = 0; i < 32; ++i) {
        EXPECT_GT(qkv[size_t(i * 33)], 0.0);
        for (int j = 0; j < i; ++j) EXPECT_NEAR(qkv[size_t(i * 32 + j)], qkv[size_t(j * 32 + i)], 1e-4 * qkv[size_t(i * 33)]);
    }
    // Against one run's Hessian, computed by the same program: exactly twice.
    LayerHessians once(cfg, backend, 1, B, T);
    once.set_weights(params.data());
    once.run(hidden.data());
    const std::vector<double> one = once.hessian(int(Proj::down));
    for (size_t k = 0; k < one.size(); ++k) EXPECT_NEAR(down[k], 2 * one[k], 1e-5 * (1 + std::fabs(one[k])));
}

TEST(Gptq, FolderRoundTripsBitExactlyAndDecodes) {
    const ModelConfig cfg = llama_tiny();
    GptqModel m;
    m.cfg = cfg;
    m.spec.options.group = 8;
    m.spec.options.desc_act = true;
    m.layout = gptq_layout(cfg, m.spec);
    m.params = random_params(cfg, 5);
    m.packed.assign(m.layout.bytes, 0);
    const ParamLayout all = make_param_layout(cfg);
    for (const QuantEntry & e : m.layout.entries) {   // GPTQ with a made-up diagonal Hessian
        const std::vector<float> W = gather_quant_entry(cfg, all, e, m.params.data());
        std::vector<double> H(size_t(e.q.in * e.q.in), 0.0);
        for (int64_t i = 0; i < e.q.in; ++i) H[size_t(i * e.q.in + i)] = 1.0 + double((i * 5) % 11);
        const GptqCodes c = gptq_quantize(W.data(), e.q.out, e.q.in, H, m.spec.options);
        const std::vector<uint8_t> b = pack_gptq(c);
        std::copy(b.begin(), b.end(), m.packed.begin() + ptrdiff_t(e.offset));
        const std::vector<float> q = c.dequantize();
        scatter_quant_entry(cfg, all, e, q.data(), m.params.data());
    }
    const fs::path dir = temp_dir("folder");
    write_gptq_folder(dir.string(), m, "F32");
    // The Hub's names and shapes, one module at a time.
    const SafetensorsFile st = SafetensorsFile::open((dir / "model.safetensors").string());
    EXPECT_EQ(st.info("model.layers.0.self_attn.k_proj.qweight").shape, (std::vector<int64_t>{4, 16}));
    EXPECT_EQ(st.info("model.layers.1.mlp.up_proj.scales").shape, (std::vector<int64_t>{4, 40}));
    EXPECT_EQ(st.info("model.layers.1.mlp.down_proj.qzeros").shape, (std::vector<int64_t>{5, 4}));
    EXPECT_EQ(st.info("model.layers.1.mlp.down_proj.scales").dtype, "F16");
    EXPECT_FALSE(st.has("model.layers.0.self_attn.q_proj.weight"));
    const GptqModel back = read_gptq_folder(dir.string());
    EXPECT_EQ(back.packed, m.packed);
    EXPECT_EQ(back.params, m.params);
    EXPECT_TRUE(back.spec.options.desc_act);
    EXPECT_EQ(back.spec.options.group, 8);
    // Decoding through the packed bytes gives the logits of the dequantized weights in fp32.
    CpuBackend backend;
    Decoder packed(cfg, backend, 12, DType::f32, back.layout), plain(cfg, backend, 12);
    packed.set_weights(back.params.data(), &back.packed);
    plain.set_weights(back.params.data());
    const std::vector<int32_t> prompt{3, 9, 27, 17, 51};
    const float * a = packed.prefill(prompt);
    const std::vector<float> la(a, a + cfg.vocab_size);
    const float * b = plain.prefill(prompt);
    for (int v = 0; v < cfg.vocab_size; ++v) EXPECT_NEAR(la[size_t(v)], b[v], 1e-4f);
    EXPECT_LT(packed.weight_bytes(), plain.weight_bytes());
    // Older Hub folders name their file by quantization_config's model_file_base_name.
    nlohmann::json config = nlohmann::json::parse(std::ifstream(dir / "config.json"));
    config["quantization_config"]["model_file_base_name"] = "gptq_model-4bit-8g";
    std::ofstream(dir / "config.json") << config.dump();
    fs::rename(dir / "model.safetensors", dir / "gptq_model-4bit-8g.safetensors");
    EXPECT_EQ(read_gptq_folder(dir.string()).packed, m.packed);
    fs::remove_all(dir.parent_path());
}

TEST(Gptq, RefusesShapesAndFoldersItCannotHold) {
    const ModelConfig cfg = llama_tiny();
    GptqSpec s;
    s.options.group = 128;   // does not divide 32 inputs
    EXPECT_THROW(gptq_layout(cfg, s), ConfigError);
    s.options.group = 8;
    s.options.bits = 3;
    EXPECT_THROW(gptq_layout(cfg, s), ConfigError);
    // A folder whose scales are the wrong shape: one line naming the tensor.
    GptqModel m;
    m.cfg = cfg;
    m.spec.options.group = 8;
    m.layout = gptq_layout(cfg, m.spec);
    m.params = random_params(cfg, 6);
    m.packed.assign(m.layout.bytes, 0);
    for (const QuantEntry & e : m.layout.entries) {
        const std::vector<float> W = gather_quant_entry(cfg, make_param_layout(cfg), e, m.params.data());
        const std::vector<uint8_t> b = pack_gptq(rtn_quantize(W.data(), e.q.out, e.q.in, m.spec.options));
        std::copy(b.begin(), b.end(), m.packed.begin() + ptrdiff_t(e.offset));
    }
    const fs::path dir = temp_dir("bad");
    write_gptq_folder(dir.string(), m);
    nlohmann::json config = nlohmann::json::parse(std::ifstream(dir / "config.json"));
    config["quantization_config"]["group_size"] = 4;   // divides every input count, not the tensors written
    std::ofstream(dir / "config.json") << config.dump();
    try {
        read_gptq_folder(dir.string());
        ADD_FAILURE() << "read a folder whose tensors do not match its group size";
    } catch (const FormatError & e) {
        EXPECT_NE(std::string(e.what()).find("qzeros"), std::string::npos) << e.what();
    }
    // The Hub's AutoGPTQ folders give every quantized module a bias, zeros where LLaMA has none:
    // read as nothing; a nonzero one is refused.
    config["quantization_config"]["group_size"] = 8;
    std::ofstream(dir / "config.json") << config.dump();
    auto with_bias = [&](float v) {
        const std::string path = (dir / "model.safetensors").string();
        std::vector<uint8_t> bytes;
        std::vector<TensorToWrite> t;
        {
            const SafetensorsFile f = SafetensorsFile::open(path);
            for (const auto & n : f.names()) {
                if (n == "model.layers.1.mlp.down_proj.bias") continue;   // the previous call's
                const auto & info = f.info(n);
                t.push_back(TensorToWrite{n, info.dtype, info.shape, nullptr, info.nbytes});
                bytes.insert(bytes.end(), info.data, info.data + info.nbytes);
            }
        }
        size_t at = 0;
        for (auto & x : t) x.data = bytes.data() + at, at += x.nbytes;
        static std::vector<uint16_t> bias;
        bias.assign(32, f32_to_f16(0.0f));
        bias[3] = f32_to_f16(v);
        t.push_back(TensorToWrite{"model.layers.1.mlp.down_proj.bias", "F16", {32}, bias.data(), 64});
        write_safetensors(path, t);
    };
    with_bias(0.0f);
    EXPECT_EQ(read_gptq_folder(dir.string()).packed, m.packed);
    with_bias(0.5f);
    EXPECT_THROW(read_gptq_folder(dir.string()), FormatError);
    config["quantization_config"]["checkpoint_format"] = "gptq_v2";
    std::ofstream(dir / "config.json") << config.dump();
    EXPECT_THROW(read_gptq_folder(dir.string()), ConfigError);
    fs::remove_all(dir.parent_path());
}
