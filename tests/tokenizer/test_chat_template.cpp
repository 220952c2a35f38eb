// Chat templates: every conversation of tests/data/chat-templates/cases.json rendered byte for
// byte as Python's jinja2 renders it under transformers (Qwen3, Qwen2.5, Llama 3.1 and 3.2,
// Mistral Nemo, DeepSeek-V3 and memfit's own three formats), the one-feature snippets of
// snippets.json against jinja2 too, then the interpreter's contract on its own (scoping,
// Undefined, syntax errors as one line, key order, threads) and TokenizerConfig on real files.
// The fixtures are written by tests/data/chat-templates/make_cases.py.
#include "core/error.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer_config.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;
using memfit::ChatTemplate;
using memfit::ConfigError;
using memfit::FormatError;
using nlohmann::ordered_json;

const std::string kDir = std::string(MEMFIT_TEST_DATA) + "/chat-templates";

// The template fixture `name`, read as memfit reads a tokenizer_config.json.
const memfit::TokenizerConfig & fixture(const std::string & name) {
    static std::map<std::string, memfit::TokenizerConfig> cache;
    auto it = cache.find(name);
    if (it == cache.end()) it = cache.emplace(name, memfit::read_tokenizer_config(kDir + "/" + name + ".json")).first;
    return it->second;
}

// render's text, or "ERROR: " + the ConfigError's message.
std::string render(const ChatTemplate & t, const ordered_json & vars) {
    try {
        return t.render(vars);
    } catch (const ConfigError & e) {
        return std::string("ERROR: ") + e.what();
    }
}

std::string render(const std::string & source, const ordered_json & vars = ordered_json::object()) {
    return render(ChatTemplate(source), vars);
}

// The FormatError a source gives when compiled ("" when it compiles).
std::string syntax_error(const std::string & source) {
    try {
        ChatTemplate t(source);
    } catch (const FormatError & e) {
        return e.what();
    }
    return "";
}

TEST(ChatTemplate, RendersEveryCaseAsJinja2) {
    const ordered_json cases = ordered_json::parse(memfit::test::read_text(kDir + "/cases.json"));
    ASSERT_GE(cases.size(), 60u);
    std::map<std::string, std::unique_ptr<ChatTemplate>> compiled;
    size_t errors = 0;
    for (const auto & c : cases) {
        const std::string name = c["template"].get<std::string>();
        SCOPED_TRACE(name + ": " + c["label"].get<std::string>());
        auto & t = compiled[name];
        if (!t) t = std::make_unique<ChatTemplate>(fixture(name).chat_template);
        if (c.contains("error")) {
            ++errors;
            EXPECT_EQ(render(*t, c["vars"]), "ERROR: chat template: " + c["error"].get<std::string>());
        } else {
            EXPECT_EQ(render(*t, c["vars"]), c["expected"].get<std::string>());
        }
    }
    EXPECT_GE(errors, 6u);
    EXPECT_EQ(compiled.size(), 9u);
}

TEST(ChatTemplate, SnippetsAsJinja2) {
    const ordered_json doc = ordered_json::parse(memfit::test::read_text(kDir + "/snippets.json"));
    const ordered_json & vars = doc["vars"];
    ASSERT_GE(doc["snippets"].size(), 150u);
    for (const auto & s : doc["snippets"]) {
        const std::string source = s["source"].get<std::string>();
        SCOPED_TRACE(source);
        const std::string got = render(source, vars);
        if (!s.contains("error")) {
            EXPECT_EQ(got, s["expected"].get<std::string>());
            continue;
        }
        // memfit's message is jinja2's (or Python's), after "chat template: " or "chat template line N: ".
        const std::string want = s["error"].get<std::string>();
        EXPECT_TRUE(got.starts_with("ERROR: chat template")) << got;
        EXPECT_TRUE(got.ends_with(": " + want)) << got << "\n  jinja2: " << want;
    }
}

