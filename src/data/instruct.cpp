#include "data/instruct.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <system_error>

#include <fmt/format.h>

#include "core/error.h"
#include "core/paths.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer_config.h"

namespace memfit {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

// The tokenizer_config.json beside a tokenizer.json or tokenizer.model ("" for gpt2 and bytes).
std::string config_beside(const std::string & kind) {
    std::string file = is_tokenizer_json(kind) ? kind : sentencepiece_model_path(kind);
    if (file.empty()) return {};
    return (fs::path(file).parent_path() / "tokenizer_config.json").string();
}

// The id of a special token's text, when it is exactly one token (-1 otherwise).
int32_t single_id(const Tokenizer & tok, const std::string & text) {
    if (text.empty()) return -1;
    const auto ids = tok.encode(text);
    return ids.size() == 1 ? ids[0] : -1;
}

ojson chat_vars(const ChatFormat & f, const ojson & messages, const ojson & tools, bool generation_prompt) {
    ojson v = ojson::object();
    v["messages"] = messages;
    v["add_generation_prompt"] = generation_prompt;
    if (!f.bos_token.empty()) v["bos_token"] = f.bos_token;
    if (!f.eos_token.empty()) v["eos_token"] = f.eos_token;
    if (!tools.is_null()) v["tools"] = tools;
    return v;
}

ojson first(const ojson & messages, size_t n) {
    ojson out = ojson::array();
    for (size_t i = 0; i < n; ++i) out.push_back(messages[i]);
    return out;
}

// Where assistant turn k starts in `text` (the whole conversation): after the generation prompt
// the template renders for messages[0, k). A template that renders earlier turns differently
// once later ones follow (Mistral's puts the system message into the last user turn) fails that
// test; the turn then starts where a marker in place of its content lands, when the text before
// the marker is the conversation's own.
size_t turn_start(const ChatFormat & f, const ojson & messages, const ojson & tools, size_t k,
                  const std::string & text) {
    const std::string before = f.chat->render(chat_vars(f, first(messages, k), tools, true));
    if (text.starts_with(before)) return before.size();
    constexpr const char * kMarker = "<<memfit turn start>>";
    ojson marked = messages;
    marked[k]["content"] = kMarker;
    const std::string m = f.chat->render(chat_vars(f, marked, tools, false));
    const size_t at = m.find(kMarker);
    if (at != std::string::npos && text.compare(0, at, m, 0, at) == 0) return at;
    throw ConfigError(fmt::format("the chat template renders the conversation before assistant message {} differently "
                                  "when more messages follow, so the turn cannot be found in it",
                                  k));
}

// Every assistant turn's start and content's end in `text` (the whole conversation) from one more
// render, so that a conversation of n turns costs two renders, not n: each assistant message's
// content is wrapped in markers of its own; where the markers land, less the markers before them,
// are the turns' starts and their contents' ends, when taking the markers out gives `text` back
// exactly. nullopt when it does not (a template that looks into the content), when content holds
// a marker's byte, or is not a string: the caller then finds the turns one by one (turn_start).
struct MarkedTurns {
    std::vector<size_t> starts, content_ends;   // per message; npos for those not the assistant's
};
std::optional<MarkedTurns> marked_turns(const ChatFormat & f, const ojson & messages, const ojson & tools,
                                        const std::string & text) {
    constexpr char kOpen = '\x1e', kEnd = '\x1d', kClose = '\x1f';
    ojson marked = messages;
    for (size_t k = 0; k < messages.size(); ++k) {
        if (messages[k].value("role", "") != "assistant") continue;
        if (!messages[k].contains("content") || !messages[k]["content"].is_string()) return std::nullopt;
        const std::string & c = messages[k]["content"].get_ref<const std::string &>();
        if (c.find_first_of(std::string{kOpen, kEnd, kClose}) != std::string::npos) return std::nullopt;
        const std::string id = std::to_string(k);
        marked[k]["content"] = kOpen + id + kClose + c + kEnd + id + kClose;
    }
    const std::string m = f.chat->render(chat_vars(f, marked, tools, false));
    MarkedTurns t{std::vector<size_t>(messages.size(), std::string::npos),
                  std::vector<size_t>(messages.size(), std::string::npos)};
    size_t plain = 0;   // bytes of `text` matched so far
    for (size_t i = 0; i < m.size();) {
        if (m[i] != kOpen && m[i] != kEnd) {
            if (plain >= text.size() || text[plain] != m[i]) return std::nullopt;
            ++plain, ++i;
            continue;
        }
        const size_t close = m.find(kClose, i);
        if (close == std::string::npos || close == i + 1 || close - i > 12) return std::nullopt;
        const size_t k = std::stoul(m.substr(i + 1, close - i - 1));
        std::vector<size_t> & at = m[i] == kOpen ? t.starts : t.content_ends;
        if (k >= at.size() || at[k] != std::string::npos) return std::nullopt;   // a marker rendered twice
        at[k] = plain;
        i = close + 1;
    }
    if (plain != text.size()) return std::nullopt;
    for (size_t k = 0; k < messages.size(); ++k)
        if (messages[k].value("role", "") == "assistant" &&
            (t.starts[k] == std::string::npos || t.content_ends[k] == std::string::npos || t.content_ends[k] < t.starts[k]))
            return std::nullopt;
    return t;
}

// Where assistant turn k, starting at `begin`, ends in `text` by rendering the conversation up to
// it (for a template with no end-of-turn text): where that render and `text` part.
size_t turn_end_one_by_one(const ChatFormat & f, const ojson & messages, const ojson & tools, size_t k, size_t begin,
                           const std::string & text) {
    const std::string upto = f.chat->render(chat_vars(f, first(messages, k + 1), tools, false));
    size_t end = begin;
    while (end < upto.size() && end < text.size() && upto[end] == text[end]) ++end;
    return end;
}

// The text after the assistant's content in a one-turn probe: what closes a turn.
std::string probe_end_of_turn(const ChatFormat & f) {
    constexpr const char * kProbe = "memfit-probe";
    const ojson user = ojson::array({ojson{{"role", "user"}, {"content", "Hi"}}});
    ojson both = user;
    both.push_back(ojson{{"role", "assistant"}, {"content", kProbe}});
    try {
        const std::string p = f.chat->render(chat_vars(f, user, nullptr, true));
        const std::string whole = f.chat->render(chat_vars(f, both, nullptr, false));
        const size_t at = whole.find(kProbe, whole.starts_with(p) ? p.size() : 0);
        if (at == std::string::npos) return {};
        std::string after = whole.substr(at + std::char_traits<char>::length(kProbe));
        if (!f.eos_token.empty() && after.starts_with(f.eos_token)) return f.eos_token;
        while (!after.empty() && std::isspace(static_cast<unsigned char>(after.back()))) after.pop_back();
        return after;
    } catch (const ConfigError &) {
        return {};   // a template that refuses the probe (it wants a system turn, say): no marker
    }
}

// Stanford Alpaca's prompt (the published format), with or without an input.
std::string alpaca_prompt(const std::string & instruction, const std::string & input) {
    if (input.empty())
        return "Below is an instruction that describes a task. Write a response that appropriately completes the "
               "request.\n\n### Instruction:\n" + instruction + "\n\n### Response:\n";
    return "Below is an instruction that describes a task, paired with an input that provides further context. "
           "Write a response that appropriately completes the request.\n\n### Instruction:\n" + instruction +
           "\n\n### Input:\n" + input + "\n\n### Response:\n";
}

// A list of messages as the template takes them: objects with a string role; ShareGPT's
// {"from", "value"} turned into {"role", "content"}.
ojson checked_messages(const ojson & list, const std::string & where, const char * field) {
    if (!list.is_array() || list.empty())
        throw ConfigError(fmt::format("{}: \"{}\" must be a non-empty list of messages", where, field));
    ojson out = ojson::array();
    for (size_t i = 0; i < list.size(); ++i) {
        const ojson & m = list[i];
        if (!m.is_object()) throw ConfigError(fmt::format("{}: {}[{}] is not an object", where, field, i));
        if (m.contains("from") && !m.contains("role")) {   // ShareGPT
            const std::string from = m["from"].is_string() ? m["from"].get<std::string>() : "";
            const std::string role = from == "human" || from == "user" ? "user"
                                     : from == "gpt" || from == "assistant" ? "assistant"
                                     : from == "system" ? "system" : "";
            if (role.empty())
                throw ConfigError(fmt::format("{}: {}[{}] is from '{}'; ShareGPT turns are from human, gpt or system",
                                              where, field, i, from));
            out.push_back(ojson{{"role", role}, {"content", m.value("value", ojson())}});
            continue;
        }
        if (!m.contains("role") || !m["role"].is_string())
            throw ConfigError(fmt::format("{}: {}[{}] has no \"role\" string", where, field, i));
        out.push_back(m);
    }
    return out;
}

std::string text_field(const ojson & r, const char * key, const std::string & where, bool required = true) {
    if (!r.contains(key) || r[key].is_null()) {
        if (required) throw ConfigError(fmt::format("{}: \"{}\" is missing", where, key));
        return {};
    }
    if (!r[key].is_string()) throw ConfigError(fmt::format("{}: \"{}\" must be a string", where, key));
    return r[key].get<std::string>();
}

// A plain prompt and completion: [bos] prompt completion [eos], the completion and eos trained.
Example encode_pair(const std::string & prompt, const std::string & completion, const ChatFormat & f,
                    const Tokenizer & tok) {
    const std::string text = prompt + completion;
    Example e = tokenize_spans(tok, text, {{prompt.size(), text.size()}});
    if (f.add_bos && f.bos_id >= 0) {
        e.tokens.insert(e.tokens.begin(), f.bos_id);
        e.trained.insert(e.trained.begin(), 0);
    }
    if (f.eos_id >= 0) {
        e.tokens.push_back(f.eos_id);
        e.trained.push_back(1);
    }
    return e;
}

}  // namespace

