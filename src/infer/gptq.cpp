#include "infer/gptq.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include <fmt/format.h>

#include "backend/quant_format.h"
#include "core/dtype.h"
#include "core/error.h"

namespace memfit {

namespace {

// In place: the lower Cholesky factor of the symmetric A [n, n] (A = L L^T) in its lower
// triangle, zeros above. False when A is not positive definite.
bool cholesky_lower(std::vector<double> & A, int64_t n) {
    for (int64_t j = 0; j < n; ++j) {
        double * aj = A.data() + j * n;
        double s = aj[j];
        for (int64_t k = 0; k < j; ++k) s -= aj[k] * aj[k];
        if (!(s > 0)) return false;
        aj[j] = std::sqrt(s);
#pragma omp parallel for schedule(static)
        for (int64_t i = j + 1; i < n; ++i) {
            double * ai = A.data() + i * n;
            double t = ai[j];
            for (int64_t k = 0; k < j; ++k) t -= ai[k] * aj[k];
            ai[j] = t / aj[j];
        }
    }
    for (int64_t i = 0; i < n; ++i) std::fill(A.begin() + i * n + i + 1, A.begin() + (i + 1) * n, 0.0);
    return true;
}

// U upper triangular with H^-1 = U^T U (the published code's cholesky(cholesky_inverse(cholesky(H)),
// upper=True)), from H positive definite. False when it is not.
bool inverse_upper_factor(std::vector<double> & H, int64_t n) {
    if (!cholesky_lower(H, n)) return false;
    // Linv, lower: L Linv = I, column by column.
    std::vector<double> Li(size_t(n * n), 0.0);
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t c = 0; c < n; ++c) {
        for (int64_t i = c; i < n; ++i) {
            double t = i == c ? 1.0 : 0.0;
            for (int64_t k = c; k < i; ++k) t -= H[size_t(i * n + k)] * Li[size_t(k * n + c)];
            Li[size_t(i * n + c)] = t / H[size_t(i * n + i)];
        }
    }
    // H^-1 = Linv^T Linv.
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j <= i; ++j) {
            double t = 0;
            for (int64_t k = i; k < n; ++k) t += Li[size_t(k * n + i)] * Li[size_t(k * n + j)];
            H[size_t(i * n + j)] = H[size_t(j * n + i)] = t;
        }
    if (!cholesky_lower(H, n)) return false;
    for (int64_t i = 0; i < n; ++i)   // transposed: the upper factor
        for (int64_t j = 0; j < i; ++j) std::swap(H[size_t(i * n + j)], H[size_t(j * n + i)]);
    return true;
}

int64_t group_of(const GptqOptions & o, int64_t in) { return o.group > 0 ? o.group : in; }

GptqCodes empty_codes(int64_t out, int64_t in, const GptqOptions & o) {
    const QuantDesc d = gptq_desc(out, in, o);
    check_gptq_shape(d, fmt::format("a {} x {} matrix", out, in));
    GptqCodes c;
    c.out = out, c.in = in, c.bits = o.bits, c.group = d.group;
    c.q.assign(size_t(out * in), 0);
    c.scales.assign(size_t(c.groups() * out), 0);
    c.zeros.assign(size_t(c.groups() * out), 0);
    c.g_idx.resize(size_t(in));
    for (int64_t i = 0; i < in; ++i) c.g_idx[size_t(i)] = int32_t(i / c.group);
    return c;
}

// Sets group g's grid of every row from columns [c0, c0 + group) of W [out, n] (as now).
void set_grid(GptqCodes & c, const std::vector<double> & W, int64_t n, int64_t c0, int64_t g, bool sym) {
    for (int64_t r = 0; r < c.out; ++r) {
        const double * x = W.data() + r * n + c0;
        const auto [lo, hi] = std::minmax_element(x, x + c.group);
        int zero = 0;
        c.scales[size_t(g * c.out + r)] = gptq_grid(*lo, *hi, c.bits, sym, &zero);
        c.zeros[size_t(g * c.out + r)] = zero;
    }
}

}  // namespace

