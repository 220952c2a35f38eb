// The engine's host views of its persistent state (engine.h): the fp32 weights (params(),
// master weights or the bf16-sr weights), the gradients and the moments of this rank's shard,
// read and written whether they are resident, offloaded (--offload optimizer: the offloaded
// part first, then the resident one) or on a device (through upload / download).
#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "backend/moments8.h"
#include "comm/communicator.h"
#include "train/engine.h"

namespace memfit {

namespace {

// A state kept per whole matrix (Adafactor's statistics, GaLore's projected moments): a
// checkpoint holds each piece's at the start of the piece's range of its moment, zeros after.
bool per_matrix(StateSize k) { return k == StateSize::factored || k == StateSize::projected; }

int state_index(const OptimizerRow & row, StateSize k) {
    for (int i = 0; i < row.n_states; ++i)
        if (row.states[size_t(i)].size == k) return i;
    return -1;
}

size_t piece_len(const TrainStep::MomentPiece & p, StateSize k) { return state_len(k, p.rows, p.cols, p.rank); }

// A state of the row this run does not keep (Adafactor's first moment without --adafactor-beta1).
bool absent(const TrainStep & st, int i) {
    return i < 0 || (optimizer_row(st.optimizer()).states[size_t(i)].size == StateSize::first_moment && !st.first_moment());
}

}  // namespace

// GaLore's projector: in a checkpoint's first moment, each projected piece's after its projected
// moment (galore_rank() keeps both within the piece's range).
void Engine::append_projector(std::vector<float> & mirror) {
    const TrainStep & st = *plans_.train;
    const int pj = state_index(optimizer_row(st.optimizer()), StateSize::projector);
    if (pj < 0) return;
    std::vector<float> copy;
    const float * proj = host_f32(st.opt_states[size_t(pj)], 0, copy);
    for (const auto & p : st.moment_pieces())
        std::copy_n(proj + p.off[size_t(StateSize::projector)], piece_len(p, StateSize::projector),
                    mirror.begin() + ptrdiff_t(p.at + piece_len(p, StateSize::projected)));
}

void Engine::store_projector(const float * src, size_t n) {
    const TrainStep & st = *plans_.train;
    const int pj = state_index(optimizer_row(st.optimizer()), StateSize::projector);
    if (pj < 0) return;
    const BufferId id = st.opt_states[size_t(pj)];
    std::vector<float> proj(st.program().buffer(id).bytes / 4);
    for (const auto & p : st.moment_pieces()) {
        const size_t at = p.at + piece_len(p, StateSize::projected), len = piece_len(p, StateSize::projector);
        MF_ASSERT(at + len <= n && at + len <= p.at + p.n);
        std::copy_n(src + at, len, proj.begin() + ptrdiff_t(p.off[size_t(StateSize::projector)]));
    }
    set_state_bytes(id, -1, proj.data(), proj.size() * 4);
}

float * Engine::host_f32(BufferId id, size_t elem0, std::vector<float> & mirror) {
    auto * p = static_cast<float *>(train_mem_->base(id)) + elem0;
    if (backend_.host_memory()) return p;
    mirror.resize(plans_.train->program().buffer(id).bytes / sizeof(float) - elem0);
    backend_.download(mirror.data(), p, mirror.size() * sizeof(float));
    return mirror.data();
}

void Engine::store_f32(BufferId id, size_t elem0, const float * src, size_t n) {
    MF_ASSERT((elem0 + n) * sizeof(float) <= plans_.train->program().buffer(id).bytes);
    auto * p = static_cast<float *>(train_mem_->base(id)) + elem0;
    if (backend_.host_memory()) std::memcpy(p, src, n * sizeof(float));
    else backend_.upload(p, src, n * sizeof(float));
}

void Engine::read_state(BufferId res, BufferId off, void * dst, size_t bytes) {
    const Program & p = plans_.train->program();
    const size_t a = off >= 0 ? p.buffer(off).bytes : 0, b = res >= 0 ? p.buffer(res).bytes : 0;
    MF_ASSERT(bytes == a + b);
    if (a) train_mem_->store()->read(dst, train_mem_->offloaded_at(off), a);
    if (b) backend_.download(static_cast<uint8_t *>(dst) + a, train_mem_->base(res), b);
}

size_t Engine::state_size(BufferId res, BufferId off) const {
    const Program & p = plans_.train->program();
    return (off >= 0 ? p.buffer(off).bytes : 0) + (res >= 0 ? p.buffer(res).bytes : 0);
}

std::vector<uint8_t> Engine::state_bytes(BufferId res, BufferId off) {
    std::vector<uint8_t> out(state_size(res, off));
    read_state(res, off, out.data(), out.size());
    return out;
}

void Engine::state_f32(BufferId res, BufferId off, std::vector<float> & out) {
    out.resize(state_size(res, off) / 4);
    read_state(res, off, out.data(), out.size() * 4);
}

void Engine::set_state_bytes(BufferId res, BufferId off, const void * src, size_t n) {
    const Program & p = plans_.train->program();
    const size_t a = std::min(n, off >= 0 ? p.buffer(off).bytes : 0);
    MF_ASSERT(n - a <= (res >= 0 ? p.buffer(res).bytes : 0));
    if (a) train_mem_->store()->write(train_mem_->offloaded_at(off), src, a);
    if (n > a) backend_.upload(train_mem_->base(res), static_cast<const uint8_t *>(src) + a, n - a);
}

std::pair<BufferId, size_t> Engine::own_params() const {
    const TrainStep & t = *plans_.train;
    if (t.master >= 0) return {t.master, 0};
    // fp32: the weights are the truth; whole under ZeRO 0-2, where this rank's shard starts at lo.
    return {t.params, opt_.zero >= 3 ? 0 : t.shard_lo()};
}

void Engine::weights_bytes(bool reading, size_t at, void * mem, size_t n) {
    const TrainStep & t = *plans_.train;
    if (t.params_offloaded()) {
        const uint64_t o = train_mem_->offloaded_at(t.params) + at;
        if (reading) train_mem_->store()->read(mem, o, n);
        else train_mem_->store()->write(o, mem, n);
        return;
    }
    auto * p = static_cast<uint8_t *>(train_mem_->base(t.params)) + at;
    if (reading) backend_.download(mem, p, n);
    else backend_.upload(p, mem, n);
}

void Engine::store_own_params(const float * src, size_t n) {
    const TrainStep & t = *plans_.train;
    if (t.offloaded.master >= 0) {
        set_state_bytes(t.master, t.offloaded.master, src, n * 4);
    } else if (t.sr_master()) {   // bf16-sr: rounded to nearest (exact for values a checkpoint holds)
        std::vector<uint16_t> raw(n);
        narrow_f32(raw.data(), src, n, DType::bf16);
        weights_bytes(false, (opt_.zero >= 3 ? 0 : t.shard_lo()) * 2, raw.data(), n * 2);
    } else if (t.params_offloaded()) {   // fp32: the weights are the truth (ZeRO 3: the shard from 0)
        weights_bytes(false, 0, const_cast<float *>(src), n * 4);
    } else {
        store_f32(own_params().first, own_params().second, src, n);
    }
    params_handed_ = false;
}

float * Engine::params() {
    params_handed_ = true;
    const TrainStep & t = *plans_.train;
    if (t.offloaded.master >= 0) {   // offloaded master weights: a host copy
        state_f32(t.master, t.offloaded.master, mirror_params_);
        return mirror_params_.data();
    }
    if (t.sr_master()) {   // bf16-sr: the bf16 weights are the truth, widened exactly
        const Shard sh = shard();
        std::vector<uint16_t> raw(sh.size);
        const size_t at = opt_.zero >= 3 ? 0 : sh.lo, have = std::min(sh.size, sh.total - std::min(sh.total, at));
        weights_bytes(true, at * 2, raw.data(), have * 2);
        mirror_params_.assign(sh.size, 0.0f);
        widen_to_f32(mirror_params_.data(), raw.data(), have, DType::bf16);
        return mirror_params_.data();
    }
    if (t.params_offloaded()) {   // fp32 weights in the store: a host copy
        mirror_params_.resize(shard().size);
        weights_bytes(true, 0, mirror_params_.data(), mirror_params_.size() * 4);
        return mirror_params_.data();
    }
    const auto [id, at] = own_params();
    return host_f32(id, at, mirror_params_);
}

Engine::Shard Engine::shard() const {
    const TrainStep & t = *plans_.train;
    return Shard{t.shard_lo(), t.shard_hi(), t.shard_size(), t.layout().total};
}

void Engine::params_changed() {
    pruned_ = false;   // new weights: --sparsity prunes them again before the next step
    const TrainStep & t = *plans_.train;
    const Shard sh = shard();
    // A device backend or offloaded master weights: what the caller wrote into params()'s host
    // mirror goes back first.
    const bool offl = t.offloaded.master >= 0;
    if ((!backend_.host_memory() || offl || t.sr_master() || t.params_offloaded()) && params_handed_)
        store_own_params(mirror_params_.data(), std::min(mirror_params_.size(), sh.hi - sh.lo));
    params_handed_ = false;
    const size_t own = sh.hi - sh.lo, cs = dtype_size(t.compute()), at = opt_.zero >= 3 ? 0 : sh.lo * cs;
    if (offl && own > 0) {   // the compute-precision copy from the master weights, rounded on the host
        const std::vector<uint8_t> raw = state_bytes(t.master, t.offloaded.master);
        std::vector<uint8_t> bytes(own * cs);
        for (size_t i = 0; i < own; ++i) {
            float f;
            std::memcpy(&f, raw.data() + 4 * i, 4);
            const uint16_t h = t.compute() == DType::bf16 ? f32_to_bf16(f) : f32_to_f16(f);
            std::memcpy(bytes.data() + 2 * i, &h, 2);
        }
        weights_bytes(false, at, bytes.data(), bytes.size());
    } else if (t.master >= 0 && own > 0) {
        Tensor dst(t.params, t.compute(), {int64_t(own)}), src(t.master, DType::f32, {int64_t(own)});
        dst.data = static_cast<uint8_t *>(train_mem_->base(t.params)) + at;
        src.data = train_mem_->base(t.master);
        backend_.copy(dst, src);
    }
    // ZeRO 1 and 2: every rank's shard into everyone's whole weights.
    if ((opt_.zero == 1 || opt_.zero == 2) && opt_.data_parallel > 1)
        comm_->iall_gather(static_cast<uint8_t *>(train_mem_->base(t.params)) + at, train_mem_->base(t.params),
                           t.shard_counts(0, sh.total), cs)->wait();
}

void Engine::set_params(const float * whole) {
    pruned_ = false;   // new weights: --sparsity prunes them again before the next step
    const TrainStep & t = *plans_.train;
    const Shard sh = shard();
    std::vector<float> slice;
    if (split_model()) slice = my_part(whole);
    const float * full = slice.empty() ? whole : slice.data();
    store_own_params(full + sh.lo, sh.hi - sh.lo);
    if (opt_.zero >= 3) {
        params_changed();
        return;
    }
    // The whole compute-precision copy from the caller's weights: no communication.
    if (!backend_.host_memory()) {   // rounded here, then uploaded
        std::vector<uint8_t> bytes(sh.total * dtype_size(t.compute()));
        narrow_f32(bytes.data(), full, sh.total, t.compute());
        backend_.upload(train_mem_->base(t.params), bytes.data(), bytes.size());
        return;
    }
    Tensor dst(t.params, t.compute(), {int64_t(sh.total)}), src(-1, DType::f32, {int64_t(sh.total)});
    dst.data = train_mem_->base(t.params);
    src.data = const_cast<float *>(full);
    backend_.copy(dst, src);
}

float * Engine::grads() {
    if (plans_.train->optimizer_in_backward())
        throw ConfigError("--optimizer-in-backward keeps no whole-model gradient: each layer's is freed by its update");
    MF_ASSERT(plans_.train->grad_dtype() == DType::f32 && opt_.zero < 2);
    return host_f32(plans_.train->grads, 0, mirror_grads_);
}
const float * Engine::adam_m() { return host_moments(0, mirror_m_); }
const float * Engine::adam_v() { return host_moments(1, mirror_v_); }

// A moment of the shard: its offloaded part (if any) then its resident one, widened to f32.
const float * Engine::host_moments(int k, std::vector<float> & mirror) {
    const TrainStep & st = *plans_.train;
    const OptimizerRow & row = optimizer_row(st.optimizer());
    const int i = row.moment[k];
    if (absent(st, i)) {   // a row without it (SGD's second moment): none (the checkpoint's is zeros)
        std::vector<float>().swap(mirror);
        return mirror.data();
    }
    const DType dt = row.states[size_t(i)].dtype;
    const BufferId id = st.opt_states[size_t(i)], off = st.offloaded.opt[size_t(i)];
    if (dt == DType::u8) return host_moments_8bit(k, mirror);
    const StateSize kind = row.states[size_t(i)].size;
    if (per_matrix(kind)) {   // each piece's state at the start of its range (GaLore's projector after)
        std::vector<float> copy;
        const float * compact = host_f32(id, 0, copy);   // the buffer itself where the host can read it
        mirror.assign(st.shard_size(), 0.0f);
        for (const auto & p : st.moment_pieces())
            std::copy_n(compact + p.off[size_t(kind)], piece_len(p, kind), mirror.begin() + ptrdiff_t(p.at));
        if (k == 0) append_projector(mirror);
        return mirror.data();
    }
    if (dt == DType::f32 && off < 0) return host_f32(id, 0, mirror);
    if (dt == DType::f32) {
        state_f32(id, off, mirror);
        return mirror.data();
    }
    MF_ASSERT(dt == DType::bf16);
    const std::vector<uint8_t> raw = state_bytes(id, off);
    const size_t n = raw.size() / dtype_size(dt);
    mirror.resize(n);
    for (size_t j = 0; j < n; ++j) {
        bf16_t b;
        std::memcpy(&b, raw.data() + 2 * j, 2);
        mirror[j] = to_f32(b);
    }
    return mirror.data();
}

void Engine::store_moments(int k, const float * src, size_t n) {
    const TrainStep & st = *plans_.train;
    const OptimizerRow & row = optimizer_row(st.optimizer());
    const int i = row.moment[k];
    if (absent(st, i)) return;   // a row without it, or a state this run does not keep
    const DType dt = row.states[size_t(i)].dtype;
    const BufferId id = st.opt_states[size_t(i)], off = st.offloaded.opt[size_t(i)];
    if (dt == DType::u8) return store_moments_8bit(k, src, n);
    const StateSize kind = row.states[size_t(i)].size;
    if (per_matrix(kind)) {
        std::vector<float> compact(st.program().buffer(id).bytes / 4);
        for (const auto & p : st.moment_pieces()) {
            MF_ASSERT(p.at + p.n <= n);
            std::copy_n(src + p.at, piece_len(p, kind), compact.begin() + ptrdiff_t(p.off[size_t(kind)]));
        }
        if (k == 0) store_projector(src, n);
        return set_state_bytes(id, off, compact.data(), compact.size() * 4);
    }
    if (dt == DType::f32) return set_state_bytes(id, off, src, n * 4);
    MF_ASSERT(dt == DType::bf16);
    std::vector<bf16_t> raw(n);
    for (size_t j = 0; j < n; ++j) raw[j] = from_f32<bf16_t>(src[j]);
    set_state_bytes(id, off, raw.data(), n * sizeof(bf16_t));
}

// 8-bit moments (backend/moments8.h): the codes and their blocks' scales, decoded piece by piece;
// k 0 the signed first moment's codes, k 1 the second's.
const float * Engine::host_moments_8bit(int k, std::vector<float> & mirror) {
    const TrainStep & st = *plans_.train;
    const OptimizerRow & row = optimizer_row(st.optimizer());
    const size_t i = size_t(row.moment[k]), si = size_t(row.scales[k]);
    const bool first = k == 0;
    const std::vector<uint8_t> codes = state_bytes(st.opt_states[i], st.offloaded.opt[i]);
    const std::vector<uint8_t> sraw = state_bytes(st.opt_states[si], st.offloaded.opt[si]);
    std::vector<float> scales(sraw.size() / 4);
    std::memcpy(scales.data(), sraw.data(), sraw.size());
    // The codes' kind: each element's (at p.at), or GaLore's projected moments (at the piece's
    // start of the checkpoint's range, zeros after).
    const StateSize kc = row.states[i].size, ks = row.states[si].size;
    mirror.assign(kc == StateSize::elements ? codes.size() : st.shard_size(), 0.0f);
    for (const auto & p : st.moment_pieces()) {
        const size_t c0 = p.off[size_t(kc)], b0 = p.off[size_t(ks)];
        for (size_t j = 0; j < piece_len(p, kc); ++j) {
            const float s = scales[b0 + j / kMoments8Block];
            mirror[p.at + j] = first ? decode_m8(codes[c0 + j], s) : decode_v8(codes[c0 + j], s);
        }
    }
    if (first) append_projector(mirror);
    return mirror.data();
}

void Engine::store_moments_8bit(int k, const float * src, size_t n) {
    const TrainStep & st = *plans_.train;
    const OptimizerRow & row = optimizer_row(st.optimizer());
    const size_t i = size_t(row.moment[k]), si = size_t(row.scales[k]);
    const bool first = k == 0;
    const BufferId id = st.opt_states[i], sid = st.opt_states[si];
    const BufferId off = st.offloaded.opt[i], soff = st.offloaded.opt[si];
    auto bytes = [&](BufferId b) { return b >= 0 ? st.program().buffer(b).bytes : 0; };
    std::vector<uint8_t> codes(bytes(id) + bytes(off), 0);
    std::vector<float> scales((bytes(sid) + bytes(soff)) / 4, 0.0f);
    const StateSize kc = row.states[i].size, ks = row.states[si].size;
    for (const auto & p : st.moment_pieces()) {
        const size_t len = piece_len(p, kc), c0 = p.off[size_t(kc)], b0 = p.off[size_t(ks)];
        MF_ASSERT(p.at + p.n <= n && len <= p.n);
        for (size_t lo = 0; lo < len; lo += kMoments8Block) {
            const size_t hi = std::min(len, lo + kMoments8Block);
            float s = 0;
            for (size_t j = lo; j < hi; ++j) s = std::max(s, first ? std::fabs(src[p.at + j]) : src[p.at + j]);
            scales[b0 + lo / kMoments8Block] = s;
            for (size_t j = lo; j < hi; ++j)
                codes[c0 + j] = first ? encode_m8(src[p.at + j], s) : encode_v8(src[p.at + j], s);
        }
    }
    set_state_bytes(id, off, codes.data(), codes.size());
    set_state_bytes(sid, soff, scales.data(), scales.size() * 4);
    if (first) store_projector(src, n);
}

}  // namespace memfit
