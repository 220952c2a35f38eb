// `memfit quantize` end to end: a tiny LLaMA trained here is quantized by GPTQ (calibrated on its
// own data) and by round-to-nearest into GPTQ folders; GPTQ's per-layer output error is below
// round-to-nearest's on the same inputs; `memfit eval` scores every folder as one JSON line;
// `memfit generate` runs the GPTQ folder from its packed weights; `memfit train --lora-rank`
// trains adapters on it as a frozen base with the plan equal to the measured peak; mistakes are
// one line each.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_util.h"

using namespace cli_test;

namespace {

// The closing line's "relative output error X over all layers".
double output_error(const std::string & out) {
    const std::regex re("relative output error ([0-9.e+-]+) over all layers");
    std::smatch m;
    return std::regex_search(out, m, re) ? std::stod(m[1].str()) : -1;
}

}  // namespace

TEST(Cli, QuantizeGptqAndRtnThenEvalGenerateAndLora) {
    const fs::path text = small_text("quant.txt");
    const fs::path data = scratch("quant_data"), run = scratch("quant_run"), hf = scratch("quant_hf"),
                   g4 = scratch("quant_g4"), r4 = scratch("quant_r4"), lora = scratch("quant_lora");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const CmdResult t = run_memfit("train --data " + data.string() + " --model llama-nano --batch 4 --seq 32 "
                                   "--steps 6 --eval-every 0 --sample 0 --threads 2 --quiet --checkpoint-every 6 "
                                   "--out " + run.string());
    ASSERT_EQ(t.code, 0) << t.err;
    ASSERT_EQ(run_memfit("export " + (run / "checkpoints").string() + " --out " + hf.string()).code, 0);

    const std::string q = "quantize --model " + hf.string() + " --calibration " + data.string() +
                          " --nsamples 16 --seq 32 --group-size 16 --out ";
    const CmdResult g = run_memfit(q + g4.string() + " --desc-act");
    ASSERT_EQ(g.code, 0) << g.err;
    EXPECT_NE(g.err.find("quantize: layer 2/2 (gptq, 4-bit): relative output error"), std::string::npos) << g.err;
    EXPECT_NE(g.out.find("(gptq, 4-bit, groups of 16, act-order, true-sequential)"), std::string::npos) << g.out;
    EXPECT_EQ(nlohmann::json::parse(slurp(g4 / "config.json"))["quantization_config"]["true_sequential"], true);
    const CmdResult r = run_memfit(q + r4.string() + " --method rtn");
    ASSERT_EQ(r.code, 0) << r.err;
    const double eg = output_error(g.out), er = output_error(r.out);
    EXPECT_GT(eg, 0) << g.out;
    EXPECT_LT(eg, er) << g.out << r.out;
    const nlohmann::json config = nlohmann::json::parse(slurp(g4 / "config.json"));
    EXPECT_EQ(config["quantization_config"]["quant_method"], "gptq");
    EXPECT_EQ(config["quantization_config"]["checkpoint_format"], "gptq");
    EXPECT_EQ(config["quantization_config"]["desc_act"], true);

    // eval: one JSON line per folder; the GPTQ folder's weights are a fraction of the fp32 one's.
    auto eval = [&](const fs::path & m) {
        const CmdResult e = run_memfit("eval --model " + m.string() + " --data " + data.string() +
                                       " --seq 32 --batch 2 --batches 2");
        EXPECT_EQ(e.code, 0) << e.err;
        return nlohmann::json::parse(e.out);
    };
    const nlohmann::json ef = eval(hf), eg4 = eval(g4), er4 = eval(r4);
    EXPECT_EQ(ef["tokens"], 128);
    EXPECT_NEAR(ef["perplexity"].get<double>(), std::exp(ef["val_loss"].get<double>()), 1e-9);
    EXPECT_LT(eg4["weights_bytes"].get<double>(), 0.5 * ef["weights_bytes"].get<double>());
    EXPECT_EQ(eg4["peak_bytes"], eg4["planned_peak_bytes"]);
    EXPECT_GT(er4["val_loss"].get<double>(), 0);

    const CmdResult gen = run_memfit("generate --model " + g4.string() + " --prompt ROMEO: --max-new-tokens 8 "
                                     "--temperature 0");
    ASSERT_EQ(gen.code, 0) << gen.err;
    EXPECT_EQ(gen.out.rfind("ROMEO:", 0), 0u) << gen.out;
    EXPECT_NE(gen.err.find("gptq projections"), std::string::npos) << gen.err;

    // LoRA on the GPTQ folder: its packed projections are the frozen base.
    const CmdResult l = run_memfit("train --data " + data.string() + " --model " + g4.string() + " --lora-rank 4 "
                                   "--batch 2 --seq 32 --steps 2 --eval-every 0 --sample 0 --threads 2 --out " +
                                   lora.string());
    ASSERT_EQ(l.code, 0) << l.err;
    EXPECT_NE(l.out.find("projections gptq (4-bit, groups of 16, the folder's packed weights)"), std::string::npos)
        << l.out;
    std::smatch tm;   // planned peak = measured peak
    ASSERT_TRUE(std::regex_search(l.out, tm, std::regex(R"(total \(sum\)\s+(\S+ \S+)\s+(\S+ \S+))"))) << l.out;
    EXPECT_EQ(tm[1].str(), tm[2].str()) << l.out;
    // Its checkpoint generates (the adapters folded into the dequantized GPTQ base).
    const CmdResult lg = run_memfit("generate --model " + (lora / "checkpoints").string() + " --prompt ROMEO: "
                                    "--max-new-tokens 4 --temperature 0");
    EXPECT_EQ(lg.code, 0) << lg.err;

    // A documents file (conversations): only the trained targets are scored, as training's loss.
    const fs::path chat = scratch("quant_chat.jsonl"), chat_data = scratch("quant_chat");
    {
        std::ofstream out(chat);
        for (int i = 0; i < 40; ++i)
            out << R"({"messages": [{"role": "user", "content": "Say something, number )" << i
                << R"(."}, {"role": "assistant", "content": "Something, as asked."}]})" << "\n";
    }
    const std::string tok = std::string(MEMFIT_TEST_DATA) + "/hf-tokenizers/tiny-chat/tokenizer.json";
    ASSERT_EQ(run_memfit("prepare --format jsonl --input " + chat.string() + " --tokenizer " + tok + " --out " +
                         chat_data.string()).code, 0);
    const fs::path chat_run = scratch("quant_chat_run");
    ASSERT_EQ(run_memfit("train --data " + chat_data.string() + " --model llama-nano --batch 2 --seq 64 --steps 1 "
                         "--eval-every 0 --sample 0 --quiet --checkpoint-every 1 --out " + chat_run.string()).code, 0);
    const CmdResult ce = run_memfit("eval --model " + (chat_run / "checkpoints").string() + " --data " +
                                    chat_data.string() + " --seq 64 --batch 1 --batches 2");
    ASSERT_EQ(ce.code, 0) << ce.err;
    const auto trained = nlohmann::json::parse(ce.out)["tokens"].get<int>();
    // Two documents' replies, "Something, as asked." (20 bytes, a byte-level vocabulary) and their
    // end-of-turn token: not the prompts, the template or the padding.
    EXPECT_EQ(trained, 2 * (20 + 1)) << ce.out;

    // Mistakes: one line each.
    expect_clean_failure(run_memfit("quantize --model " + hf.string() + " --out " + scratch("x").string()),
                         "--calibration");
    expect_clean_failure(run_memfit("quantize --model " + hf.string() + " --method rtn --group-size 48 --out " +
                                    scratch("y").string()), "does not divide");
    expect_clean_failure(run_memfit("generate --model " + g4.string() + " --weights nf4"), "GPTQ folder");
    expect_clean_failure(run_memfit("quantize --model " + g4.string() + " --method rtn --out " + scratch("z").string()),
                         "already quantized");
    expect_clean_failure(run_memfit("train --data " + data.string() + " --model " + g4.string() + " --steps 1"),
                         "--lora-rank");
}
