// Which of the two bf16 gemm paths this CPU runs faster, decided by measuring both on its cores,
// never by its flags: oneDNN's native bf16 matmul (avx512_bf16, AMX) against memfit's convert
// path (bf16 tiles widened to fp32 and multiplied by the fp32 gemm: gemm_mixed.h). The native
// matmul doubles the speed on an AMD Zen 5 and halves it on an Intel Xeon without AMX (159
// GFLOP/s against fp32's 298), so the flag alone picks wrong somewhere.
//
// The rates are measured once per machine (about a second, model-shaped gemms at the current
// thread count) and kept in a cache file, so every later process, rank and test on the machine
// takes the same path (a bitwise comparison between two runs never straddles a change of path).
// The file is written atomically under an exclusive lock; a process that finds another measuring
// waits for its result. MEMFIT_CPU_NATIVE_BF16=0 or 1 overrides the choice (tests, experiments).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace memfit::cpu {

// GFLOP/s of the three ways a gemm can run here (0: that path does not exist on this CPU).
struct GemmRates {
    double fp32 = 0;      // oneDNN fp32
    double native = 0;    // oneDNN bf16 (bf16 inputs, f32 output)
    double convert = 0;   // bf16 storage through fp32 tiles
    // The bf16 path's rate as the engine runs it: the faster of the two.
    double bf16() const;
    // bf16's rate over fp32's: the time model's factor for gemms on 16-bit storage.
    double bf16_over_fp32() const;
};

// The decision from measured rates: native only where it is at least 5% faster than the convert
// path (closer than that the convert path is kept: its results do not depend on oneDNN's kernels).
bool prefer_native_bf16(const GemmRates & r);

// This machine's rates: the cache file's (when it names this CPU and oneDNN version), else
// measured now and written there. Thread-safe; measured at most once per process.
const GemmRates & machine_gemm_rates();

// Whether bf16 gemms take oneDNN's native matmul here: MEMFIT_CPU_NATIVE_BF16 when set, else
// prefer_native_bf16(machine_gemm_rates()).
bool native_bf16_chosen();

// The cache file: $MEMFIT_CACHE_DIR, else $XDG_CACHE_HOME/memfit, else ~/.cache/memfit, else
// /tmp/memfit-UID; then gemm-rates.json.
std::string gemm_rates_cache_path();

// Reading and writing that file (the key: the CPU's model name, the thread count and oneDNN's
// version); nullopt when absent, unreadable or for another key.
std::optional<GemmRates> read_gemm_rates(const std::string & path, const std::string & key);
void write_gemm_rates(const std::string & path, const std::string & key, const GemmRates & r);
std::string gemm_rates_key();

// Rows per call of a large native bf16 gemm (dnnl_gemm.cpp), chosen per shape by timing: some
// shapes run much faster cut into row tiles, each over the whole K, so with the same bits (the LM
// head's forward on an Intel Xeon with AMX, 512x384x50257 with fp32 logits: 310 GFLOP/s as one
// call, 751 in 64-row calls), others slower. `measure` times the candidates and returns its
// choice (0: one call); the answer is kept per shape key in the cache file's "row_tiles", so every
// later process and rank on the machine runs that shape the same way. MEMFIT_CPU_ROW_TILE=R
// (tests, experiments) answers R for every such shape without measuring (0: one call).
int64_t machine_row_tile(const std::string & shape, const std::function<int64_t()> & measure);

// The choice from (rows per call, seconds) with the one-call candidate first: the fastest tile
// where it takes at most 1/1.1 of one call's time, else 0.
int64_t choose_row_tile(const std::vector<std::pair<int64_t, double>> & timed);

}  // namespace memfit::cpu
