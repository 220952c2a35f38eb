// Knowledge distillation from the command line: a teacher trained and exported by memfit teaches
// a smaller student (--teacher DIR); the plan shows the teacher's bytes as their own category and
// `memfit plan` counts them too; a teacher of another vocabulary, one without weights and bad
// alpha or temperature values are one clear line each.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_util.h"

namespace memfit {
namespace {

using namespace cli_test;

TEST(Cli, DistillFromAnExportedTeacher) {
    const fs::path text = small_text("distill.txt");
    const fs::path data = scratch("distill_data"), trun = scratch("distill_teacher"), thf = scratch("distill_teacher_hf"),
                   srun = scratch("distill_student");
    ASSERT_EQ(run_memfit("prepare --tokenizer bytes --input " + text.string() + " --out " + data.string()).code, 0);
    const std::string common = "train --data " + data.string() + " --batch 2 --seq 32 --eval-every 0 --eval-batches 1 "
                               "--sample 0 --threads 1 ";
    ASSERT_EQ(run_memfit(common + "--quiet --model micro --steps 2 --checkpoint-every 2 --out " + trun.string()).code, 0);
    ASSERT_EQ(run_memfit("export " + (trun / "checkpoints").string() + " --out " + thf.string()).code, 0);

    const CmdResult s = run_memfit(common + "--progress plain --model nano --steps 3 --loss-chunk 16 --teacher " +
                                   thf.string() + " --distill-alpha 0.7 --distill-temperature 2 --out " + srun.string());
    ASSERT_EQ(s.code, 0) << s.err << s.out;
    EXPECT_NE(s.out.find("teacher " + thf.string()), std::string::npos) << s.out;
    EXPECT_NE(s.out.find("(1 - 0.7) x cross-entropy + 0.7 x T^2 x KL at T = 2"), std::string::npos) << s.out;
    EXPECT_NE(s.out.find("  teacher "), std::string::npos) << "the plan's teacher row: " << s.out;
    EXPECT_NE((s.out + s.err).find("hint: --teacher-weights nf4 would lower the planned peak"), std::string::npos)
        << s.out << s.err;
    // The same run with the teacher packed to int8: fewer teacher bytes in the plan.
    const CmdResult q = run_memfit(common + "--progress plain --model nano --steps 1 --teacher " + thf.string() +
                                   " --teacher-weights int8 --out " + scratch("distill_int8").string());
    ASSERT_EQ(q.code, 0) << q.err << q.out;
    EXPECT_NE(q.out.find("int8 weights"), std::string::npos) << q.out;

    // memfit plan counts the teacher too.
    const CmdResult p = run_memfit("plan --model nano --teacher micro --seq 128 --micro-batch 4 --global-batch 4 "
                                   "--hardware h100-80g --gpus 1 --zero 0 --tp 1 --pp 1 --json");
    ASSERT_EQ(p.code, 0) << p.err;
    const nlohmann::json plan = nlohmann::json::parse(p.out);
    // micro's 0.86M parameters (its vocabulary the student's 256 bytes) in bf16.
    EXPECT_EQ(plan.at("best").at(0).at("memory").at("per_device").at("teacher"), 1717760) << p.out;
    const CmdResult none = run_memfit("plan --model nano --seq 128 --micro-batch 4 --global-batch 4 "
                                      "--hardware h100-80g --gpus 1 --zero 0 --tp 1 --pp 1 --json");
    ASSERT_EQ(none.code, 0) << none.err;
    const nlohmann::json alone = nlohmann::json::parse(none.out);
    EXPECT_EQ(alone.at("best").at(0).at("memory").at("per_device").at("teacher"), 0);
    EXPECT_GT(alone.at("best").at(0).at("tokens_per_s").get<double>(),
              plan.at("best").at(0).at("tokens_per_s").get<double>()) << "the teacher's forward takes time";

    // One clear line each.
    const fs::path wide = scratch("distill_wide_data");
    ASSERT_EQ(run_memfit("prepare --tokenizer gpt2 --input " + text.string() + " --out " + wide.string()).code, 0);
    expect_clean_failure(run_memfit("train --data " + wide.string() + " --batch 2 --seq 32 --steps 1 --model nano "
                                    "--teacher " + thf.string() + " --out " + scratch("distill_bad1").string()),
                         "vocabulary of 256 tokens");
    expect_clean_failure(run_memfit(common + "--model nano --steps 1 --teacher nano --out " +
                                    scratch("distill_bad2").string()),
                         "no weights there");
    expect_clean_failure(run_memfit(common + "--model nano --steps 1 --teacher " + thf.string() +
                                    " --distill-alpha 1.5 --out " + scratch("distill_bad3").string()),
                         "--distill-alpha");
    expect_clean_failure(run_memfit(common + "--model nano --steps 1 --teacher " + thf.string() +
                                    " --distill-temperature 0 --out " + scratch("distill_bad4").string()),
                         "--distill-temperature");
}

}  // namespace
}  // namespace memfit