ChatFormat load_chat_format(const std::string & kind, const Tokenizer & tok, const std::string & choice) {
    const std::string config = config_beside(kind);
    std::error_code ec;
    TokenizerConfig tc;
    if (!config.empty() && fs::is_regular_file(config, ec)) tc = read_tokenizer_config(config);
    else if (tok.eot_id() >= 0) tc.eos_token = tok.decode({tok.eot_id()});
    std::string source, name = "none";
    if (!sentencepiece_model_path(kind).empty()) {   // its special tokens are ids, never text
        const std::string why = "a SentencePiece tokenizer.model does not encode a chat template's special tokens "
                                "from their text; use the model's tokenizer.json";
        if (choice != "auto" && choice != "none") throw ConfigError(fmt::format("--chat-template {}: {}", choice, why));
        ChatFormat f = make_chat_format("", name, tc, tok);
        f.why_none = why;
        return f;
    }
    if (choice == "auto") {
        source = tc.chat_template;
        if (!source.empty()) name = config;
    } else if (choice != "none") {
        source = builtin_chat_template(choice);
        name = choice;
        if (source.empty()) {
            if (!fs::is_regular_file(choice, ec))
                throw ConfigError(fmt::format("--chat-template '{}': expected auto, none, chatml, llama3, mistral or a "
                                              "Jinja file", choice));
            source = read_whole_file(choice, "a chat template", "pass a Jinja file, or chatml, llama3 or mistral");
        }
    }
    return make_chat_format(source, name, tc, tok);
}

