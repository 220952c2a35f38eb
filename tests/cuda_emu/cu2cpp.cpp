// cu2cpp IN OUT: rewrites a CUDA source so that a host C++ compiler builds it against the CUDA
// emulator (emu.h). Two constructs are not C++ and are rewritten; everything else is kept:
//   kernel<...><<<grid, block, smem, stream>>>(args);
//     -> ::emu::launch([&] { kernel<...>(args); }, grid, block, smem, stream);
//   extern __shared__ <attributes> T name[];
//     -> T * const name = reinterpret_cast<T *>(::emu::dynamic_shared());
// A #line directive keeps compiler messages pointing at the original file.
#include <cctype>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>

namespace {

[[noreturn]] void die(const std::string & file, const std::string & why) {
    std::cerr << "cu2cpp: " << file << ": " << why << "\n";
    std::exit(1);
}

bool ident(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Start of the kernel expression that ends just before position `end` (exclusive): an
// identifier, possibly qualified (a::b), possibly followed by template arguments <...>.
size_t kernel_start(const std::string & s, size_t end, const std::string & file) {
    size_t i = end;
    while (i > 0 && std::isspace(static_cast<unsigned char>(s[i - 1]))) --i;
    for (;;) {
        if (i > 0 && s[i - 1] == '>') {   // template arguments: match <> (and () inside)
            int depth = 0;
            do {
                --i;
                if (s[i] == '>' || s[i] == ')') ++depth;
                else if (s[i] == '<' || s[i] == '(') --depth;
            } while (i > 0 && depth > 0);
            if (depth != 0) die(file, "unbalanced template arguments before <<<");
        }
        const size_t id_end = i;
        while (i > 0 && ident(s[i - 1])) --i;
        if (i == id_end) die(file, "no kernel name before <<<");
        if (i >= 2 && s[i - 1] == ':' && s[i - 2] == ':') {
            i -= 2;
            continue;
        }
        // `template` keyword or `.`/`->` member access are not used for kernels here.
        return i;
    }
}

// Position just past the parenthesised list that starts at `open` (s[open] == '(').
size_t match_parens(const std::string & s, size_t open, const std::string & file) {
    int depth = 0;
    for (size_t i = open; i < s.size(); ++i) {
        if (s[i] == '(') ++depth;
        else if (s[i] == ')' && --depth == 0) return i + 1;
    }
    die(file, "unbalanced kernel arguments after >>>");
}

std::string rewrite_launches(std::string s, const std::string & file) {
    for (size_t at = s.find("<<<"); at != std::string::npos; at = s.find("<<<", at)) {
        const size_t cfg_end = s.find(">>>", at);
        if (cfg_end == std::string::npos) die(file, "<<< without >>>");
        const size_t k0 = kernel_start(s, at, file);
        size_t open = cfg_end + 3;
        while (open < s.size() && std::isspace(static_cast<unsigned char>(s[open]))) ++open;
        if (open >= s.size() || s[open] != '(') die(file, "no argument list after >>>");
        const size_t close = match_parens(s, open, file);
        const std::string kernel = s.substr(k0, at - k0);
        const std::string cfg = s.substr(at + 3, cfg_end - at - 3);
        const std::string call = "::emu::launch([&] { " + kernel + s.substr(open, close - open) + "; }, " + cfg + ")";
        s.replace(k0, close - k0, call);
        at = k0 + call.size();
    }
    return s;
}

std::string rewrite_dynamic_shared(const std::string & s) {
    static const std::regex re(R"(extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?([A-Za-z_][\w\s:]*?)\s+(\w+)\s*\[\s*\]\s*;)");
    return std::regex_replace(s, re, "$1 * const $2 = reinterpret_cast<$1 *>(::emu::dynamic_shared());");
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc != 3) {
        std::cerr << "usage: cu2cpp IN OUT\n";
        return 2;
    }
    std::ifstream in(argv[1], std::ios::binary);
    if (!in) die(argv[1], "cannot read");
    std::stringstream buf;
    buf << in.rdbuf();
    const std::string out_text = "#line 1 \"" + std::string(argv[1]) + "\"\n" +
                                 rewrite_dynamic_shared(rewrite_launches(buf.str(), argv[1]));
    const std::string tmp = std::string(argv[2]) + ".tmp";
    {
        std::ofstream out(tmp, std::ios::binary);
        out << out_text;
        if (!out) die(argv[2], "cannot write");
    }
    if (std::rename(tmp.c_str(), argv[2]) != 0) die(argv[2], "cannot rename into place");
    return 0;
}
