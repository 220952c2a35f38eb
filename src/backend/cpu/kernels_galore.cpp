// GaLore's linear algebra on the CPU (Zhao et al. 2024; the step is in kernels_optim.cpp). For an
// R x C gradient G the projector Q holds r orthonormal rows of the shorter side's length s =
// min(R, C): the top r left singular vectors of G when R < C (the projected gradient Q G, r x C),
// else the top r right ones (G Q^T, R x r), as GaLore's reference projector orients them.
//
// The singular vectors are the eigenvectors of the shorter side's Gram matrix (G G^T or G^T G),
// formed in double and diagonalised by cyclic Jacobi rotations (no LAPACK here; O(s^3) a sweep,
// once every update gap). Each vector's sign is fixed so that its largest-magnitude component
// (the first of equals) is positive: an SVD leaves the sign free, and the moments kept across a
// refresh see it, so the float64 reference fixes it the same way. Every sum has a fixed order
// (per output element, or per rotation), so results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <vector>

#include "backend/cpu/kernels.h"
#include "core/error.h"

namespace memfit::cpu {

namespace {

// A[s x s] = the shorter side's Gram matrix of g (R x C, fp32), in double.
void gram(double * A, const float * g, int64_t R, int64_t C) {
    if (R < C) {   // G G^T: rows against rows
#pragma omp parallel for schedule(dynamic, 4)
        for (int64_t i = 0; i < R; ++i)
            for (int64_t k = i; k < R; ++k) {
                double sum = 0;
                const float * a = g + i * C, * b = g + k * C;
                for (int64_t j = 0; j < C; ++j) sum += double(a[j]) * double(b[j]);
                A[i * R + k] = A[k * R + i] = sum;
            }
        return;
    }
    // G^T G: row j of A accumulates g[i][j] g[i][k] over the rows i in order.
#pragma omp parallel for schedule(dynamic, 4)
    for (int64_t j = 0; j < C; ++j) {
        double * aj = A + j * C;
        std::fill(aj, aj + C, 0.0);
        for (int64_t i = 0; i < R; ++i) {
            const float * gi = g + i * C;
            const double gij = gi[j];
            for (int64_t k = 0; k < C; ++k) aj[k] += gij * double(gi[k]);
        }
    }
}

// Diagonalises the symmetric A[s x s] in place by cyclic Jacobi rotations, accumulating the
// eigenvectors as the rows of Vt: A = Vt^T diag(A) Vt on return. Each rotation (p, q) updates
// rows p and q (contiguous) and mirrors them into columns p and q, so only those two columns are
// written with a stride; the diagonal takes the closed form (a_pp - t a_pq, a_qq + t a_pq).
void jacobi_eigen(double * A, double * Vt, int64_t s) {
    for (int64_t i = 0; i < s; ++i)
        for (int64_t k = 0; k < s; ++k) Vt[i * s + k] = i == k ? 1.0 : 0.0;
    double frob = 0;
    for (int64_t i = 0; i < s * s; ++i) frob += A[i] * A[i];
    for (int sweep = 0; sweep < 100; ++sweep) {
        double off = 0;
        for (int64_t p = 0; p < s; ++p)
            for (int64_t q = p + 1; q < s; ++q) off += A[p * s + q] * A[p * s + q];
        if (off <= 1e-30 * frob) return;
        bool rotated = false;
        for (int64_t p = 0; p < s; ++p)
            for (int64_t q = p + 1; q < s; ++q) {
                double * ap = A + p * s, * aq = A + q * s;
                const double apq = ap[q];
                // Negligible beside both diagonal elements: rounding, not signal (left as it is).
                if (std::fabs(apq) <= 1e-15 * std::sqrt(std::fabs(ap[p] * aq[q]))) continue;
                rotated = true;
                // The rotation zeroing a_pq: t = tan(phi), cot(2 phi) = (a_qq - a_pp) / (2 a_pq).
                const double theta = (aq[q] - ap[p]) / (2 * apq);
                const double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
                const double c = 1 / std::sqrt(t * t + 1), sn = t * c;
                const double app = ap[p] - t * apq, aqq = aq[q] + t * apq;
#pragma omp simd
                for (int64_t k = 0; k < s; ++k) {
                    const double x = ap[k], y = aq[k];
                    ap[k] = c * x - sn * y;
                    aq[k] = sn * x + c * y;
                }
                for (int64_t k = 0; k < s; ++k) A[k * s + p] = ap[k], A[k * s + q] = aq[k];
                ap[p] = app, aq[q] = aqq, ap[q] = aq[p] = 0;
                double * vp = Vt + p * s, * vq = Vt + q * s;
#pragma omp simd
                for (int64_t k = 0; k < s; ++k) {
                    const double x = vp[k], y = vq[k];
                    vp[k] = c * x - sn * y;
                    vq[k] = sn * x + c * y;
                }
            }
        if (!rotated) return;
    }
}

}  // namespace

void galore_projector(float * proj, const float * g, int64_t R, int64_t C, int64_t r, double * work) {
    const int64_t s = std::min(R, C);
    MF_ASSERT(r >= 1 && r <= s);
    double * A = work, * Vt = work + s * s;
    gram(A, g, R, C);
    jacobi_eigen(A, Vt, s);
    std::vector<int64_t> order(static_cast<size_t>(s));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return A[a * s + a] > A[b * s + b]; });
    for (int64_t k = 0; k < r; ++k) {
        const int64_t col = order[size_t(k)];
        const double * v = Vt + col * s;
        int64_t big = 0;
        for (int64_t i = 1; i < s; ++i)
            if (std::fabs(v[i]) > std::fabs(v[big])) big = i;
        const double sign = v[big] < 0 ? -1.0 : 1.0;
        for (int64_t i = 0; i < s; ++i) proj[k * s + i] = float(sign * v[i]);
    }
}