TEST(ChatTemplate, BuiltinFormatsAreTheFixtures) {
    for (const char * name : {"chatml", "llama3", "mistral"}) {
        SCOPED_TRACE(name);
        EXPECT_EQ(memfit::builtin_chat_template(name), fixture(name).chat_template);
        EXPECT_NO_THROW(ChatTemplate{memfit::builtin_chat_template(name)});
    }
    EXPECT_EQ(memfit::builtin_chat_template("vicuna"), "");
    const ordered_json chat = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"add_generation_prompt", true}};
    EXPECT_EQ(render(memfit::builtin_chat_template("chatml"), chat), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, SyntaxErrorsAreOneLineNamingTheLine) {
    const auto expect = [](const std::string & source, const std::string & want) {
        const std::string got = syntax_error(source);
        EXPECT_EQ(got, want) << source;
        EXPECT_EQ(got.find('\n'), std::string::npos);
    };
    expect("a\n{% if x %}\n{% include 'other.jinja' %}{% endif %}",
           "chat template line 3: {% include %} is not implemented (memfit renders one self-contained chat template)");
    expect("x\n\n{% for m in messages %}{{ m }}", "chat template line 3: {% for %} without {% endfor %}");
    expect("{{ x | groupby('a') }}", "chat template line 1: the filter 'groupby' is not implemented");
    expect("{{ x | nosuch }}", "chat template line 1: there is no filter 'nosuch'");
    expect("{% if x is frobnicated %}{% endif %}", "chat template line 1: there is no test 'frobnicated'");
    expect("{% endif %}", "chat template line 1: unexpected {% endif %}");
    expect("{% frob %}", "chat template line 1: unknown tag 'frob'");
    expect("{{ 'abc }}", "chat template line 1: a string is not closed");
    expect("ok\n{{ x", "chat template line 2: a {{ is not closed");
    expect("{# never closed", "chat template line 1: a comment {# is not closed");
    expect("{% break %}", "chat template line 1: {% break %} outside a for loop");
    expect("{{ (1 }}", "chat template line 1: unexpected '}', expected ')'");
    expect("{{ (1 2) }}", "chat template line 1: expected ')', got the number 2");
    expect("{{ x ]] }}", "chat template line 1: unexpected ']'");
    expect("{{ f(*args) }}", "chat template line 1: *args and **kwargs in a call are not implemented");
    expect("{% for x in y recursive %}{% endfor %}", "chat template line 1: recursive for loops are not implemented");
    expect("{{ 1 + }}", "chat template line 1: unexpected '}}'");
    expect("{{ 'Qwen' }}\n{{ x @ y }}", "chat template line 2: unexpected character '@'");
}

TEST(ChatTemplate, ScopingAsJinja) {
    // A set in a loop lives for one iteration; namespace() carries values out.
    EXPECT_EQ(render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}|{{ x }}"), "23|1");
    EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"), "6");
    // An if is no scope; a macro sees the template's variables when it is called.
    EXPECT_EQ(render("{% if true %}{% set y = 'in' %}{% endif %}{{ y }}"), "in");
    EXPECT_EQ(render("{% macro m() %}{{ z }}{% endmacro %}{% set z = 5 %}{{ m() }}"), "5");
    // Loop variables.
    EXPECT_EQ(render("{% for c in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
                     "{{ loop.first|int }}{{ loop.last|int }}{{ loop.length }} {% endfor %}"),
              "1032103 2121003 3210013 ");
    EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {{"d", {{"b", 1}, {"a", 2}}}}), "b=1;a=2;");
    EXPECT_EQ(render("{% for i in range(6) if i is odd %}{% if i > 3 %}{% break %}{% endif %}{{ i }}{% endfor %}"), "13");
}

TEST(ChatTemplate, UndefinedAsJinja) {
    EXPECT_EQ(render("[{{ missing }}]{% if missing %}t{% else %}f{% endif %}{% for x in missing %}x{% endfor %}"), "[]f");
    EXPECT_EQ(render("{{ missing is defined }} {{ missing is undefined }} {{ missing | length }} {{ missing | default('d') }}"),
              "False True 0 d");
    EXPECT_EQ(render("{{ m.absent }}|{{ m.absent is defined }}", {{"m", ordered_json::object()}}), "|False");
    EXPECT_EQ(render("{{ m }}\n{{ m.absent.deeper }}", {{"m", ordered_json::object()}}),
              "ERROR: chat template line 2: 'dict object' has no attribute 'absent'");
    EXPECT_EQ(render("{{ missing + 'x' }}"), "ERROR: chat template line 1: 'missing' is undefined");
    EXPECT_EQ(render("{{ missing.attr }}"), "ERROR: chat template line 1: 'missing' is undefined");
}