ChatFormat make_chat_format(const std::string & source, const std::string & name, const TokenizerConfig & tc,
                            const Tokenizer & tok) {
    ChatFormat f;
    f.name = name;
    f.bos_token = tc.bos_token;
    f.eos_token = tc.eos_token;
    f.add_bos = tc.add_bos_token;
    if (!source.empty()) f.chat = std::make_shared<const ChatTemplate>(source);
    f.bos_id = single_id(tok, f.bos_token);
    f.eos_id = f.eos_token.empty() ? tok.eot_id() : single_id(tok, f.eos_token);
    const int32_t pad = single_id(tok, tc.pad_token);
    f.pad_id = pad >= 0 ? pad : std::max(f.eos_id, 0);
    if (f.chat) {
        f.end_of_turn = probe_end_of_turn(f);
        f.end_of_turn_id = single_id(tok, f.end_of_turn);
    }
    return f;
}

RenderedChat render_chat(const ChatFormat & f, const ojson & messages, const ojson & tools, size_t train_from,
                         TurnSearch search) {
    MF_ASSERT(f.chat);
    RenderedChat rc;
    rc.text = f.chat->render(chat_vars(f, messages, tools, false));
    rc.renders = 1;
    // The one-by-one searches, each a render of the conversation up to a turn (counted).
    const auto start_of = [&](size_t k) {
        ++rc.renders;
        return turn_start(f, messages, tools, k, rc.text);
    };
    const auto end_of = [&](size_t k, size_t begin) {
        ++rc.renders;
        return turn_end_one_by_one(f, messages, tools, k, begin, rc.text);
    };
    // The turns' starts from one marked render (two renders for any number of turns, not one per
    // turn), when it agrees with the one-by-one search on the first and the next-to-last trained
    // turns; the last one, which templates treat apart (Qwen3 opens an empty think block there),
    // is found one by one whatever the markers say. Else every turn one by one.
    std::vector<size_t> trained;
    for (size_t k = train_from; k < messages.size(); ++k)
        if (messages[k].value("role", "") == "assistant") trained.push_back(k);
    std::optional<MarkedTurns> marks;
    if (trained.size() > 2 && search == TurnSearch::marked) {
        marks = marked_turns(f, messages, tools, rc.text);
        ++rc.renders;
    }
    if (marks) {
        for (const size_t k : {trained.front(), trained[trained.size() - 2]})
            if (marks && marks->starts[k] != start_of(k)) marks.reset();   // (a reset one is not read again)
        if (marks) marks->starts[trained.back()] = start_of(trained.back());
    }
    // No end-of-turn text: a turn ends a fixed number of bytes after its content, learnt on the
    // first trained turn and checked on the next-to-last and the last; else each turn one by one.
    std::optional<size_t> after_content;
    if (marks && f.end_of_turn.empty()) {
        const auto one_by_one = [&](size_t k) { return end_of(k, marks->starts[k]); };
        const size_t k0 = trained.front();
        const size_t end0 = one_by_one(k0);
        if (end0 >= marks->content_ends[k0]) after_content = end0 - marks->content_ends[k0];
        for (const size_t k : {trained[trained.size() - 2], trained.back()})
            if (after_content && one_by_one(k) != std::min(rc.text.size(), marks->content_ends[k] + *after_content))
                after_content.reset();
    }
    rc.marked = marks.has_value() && (!f.end_of_turn.empty() || after_content.has_value());
    size_t done = 0;   // the end of the last span
    for (const size_t k : trained) {
        const size_t begin = std::max(marks ? marks->starts[k] : start_of(k), done);
        size_t end = rc.text.size();
        if (!f.end_of_turn.empty()) {
            const size_t at = rc.text.find(f.end_of_turn, begin);
            if (at != std::string::npos) end = at + f.end_of_turn.size();
        } else if (after_content) {
            end = std::min(rc.text.size(), marks->content_ends[k] + *after_content);
        } else {
            end = end_of(k, begin);
        }
        if (end > begin) rc.spans.emplace_back(begin, end);
        done = end;
    }
    return rc;
}

