// Instruction data: JSON lines of conversations or prompt/completion pairs, turned into tokens
// and a loss mask (token file version 2, data/token_file.h), so that the loss counts only what
// the model should learn to write: the assistant's turns, or the completion.
//
// Records (one JSON object per line; blank lines are skipped):
//   {"messages": [{"role", "content"}, ...]}     conversations (OpenAI / TRL); "tools" passed on
//   {"conversations": [{"from", "value"}, ...]}  ShareGPT (human -> user, gpt -> assistant)
//   {"prompt": "...", "completion": "..."}        TRL's prompt-completion; prompt and completion
//                                                 may instead be lists of messages (TRL's
//                                                 conversational form: the completion's turns train)
//   {"instruction", "input", "output"}            Alpaca: the Stanford Alpaca prompt, then output
// and, for preference data (DPO), {"prompt", "chosen", "rejected"} (encode_preference below).
// A record without any trained token (no assistant turn) is left out by `memfit prepare`.
// A conversation is rendered with the chat template (tokenizer/chat_template.h) and tokenized
// whole (the tokens `apply_chat_template(..., tokenize=True)` gives); an assistant turn trains
// from the end of the generation prompt that the template renders before it (so a template's
// own scaffolding there, such as Qwen3's empty <think></think>, trains too) up to and including
// its end-of-turn marker. A plain prompt-completion pair is [bos if add_bos_token] prompt
// completion [eos], tokenized together; the completion and eos train.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_config.h"

namespace memfit {

// How records become text: the chat template (null: conversations are refused), the special
// tokens' text and ids, and what ends an assistant turn.
struct ChatFormat {
    std::shared_ptr<const ChatTemplate> chat;
    std::string name;                 // where the template came from: tokenizer_config.json, chatml, a file
    std::string bos_token, eos_token; // as the template sees them ("": undefined there)
    bool add_bos = false;             // prompt-completion pairs start with bos
    int32_t bos_id = -1, eos_id = -1, pad_id = 0;
    std::string end_of_turn;          // the text that closes an assistant turn ("" when the template has none)
    int32_t end_of_turn_id = -1;      // its id when it is one token (generation stops there)
    std::string why_none;             // no template: why ("" when there is just none)
};

// The format for tokenizer `kind` (make_tokenizer's kinds) and `choice`:
//   auto     the chat_template of the tokenizer_config.json beside a tokenizer.json or
//            tokenizer.model, if it has one; else none
//   none     no template (prompt-completion and Alpaca records only)
//   chatml | llama3 | mistral   memfit's own (builtin_chat_template)
//   PATH     a Jinja file
// The special tokens come from that tokenizer_config.json when there is one. ConfigError for an
// unknown name, or for a template with a SentencePiece tokenizer.model (it does not encode the
// template's special tokens from their text: auto leaves such a tokenizer without a template);
// IoError / FormatError for unreadable or malformed files.
ChatFormat load_chat_format(const std::string & kind, const Tokenizer & tok, const std::string & choice);
// The format of template `source` ("": none; FormatError when it does not compile) with the
// special tokens of `tc` (its chat_template is not read), named `name`.
ChatFormat make_chat_format(const std::string & source, const std::string & name, const TokenizerConfig & tc,
                            const Tokenizer & tok);

// One record's tokens and which of them train (the loss counts predicting token i when trained[i]).
struct Example {
    std::vector<int32_t> tokens;
    std::vector<uint8_t> trained;
};

// The text a conversation renders to, and the [begin, end) byte spans of it that train.
struct RenderedChat {
    std::string text;
    std::vector<std::pair<size_t, size_t>> spans;
    bool marked = false;   // the turns came from the marked render (TurnSearch below)
    int renders = 0;       // the template's renders it took (a few, whatever the turns, when marked)
};
// messages: a JSON array; turns from message `train_from` on train (0: every assistant turn).
// ConfigError when the template fails or renders a turn's generation prompt differently from the
// conversation (then no turn boundary can be found).
// How the turns are found: `marked` renders the conversation once more with a marker before each
// assistant message's content (linear in the turns), checked against `one_by_one` (each turn's
// generation prompt rendered by itself, quadratic: 16,000 turns took minutes) on some of them and
// falling back to it where they disagree; `one_by_one` is the reference the tests hold it to.
enum class TurnSearch { marked, one_by_one };
RenderedChat render_chat(const ChatFormat & fmt, const nlohmann::ordered_json & messages,
                         const nlohmann::ordered_json & tools, size_t train_from = 0,
                         TurnSearch search = TurnSearch::marked);

// The text a model is prompted with for one user turn (after an optional system message),
// generation prompt included. ConfigError when the template refuses it.
std::string chat_prompt(const ChatFormat & fmt, const std::string & system, const std::string & user);
// The same for a whole conversation (a JSON array of {role, content}), generation prompt after it.
std::string chat_prompt(const ChatFormat & fmt, const nlohmann::ordered_json & messages);

// A record (the parsed line) -> tokens and mask. ConfigError naming what is wrong (`where`:
// "data.jsonl line 7" for messages).
Example encode_record(const nlohmann::ordered_json & record, const ChatFormat & fmt, const Tokenizer & tok,
                      const std::string & where);

// Preference data (TRL's DPOTrainer forms), one record a pair of answers to one prompt:
//   {"prompt": "...", "chosen": "...", "rejected": "..."}           standard, explicit prompt
//   {"prompt": [messages], "chosen": [messages], "rejected": [messages]}   conversational
//   {"chosen": [messages], "rejected": [messages]}                  implicit prompt: the messages
//                                                                   both lists start with
// Each side is the prompt-completion record {"prompt", "completion": chosen or rejected} (with
// the record's "tools"), so that its mask is encode_record's: only the side's completion trains.
// An implicit prompt that is empty gives {"messages": side} (every assistant turn trains); a side
// that the common messages cover whole gives {"prompt", "completion": []} (nothing to train).
// ConfigError (naming `where`, with a hint) for a missing "chosen" or "rejected", types that are
// not all strings or all lists, an empty list, or strings without a "prompt" (memfit does not
// guess where a prompt ends inside text).
struct PreferenceSides {
    nlohmann::ordered_json chosen, rejected;
};
PreferenceSides preference_sides(const nlohmann::ordered_json & record, const std::string & where);

// Both sides' tokens and masks (encode_record of preference_sides'; a side with nothing left to
// train is an empty Example). The caller leaves out a pair either of whose sides trains nothing.
struct PreferencePair {
    Example chosen, rejected;
};
PreferencePair encode_preference(const nlohmann::ordered_json & record, const ChatFormat & fmt, const Tokenizer & tok,
                                 const std::string & where);

// `text`'s tokens, each trained when its first byte lies in one of `spans` (sorted, disjoint).
Example tokenize_spans(const Tokenizer & tok, const std::string & text,
                       const std::vector<std::pair<size_t, size_t>> & spans);

}  // namespace memfit
