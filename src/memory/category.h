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
    // Master weights and optimizer states kept off the device (--offload optimizer): pinned host
    // memory, or files under --offload-dir. Planned and measured like the others, but not
    // device memory: total() leaves them out.
    offloaded,
    teacher,           // a distillation teacher's frozen weights (model/distill.h)
    reference,         // preference tuning's frozen reference copy (model/preference.h)
};
constexpr int kCategoryCount = 11;

constexpr std::array<std::string_view, kCategoryCount> kCategoryNames = {
    "parameters", "master_weights", "optimizer_states", "gradients",
    "activations", "workspace", "communication", "runtime", "offloaded", "teacher",
    "reference"};

constexpr std::string_view category_name(Category c) { return kCategoryNames[size_t(c)]; }

// One number per category (bytes).
struct CategoryBytes {
    std::array<uint64_t, kCategoryCount> v{};
    uint64_t & operator[](Category c) { return v[size_t(c)]; }
    uint64_t   operator[](Category c) const { return v[size_t(c)]; }
    // The device's bytes: every category but `offloaded`.
    uint64_t   total() const {
        uint64_t s = 0;
        for (size_t c = 0; c < v.size(); ++c) s += c == size_t(Category::offloaded) ? 0 : v[c];
        return s;
    }
};

}  // namespace memfit