std::string chat_prompt(const ChatFormat & f, const std::string & system, const std::string & user) {
    MF_ASSERT(f.chat);
    ojson messages = ojson::array();
    if (!system.empty()) messages.push_back(ojson{{"role", "system"}, {"content", system}});
    messages.push_back(ojson{{"role", "user"}, {"content", user}});
    return chat_prompt(f, messages);
}

std::string chat_prompt(const ChatFormat & f, const ojson & messages) {
    MF_ASSERT(f.chat);
    return f.chat->render(chat_vars(f, messages, nullptr, true));
}

Example tokenize_spans(const Tokenizer & tok, const std::string & text,
                       const std::vector<std::pair<size_t, size_t>> & spans_in) {
    // Asked in increasing byte order (each token's first byte): a sweep over the sorted spans, not
    // a scan of all of them per token (which was quadratic in a conversation's turns).
    std::vector<std::pair<size_t, size_t>> spans = spans_in;
    std::sort(spans.begin(), spans.end());
    size_t next = 0;
    auto trained_at = [&](size_t byte) {
        while (next < spans.size() && spans[next].second <= byte) ++next;
        for (size_t j = next; j < spans.size() && spans[j].first <= byte; ++j)
            if (byte < spans[j].second) return true;
        return false;
    };
    Example e;
    e.tokens = tok.encode(text);
    // Each token's first byte, from the bytes it decodes to; exact when they add up to the text.
    std::string joined;
    std::vector<size_t> starts;
    for (const int32_t id : e.tokens) {
        starts.push_back(joined.size());
        joined += tok.decode_token(id);
    }
    if (joined == text) {
        for (const size_t s : starts) e.trained.push_back(trained_at(s) ? 1 : 0);
        return e;
    }
    // A tokenizer whose tokens do not give the bytes back one by one (SentencePiece, or text that
    // normalisation changes): the pieces between span edges tokenized one by one.
    std::vector<size_t> cuts{0, text.size()};
    for (const auto & [a, b] : spans) cuts.insert(cuts.end(), {a, b});
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    e.tokens.clear();
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
        const auto ids = tok.encode(std::string_view(text).substr(cuts[i], cuts[i + 1] - cuts[i]));
        e.tokens.insert(e.tokens.end(), ids.begin(), ids.end());
        e.trained.insert(e.trained.end(), ids.size(), trained_at(cuts[i]) ? 1 : 0);
    }
    return e;
}