TEST(ChatTemplate, PythonPrintingAndTojson) {
    const ordered_json vars = {{"x", {{"k", "v"}, {"n", 1.0}, {"l", {1, "a", nullptr, true}}}}};
    EXPECT_EQ(render("{{ x }}", vars), "{'k': 'v', 'n': 1.0, 'l': [1, 'a', None, True]}");
    EXPECT_EQ(render("{{ x | tojson }}", vars), R"({"k": "v", "n": 1.0, "l": [1, "a", null, true]})");
    EXPECT_EQ(render("{{ x.l | tojson(indent=2) }}", vars), "[\n  1,\n  \"a\",\n  null,\n  true\n]");
    EXPECT_EQ(render("{{ 'é😀\n' | tojson }}"), "\"é😀\\n\"");
    // The keys keep the order given (an ordered_json); a plain json sorts them.
    const ordered_json ordered = {{"t", {{"zeta", 1}, {"alpha", 2}}}};
    EXPECT_EQ(render("{{ t | tojson }}", ordered), R"({"zeta": 1, "alpha": 2})");
    const nlohmann::json sorted = {{"t", {{"zeta", 1}, {"alpha", 2}}}};
    EXPECT_EQ(ChatTemplate("{{ t | tojson }}").render(sorted), R"({"alpha": 2, "zeta": 1})");
}

TEST(ChatTemplate, RuntimeErrors) {
    EXPECT_EQ(render("ok{{ raise_exception('Conversation roles must alternate!') }}"),
              "ERROR: chat template: Conversation roles must alternate!");
    EXPECT_EQ(render("{{ l.append(1) }}", {{"l", {1}}}),
              "ERROR: chat template line 1: access to attribute 'append' of 'list' object is unsafe.");
    EXPECT_EQ(render("{{ 1 + 'a' }}"), "ERROR: chat template line 1: unsupported operand type(s) for +: 'int' and 'str'");
    EXPECT_EQ(render("{{ 9223372036854775807 + 1 }}"),
              "ERROR: chat template line 1: integer overflow (memfit's template integers are 64-bit)");
    EXPECT_THROW(ChatTemplate("x").render(ordered_json::array()), ConfigError);
}

