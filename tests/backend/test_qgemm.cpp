// The CPU backend's quantized gemms (Backend::qgemm_*, backend/cpu/qgemm.cpp) and LoRA column ops
// (add_columns / take_columns): qgemm_fwd and qgemm_bwd (written and accumulated) against a double
// reference over x · dequantize(W)^T (+ bias) and dy · dequantize(W) for int8, nf4, nf4+dq and sparse24 with
// f32, bf16 and f16 activations, on shapes whose rows are not a multiple of the row chunk and whose
// output channels are not a multiple of the tile; every call runs in a workspace of exactly
// qgemm_workspace bytes, poisoned with NaN, with guard bytes after it; results are bitwise
// repeatable; quantize / dequantize are quant_format.h's formats of exactly quant_bytes bytes, and
// an identity gemm reads back exactly the dequantized weights.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/quant.h"
#include "backend/quant_format.h"
#include "test_util.h"

namespace memfit {
namespace {

std::vector<float> gaussian(size_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    return test::randn(n, rng, scale);
}


// An activation array stored in dtype t (caller-owned memory behind a Tensor).
struct Act {
    DType dtype;
    std::vector<float> f32;
    std::vector<uint16_t> half;  // bf16 or f16 bits
    int64_t rows = 0, cols = 0;

    Act(DType t, const std::vector<float> & v, int64_t r, int64_t c) : dtype(t), rows(r), cols(c) { set(v); }
    void set(const std::vector<float> & v) {
        if (dtype == DType::f32) { f32 = v; return; }
        half.resize(v.size());
        for (size_t i = 0; i < v.size(); ++i)
            half[i] = dtype == DType::bf16 ? from_f32<bf16_t>(v[i]).bits : from_f32<f16_t>(v[i]).bits;
    }
    // The stored values, as floats.
    std::vector<float> values() const {
        if (dtype == DType::f32) return f32;
        std::vector<float> v(half.size());
        for (size_t i = 0; i < v.size(); ++i)
            v[i] = dtype == DType::bf16 ? to_f32(bf16_t{half[i]}) : to_f32(f16_t{half[i]});
        return v;
    }
    Tensor tensor() {
        Tensor t(-1, dtype, {rows, cols});
        t.data = dtype == DType::f32 ? static_cast<void *>(f32.data()) : static_cast<void *>(half.data());
        return t;
    }
    const void * bytes() const { return dtype == DType::f32 ? static_cast<const void *>(f32.data()) : half.data(); }
    size_t nbytes() const { return size_t(rows * cols) * dtype_size(dtype); }
};

// A workspace of exactly `bytes`, poisoned with NaN (0xff bytes) before each use, followed by
// guard bytes that must stay untouched.
struct Guarded {
    static constexpr size_t kGuard = 256;
    size_t bytes;
    std::vector<float> storage;  // float-aligned
    explicit Guarded(size_t b) : bytes(b), storage((b + kGuard) / sizeof(float) + 1) { poison(); }
    void poison() {
        auto * p = reinterpret_cast<uint8_t *>(storage.data());
        std::memset(p, 0xff, bytes);
        std::memset(p + bytes, 0x5a, storage.size() * sizeof(float) - bytes);
    }
    Tensor tensor() {
        poison();
        Tensor t(-1, DType::u8, {int64_t(bytes)});
        t.data = storage.data();
        return t;
    }
    bool guard_intact() const {
        const auto * p = reinterpret_cast<const uint8_t *>(storage.data());
        for (size_t i = bytes; i < bytes + kGuard; ++i)
            if (p[i] != 0x5a) return false;
        return true;
    }
};

// A quantized weight: the packed bytes (exactly quant_bytes, in a Tensor) and W' dequantized.
struct Weight {
    QuantDesc q;
    std::vector<uint8_t> packed;
    std::vector<float> Wd;
    Weight(CpuBackend & be, const QuantDesc & qd, uint32_t seed) : q(qd), packed(quant_bytes(qd)) {
        const std::vector<float> W = gaussian(size_t(q.out * q.in), seed, 0.05f);
        be.quantize(q, packed.data(), W.data());
        Wd.resize(W.size());
        be.dequantize(q, Wd.data(), packed.data());
    }
    Tensor tensor() {
        Tensor t(-1, DType::u8, {int64_t(packed.size())});
        t.data = packed.data();
        return t;
    }
};

// The bound on |got - ref| for an element whose exact value is ref, computed from fp32 sums of
// terms whose absolute values sum to abs, then stored in dtype t (one rounding).
double bound(DType t, double ref, double abs) {
    const double round = t == DType::f32 ? 0.0 : t == DType::bf16 ? 1.0 / 256 : 1.0 / 2048;  // one ulp
    return round * std::fabs(ref) + 2e-5 * abs + 1e-30;
}

// |got - ref| per element within bound(), and the error's RMS relative to the output RMS below
// rel_rms_max.
void expect_close(DType t, const std::vector<float> & got, const std::vector<double> & ref,
                  const std::vector<double> & abs, double rel_rms_max, const char * what) {
    ASSERT_EQ(got.size(), ref.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double e = std::fabs(double(got[i]) - ref[i]);
        ASSERT_LE(e, bound(t, ref[i], abs[i])) << what << " element " << i << ": " << got[i] << " vs " << ref[i];
        num += e * e;
        den += ref[i] * ref[i];
    }
    EXPECT_LT(std::sqrt(num / den), rel_rms_max) << what;
}

double rel_rms_max(DType t) { return t == DType::f32 ? 1e-5 : t == DType::bf16 ? 5e-3 : 8e-4; }

// x[M, in] · W'^T (+ bias), dx0 + dy[M, out] · W' against the double reference, for each
// activation dtype, with an exact workspace.
void check_qgemm(QuantFormat f, int64_t M, int64_t out, int64_t in, uint32_t seed) {
    CpuBackend be;
    Weight w(be, QuantDesc{f, out, in}, seed);
    const std::vector<float> x0 = gaussian(size_t(M * in), seed + 1);
    const std::vector<float> dy0 = gaussian(size_t(M * out), seed + 2);
    const std::vector<float> dx00 = gaussian(size_t(M * in), seed + 3);
    const std::vector<float> bias0 = gaussian(size_t(out), seed + 4);

    for (const DType t : {DType::f32, DType::bf16, DType::f16}) {
        SCOPED_TRACE(std::string(quant_format_name(f)) + " " + std::string(dtype_name(t)));
        Act x(t, x0, M, in), dy(t, dy0, M, out), dx0(t, dx00, M, in), bias(t, bias0, 1, out);
        const std::vector<float> xv = x.values(), dyv = dy.values(), dx0v = dx0.values(), bv = bias.values();

        // References from the stored (rounded) inputs, in double, with the sums of |terms|.
        std::vector<double> y_ref(size_t(M * out)), y_abs(size_t(M * out));
        std::vector<double> dx_ref(size_t(M * in), 0.0), dx_abs(size_t(M * in), 0.0);
        for (int64_t m = 0; m < M; ++m) {
            for (int64_t o = 0; o < out; ++o) {
                double s = 0, a = 0;
                for (int64_t k = 0; k < in; ++k) {
                    const double p = double(xv[size_t(m * in + k)]) * double(w.Wd[size_t(o * in + k)]);
                    s += p;
                    a += std::fabs(p);
                }
                y_ref[size_t(m * out + o)] = s;
                y_abs[size_t(m * out + o)] = a;
            }
            for (int64_t o = 0; o < out; ++o) {
                const double g = dyv[size_t(m * out + o)];
                for (int64_t k = 0; k < in; ++k) {
                    const double p = g * double(w.Wd[size_t(o * in + k)]);
                    dx_ref[size_t(m * in + k)] += p;
                    dx_abs[size_t(m * in + k)] += std::fabs(p);
                }
            }
        }

        Guarded ws(be.qgemm_workspace(w.q, M, t));
        const std::vector<float> nan(size_t(M * std::max(in, out)), std::nanf(""));

        // Forward, without and with bias; run twice for bitwise repeatability.
        for (const bool with_bias : {false, true}) {
            SCOPED_TRACE(with_bias ? "bias" : "no bias");
            std::vector<double> ref = y_ref, abs = y_abs;
            if (with_bias)
                for (int64_t m = 0; m < M; ++m)
                    for (int64_t o = 0; o < out; ++o) {
                        ref[size_t(m * out + o)] += bv[size_t(o)];
                        abs[size_t(m * out + o)] += std::fabs(bv[size_t(o)]);
                    }
            Act y(t, std::vector<float>(nan.begin(), nan.begin() + M * out), M, out);
            be.qgemm_fwd(w.q, y.tensor(), x.tensor(), w.tensor(), with_bias ? bias.tensor() : Tensor{}, ws.tensor());
            EXPECT_TRUE(ws.guard_intact());
            expect_close(t, y.values(), ref, abs, rel_rms_max(t), "y");

            Act y2(t, std::vector<float>(nan.begin(), nan.begin() + M * out), M, out);
            be.qgemm_fwd(w.q, y2.tensor(), x.tensor(), w.tensor(), with_bias ? bias.tensor() : Tensor{}, ws.tensor());
            EXPECT_EQ(std::memcmp(y.bytes(), y2.bytes(), y.nbytes()), 0) << "forward not repeatable";
        }

        // Backward: written (over NaN) and accumulated (onto dx0).
        for (const bool acc : {false, true}) {
            SCOPED_TRACE(acc ? "accumulate" : "write");
            std::vector<double> ref = dx_ref, abs = dx_abs;
            if (acc)
                for (size_t i = 0; i < ref.size(); ++i) {
                    ref[i] += dx0v[i];
                    abs[i] += std::fabs(dx0v[i]);
                }
            Act dx = acc ? dx0 : Act(t, std::vector<float>(nan.begin(), nan.begin() + M * in), M, in);
            be.qgemm_bwd(w.q, dx.tensor(), dy.tensor(), w.tensor(), acc, ws.tensor());
            EXPECT_TRUE(ws.guard_intact());
            expect_close(t, dx.values(), ref, abs, rel_rms_max(t), "dx");

            Act dx2 = acc ? dx0 : Act(t, std::vector<float>(nan.begin(), nan.begin() + M * in), M, in);
            be.qgemm_bwd(w.q, dx2.tensor(), dy.tensor(), w.tensor(), acc, ws.tensor());
            EXPECT_EQ(std::memcmp(dx.bytes(), dx2.bytes(), dx.nbytes()), 0) << "backward not repeatable";
        }
    }
}

// M = 300 = 2 * 128 + 44 rows; in = 1056 (rows straddle NF4's 64-blocks: 1056 = 16.5 * 64) gives
// 124-row tiles, so out = 200 = 124 + 76.
constexpr int64_t kM = 300, kOut = 200, kIn = 1056;

TEST(QGemm, ShapesAreUneven) {
    EXPECT_NE(kM % cpu::kQgemmRowChunk, 0);
    EXPECT_GT(kM, cpu::kQgemmRowChunk);
    const int64_t tile = cpu::qgemm_tile_rows(kOut, kIn);
    EXPECT_LT(tile, kOut);
    EXPECT_NE(kOut % tile, 0);
    EXPECT_EQ(kOut * kIn % 64, 0);
}

TEST(QGemm, Int8) { check_qgemm(QuantFormat::int8, kM, kOut, kIn, 100); }
TEST(QGemm, Nf4) { check_qgemm(QuantFormat::nf4, kM, kOut, kIn, 200); }
TEST(QGemm, Nf4DoubleQuant) { check_qgemm(QuantFormat::nf4_dq, kM, kOut, kIn, 300); }
TEST(QGemm, Sparse24) { check_qgemm(QuantFormat::sparse24, kM, kOut, kIn, 600); }
// Fewer rows than a chunk, and one tile (out <= tile_rows); and a single row.
TEST(QGemm, SmallShapes) {
    check_qgemm(QuantFormat::int8, 5, 24, 40, 400);
    check_qgemm(QuantFormat::nf4_dq, 1, 16, 64, 500);
    check_qgemm(QuantFormat::sparse24, 3, 10, 8, 700);
}

// quantize / dequantize are quant.h's formats, write exactly quant_bytes(q) bytes, and the gemm
// reads exactly the dequantized weights: x = identity gives y[k, o] = W'[o, k] and dy = identity
// gives dx[o, :] = W'[o, :] (bitwise in f32, W' rounded once in bf16).
TEST(QGemm, QuantizeRoundTripMatchesGemm) {
    CpuBackend be;
    const int64_t out = 136, in = 1024;  // tiles of 128 rows: 128 + 8
    const std::vector<float> W = gaussian(size_t(out * in), 7, 0.05f);
    for (const QuantFormat f : {QuantFormat::int8, QuantFormat::nf4, QuantFormat::nf4_dq, QuantFormat::sparse24}) {
        SCOPED_TRACE(quant_format_name(f));
        const QuantDesc q{f, out, in};
        const size_t n = quant_bytes(q);
        std::vector<uint8_t> packed(n + 64, 0x5a), ref(n);
        be.quantize(q, packed.data(), W.data());
        for (size_t i = n; i < n + 64; ++i) ASSERT_EQ(packed[i], 0x5a) << "quantize wrote past quant_bytes";
        std::vector<float> Wd(size_t(out * in), std::nanf("")), Wr(size_t(out * in));
        be.dequantize(q, Wd.data(), packed.data());
        with_quant(q, [&](const auto & Q) {
            ASSERT_EQ(Q.bytes(), n);
            Q.quantize(ref.data(), W.data());
            Q.dequantize_rows(Wr.data(), ref.data(), 0, out);
        });
        EXPECT_EQ(std::memcmp(packed.data(), ref.data(), n), 0);
        EXPECT_EQ(std::memcmp(Wd.data(), Wr.data(), Wd.size() * sizeof(float)), 0);
        // Close to W: int8's step is max|row|/127, NF4's relative error about 0.1; sparse24 drops
        // the two smallest of every four (tests/backend/test_sparse24.cpp checks which).
        double num = 0, den = 0;
        for (size_t i = 0; i < W.size(); ++i) {
            num += double(W[i] - Wd[i]) * double(W[i] - Wd[i]);
            den += double(W[i]) * double(W[i]);
        }
        EXPECT_LT(std::sqrt(num / den), f == QuantFormat::int8 ? 0.012 : f == QuantFormat::sparse24 ? 0.4 : 0.12);

        for (const DType t : {DType::f32, DType::bf16}) {
            SCOPED_TRACE(std::string(dtype_name(t)));
            auto rounded = [&](float v) { return t == DType::f32 ? v : to_f32(from_f32<bf16_t>(v)); };
            Tensor pk(-1, DType::u8, {int64_t(n)});
            pk.data = packed.data();
            std::vector<float> eye_in(size_t(in * in), 0.0f), eye_out(size_t(out * out), 0.0f);
            for (int64_t k = 0; k < in; ++k) eye_in[size_t(k * in + k)] = 1.0f;
            for (int64_t o = 0; o < out; ++o) eye_out[size_t(o * out + o)] = 1.0f;

            Act x(t, eye_in, in, in), y(t, std::vector<float>(size_t(in * out), 0.0f), in, out);
            Guarded ws(be.qgemm_workspace(q, in, t));
            be.qgemm_fwd(q, y.tensor(), x.tensor(), pk, Tensor{}, ws.tensor());
            EXPECT_TRUE(ws.guard_intact());
            const std::vector<float> yv = y.values();
            for (int64_t k = 0; k < in; ++k)
                for (int64_t o = 0; o < out; ++o)
                    ASSERT_EQ(yv[size_t(k * out + o)], rounded(Wd[size_t(o * in + k)])) << "k " << k << " o " << o;

            Act dy(t, eye_out, out, out), dx(t, std::vector<float>(size_t(out * in), 0.0f), out, in);
            Guarded ws2(be.qgemm_workspace(q, out, t));
            be.qgemm_bwd(q, dx.tensor(), dy.tensor(), pk, false, ws2.tensor());
            EXPECT_TRUE(ws2.guard_intact());
            const std::vector<float> dxv = dx.values();
            for (size_t i = 0; i < dxv.size(); ++i) ASSERT_EQ(dxv[i], rounded(Wd[i])) << "element " << i;
        }
    }
}

// One formula for the packed sizes: quant_format.h's int8_bytes / nf4_bytes are quant_bytes().
TEST(QGemm, PackedSizes) {
    for (const int64_t out : {1, 3, 64, 200, 4096})
        for (const int64_t in : {64, 100, 1056, 4096}) {
            EXPECT_EQ(int8_bytes(out, in), quant_bytes(QuantDesc{QuantFormat::int8, out, in}));
            if (out * in % 64 != 0) continue;
            EXPECT_EQ(nf4_bytes(out * in, false), quant_bytes(QuantDesc{QuantFormat::nf4, out, in}));
            EXPECT_EQ(nf4_bytes(out * in, true), quant_bytes(QuantDesc{QuantFormat::nf4_dq, out, in}));
            EXPECT_EQ(sparse24_bytes(out, in), quant_bytes(QuantDesc{QuantFormat::sparse24, out, in}));
        }
    EXPECT_EQ(quant_bytes(QuantDesc{QuantFormat::nf4_dq, 64, 257}), size_t(64 * 257 / 2 + 257 + 2 * 4 + 4));
}

// The workspace is a pure function of (q, M, dtype), and for bf16/f16 it stops growing with M
// beyond the row chunk.
TEST(QGemm, WorkspaceSize) {
    CpuBackend be;
    const int64_t c = cpu::kQgemmRowChunk;
    for (const QuantFormat f : {QuantFormat::int8, QuantFormat::nf4_dq}) {
        const QuantDesc q{f, 512, 1024};
        EXPECT_EQ(be.qgemm_workspace(q, 0, DType::bf16), 0u);
        for (const DType t : {DType::bf16, DType::f16}) {
            const size_t w1 = be.qgemm_workspace(q, c, t);
            EXPECT_EQ(be.qgemm_workspace(q, 4 * c, t), w1);
            EXPECT_EQ(be.qgemm_workspace(q, 64 * c, t), w1);
            EXPECT_EQ(be.qgemm_workspace(q, 300, t), be.qgemm_workspace(q, 300, t));
            // The two fp32 chunks and the fp32 tile at least.
            const int64_t tile = cpu::qgemm_tile_rows(q.out, q.in);
            EXPECT_GE(w1, size_t(4 * (c * (q.in + q.out) + tile * q.in)));
            EXPECT_LT(be.qgemm_workspace(q, 5, t), w1);
        }
        EXPECT_EQ(be.qgemm_workspace(q, 300, DType::f32), be.qgemm_workspace(q, 300, DType::f32));
    }
}

// The tile: about 512 KiB of fp32, at least 64 rows, at most out.
TEST(QGemm, TileRows) {
    EXPECT_EQ(cpu::qgemm_tile_rows(4096, 4096), 64);
    EXPECT_EQ(cpu::qgemm_tile_rows(4096, 1024), 128);
    EXPECT_EQ(cpu::qgemm_tile_rows(4096, 11008), 64);
    EXPECT_EQ(cpu::qgemm_tile_rows(4096, 256), 512);
    EXPECT_EQ(cpu::qgemm_tile_rows(40, 128), 40);
    EXPECT_EQ(cpu::qgemm_tile_rows(200, 1056), 124);
}

// ---- LoRA column slices ------------------------------------------------------------------

template <class T>
void check_columns(uint32_t seed) {
    CpuBackend be;
    constexpr DType t = dtype_of<T>();
    const int64_t N = 37, W = 96, cols = 24, col0 = 40;
    const float scale = 0.375f;
    const std::vector<float> out0 = gaussian(size_t(N * W), seed), d0 = gaussian(size_t(N * cols), seed + 1);
    Act out(t, out0, N, W), d(t, d0, N, cols);
    const std::vector<float> ov = out.values(), dv = d.values();
    auto store = [&](float v) { return to_f32(from_f32<T>(v)); };
    const double tol = t == DType::f32 ? 1e-6 : 1.0 / 256;

    be.add_columns(out.tensor(), d.tensor(), col0, scale);
    const std::vector<float> got = out.values();
    for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < W; ++j) {
            const size_t k = size_t(i * W + j);
            if (j < col0 || j >= col0 + cols) {
                ASSERT_EQ(got[k], ov[k]) << "column " << j << " outside the slice changed";
            } else {
                const float ref = store(ov[k] + scale * dv[size_t(i * cols + j - col0)]);
                ASSERT_LE(std::fabs(got[k] - ref), tol * std::fabs(ref)) << i << "," << j;
            }
        }