QuantDesc gptq_desc(int64_t out, int64_t in, const GptqOptions & o) {
    return QuantDesc{QuantFormat::gptq, out, in, o.bits, int32_t(group_of(o, in))};
}

GptqCodes rtn_quantize(const float * W, int64_t out, int64_t in, const GptqOptions & o) {
    GptqCodes c = empty_codes(out, in, o);
    const std::vector<double> Wd(W, W + out * in);
    for (int64_t g = 0; g < c.groups(); ++g) set_grid(c, Wd, in, g * c.group, g, o.sym);
    for (int64_t r = 0; r < out; ++r)
        for (int64_t i = 0; i < in; ++i) {
            const size_t at = size_t((i / c.group) * out + r);
            c.q[size_t(r * in + i)] =
                uint8_t(gptq_code(Wd[size_t(r * in + i)], f16_to_f32(c.scales[at]), c.zeros[at], c.bits));
        }
    return c;
}

GptqCodes gptq_quantize(const float * W, int64_t out, int64_t in, std::vector<double> H, const GptqOptions & o) {
    GptqCodes c = empty_codes(out, in, o);
    const int64_t n = in, G = c.group;
    MF_ASSERT(H.size() == size_t(n * n));
    std::vector<double> Wd(W, W + out * n);
    for (int64_t i = 0; i < n; ++i)
        if (H[size_t(i * n + i)] == 0) {   // an input never seen: its weights cannot matter
            H[size_t(i * n + i)] = 1;
            for (int64_t r = 0; r < out; ++r) Wd[size_t(r * n + i)] = 0;
        }
    std::vector<int64_t> perm(static_cast<size_t>(n));
    std::iota(perm.begin(), perm.end(), 0);
    if (o.desc_act) {
        std::stable_sort(perm.begin(), perm.end(),
                         [&](int64_t a, int64_t b) { return H[size_t(a * n + a)] > H[size_t(b * n + b)]; });
        std::vector<double> Wp(Wd.size()), Hp(H.size());
        for (int64_t r = 0; r < out; ++r)
            for (int64_t j = 0; j < n; ++j) Wp[size_t(r * n + j)] = Wd[size_t(r * n + perm[size_t(j)])];
        for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < n; ++j) Hp[size_t(i * n + j)] = H[size_t(perm[size_t(i)] * n + perm[size_t(j)])];
        Wd.swap(Wp), H.swap(Hp);
    }
    double mean = 0;
    for (int64_t i = 0; i < n; ++i) mean += H[size_t(i * n + i)];
    mean /= double(n);
    for (int64_t i = 0; i < n; ++i) H[size_t(i * n + i)] += o.damp * mean;
    if (!inverse_upper_factor(H, n))
        throw ConfigError(fmt::format("GPTQ: the Hessian of a {} x {} layer is not positive definite after "
                                      "dampening by {:g} of its mean diagonal; raise --damp-percent or give more "
                                      "calibration data", out, in, o.damp));
    const std::vector<double> & U = H;
    // Blocks whose boundaries are group boundaries (gptq.h).
    const int64_t B = G >= o.block ? G : std::max<int64_t>(G, o.block / G * G);
    std::vector<double> err(size_t(out * B));
    for (int64_t i1 = 0; i1 < n; i1 += B) {
        const int64_t i2 = std::min(i1 + B, n);
        for (int64_t i = i1; i < i2; ++i) {
            if (i % G == 0) set_grid(c, Wd, n, i, i / G, o.sym);
            const double d = U[size_t(i * n + i)];
            const int64_t g = i / G;
#pragma omp parallel for schedule(static)
            for (int64_t r = 0; r < out; ++r) {
                double * w = Wd.data() + r * n;
                const double s = f16_to_f32(c.scales[size_t(g * out + r)]);
                const int zero = c.zeros[size_t(g * out + r)];
                const int q = gptq_code(w[i], s, zero, c.bits);
                c.q[size_t(r * n + perm[size_t(i)])] = uint8_t(q);
                const double e = (w[i] - s * double(q - zero)) / d;
                for (int64_t k = i + 1; k < i2; ++k) w[k] -= e * U[size_t(i * n + k)];
                err[size_t(r * B + (i - i1))] = e;
            }
        }
        // The lazy batch: the columns after the block take the block's errors at once.
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < out; ++r) {
            double * w = Wd.data() + r * n;
            for (int64_t j = 0; j < i2 - i1; ++j) {
                const double e = err[size_t(r * B + j)];
                const double * u = U.data() + (i1 + j) * n;
                for (int64_t k = i2; k < n; ++k) w[k] -= e * u[k];
            }
        }
    }
    for (int64_t j = 0; j < n; ++j) c.g_idx[size_t(perm[size_t(j)])] = int32_t(j / G);
    return c;
}