// A template is a program from a stranger: each way to grow a string or a list is refused at the
// budget (64 MiB, 4M items, 256 MiB of strings in a list) before it is built, and a runaway loop at
// the render's budgets; each is one line naming the template's line.
TEST(ChatTemplate, BudgetsRefuseRunawayGrowth) {
    const std::string past_text = "more than the 64 MiB a chat template may build";
    const std::vector<std::string> text_growth = {
        "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
        "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        "{{ 'x'.ljust(2**40) }}",
        "{{ 'x'.rjust(2**40, '-') }}",
        "{{ 'x'.center(2**40) }}",
        "{{ 'a b' | indent(10**9) }}",
        "{{ [1, 2] | tojson(indent=10**9) }}",
        "{{ ('ab' * 1000000).replace('', 'x' * 1000) }}",
        "{% set ns = namespace(l=['x' * 1000000]) %}{% for i in range(7) %}{% set ns.l = ns.l + ns.l %}{% endfor %}"
        "{{ ns.l | join('') }}",
        "{% set ns = namespace(l=['x' * 1000000]) %}{% for i in range(7) %}{% set ns.l = ns.l + ns.l %}{% endfor %}"
        "{{ ''.join(ns.l) }}",
        "{{ 'y' * (2**27) }}",
        "{% for i in range(100) %}{{ 'z' * 1000000 }}{% endfor %}",
    };
    for (const std::string & source : text_growth) {
        const std::string got = render(source);
        EXPECT_EQ(got.rfind("ERROR: chat template line 1: ", 0), 0u) << source << " -> " << got.substr(0, 200);
        EXPECT_NE(got.find(past_text), std::string::npos) << source << " -> " << got.substr(0, 200);
        EXPECT_EQ(got.find('\n'), std::string::npos) << source;
    }
    const std::vector<std::string> list_growth = {
        "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
        "{{ ([1, 2] * (2**23)) | length }}",
        "{% for c in 'x' * (2**23) %}{% endfor %}",
    };
    for (const std::string & source : list_growth) {
        const std::string got = render(source);
        EXPECT_NE(got.find("a chat template may build"), std::string::npos) << source << " -> " << got.substr(0, 200);
        EXPECT_NE(got.find("items"), std::string::npos) << source << " -> " << got.substr(0, 200);
    }
    // The render's budgets (smaller here than the defaults, to keep the test quick): macro fan-out
    // and loops whose iterations run no statement (10^10 of them used to run for most of an hour)
    // count against the steps; a loop copying a long string, against the bytes.
    memfit::RenderBudgets small;
    small.steps = 200'000;
    small.bytes = uint64_t(256) << 20;
    const auto render_small = [&](const std::string & source) {
        try {
            return ChatTemplate(source).render(ordered_json::object(), small);
        } catch (const ConfigError & e) {
            return std::string("ERROR: ") + e.what();
        }
    };
    const std::string past_steps = "ran more than 200000 statements, loop iterations and macro calls";
    for (const std::string & source :
         {std::string("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}\n{{ f(30) }}"),
          std::string("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"),
          std::string("{% for i in range(9) %}{% for j in range(100000) if j < 0 %}{% endfor %}{% endfor %}")}) {
        const std::string got = render_small(source);
        EXPECT_NE(got.find(past_steps), std::string::npos) << source << " -> " << got;
    }
    const std::string copies = render_small("{% set s = 'x' * 10000000 %}{% for i in range(100000) %}{% set t = s ~ 'y' %}"
                                            "{% endfor %}");
    EXPECT_NE(copies.find("made more than 256.00 MiB of strings on one conversation"), std::string::npos) << copies;
    const std::string list_copies = render("{{ ['x' * 1000000] * 1000 }}");
    EXPECT_NE(list_copies.find("holding 1000000000 bytes of strings"), std::string::npos) << list_copies;
    // The defaults hold the 20M steps.
    EXPECT_EQ(memfit::RenderBudgets{}.steps, 20'000'000u);
    // Under the budgets, a template's work is as before.
    EXPECT_EQ(render("{{ ('ab' * 3).replace('', '-') }}|{{ 'x'.center(5, '*') }}"), "-a-b-a-b-a-b-|**x**");
}

// A loop's iterations keep nothing once they end: a million of them (each setting a variable) used
// to hold about 750 bytes each until the render ended (two nested range(3000): 5.5 GB).
TEST(ChatTemplate, LoopsRetainNoMemoryPerIteration) {
    const ChatTemplate t("{% for i in range(1000) %}{% for j in range(1000) %}{% set k = i + j %}{% endfor %}{% endfor %}"
                         "{{ 'done' }}");
    rusage before{};
    getrusage(RUSAGE_SELF, &before);
    EXPECT_EQ(t.render(ordered_json::object()), "done");
    rusage after{};
    getrusage(RUSAGE_SELF, &after);
    const long grown_mib = (after.ru_maxrss - before.ru_maxrss) / 1024;   // ru_maxrss is in KiB
    EXPECT_LT(grown_mib, 150) << "the peak resident set grew by " << grown_mib << " MiB over 1M iterations";
}

TEST(ChatTemplate, StrftimeNowIsLocalTime) {
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char year[16];
    std::strftime(year, sizeof year, "%Y", &local);
    EXPECT_EQ(render("{{ strftime_now('%Y') }}"), year);
    // Llama 3.2 asks for today's date when no date_string is given.
    char today[32];
    std::strftime(today, sizeof today, "%d %b %Y", &local);
    const ordered_json vars = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
    const std::string out = render(ChatTemplate(fixture("llama3_2").chat_template), vars);
    EXPECT_NE(out.find(std::string("Today Date: ") + today), std::string::npos) << out;
}

TEST(ChatTemplate, RendersFromSeveralThreads) {
    const ChatTemplate t(fixture("qwen3").chat_template);
    const ordered_json cases = ordered_json::parse(memfit::test::read_text(kDir + "/cases.json"));
    std::vector<std::pair<ordered_json, std::string>> work;
    for (const auto & c : cases)
        if (c["template"] == "qwen3" && c.contains("expected")) work.emplace_back(c["vars"], c["expected"].get<std::string>());
    ASSERT_GE(work.size(), 8u);
    std::vector<int> wrong(4, 0);
    std::vector<std::thread> threads;
    for (int k = 0; k < 4; ++k)
        threads.emplace_back([&, k] {
            for (int round = 0; round < 20; ++round)
                for (const auto & [vars, want] : work) wrong[size_t(k)] += t.render(vars) != want;
        });
    for (auto & th : threads) th.join();
    EXPECT_EQ(wrong, std::vector<int>(4, 0));
}