Example encode_record(const ojson & r, const ChatFormat & f, const Tokenizer & tok, const std::string & where) {
    if (!r.is_object()) throw ConfigError(fmt::format("{}: expected a JSON object", where));
    auto need_template = [&] {
        if (!f.chat)
            throw ConfigError(fmt::format("{}: a conversation needs a chat template and the tokenizer has none; {}",
                                          where, f.why_none.empty() ? "pass --chat-template chatml, llama3, mistral or "
                                                                      "a Jinja file" : f.why_none));
    };
    auto chat = [&](const ojson & messages, size_t train_from) {
        need_template();
        try {
            const RenderedChat rc = render_chat(f, messages, r.value("tools", ojson()), train_from);
            return tokenize_spans(tok, rc.text, rc.spans);
        } catch (const ConfigError & e) {
            throw ConfigError(fmt::format("{}: {}", where, e.what()));
        }
    };
    if (r.contains("messages") || r.contains("conversations")) {
        const char * key = r.contains("messages") ? "messages" : "conversations";
        return chat(checked_messages(r[key], where, key), 0);
    }
    if (r.contains("prompt") && r.contains("completion")) {
        if (r["prompt"].is_array() && r["completion"].is_array()) {   // TRL's conversational prompt-completion
            ojson messages = checked_messages(r["prompt"], where, "prompt");
            const size_t from = messages.size();
            for (const auto & m : checked_messages(r["completion"], where, "completion")) messages.push_back(m);
            return chat(messages, from);
        }
        return encode_pair(text_field(r, "prompt", where), text_field(r, "completion", where), f, tok);
    }
    if (r.contains("instruction") && r.contains("output"))
        return encode_pair(alpaca_prompt(text_field(r, "instruction", where), text_field(r, "input", where, false)),
                           text_field(r, "output", where), f, tok);
    std::string keys;
    for (const auto & [k, v] : r.items()) keys += (keys.empty() ? "" : ", ") + k;
    throw ConfigError(fmt::format("{}: expected \"messages\", \"conversations\", \"prompt\" and \"completion\", or "
                                  "\"instruction\" and \"output\"; the record has {}",
                                  where, keys.empty() ? std::string("no keys") : keys));
}

namespace {

// What a JSON value is, for error messages.
const char * json_kind(const ojson & v) {
    if (v.is_string()) return "a string";
    if (v.is_array()) return "a list";
    if (v.is_object()) return "an object";
    if (v.is_null()) return "null";
    if (v.is_boolean()) return "true or false";
    return "a number";
}

// One side as a prompt-completion record (or a conversation, when the prompt is an empty list),
// with the record's tools.
ojson side_record(const ojson & prompt, const ojson & completion, const ojson & r) {
    ojson side = ojson::object();
    if (prompt.is_array() && prompt.empty()) {
        side["messages"] = completion;
    } else {
        side["prompt"] = prompt;
        side["completion"] = completion;
    }
    if (r.contains("tools")) side["tools"] = r["tools"];
    return side;
}

}  // namespace