void galore_project(float * low, const float * proj, const float * g, int64_t R, int64_t C, int64_t r) {
    if (R < C) {   // Q G: row k sums Q[k][i] g[i][:] over i in order
#pragma omp parallel for schedule(static)
        for (int64_t k = 0; k < r; ++k) {
            float * out = low + k * C;
            std::fill(out, out + C, 0.0f);
            for (int64_t i = 0; i < R; ++i) {
                const float q = proj[k * R + i];
                const float * gi = g + i * C;
#pragma omp simd
                for (int64_t j = 0; j < C; ++j) out[j] += q * gi[j];
            }
        }
        return;
    }
    // G Q^T: element (i, k) is row i of g against row k of Q.
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < R; ++i) {
        const float * gi = g + i * C;
        for (int64_t k = 0; k < r; ++k) {
            const float * q = proj + k * C;
            float sum = 0;
#pragma omp simd reduction(+ : sum)
            for (int64_t j = 0; j < C; ++j) sum += gi[j] * q[j];
            low[i * r + k] = sum;
        }
    }
}

void galore_project_back_row(float * out, const float * proj, const float * dir, int64_t i, int64_t R, int64_t C,
                             int64_t r) {
    std::fill(out, out + C, 0.0f);
    if (R < C) {   // row i of Q^T N: sum over k of Q[k][i] N[k][:]
        for (int64_t k = 0; k < r; ++k) {
            const float q = proj[k * R + i];
            const float * n = dir + k * C;
#pragma omp simd
            for (int64_t j = 0; j < C; ++j) out[j] += q * n[j];
        }
        return;
    }
    for (int64_t k = 0; k < r; ++k) {   // row i of N Q: sum over k of N[i][k] Q[k][:]
        const float nik = dir[i * r + k];
        const float * q = proj + k * C;
#pragma omp simd
        for (int64_t j = 0; j < C; ++j) out[j] += nik * q[j];
    }
}

}  // namespace memfit::cpu
