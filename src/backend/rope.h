// Rotary position embedding's frequencies (Su et al. 2021): with d = rotary_dims(hd) (the whole
// head, or its first d dimensions under partial rotary: GPT-NeoX, Phi-4-mini), head pair
// (i, i + d/2) of the token at position p turns by the angle p * inv_freq(i), inv_freq(i) =
// theta^(-2i/d), the head's dimensions from d on untouched; optionally rescaled for a longer
// context as Hugging Face's rope_scaling says:
//   linear (Chen et al. 2023, position interpolation): inv_freq / factor.
//   llama3 (Llama 3.1 / 3.2): with wavelength w = 2 pi / inv_freq and the original context O,
//     w < O / high_freq_factor (high frequencies): unchanged;
//     w > O / low_freq_factor (low frequencies): inv_freq / factor;
//     between: (1 - s) inv_freq / factor + s inv_freq, s = (O / w - low) / (high - low).
//   longrope (Phi-3 128K, Phi-3.5, Phi-4-mini; Ding et al. 2024): inv_freq / ext[i], ext the
//     config's long_factor when the sequence is longer than the original context, else its
//     short_factor; and cos and sin scaled by attention_factor (given, or sqrt(1 + ln(s) /
//     ln(O)) for s = max_position_embeddings / O > 1, else 1), as transformers does.
//   yarn (Peng et al. 2023; Qwen2.5 / Qwen3 past 32K, DeepSeek): with d rotary dimensions and
//     the original context O, the frequency index where a pair turns r times over O is
//     c(r) = d ln(O / (2 pi r)) / (2 ln theta); low = floor c(beta_fast), high = ceil c(beta_slow),
//     clamped to [0, d - 1]; pair i blends e inv_freq + (1 - e) inv_freq / factor, e = 1 -
//     clamp((i - low) / (high - low), 0, 1): high frequencies kept, low ones interpolated. cos and
//     sin scaled by attention_factor (given, or 0.1 ln(factor) + 1; with mscale and mscale_all_dim
//     their ratio), at every length, as transformers does.
// The others leave the magnitude of cos and sin alone (attention_factor 1).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace memfit {

enum class RopeScaling { none, linear, llama3, longrope, yarn };

struct Rope {
    float theta = 10000.0f;
    RopeScaling scaling = RopeScaling::none;
    float factor = 1.0f;             // linear, llama3, yarn
    float low_freq_factor = 1.0f;    // llama3
    float high_freq_factor = 4.0f;   // llama3
    int original_context = 8192;     // llama3, longrope, yarn: original_max_position_embeddings
    float beta_fast = 32.0f, beta_slow = 1.0f;   // yarn: the ramp's ends, in turns over the original context
    bool truncate = true;                        // yarn: the ramp's ends rounded outwards to whole indices
    int rotary_dim = 0;              // partial rotary: the dimensions of each head that turn (0: all)
    // longrope: the config's short_factor and long_factor (rotary_dims / 2 each), which of them
    // applies (for_sequence picks), and the cos/sin scale.
    std::vector<double> short_factor, long_factor;
    bool long_context = false;
    float attention_factor = 1.0f;

    Rope() = default;
    Rope(float base) : theta(base) {}   // plain RoPE (implicit: a base is a whole Rope)

    int rotary_dims(int hd) const { return rotary_dim > 0 ? rotary_dim : hd; }
    // The scale of cos and sin.
    float magnitude() const {
        return scaling == RopeScaling::longrope || scaling == RopeScaling::yarn ? attention_factor : 1.0f;
    }
    // This Rope for sequences of `seq` positions: longrope takes its long factors past the
    // original context (transformers decides so on the length of the forward).
    Rope for_sequence(int seq) const {
        Rope r = *this;
        r.long_context = seq > original_context;
        return r;
    }

    // The i-th of the rotary_dims(hd)/2 frequencies, in double (the kernels compute angles in double).
    double inv_freq(int i, int hd) const {
        const int d = rotary_dims(hd);
        const double f = std::pow(static_cast<double>(theta), -2.0 * i / d);
        if (scaling == RopeScaling::longrope) return f / (long_context ? long_factor : short_factor)[size_t(i)];
        if (scaling == RopeScaling::linear) return f / factor;
        if (scaling == RopeScaling::yarn) return yarn_inv_freq(f, i, d);
        if (scaling != RopeScaling::llama3) return f;
        constexpr double kTwoPi = 6.283185307179586476925286766559;
        const double wavelen = kTwoPi / f, context = original_context;
        if (wavelen < context / high_freq_factor) return f;
        if (wavelen > context / low_freq_factor) return f / factor;
        const double s = (context / wavelen - low_freq_factor) / (double(high_freq_factor) - low_freq_factor);
        return (1.0 - s) * f / factor + s * f;
    }

    // yarn's blend of frequency f (pair i of d rotary dimensions), above.
    double yarn_inv_freq(double f, int i, int d) const {
        constexpr double kTwoPi = 6.283185307179586476925286766559;
        auto index_of = [&](double turns) {
            return d * std::log(double(original_context) / (turns * kTwoPi)) / (2.0 * std::log(double(theta)));
        };
        double low = index_of(beta_fast), high = index_of(beta_slow);
        if (truncate) low = std::floor(low), high = std::ceil(high);
        low = std::max(low, 0.0);
        high = std::min(high, double(d - 1));
        if (low == high) high += 0.001;   // transformers' guard against a zero-width ramp
        const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0), keep = 1.0 - ramp;
        return f / factor * (1.0 - keep) + f * keep;
    }
};

}  // namespace memfit
