// The lexer of memfit's Jinja interpreter (chat_template.h): a template's text as jinja2 3.1's
// lexer splits it with trim_blocks and lstrip_blocks on (transformers' settings). Newlines are
// normalised to "\n" and one trailing newline is dropped (keep_trailing_newline off); '-' after
// an opening or before a closing delimiter strips the whitespace on that side; '+' keeps it
// (lstrip_blocks at an opening, trim_blocks at a closing); comments are dropped; a
// {% raw %}...{% endraw %} block is text. Internal to src/tokenizer/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace memfit::jinja {

enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };

struct Token {
    Tok kind = Tok::End;
    std::string text;   // Text: the text; Name: the name; String: the value, escapes done; Op: the operator
    int line = 1;       // where the token starts
    int64_t i = 0;      // Int
    double f = 0;       // Float
};

// The tokens, ending with one Tok::End. FormatError "chat template line N: ..." for what does
// not lex (an unclosed tag, comment or string, an unknown character, unbalanced brackets).
std::vector<Token> lex(const std::string & source);

// "chat template line N: what": the one line every syntax error is.
[[noreturn]] void syntax_error(int line, const std::string & what);

}  // namespace memfit::jinja