std::vector<float> GptqCodes::dequantize() const {
    std::vector<float> w(size_t(out * in));
    for (int64_t r = 0; r < out; ++r)
        for (int64_t i = 0; i < in; ++i) {
            const size_t at = size_t(g_idx[size_t(i)] * out + r);
            w[size_t(r * in + i)] = f16_to_f32(scales[at]) * float(int(q[size_t(r * in + i)]) - zeros[at]);
        }
    return w;
}

std::vector<uint8_t> pack_gptq(const GptqCodes & c) {
    const GptqQuant l{c.out, c.in, c.bits, c.group};
    std::vector<uint8_t> b(l.bytes(), 0);
    const int p = l.per_word();
    auto put = [&](size_t at, uint32_t v, int slot) {
        uint32_t word;
        std::memcpy(&word, b.data() + at, 4);
        word |= v << (c.bits * slot);
        std::memcpy(b.data() + at, &word, 4);
    };
    for (int64_t i = 0; i < c.in; ++i)
        for (int64_t o = 0; o < c.out; ++o) put(size_t((i / p) * c.out + o) * 4, c.q[size_t(o * c.in + i)], int(i % p));
    for (int64_t g = 0; g < c.groups(); ++g)
        for (int64_t o = 0; o < c.out; ++o) {
            put(l.qzeros_at() + size_t(g * (c.out / p) + o / p) * 4, uint32_t(c.zeros[size_t(g * c.out + o)] - 1),
                int(o % p));
            std::memcpy(b.data() + l.scales_at() + size_t(g * c.out + o) * 2, &c.scales[size_t(g * c.out + o)], 2);
        }
    std::memcpy(b.data() + l.g_idx_at(), c.g_idx.data(), size_t(c.in) * 4);
    return b;
}

GptqCodes unpack_gptq(const QuantDesc & q, const uint8_t * packed) {
    GptqOptions o;
    o.bits = q.bits, o.group = q.group;
    GptqCodes c = empty_codes(q.out, q.in, o);
    const GptqQuant l{q.out, q.in, q.bits, q.group};
    const int p = l.per_word();
    const uint32_t mask = (1u << q.bits) - 1;
    auto get = [&](size_t at, int slot) {
        uint32_t word;
        std::memcpy(&word, packed + at, 4);
        return (word >> (q.bits * slot)) & mask;
    };
    for (int64_t i = 0; i < q.in; ++i)
        for (int64_t r = 0; r < q.out; ++r) c.q[size_t(r * q.in + i)] = uint8_t(get(size_t((i / p) * q.out + r) * 4, int(i % p)));
    for (int64_t g = 0; g < c.groups(); ++g)
        for (int64_t r = 0; r < q.out; ++r) {
            c.zeros[size_t(g * q.out + r)] = int32_t(get(l.qzeros_at() + size_t(g * (q.out / p) + r / p) * 4, int(r % p))) + 1;
            std::memcpy(&c.scales[size_t(g * q.out + r)], packed + l.scales_at() + size_t(g * q.out + r) * 2, 2);
        }
    std::memcpy(c.g_idx.data(), packed + l.g_idx_at(), size_t(q.in) * 4);
    for (const int32_t g : c.g_idx)
        if (g < 0 || g >= c.groups()) throw FormatError(fmt::format("g_idx holds group {} of {}", g, c.groups()));
    return c;
}

}  // namespace memfit
