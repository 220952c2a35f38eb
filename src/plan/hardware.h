// The hardware catalog of `memfit plan`: data/hardware.json, one object per device kind, in
// human units (GiB, TFLOP/s, GB/s, microseconds; the file's "units" object says which field has
// which) converted at load to the bytes, FLOP/s, bytes/s and seconds of `Hardware`.
//
// The `cpu` entry is this machine: default_hardware_catalog() gives it the machine's memory and,
// when `memfit bench --calibrate` has written a calibration file, the measured rates.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "plan/plan_types.h"

namespace memfit {

// Where `memfit bench --calibrate` writes by default, relative to the current directory.
inline constexpr const char * kDefaultCalibrationPath = "runs/calibration.json";

// Reads and validates a catalog. IoError when the file cannot be read; ConfigError, naming the
// entry and the field, for bad JSON, a missing, non-numeric, zero or negative field, an unknown
// key (typos), a duplicate name, or reserved memory not below the memory.
std::vector<Hardware> load_hardware_catalog(const std::string & path);

// The entry called `name`; ConfigError listing the known names otherwise.
const Hardware & find_hardware(const std::vector<Hardware> & catalog, const std::string & name);

// What `memfit bench --calibrate` measured on this machine.
struct Calibration {
    double fp32_flops = 0;   // FLOP/s, oneDNN fp32 matmul on model-shaped gemms
    double bf16_flops = 0;   // FLOP/s, memfit's 16-bit storage path on the same gemms (0: not measured)
    double mem_bw = 0;       // bytes/s, streaming triad (reads + writes counted)
    double offload_bw = 0;   // bytes/s, --offload-dir's round trip (0: not measured; then mem_bw)
    int threads = 0;         // OpenMP threads it ran with (0: not recorded)
    std::string cpu;         // the CPU's model name, if recorded
    std::string created;     // UTC time of the measurement, if recorded
};

// nullopt when `path` does not exist; FormatError (naming the file, with a hint) when it exists
// but lacks positive "fp32_gflops" and "mem_bw_gbs" numbers.
std::optional<Calibration> read_calibration(const std::string & path);

// The calibrated rates replace a `cpu` entry's defaults: fp32 the fp32 rate, bf16 and fp16 the
// 16-bit storage path's rate (the fp32 rate for a file without one), device and host bandwidth
// the measured bandwidth. The entry's efficiencies (hardware.json) stay: they are fractions of these.
void apply_calibration(Hardware & cpu, const Calibration & c, const std::string & path);

// data_dir()/hardware.json with the `cpu` entry fitted to this machine: memory and host memory
// become MemTotal (capped by a cgroup memory limit; usable keeps the catalog's reserve), and the
// calibration file at `calibration_path` (if it exists; "" skips it) overlays the rates.
std::vector<Hardware> default_hardware_catalog(const std::string & calibration_path = kDefaultCalibrationPath);

}  // namespace memfit
