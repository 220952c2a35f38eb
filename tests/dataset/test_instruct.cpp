// Instruction data (data/instruct.h): the loss mask against the chat templates.
//   - exact trained spans for Qwen3 (its empty <think></think> on the last turn), Llama 3.1 and
//     Mistral Nemo, written out by hand from each template;
//   - every conversation of the jinja2 fixtures (tests/data/chat-templates/cases.json): the text
//     is jinja2's, one span per assistant turn, each ending at the template's end of turn and
//     holding the turn's content, and no assistant content outside the spans;
//   - Qwen3's tokenizer: token by token, the trained tokens decode to the spans;
//   - prompt/completion, Alpaca and ShareGPT records; one-line errors.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/instruct.h"
#include "tokenizer/tokenizer.h"
#include "test_util.h"

using namespace memfit;
using ojson = nlohmann::ordered_json;

namespace {

const std::string kTemplates = std::string(MEMFIT_TEST_DATA) + "/chat-templates/";
const std::string kQwen3 = std::string(MEMFIT_TEST_DATA) + "/hf-tokenizers/qwen3/tokenizer.json";

ojson read_json(const std::string & path) { return ojson::parse(memfit::test::read_text(path)); }

// A fixture template with the bytes tokenizer (byte-exact, so spans are the text's own bytes).
ChatFormat fixture_format(const std::string & name, const Tokenizer & tok) {
    const ojson t = read_json(kTemplates + name + ".json");
    TokenizerConfig tc;
    if (t.contains("bos_token") && t["bos_token"].is_string()) tc.bos_token = t["bos_token"];
    if (t.contains("eos_token") && t["eos_token"].is_string()) tc.eos_token = t["eos_token"];
    return make_chat_format(t["chat_template"].get<std::string>(), name, tc, tok);
}

std::vector<std::string> span_texts(const RenderedChat & rc) {
    std::vector<std::string> out;
    for (const auto & [a, b] : rc.spans) out.push_back(rc.text.substr(a, b - a));
    return out;
}

ojson conversation() {
    return ojson::array({{{"role", "system"}, {"content", "Be brief."}},
                         {{"role", "user"}, {"content", "Hi there"}},
                         {{"role", "assistant"}, {"content", "Hello! "}},
                         {{"role", "user"}, {"content", "What is 2+2?"}},
                         {{"role", "assistant"}, {"content", "4"}}});
}

}  // namespace

