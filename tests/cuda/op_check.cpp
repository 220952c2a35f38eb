#include "op_check.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"

namespace memfit::test {

CudaBackend * gpu(std::string * why) {
    static std::string reason;
    static std::unique_ptr<CudaBackend> backend = [] {
        if (cuda_device_count(&reason) == 0) return std::unique_ptr<CudaBackend>();
        return std::make_unique<CudaBackend>(0);
    }();
    if (!backend && why) *why = reason;
    return backend.get();
}

namespace {

float load(DType t, const uint8_t * p, size_t i) {
    switch (t) {
        case DType::f32: { float f; std::memcpy(&f, p + 4 * i, 4); return f; }
        case DType::i32: { int32_t v; std::memcpy(&v, p + 4 * i, 4); return float(v); }
        case DType::bf16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); return bf16_to_f32(h); }
        case DType::f16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); return f16_to_f32(h); }
        case DType::u8: return float(p[i]);
        case DType::u16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); return float(h); }
    }
    return 0;
}

void store(DType t, uint8_t * p, size_t i, float f) {
    switch (t) {
        case DType::f32: std::memcpy(p + 4 * i, &f, 4); return;
        case DType::i32: { const int32_t v = int32_t(std::lround(f)); std::memcpy(p + 4 * i, &v, 4); return; }
        case DType::bf16: { const uint16_t h = f32_to_bf16(f); std::memcpy(p + 2 * i, &h, 2); return; }
        case DType::f16: { const uint16_t h = f32_to_f16(f); std::memcpy(p + 2 * i, &h, 2); return; }
        case DType::u8: p[i] = uint8_t(f); return;
        case DType::u16: { const uint16_t h = uint16_t(f); std::memcpy(p + 2 * i, &h, 2); return; }
    }
}

std::vector<float> as_f32(DType t, const std::vector<uint8_t> & b) {
    std::vector<float> out(b.size() / dtype_size(t));
    for (size_t i = 0; i < out.size(); ++i) out[i] = load(t, b.data(), i);
    return out;
}

}  // namespace

OpCheck::~OpCheck() {
    CudaBackend * g = test::gpu();
    for (auto & b : bufs_)
        if (b.dev.data && g) g->allocator().release(b.dev.data, b.dev.nbytes());
}

int OpCheck::add(DType dt, std::initializer_list<int64_t> dims, std::vector<uint8_t> bytes) {
    Buf b;
    b.host = Tensor(-1, dt, dims);
    b.dev = b.host;
    MF_ASSERT(bytes.size() == b.host.nbytes());
    b.bytes = std::move(bytes);
    bufs_.push_back(std::move(b));
    return int(bufs_.size()) - 1;
}

int OpCheck::rand(DType dt, std::initializer_list<int64_t> dims, float lo, float hi) {
    Tensor shape(-1, dt, dims);
    std::mt19937_64 rng(0x5eed + bufs_.size() * 7919);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<uint8_t> bytes(shape.nbytes());
    for (int64_t i = 0; i < shape.numel(); ++i) store(dt, bytes.data(), size_t(i), u(rng));
    return add(dt, dims, std::move(bytes));
}

int OpCheck::values(DType dt, std::initializer_list<int64_t> dims, const std::vector<float> & v) {
    Tensor shape(-1, dt, dims);
    MF_ASSERT(int64_t(v.size()) == shape.numel());
    std::vector<uint8_t> bytes(shape.nbytes());
    for (size_t i = 0; i < v.size(); ++i) store(dt, bytes.data(), i, v[i]);
    return add(dt, dims, std::move(bytes));
}

int OpCheck::ints(std::initializer_list<int64_t> dims, int lo, int hi) {
    Tensor shape(-1, DType::i32, dims);
    std::mt19937_64 rng(0x1d5 + bufs_.size() * 104729);
    std::uniform_int_distribution<int> u(lo, hi - 1);
    std::vector<float> v(size_t(shape.numel()));
    for (auto & x : v) x = float(u(rng));
    return values(DType::i32, dims, v);
}

int OpCheck::zeros(DType dt, std::initializer_list<int64_t> dims) {
    Tensor shape(-1, dt, dims);
    return add(dt, dims, std::vector<uint8_t>(shape.nbytes(), 0));
}

void OpCheck::run(const std::function<void(Backend &, const std::vector<Tensor> &)> & op) {
    CudaBackend * g = test::gpu();
    MF_ASSERT(g && "OpCheck::run needs a GPU: start the test with MF_REQUIRE_GPU()");
    std::vector<Tensor> host, dev;
    for (auto & b : bufs_) {
        b.cpu_after = b.bytes;
        b.host.data = b.cpu_after.data();
        if (!b.dev.data) b.dev.data = g->allocator().allocate(std::max<size_t>(b.dev.nbytes(), 1));
        g->upload(b.dev.data, b.bytes.data(), b.bytes.size());
        host.push_back(b.host);
        dev.push_back(b.dev);
    }
    CpuBackend cpu;
    op(cpu, host);
    op(*g, dev);
    g->synchronize();
    for (auto & b : bufs_) {
        b.gpu_after.resize(b.bytes.size());
        g->download(b.gpu_after.data(), b.dev.data, b.bytes.size());
    }
}

std::string env_or(const char * name, const char * built_in) {
    const char * v = std::getenv(name);
    return v && *v ? v : built_in;
}

std::vector<float> OpCheck::cpu(int i) const { return as_f32(bufs_[size_t(i)].host.dtype, bufs_[size_t(i)].cpu_after); }
std::vector<float> OpCheck::gpu(int i) const { return as_f32(bufs_[size_t(i)].dev.dtype, bufs_[size_t(i)].gpu_after); }

double OpCheck::rel_err(int i) const {
    const std::vector<float> a = cpu(i), b = gpu(i);
    double max_ref = 0, max_diff = 0;
    for (size_t k = 0; k < a.size(); ++k) {
        if (std::isfinite(a[k]) != std::isfinite(b[k])) return INFINITY;
        if (!std::isfinite(a[k])) continue;
        max_ref = std::max(max_ref, double(std::fabs(a[k])));
        max_diff = std::max(max_diff, double(std::fabs(a[k] - b[k])));
    }
    return max_diff / (max_ref > 0 ? max_ref : 1.0);
}

}  // namespace memfit::test
