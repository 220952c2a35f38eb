#include "tokenizer/chat_template.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/jinja_ast.h"

namespace memfit {

struct ChatTemplate::Compiled {
    std::string source;
    jinja::Body body;
};

namespace {

using jinja::Value;

Value to_value(const nlohmann::ordered_json & j) {
    switch (j.type()) {
        case nlohmann::ordered_json::value_t::null: return Value::none();
        case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
        case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
        case nlohmann::ordered_json::value_t::number_unsigned: {
            const auto u = j.get<uint64_t>();
            return u <= uint64_t(INT64_MAX) ? Value::integer(int64_t(u)) : Value::number(double(u));
        }
        case nlohmann::ordered_json::value_t::number_float: return Value::number(j.get<double>());
        case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
        case nlohmann::ordered_json::value_t::array: {
            std::vector<Value> items;
            items.reserve(j.size());
            for (const auto & x : j) items.push_back(to_value(x));
            return Value::make_list(std::move(items));
        }
        case nlohmann::ordered_json::value_t::object: {
            jinja::Dict d;
            d.entries.reserve(j.size());
            for (const auto & [k, x] : j.items()) d.entries.emplace_back(Value::string(k), to_value(x));
            return Value::make_dict(std::move(d));
        }
        default: throw ConfigError("chat template: a variable holds JSON binary data, which a template cannot use");
    }
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string & source) {
    auto c = std::make_shared<Compiled>();
    c->source = source;
    c->body = jinja::parse_template(source);
    compiled_ = std::move(c);
}

const std::string & ChatTemplate::source() const { return compiled_->source; }

std::string ChatTemplate::render(const nlohmann::ordered_json & vars, const RenderBudgets & budgets) const {
    if (!vars.is_object()) throw ConfigError("chat template: the variables to render with are not a JSON object");
    const Value v = to_value(vars);
    jinja::Context ctx(*v.dict, budgets);
    std::string out;
    ctx.out = &out;
    try {
        jinja::exec_body(compiled_->body, ctx);
    } catch (const jinja::RenderError & e) {
        if (e.raised) throw ConfigError(fmt::format("chat template: {}", e.what()));
        throw ConfigError(fmt::format("chat template line {}: {}", ctx.line, e.what()));
    }
    return out;
}

std::string builtin_chat_template(const std::string & name) {
    if (name == "chatml")
        return "{%- for message in messages %}\n"
               "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}\n"
               "{%- endfor %}\n"
               "{%- if add_generation_prompt %}\n"
               "{{- '<|im_start|>assistant\\n' }}\n"
               "{%- endif %}\n";
    if (name == "llama3")
        return "{{- bos_token }}\n"
               "{%- for message in messages %}\n"
               "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}\n"
               "{%- endfor %}\n"
               "{%- if add_generation_prompt %}\n"
               "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
               "{%- endif %}\n";
    if (name == "mistral")
        return "{%- if messages and messages[0]['role'] == 'system' %}\n"
               "    {%- set system_message = messages[0]['content'] %}\n"
               "    {%- set loop_messages = messages[1:] %}\n"
               "{%- else %}\n"
               "    {%- set loop_messages = messages %}\n"
               "{%- endif %}\n"
               "{{- bos_token }}\n"
               "{%- for message in loop_messages %}\n"
               "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n"
               "        {{- raise_exception('After the optional system message, conversation roles must alternate "
               "user/assistant/user/assistant/...') }}\n"
               "    {%- endif %}\n"
               "    {%- if message['role'] == 'user' %}\n"
               "        {%- if loop.first and system_message is defined %}\n"
               "            {{- '[INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n"
               "        {%- else %}\n"
               "            {{- '[INST] ' + message['content'] + ' [/INST]' }}\n"
               "        {%- endif %}\n"
               "    {%- elif message['role'] == 'assistant' %}\n"
               "        {{- ' ' + message['content'] + eos_token }}\n"
               "    {%- else %}\n"
               "        {{- raise_exception('Only user and assistant roles are supported, after an optional first "
               "system message') }}\n"
               "    {%- endif %}\n"
               "{%- endfor %}\n";
    return "";
}

}  // namespace memfit
