// libFuzzer target: the chat template engine (tokenizer/chat_template.h) on arbitrary bytes as a
// Jinja source: compiled, then rendered with a small fixed conversation (system, user and
// assistant turns, add_generation_prompt true, bos/eos tokens, one tool). Every input must render
// or fail with memfit::Error (FormatError at compile time, ConfigError while rendering, a budget
// when it loops or grows hugely); anything else is a bug. The render's budgets are smaller than a
// run's (RenderBudgets' defaults take minutes to reach under the sanitizers at -O0; these, about
// a second): what is checked here is that reaching one is an error and nothing worse; ChatTemplate.BudgetsRefuseRunawayGrowth
// checks the limits themselves.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/chat_template.h"

namespace {

nlohmann::ordered_json conversation() {
    return nlohmann::ordered_json::parse(R"({
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "And caf\u00e9 <b>x</b>?"}
        ],
        "tools": [{"type": "function", "function": {"name": "add", "parameters": {"a": 1, "b": [1, 2.5, null]}}}],
        "add_generation_prompt": true,
        "bos_token": "<s>",
        "eos_token": "</s>"
    })");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    static const nlohmann::ordered_json vars = conversation();
    const std::string source(reinterpret_cast<const char *>(data), size);
    try {
        const memfit::ChatTemplate t(source);
        memfit::RenderBudgets small;
        small.steps = 100'000;
        small.bytes = uint64_t(64) << 20;
        small.seconds = 5;
        (void) t.render(vars, small);
    } catch (const memfit::Error &) {}
    return 0;
}
