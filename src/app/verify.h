// `memfit verify`: replay a reference fixture (format: parameters under Hugging Face
// names, input_ids, targets, expected.* tensors, config and AdamW hyperparameters in the
// metadata) through the engine and measure the relative error of everything it checks.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace memfit {

struct VerifyReport {
    nlohmann::json json;   // {"fixture", "errors": {name: rel_err}, "max_error", "worst", "ok", "tolerance"}
    bool ok = false;
};

// Relative error ||a - b|| / ||b|| (or ||a - b|| when b is all zeros).
double relative_error(const float * a, const float * b, size_t n);

// device: the backend to replay it on (make_backend: "cpu" or "cuda", in fp32 either way).
VerifyReport verify_fixture(const std::string & path, double tolerance = 1e-4, bool checking = false,
                            const std::string & device = "cpu");

}  // namespace memfit