TEST(TokenizerConfig, Qwen3RealFile) {
    const auto c = memfit::read_tokenizer_config(std::string(MEMFIT_TEST_DATA) + "/hf-tokenizers/qwen3/tokenizer_config.json");
    EXPECT_EQ(c.bos_token, "");   // null
    EXPECT_EQ(c.eos_token, "<|im_end|>");
    EXPECT_EQ(c.pad_token, "<|endoftext|>");
    EXPECT_FALSE(c.add_bos_token);
    EXPECT_FALSE(c.add_eos_token);   // null
    EXPECT_TRUE(c.chat_template.starts_with("{%- if tools %}")) << c.chat_template.substr(0, 40);
}

TEST(TokenizerConfig, AddedTokenObjectsOfDeepSeek) {
    const auto c = memfit::read_tokenizer_config(kDir + "/deepseek_v3.json");
    EXPECT_EQ(c.bos_token, "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");   // <｜begin▁of▁sentence｜>
    EXPECT_EQ(c.eos_token, "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
    EXPECT_FALSE(c.chat_template.empty());
}

TEST(TokenizerConfig, ListOfNamedTemplates) {
    const std::string text = R"({"eos_token": "</s>", "add_bos_token": true, "chat_template": [
        {"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})";
    const auto c = memfit::parse_tokenizer_config(text, "inline");
    EXPECT_EQ(c.chat_template, "D");
    EXPECT_TRUE(c.add_bos_token);
    EXPECT_EQ(memfit::parse_tokenizer_config(R"({"chat_template": [{"name": "rag", "template": "R"}]})", "x").chat_template, "");
    EXPECT_EQ(memfit::parse_tokenizer_config("{}", "x").chat_template, "");
}

TEST(TokenizerConfig, MalformedIsOneLineNamingFileAndField) {
    const auto error = [](const std::string & text) {
        try {
            memfit::parse_tokenizer_config(text, "/m/tokenizer_config.json");
        } catch (const FormatError & e) {
            return std::string(e.what());
        }
        return std::string();
    };
    EXPECT_EQ(error("{\"eos_token\": 7}"), "/m/tokenizer_config.json: \"eos_token\" is neither a string, null nor an AddedToken "
                                           "{\"content\": ...}; the file is not a tokenizer_config.json memfit can read");
    EXPECT_NE(error("{\"add_bos_token\": \"yes\"}").find("\"add_bos_token\" is not true, false or null"), std::string::npos);
    EXPECT_NE(error("{\"chat_template\": 3}").find("\"chat_template\" is neither"), std::string::npos);
    EXPECT_NE(error("{\"chat_template\": [{\"name\": 1}]}").find("an entry of \"chat_template\""), std::string::npos);
    EXPECT_NE(error("{oops").find("/m/tokenizer_config.json: not valid JSON at line 1, column"), std::string::npos);
    EXPECT_NE(error("[1]").find("not a JSON object"), std::string::npos);
    EXPECT_THROW(memfit::read_tokenizer_config("/nonexistent/tokenizer_config.json"), memfit::IoError);
}

TEST(TokenizerConfig, ChatTemplateJinjaBesideTakesPrecedence) {
    const fs::path dir = fs::temp_directory_path() / ("memfit_tok_config." + std::to_string(::getpid()));
    fs::create_directories(dir);
    std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "<e>", "chat_template": "old"})";
    EXPECT_EQ(memfit::read_tokenizer_config((dir / "tokenizer_config.json").string()).chat_template, "old");
    std::ofstream(dir / "chat_template.jinja") << "{{ messages }}";
    const auto c = memfit::read_tokenizer_config((dir / "tokenizer_config.json").string());
    EXPECT_EQ(c.chat_template, "{{ messages }}");
    EXPECT_EQ(c.eos_token, "<e>");
    fs::remove_all(dir);
}

}  // namespace