PreferenceSides preference_sides(const ojson & r, const std::string & where) {
    if (!r.is_object()) throw ConfigError(fmt::format("{}: expected a JSON object", where));
    for (const char * key : {"chosen", "rejected"}) {
        if (r.contains(key) && !r[key].is_null()) continue;
        std::string keys;
        for (const auto & [k, v] : r.items()) keys += (keys.empty() ? "" : ", ") + k;
        throw ConfigError(fmt::format("{}: a preference record needs \"chosen\" and \"rejected\"; this one has no "
                                      "\"{}\" (its keys: {}); expected {{\"prompt\", \"chosen\", \"rejected\"}} "
                                      "(TRL's DPO forms)", where, key, keys.empty() ? std::string("none") : keys));
    }
    const ojson & chosen = r["chosen"];
    const ojson & rejected = r["rejected"];
    const bool has_prompt = r.contains("prompt") && !r["prompt"].is_null();
    // All strings (the standard form) or all lists of messages (the conversational form).
    std::vector<std::pair<const char *, const ojson *>> fields;
    if (has_prompt) fields.emplace_back("prompt", &r["prompt"]);
    fields.emplace_back("chosen", &chosen);
    fields.emplace_back("rejected", &rejected);
    const bool text = fields.front().second->is_string();
    for (const auto & [key, v] : fields) {
        if (text ? v->is_string() : v->is_array()) continue;
        throw ConfigError(fmt::format("{}: {} must all be strings (TRL's standard form) or all lists of messages (its "
                                      "conversational form); here \"{}\" is {} and \"{}\" is {}", where,
                                      has_prompt ? "\"prompt\", \"chosen\" and \"rejected\""
                                                 : "\"chosen\" and \"rejected\"",
                                      fields.front().first, json_kind(*fields.front().second), key, json_kind(*v)));
    }
    if (!text)
        for (const auto & [key, v] : fields)
            if (v->empty())
                throw ConfigError(fmt::format("{}: \"{}\" is an empty list; it must hold at least one message{}", where,
                                              key, std::string(key) == "prompt" ? " (or leave \"prompt\" out)" : ""));
    if (has_prompt) return {side_record(r["prompt"], chosen, r), side_record(r["prompt"], rejected, r)};
    if (text)
        throw ConfigError(fmt::format("{}: \"chosen\" and \"rejected\" are strings without a \"prompt\"; where a "
                                      "prompt ends inside text is a guess memfit does not make: add an explicit "
                                      "\"prompt\" (or give lists of messages, whose common first messages are the "
                                      "prompt)", where));
    // Implicit prompt: the messages both sides start with (TRL's extract_prompt).
    size_t common = 0;
    while (common < chosen.size() && common < rejected.size() && chosen[common] == rejected[common]) ++common;
    ojson prompt = ojson::array(), rest_c = ojson::array(), rest_r = ojson::array();
    for (size_t i = 0; i < common; ++i) prompt.push_back(chosen[i]);
    for (size_t i = common; i < chosen.size(); ++i) rest_c.push_back(chosen[i]);
    for (size_t i = common; i < rejected.size(); ++i) rest_r.push_back(rejected[i]);
    return {side_record(prompt, rest_c, r), side_record(prompt, rest_r, r)};
}

PreferencePair encode_preference(const ojson & r, const ChatFormat & f, const Tokenizer & tok,
                                 const std::string & where) {
    const PreferenceSides s = preference_sides(r, where);
    const auto side = [&](const ojson & rec) {
        // The common messages cover this side whole: nothing of its own to train.
        if (rec.contains("completion") && rec["completion"].is_array() && rec["completion"].empty()) return Example{};
        return encode_record(rec, f, tok, where);
    };
    return {side(s.chosen), side(s.rejected)};
}

}  // namespace memfit