    Act taken(t, std::vector<float>(size_t(N * cols), std::nanf("")), N, cols);
    Act src(t, out0, N, W);
    be.take_columns(taken.tensor(), src.tensor(), col0, scale);
    const std::vector<float> tv = taken.values();
    for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < cols; ++j)  // the same one fp32 product, rounded once: exact
            ASSERT_EQ(tv[size_t(i * cols + j)], store(scale * ov[size_t(i * W + col0 + j)])) << i << "," << j;
    EXPECT_EQ(std::memcmp(src.values().data(), ov.data(), ov.size() * sizeof(float)), 0) << "src changed";
}

TEST(QGemm, AddTakeColumnsF32) { check_columns<float>(900); }
TEST(QGemm, AddTakeColumnsBf16) { check_columns<bf16_t>(910); }
TEST(QGemm, AddTakeColumnsF16) { check_columns<f16_t>(920); }

// Mixed storage: a bf16 slice added into an f32 output.
TEST(QGemm, AddColumnsMixedDtypes) {
    CpuBackend be;
    const int64_t N = 5, W = 10, cols = 3, col0 = 7;
    const std::vector<float> out0 = gaussian(size_t(N * W), 930), d0 = gaussian(size_t(N * cols), 931);
    Act out(DType::f32, out0, N, W), d(DType::bf16, d0, N, cols);
    const std::vector<float> dv = d.values();
    be.add_columns(out.tensor(), d.tensor(), col0, 2.0f);
    for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < cols; ++j)
            EXPECT_EQ(out.f32[size_t(i * W + col0 + j)],
                      out0[size_t(i * W + col0 + j)] + 2.0f * dv[size_t(i * cols + j)]);
}

}  // namespace
}  // namespace memfit
