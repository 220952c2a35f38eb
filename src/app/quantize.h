// `memfit quantize` and `memfit eval`: post-training quantization into a GPTQ folder, and a model's
// validation loss and perplexity.
//
// quantize: the model (any folder or checkpoint generate reads) is quantized block by block in
// forward order. GPTQ (infer/gptq.h) calibrates layer l on the inputs of the model whose blocks
// below l already hold their quantized weights (infer/calibration.h), and under true-sequential
// each projection of the block on the inputs its quantized predecessors produce: `samples` windows of `seq`
// tokens from the calibration data's train.bin, drawn by the seed, `batch` windows per program
// run. RTN rounds each group to nearest (no calibration). Either way the result is a GPTQ folder
// (infer/gptq_folder.h) with the source folder's tokenizer files; each layer prints one progress
// line with its relative output error sum ||(W - W')X||^2 / sum ||WX||^2 over its projections
// (GPTQ's objective, from the Hessians: both methods are measured on the same inputs, RTN's too
// when a calibration folder is given).
#pragma once

#include <cstdio>
#include <string>

#include "model/gptq_folder.h"

namespace memfit {

struct QuantizeRequest {
    std::string model, out, calibration, tokenizer;
    GptqSpec    spec;
    int         samples = 128, seq = 2048, batch = 4;
    uint64_t    seed = 0;
    std::string dtype = "F16";   // the folder's dense weights
};
// Returns the closing line (what was written, the bytes, the time, calibration memory).
std::string quantize_model(const QuantizeRequest & r, std::FILE * progress);

struct EvalRequest {
    std::string model, data, tokenizer, weights = "fp32";
    int         seq = 0, batch = 4, batches = 8;   // seq 0: min(256, the trained context)
};
// {"val_loss", "perplexity", "tokens", "weights_bytes", "peak_bytes", "planned_peak_bytes"} of
// `batches` x `batch` windows from the data folder's val.bin (train.bin if none): consecutive
// windows of `seq` + 1 tokens of a text file, or the first `seq` + 1 tokens of each document of a
// documents file (prepared conversations, preference data) with only its trained targets scored,
// as training's loss. The targets are scored through the decoder one token at a time (the KV
// cache's path, with the weights as generate stores them: a GPTQ folder's packed projections as
// they are).
nlohmann::json evaluate_model(const EvalRequest & r);

}  // namespace memfit
