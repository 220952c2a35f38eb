// `memfit train --sparsity N:M` end to end: a tiny model trains dense for --sparsity-start steps,
// is pruned, trains on masked, and its exported safetensors hold the pattern in every block
// projection (GPT-2's Conv1D and LLaMA's Linear layouts); `memfit generate --weights sparse24`
// runs it from 0.5625x of bf16's projection bytes; bad patterns and LoRA fail in one line.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli_util.h"
#include "model/config.h"
#include "model/hf_weights.h"
#include "model/param_layout.h"
#include "model/sparsity.h"

using namespace cli_test;

namespace {

// The exported folder's weights: groups violating 2:4 in its block projections, and the share of
// zeros there.
std::pair<size_t, double> exported_pattern(const fs::path & hf) {
    const memfit::ModelConfig cfg = memfit::resolve_model(hf.string() + "/");
    const memfit::ParamLayout layout = memfit::make_param_layout(cfg);
    std::vector<float> w(layout.total);
    memfit::load_hf_weights(hf.string(), cfg, layout, w.data());
    size_t zeros = 0, targets = 0;
    for (const auto & p : layout.params) {
        if (!memfit::sparse_target(p.name)) continue;
        targets += p.numel;
        for (size_t i = p.offset; i < p.offset + p.numel; ++i) zeros += w[i] == 0.0f;
    }
    return {memfit::nm_violations(cfg, layout, w.data(), memfit::NmSparsity{2, 4}), double(zeros) / double(targets)};
}

}  // namespace

TEST(Cli, SparsityTrainExportGenerate) {
    const fs::path text = small_text("sparse.txt");
    const fs::path data = scratch("sparse_data"), run = scratch("sparse_run"), hf = scratch("sparse_hf"),
                   dense = scratch("sparse_dense");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const std::string base = "train --data " + data.string() + " --batch 2 --seq 32 --eval-every 0 "
                             "--eval-batches 1 --sample 0 --threads 2 ";
    const CmdResult t = run_memfit(base + "--model nano --progress plain --sparsity 2:4 --sparsity-start 2 --steps 4 "
                                   "--checkpoint-every 4 --out " + run.string());
    ASSERT_EQ(t.code, 0) << t.err << t.out;
    EXPECT_NE(t.out.find("sparsity 2:4: block projections pruned by magnitude once 2 updates are in"),
              std::string::npos) << t.out;
    ASSERT_EQ(run_memfit("export " + (run / "checkpoints").string() + " --out " + hf.string()).code, 0);
    const auto [violations, zeros] = exported_pattern(hf);
    EXPECT_EQ(violations, 0u);
    EXPECT_DOUBLE_EQ(zeros, 0.5);   // two of every four, no more: the kept weights trained on

    // Packed for generation: 9/16 of bf16's projection bytes.
    const std::string gen = "generate --model " + hf.string() + " --prompt ROMEO: --max-new-tokens 8 --temperature 0 ";
    const CmdResult s24 = run_memfit(gen + "--weights sparse24");
    ASSERT_EQ(s24.code, 0) << s24.err;
    EXPECT_EQ(s24.out.rfind("ROMEO:", 0), 0u) << s24.out;
    EXPECT_NE(s24.err.find("sparse24 projections"), std::string::npos) << s24.err;
    EXPECT_NE(s24.err.find("= 56.2% of bf16"), std::string::npos) << s24.err;

    // A dense model trains dense; the flag's mistakes are one line each.
    const CmdResult d = run_memfit(base + "--model nano --quiet --steps 1 --checkpoint-every 1 --out " + dense.string());
    ASSERT_EQ(d.code, 0) << d.err;
    expect_clean_failure(run_memfit(base + "--model nano --sparsity 3:2 --steps 1"), "--sparsity 3:2");
    expect_clean_failure(run_memfit(base + "--model nano --sparsity 2:5 --steps 1"), "not a multiple of M = 5");
    expect_clean_failure(run_memfit(base + "--model nano --sparsity 2:4 --lora-rank 2 --steps 1"), "LoRA");
}

TEST(Cli, SparsityLlamaExportHoldsThePattern) {
    const fs::path text = small_text("sparse_llama.txt");
    const fs::path data = scratch("sparse_llama_data"), run = scratch("sparse_llama_run"), hf = scratch("sparse_llama_hf");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const CmdResult t = run_memfit("train --data " + data.string() + " --model llama-nano --batch 2 --seq 32 "
                                   "--eval-every 0 --eval-batches 1 --sample 0 --threads 2 --quiet --precision bf16 "
                                   "--sparsity --steps 2 --checkpoint-every 2 --out " + run.string());
    ASSERT_EQ(t.code, 0) << t.err;
    ASSERT_EQ(run_memfit("export " + (run / "checkpoints").string() + " --out " + hf.string()).code, 0);
    const auto [violations, zeros] = exported_pattern(hf);
    EXPECT_EQ(violations, 0u);
    EXPECT_DOUBLE_EQ(zeros, 0.5);
}
