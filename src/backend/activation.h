// The GELU variants an MLP applies (model/config.cpp maps config.json's activation names to them).
//   tanh  0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): GPT-2's "gelu_new", also named
//         "gelu_pytorch_tanh" and "gelu_fast"
//   erf   x Phi(x) = 0.5 x (1 + erf(x / sqrt(2))): PyTorch's nn.GELU(), Hugging Face's "gelu"
// The gate of a gated MLP (LLaMA family: act(gate) * up):
//   silu       SwiGLU (LLaMA, Qwen, Mistral, Phi-3, OLMo 2: hidden_act "silu")
//   gelu_tanh  GeGLU with GELU's tanh form (Gemma 3: hidden_activation "gelu_pytorch_tanh")
#pragma once

#include <cstdint>

namespace memfit {

enum class Gelu : uint8_t { tanh, erf };
enum class Glu : uint8_t { silu, gelu_tanh };

}  // namespace memfit
