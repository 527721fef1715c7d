// duet's own templates for the published DeepSeek chat formats, for model files that carry no
// tokenizer.chat_template. Written for Hugging Face's settings (trim_blocks, lstrip_blocks); for
// every conversation the published templates render, these render the same text. Where a
// published template fails or loses text (a role it does not know, several rounds of tool calls)
// these raise a clear error or keep the format consistent instead.
#include <string>

#include "duet/core/error.h"
#include "duet/tokenizer/chat_template.h"

namespace duet {
namespace {

// DeepSeek-LLM chat, DeepSeek-V2 and Coder-V2:
//   {bos}{system}\n\nUser: {user}\n\nAssistant: {assistant}{eos}User: ...\n\nAssistant:
constexpr std::string_view kDeepSeekLLM = R"({{- bos_token }}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}
        {{- message['content'] + '\n\n' }}
    {%- elif message['role'] == 'user' %}
        {{- 'User: ' + message['content'] + '\n\n' }}
    {%- elif message['role'] == 'assistant' and message['tool_calls'] %}
        {{- raise_exception('the DeepSeek-LLM chat format has no tool calls') }}
    {%- elif message['role'] == 'assistant' %}
        {{- 'Assistant: ' + message['content'] + eos_token }}
    {%- else %}
        {{- raise_exception("the DeepSeek-LLM chat format has no role '" ~ message['role'] ~ "'") }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- 'Assistant:' }}
{%- endif %}
)";

// DeepSeek-Coder instruct: a default system prompt unless the conversation has one, then
//   ### Instruction:\n{user}\n### Response:\n{assistant}\n<|EOT|>\n ... ### Response:\n
constexpr std::string_view kDeepSeekCoder = R"({%- set ns = namespace(has_system=false) %}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}
        {%- set ns.has_system = true %}
    {%- endif %}
{%- endfor %}
{{- bos_token }}
{%- if not ns.has_system %}
    {{- 'You are an AI programming assistant, utilizing the Deepseek Coder model, developed by Deepseek Company, and you only answer questions related to computer science. For politically sensitive questions, security and privacy issues, and other non-computer science questions, you will refuse to answer\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}
        {{- message['content'] }}
    {%- elif message['role'] == 'user' %}
        {{- '### Instruction:\n' + message['content'] + '\n' }}
    {%- elif message['role'] == 'assistant' and message['tool_calls'] %}
        {{- raise_exception('the DeepSeek-Coder instruct format has no tool calls') }}
    {%- elif message['role'] == 'assistant' %}
        {{- '### Response:\n' + message['content'] + '\n<|EOT|>\n' }}
    {%- else %}
        {{- raise_exception("the DeepSeek-Coder instruct format has no role '" ~ message['role'] ~ "'") }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '### Response:\n' }}
{%- endif %}
)";

// DeepSeek-V3 and R1 (after a line that sets generation_prompt): system prompts first, joined by
// blank lines; earlier reasoning (up to the last </think>) dropped from assistant turns; tool
// calls as fenced JSON; a run of tool results wrapped in tool-outputs markers, after which the
// assistant continues without a new <｜Assistant｜>.
constexpr std::string_view kDeepSeekV3Body = R"(
{%- set ns = namespace(system_prompt='', first_system=true, in_tool_outputs=false) %}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}
        {%- if ns.first_system %}
            {%- set ns.system_prompt = message['content'] %}
            {%- set ns.first_system = false %}
        {%- else %}
            {%- set ns.system_prompt = ns.system_prompt + '\n\n' + message['content'] %}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{{- bos_token + ns.system_prompt }}
{%- for message in messages %}
    {%- set role = message['role'] %}
    {%- if role == 'tool' %}
        {%- if ns.in_tool_outputs %}
            {{- '\n<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>' }}
        {%- else %}
            {{- '<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>' }}
            {%- set ns.in_tool_outputs = true %}
        {%- endif %}
    {%- elif role == 'user' or role == 'assistant' %}
        {%- if ns.in_tool_outputs %}
            {{- '<｜tool▁outputs▁end｜>' }}
        {%- endif %}
        {%- if role == 'user' %}
            {{- '<｜User｜>' + message['content'] }}
        {%- elif message['tool_calls'] %}
            {%- if not ns.in_tool_outputs %}
                {{- '<｜Assistant｜>' }}
            {%- endif %}
            {{- message['content'] if message['content'] is string else '' }}
            {{- '<｜tool▁calls▁begin｜>' }}
            {%- for call in message['tool_calls'] %}
                {%- set arguments = call['function']['arguments'] %}
                {{- ('\n' if not loop.first else '') + '<｜tool▁call▁begin｜>' + (call['type'] | default('function')) }}
                {{- '<｜tool▁sep｜>' + call['function']['name'] + '\n```json\n' }}
                {{- (arguments if arguments is string else arguments | tojson) + '\n```<｜tool▁call▁end｜>' }}
            {%- endfor %}
            {{- '<｜tool▁calls▁end｜><｜end▁of▁sentence｜>' }}
        {%- else %}
            {%- set content = message['content'] if message['content'] is string else '' %}
            {%- if '</think>' in content %}
                {%- set content = content.split('</think>')[-1] %}
            {%- endif %}
            {%- if not ns.in_tool_outputs %}
                {{- '<｜Assistant｜>' }}
            {%- endif %}
            {{- content + '<｜end▁of▁sentence｜>' }}
        {%- endif %}
        {%- set ns.in_tool_outputs = false %}
    {%- elif role != 'system' %}
        {{- raise_exception("the DeepSeek-V3 chat format has no role '" ~ role ~ "'") }}
    {%- endif %}
{%- endfor %}
{%- if ns.in_tool_outputs %}
    {{- '<｜tool▁outputs▁end｜>' }}
{%- elif add_generation_prompt %}
    {{- generation_prompt }}
{%- endif %}
)";

}  // namespace

std::string_view builtin_chat_format_name(BuiltinChatFormat format) {
  switch (format) {
    case BuiltinChatFormat::kDeepSeekLLM: return "deepseek-llm";
    case BuiltinChatFormat::kDeepSeekCoder: return "deepseek-coder";
    case BuiltinChatFormat::kDeepSeekV3: return "deepseek-v3";
    case BuiltinChatFormat::kDeepSeekR1: return "deepseek-r1";
  }
  return "unknown";
}

std::string_view builtin_chat_template_source(BuiltinChatFormat format) {
  static const std::string kV3 = "{%- set generation_prompt = '<｜Assistant｜>' %}" + std::string(kDeepSeekV3Body);
  static const std::string kR1 = "{%- set generation_prompt = '<｜Assistant｜><think>\\n' %}" + std::string(kDeepSeekV3Body);
  switch (format) {
    case BuiltinChatFormat::kDeepSeekLLM: return kDeepSeekLLM;
    case BuiltinChatFormat::kDeepSeekCoder: return kDeepSeekCoder;
    case BuiltinChatFormat::kDeepSeekV3: return kV3;
    case BuiltinChatFormat::kDeepSeekR1: return kR1;
  }
  fail(ErrorCode::kInternal, "unknown built-in chat format {}", static_cast<int>(format));
}

}  // namespace duet
