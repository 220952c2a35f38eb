// Memory categories: every byte memfit places belongs to exactly one.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace memfit {

enum class Category : uint8_t {
    parameters,        // weights in compute precision
    master_weights,    // fp32 copy when computing in bf16/fp16
    optimizer_states,  // AdamW moments
    gradients,         // parameter gradients
    activations,       // saved-for-backward and transient tensors of the step
    workspace,         // library / kernel scratch
    communication,     // collective buffers
    runtime,           // CUDA context, handles: measured, not planned
};
constexpr int kCategoryCount = 8;

constexpr std::array<std::string_view, kCategoryCount> kCategoryNames = {
    "parameters", "master_weights", "optimizer_states", "gradients",
    "activations", "workspace", "communication", "runtime"};

constexpr std::string_view category_name(Category c) { return kCategoryNames[size_t(c)]; }

// One number per category (bytes).
struct CategoryBytes {
    std::array<uint64_t, kCategoryCount> v{};
    uint64_t & operator[](Category c) { return v[size_t(c)]; }
    uint64_t   operator[](Category c) const { return v[size_t(c)]; }
    uint64_t   total() const { uint64_t s = 0; for (auto x : v) s += x; return s; }
};

}  // namespace memfit
