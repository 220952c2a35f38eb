// Rotary position embedding's frequencies (Su et al. 2021): head pair (i, i + hd/2) of the token
// at position p turns by the angle p * inv_freq(i), inv_freq(i) = theta^(-2i/hd), optionally
// rescaled for a longer context as Hugging Face's rope_scaling says:
//   linear (Chen et al. 2023, position interpolation): inv_freq / factor.
//   llama3 (Llama 3.1 / 3.2): with wavelength w = 2 pi / inv_freq and the original context O,
//     w < O / high_freq_factor (high frequencies): unchanged;
//     w > O / low_freq_factor (low frequencies): inv_freq / factor;
//     between: (1 - s) inv_freq / factor + s inv_freq, s = (O / w - low) / (high - low).
// Neither changes the magnitude of cos and sin (transformers' attention_factor is 1 for both).
#pragma once

#include <cmath>

namespace memfit {

enum class RopeScaling { none, linear, llama3 };

struct Rope {
    float theta = 10000.0f;
    RopeScaling scaling = RopeScaling::none;
    float factor = 1.0f;             // linear, llama3
    float low_freq_factor = 1.0f;    // llama3
    float high_freq_factor = 4.0f;   // llama3
    int original_context = 8192;     // llama3: original_max_position_embeddings

    Rope() = default;
    Rope(float base) : theta(base) {}   // plain RoPE (implicit: a base is a whole Rope)

    // The i-th of the hd/2 frequencies, in double (the kernels compute angles in double).
    double inv_freq(int i, int hd) const {
        const double f = std::pow(static_cast<double>(theta), -2.0 * i / hd);
        if (scaling == RopeScaling::linear) return f / factor;
        if (scaling != RopeScaling::llama3) return f;
        constexpr double kTwoPi = 6.283185307179586476925286766559;
        const double wavelen = kTwoPi / f, context = original_context;
        if (wavelen < context / high_freq_factor) return f;
        if (wavelen > context / low_freq_factor) return f / factor;
        const double s = (context / wavelen - low_freq_factor) / (double(high_freq_factor) - low_freq_factor);
        return (1.0 - s) * f / factor + s * f;
    }
};

}  // namespace memfit