TEST(Instruct, TrainedSpansFollowEachTemplate) {
    ByteTokenizer bytes;
    {
        const ChatFormat f = fixture_format("qwen3", bytes);
        EXPECT_EQ(f.end_of_turn, "<|im_end|>");
        const RenderedChat rc = render_chat(f, conversation(), nullptr);
        EXPECT_EQ(rc.text, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
                           "<|im_start|>assistant\nHello! <|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                           "<|im_start|>assistant\n<think>\n\n</think>\n\n4<|im_end|>\n");
        EXPECT_EQ(span_texts(rc), (std::vector<std::string>{"Hello! <|im_end|>", "<think>\n\n</think>\n\n4<|im_end|>"}));
    }
    {
        const ChatFormat f = fixture_format("llama3_1", bytes);
        EXPECT_EQ(f.end_of_turn, "<|eot_id|>");
        const RenderedChat rc = render_chat(f, conversation(), nullptr);
        EXPECT_EQ(span_texts(rc), (std::vector<std::string>{"Hello!<|eot_id|>", "4<|eot_id|>"}));   // content | trim
        EXPECT_TRUE(rc.text.starts_with("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief."));
    }
    {
        const ChatFormat f = fixture_format("mistral_nemo", bytes);
        EXPECT_EQ(f.end_of_turn, "</s>");
        const RenderedChat rc = render_chat(f, conversation(), nullptr);
        // Nemo's template puts the system message into the last user turn only when the
        // conversation ends with a user turn (so here it drops it), and into the generation prompt
        // rendered for each assistant turn: the turns are found by a marker instead.
        EXPECT_EQ(rc.text, "<s>[INST]Hi there[/INST]Hello! </s>[INST]What is 2+2?[/INST]4</s>");
        EXPECT_EQ(span_texts(rc), (std::vector<std::string>{"Hello! </s>", "4</s>"}));
    }
}

TEST(Instruct, EveryFixtureConversationHasOneSpanPerAssistantTurn) {
    ByteTokenizer bytes;
    int checked = 0;
    for (const auto & c : read_json(kTemplates + "cases.json")) {
        if (!c.contains("expected")) continue;
        const ojson & v = c["vars"];
        if (v.value("add_generation_prompt", false) || v.contains("tools") || v.size() > 4) continue;
        bool plain = true;
        std::vector<std::string> contents;
        for (const auto & m : v["messages"]) {
            if (m.contains("tool_calls") || m.value("role", "") == "tool" || !m["content"].is_string()) plain = false;
            else if (m["role"] == "assistant") contents.push_back(m["content"]);
        }
        if (!plain || contents.empty()) continue;
        const std::string name = c["template"];
        SCOPED_TRACE(name + ": " + c.value("label", ""));
        TokenizerConfig tc;
        const ojson t = read_json(kTemplates + name + ".json");
        tc.bos_token = v.value("bos_token", "");
        tc.eos_token = v.value("eos_token", "");
        const ChatFormat f = make_chat_format(t["chat_template"].get<std::string>(), name, tc, bytes);
        const RenderedChat rc = render_chat(f, v["messages"], nullptr);
        EXPECT_EQ(rc.text, c["expected"].get<std::string>());
        ASSERT_EQ(rc.spans.size(), contents.size());
        std::string outside = rc.text;
        for (size_t k = rc.spans.size(); k-- > 0;) {
            const auto [a, b] = rc.spans[k];
            const std::string s = rc.text.substr(a, b - a);
            EXPECT_TRUE(s.ends_with(f.end_of_turn)) << s;
            // The content, less what the template strips (Llama trims it; Qwen3 moves a <think> part).
            std::string core = contents[k].substr(contents[k].rfind("</think>") == std::string::npos
                                                      ? 0 : contents[k].rfind("</think>") + 8);
            core.erase(0, core.find_first_not_of(" \t\r\n"));
            core.erase(core.find_last_not_of(" \t\r\n") + 1);
            EXPECT_NE(s.find(core), std::string::npos) << s << " lacks " << core;
            outside.erase(a, b - a);
        }
        for (const auto & content : contents) {
            if (content.size() > 3) {
                EXPECT_EQ(outside.find(content), std::string::npos) << content;
            }
        }
        ++checked;
    }
    EXPECT_GE(checked, 15);
}

TEST(Instruct, Qwen3TokensTrainExactlyTheAssistantTurns) {
    const auto tok = make_tokenizer(kQwen3, "");
    const ChatFormat f = load_chat_format(kQwen3, *tok, "auto");
    EXPECT_EQ(f.end_of_turn, "<|im_end|>");
    EXPECT_EQ(f.end_of_turn_id, 151645);
    EXPECT_EQ(f.pad_id, 151643);   // <|endoftext|>
    const ojson rec = {{"messages", conversation()}};
    const Example e = encode_record(rec, f, *tok, "test");
    ASSERT_EQ(e.tokens.size(), e.trained.size());
    std::string all, trained;
    for (size_t i = 0; i < e.tokens.size(); ++i) {
        all += tok->decode_token(e.tokens[i]);
        if (e.trained[i]) trained += tok->decode_token(e.tokens[i]);
    }
    EXPECT_EQ(all, render_chat(f, conversation(), nullptr).text);
    EXPECT_EQ(trained, "Hello! <|im_end|><think>\n\n</think>\n\n4<|im_end|>");
    EXPECT_EQ(e.tokens, tok->encode(all));   // the conversation tokenized whole
}

TEST(Instruct, PromptCompletionAlpacaAndShareGpt) {
    const auto tok = make_tokenizer(kQwen3, "");
    const ChatFormat f = load_chat_format(kQwen3, *tok, "auto");
    auto trained_text = [&](const Example & e) {
        std::string s;
        for (size_t i = 0; i < e.tokens.size(); ++i)
            if (e.trained[i]) s += tok->decode_token(e.tokens[i]);
        return s;
    };
    // Plain strings: prompt + completion + eos (Qwen adds no bos), the completion and eos trained.
    const Example pc = encode_record({{"prompt", "The capital of France is"}, {"completion", " Paris."}}, f, *tok, "t");
    EXPECT_EQ(trained_text(pc), " Paris.<|im_end|>");
    EXPECT_EQ(pc.tokens.back(), 151645);
    const Example al = encode_record({{"instruction", "Name a color."}, {"input", ""}, {"output", "Blue."}}, f, *tok, "t");
    EXPECT_EQ(trained_text(al), "Blue.<|im_end|>");
    EXPECT_EQ(tok->decode(std::vector<int32_t>(al.tokens.begin(), al.tokens.begin() + 6)).substr(0, 18),
              "Below is an instru");
    // Conversational prompt-completion: only the completion's turn trains.
    const ojson conv = conversation();
    ojson prompt = ojson::array(), completion = ojson::array();
    for (size_t i = 0; i < conv.size(); ++i) (i < 4 ? prompt : completion).push_back(conv[i]);
    const Example cpc = encode_record({{"prompt", prompt}, {"completion", completion}}, f, *tok, "t");
    EXPECT_EQ(trained_text(cpc), "<think>\n\n</think>\n\n4<|im_end|>");
    // ShareGPT: human/gpt turns.
    const Example sg = encode_record(
        {{"conversations", ojson::array({{{"from", "human"}, {"value", "Hi"}}, {{"from", "gpt"}, {"value", "Yo"}}})}}, f,
        *tok, "t");
    EXPECT_EQ(trained_text(sg), "<think>\n\n</think>\n\nYo<|im_end|>");
}

TEST(Instruct, BadRecordsAreOneLineNamingTheLine) {
    const auto tok = make_tokenizer(kQwen3, "");
    const ChatFormat f = load_chat_format(kQwen3, *tok, "auto");
    auto error_of = [&](const ojson & r) {
        try {
            encode_record(r, f, *tok, "data.jsonl line 7");
        } catch (const ConfigError & e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_NE(error_of({{"text", "x"}}).find("data.jsonl line 7: expected \"messages\""), std::string::npos);
    EXPECT_NE(error_of({{"messages", "hi"}}).find("non-empty list"), std::string::npos);
    EXPECT_NE(error_of({{"messages", ojson::array({{{"content", "x"}}})}}).find("no \"role\""), std::string::npos);
    EXPECT_NE(error_of({{"prompt", 3}, {"completion", "x"}}).find("\"prompt\" must be a string"), std::string::npos);
    ByteTokenizer bytes;
    const ChatFormat none = load_chat_format("bytes", bytes, "auto");
    EXPECT_FALSE(none.chat);
    try {
        encode_record({{"messages", conversation()}}, none, bytes, "d.jsonl line 1");
        ADD_FAILURE() << "a conversation without a template";
    } catch (const ConfigError & e) {
        EXPECT_NE(std::string(e.what()).find("--chat-template"), std::string::npos);
    }
    EXPECT_THROW(load_chat_format("bytes", bytes, "no-such-template"), ConfigError);
    // A SentencePiece model encodes special tokens as ids only, never from text: no template.
    const std::string sp = "sentencepiece:/nowhere/tokenizer.model";
    EXPECT_THROW(load_chat_format(sp, bytes, "chatml"), ConfigError);
    const ChatFormat spf = load_chat_format(sp, bytes, "auto");
    EXPECT_FALSE(spf.chat);
    try {
        encode_record({{"messages", conversation()}}, spf, bytes, "d.jsonl line 2");
        ADD_FAILURE() << "a conversation with a SentencePiece tokenizer";
    } catch (const ConfigError & e) {
        EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
    }
    // memfit's own ChatML with the bytes tokenizer: the marker comes from the template.
    const ChatFormat chatml = load_chat_format("bytes", bytes, "chatml");
    EXPECT_EQ(chatml.end_of_turn, "<|im_end|>");
}

// A long conversation's turns found from one marked render are the turns found one by one
// (each turn's generation prompt rendered by itself, the definition), for every fixture
// template: the marked search is what makes a 16,000-turn conversation prepare in a second.
TEST(Instruct, MarkedTurnSearchEqualsOneByOne) {
    ByteTokenizer bytes;
    ojson messages = ojson::array({{{"role", "system"}, {"content", "Be brief."}}});
    for (int i = 0; i < 12; ++i) {
        messages.push_back({{"role", "user"}, {"content", "Question " + std::to_string(i) + "?"}});
        messages.push_back({{"role", "assistant"}, {"content", " Answer " + std::to_string(i) + ". "}});
    }
    int compared = 0, marked = 0;
    for (const char * name : {"chatml", "llama3", "llama3_1", "llama3_2", "mistral", "mistral_nemo", "qwen2_5", "qwen3",
                              "deepseek_v3"}) {
        SCOPED_TRACE(name);
        const ChatFormat f = fixture_format(name, bytes);
        RenderedChat fast, slow;
        try {
            slow = render_chat(f, messages, nullptr, 0, TurnSearch::one_by_one);
        } catch (const ConfigError &) {
            EXPECT_THROW(render_chat(f, messages, nullptr), ConfigError);   // the same refusal
            continue;
        }
        fast = render_chat(f, messages, nullptr);
        EXPECT_EQ(fast.text, slow.text);
        EXPECT_EQ(fast.spans, slow.spans);
        EXPECT_EQ(fast.spans.size(), 12u);
        marked += fast.marked;
        if (fast.marked) {
            EXPECT_LE(fast.renders, 8);
        }
        // From a later message on (a prompt-completion record's completion).
        EXPECT_EQ(render_chat(f, messages, nullptr, 9).spans, render_chat(f, messages, nullptr, 9, TurnSearch::one_by_one).spans);
        ++compared;
    }
    EXPECT_GE(compared, 7);
    EXPECT_GE(marked, 5);   // the fast path is the one taken, not the fallback
    // Templates with no end-of-turn text (a blank line, or nothing, after the content): the turn's
    // end is learnt on the first turn and checked on the last two, not found by rendering up to
    // each turn (quadratic in the turns).
    for (const char * source :
         {"{% for m in messages %}{{ m.role }}: {{ m.content }}\n\n{% endfor %}"
          "{% if add_generation_prompt %}assistant: {% endif %}",
          "{% for m in messages %}{% if m.role == 'assistant' %}Bot:{{ m.content }}{% else %}\n{{ m.role }}> "
          "{{ m.content }}\n{% endif %}{% endfor %}{% if add_generation_prompt %}Bot:{% endif %}"}) {
        SCOPED_TRACE(source);
        const ChatFormat f = make_chat_format(source, "plain", TokenizerConfig{}, bytes);
        EXPECT_EQ(f.end_of_turn, "");
        const RenderedChat slow = render_chat(f, messages, nullptr, 0, TurnSearch::one_by_one);
        const RenderedChat fast = render_chat(f, messages, nullptr);
        EXPECT_EQ(fast.spans, slow.spans);
        EXPECT_EQ(fast.spans.size(), 12u);
        EXPECT_TRUE(fast.marked);
        EXPECT_LE(fast.renders, 8);   // whatever the turns; one by one, one or two per turn
        EXPECT_GE(slow.renders, 24);
    }
}
