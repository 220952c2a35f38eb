// `memfit bench --calibrate`: measure this machine's fp32 matmul rate and memory bandwidth and
// save them for `memfit plan`, whose `cpu` hardware entry reads them (plan/hardware.h).
//
// The file is one JSON object; the planner reads "fp32_gflops" (10^9 FLOP/s), "mem_bw_gbs"
// (10^9 bytes/s) and "offload_gbs" (the --offload-dir round trip, the cpu entry's host link);
// the other fields record how and where it was measured.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace memfit {

struct CalibrateOptions {
    std::string path = "runs/calibration.json";   // = kDefaultCalibrationPath of plan/hardware.h
    int threads = 0;              // OpenMP threads (0: the current default, all cores)
    int matmul_repeats = 5;       // timed runs per gemm shape (median per shape, best shape kept)
    uint64_t stream_bytes = 0;    // bytes of the three triad arrays together; 0: 4 x L3 within
                                  // [384 MiB, 1 GiB], at most a quarter of the available memory
    int stream_repeats = 9;       // timed triads (median kept)
    // --offload optimizer's file store: its round trip measured under this folder (empty: the
    // calibration file's), offload_bytes written and read back per run, the median of 3 runs.
    std::string offload_dir;
    uint64_t offload_bytes = 256ull << 20;
};

// Bytes/s of --offload-dir's round trip: `bytes` written and read back in 1 MiB copies through
// the offload store's I/O thread (memory/offload_store.h), as the step moves its units (buffered
// I/O: what fits the page cache runs at its rate), both directions counted; median of `repeats`.
double measure_offload_bandwidth(const std::string & dir, uint64_t bytes, int repeats);

// Bytes/s of the triad a[i] = b[i] + s * c[i] over three arrays of doubles totalling `bytes`
// (two reads and one write per element counted; write-allocate traffic is not), median of
// `repeats` timed passes after one untimed pass, with the current OpenMP thread count.
double measure_stream_bandwidth(uint64_t bytes, int repeats);

// Measures, writes the calibration file atomically (creating its folder) and returns what it
// wrote plus "path". IoError when the file cannot be written.
nlohmann::json run_calibration(const CalibrateOptions & opt);

}  // namespace memfit
