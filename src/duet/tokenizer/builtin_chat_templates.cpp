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

// DeepSeek-V3.2: the published encoding (DeepSeek's encoding_dsv32.py, which replaces a Jinja
// template), as vLLM serves it: a request's tools in a system part of their own first, tool
// calls in DSML markup with each argument a parameter (text as it is, other values as JSON),
// tool results in <function_results>, and the thinking mode (chat_template_kwargs thinking or
// enable_thinking) opening <think> after the last user turn; earlier reasoning is left out.
// Tool call arguments may be objects or JSON text (parse_json, duet's global, reads the text).
// add_generation_prompt false leaves the last user turn without its "<｜Assistant｜>" opening.
constexpr std::string_view kDeepSeekV32 = R"({%- set ns = namespace(think=false, last_user=-1, tool_calls=0, tool_order=0) %}
{%- if (thinking is defined and thinking) or (enable_thinking is defined and enable_thinking) %}
    {%- set ns.think = true %}
{%- endif %}
{%- macro tool_prompt(tools) %}
    {%- set schemas = namespace(text='') %}
    {%- for tool in tools %}
        {%- set schemas.text = schemas.text + ('\n' if not loop.first else '') + (tool['function'] | tojson) %}
    {%- endfor %}
    {{- "## Tools\n"
        "\n"
        "You have access to a set of tools you can use to answer the user's question.\n"
        "You can invoke functions by writing a \"<｜DSML｜function_calls>\" block like the following as part of your reply to the user:\n"
        "<｜DSML｜function_calls>\n"
        "<｜DSML｜invoke name=\"$FUNCTION_NAME\">\n"
        "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
        "...\n"
        "</｜DSML｜invoke>\n"
        "<｜DSML｜invoke name=\"$FUNCTION_NAME2\">\n"
        "...\n"
        "</｜DSML｜invoke>\n"
        "</｜DSML｜function_calls>\n"
        "\n"
        "String and scalar parameters should be specified as is without any escaping or quotes, while lists and objects should use JSON format. The \"string\" attribute should be set to \"true\" for string type parameters and \"false\" for other types (numbers, booleans, arrays, objects).\n"
        "\n"
        "If the thinking_mode is enabled, then after function results you should strongly consider outputting a thinking block. Here is an example:\n"
        "\n"
        "<｜DSML｜function_calls>\n"
        "...\n"
        "</｜DSML｜function_calls>\n"
        "\n"
        "<function_results>\n"
        "...\n"
        "</function_results>\n"
        "\n"
        "<think>...thinking about results</think>\n"
        "\n"
        "Here are the functions available in JSONSchema format:\n"
        "<functions>\n"
        + schemas.text + '\n</functions>\n' }}
{%- endmacro %}
{%- macro extras(m) %}
    {%- if m['tools'] %}
        {{- '\n\n' + tool_prompt(m['tools']) }}
    {%- endif %}
    {%- if m['response_format'] %}
        {{- '\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n' + (m['response_format'] | tojson) }}
    {%- endif %}
{%- endmacro %}
{%- set msgs = ([{'role': 'system', 'tools': tools}] if tools else []) + messages %}
{%- for m in msgs %}
    {%- if m['role'] == 'user' or m['role'] == 'developer' %}
        {%- set ns.last_user = loop.index0 %}
    {%- endif %}
{%- endfor %}
{{- bos_token }}
{%- for m in msgs %}
    {%- set role = m['role'] %}
    {%- set content = m['content'] if m['content'] is string else '' %}
    {%- if role == 'system' %}
        {{- content + extras(m) }}
    {%- elif role == 'user' or role == 'developer' %}
        {%- if role == 'user' %}
            {{- '<｜User｜>' + content }}
        {%- elif not content %}
            {{- raise_exception('the DeepSeek-V3.2 chat format needs text in a developer message') }}
        {%- else %}
            {{- '<｜User｜>' + extras(m) + "\n\n# The user's message is: " + content }}
        {%- endif %}
        {%- if not (loop.last and add_generation_prompt is defined and not add_generation_prompt) %}
            {{- '<｜Assistant｜>' + ('<think>' if ns.think and loop.index0 == ns.last_user else '</think>') }}
        {%- endif %}
    {%- elif role == 'tool' %}
        {%- if ns.tool_order >= ns.tool_calls %}
            {{- raise_exception('the DeepSeek-V3.2 chat format takes a tool message only for a tool call of the assistant message before it') }}
        {%- endif %}
        {%- set ns.tool_order = ns.tool_order + 1 %}
        {%- if ns.tool_order == 1 %}
            {{- '\n\n<function_results>' }}
        {%- endif %}
        {{- '\n<result>' + content + '</result>' }}
        {%- if ns.tool_order == ns.tool_calls %}
            {{- '\n</function_results>\n\n' + ('<think>' if ns.think and loop.index0 >= ns.last_user else '</think>') }}
        {%- endif %}
    {%- elif role == 'assistant' %}
        {%- set ns.tool_order = 0 %}
        {%- set ns.tool_calls = m['tool_calls'] | length if m['tool_calls'] else 0 %}
        {%- if ns.think and loop.index0 > ns.last_user %}
            {%- set reasoning = m['reasoning_content'] if m['reasoning_content'] is string else m['reasoning'] %}
            {{- (reasoning if reasoning is string else '') + '</think>' }}
        {%- endif %}
        {{- content }}
        {%- if m['tool_calls'] %}
            {{- '\n\n<｜DSML｜function_calls>\n' }}
            {%- for call in m['tool_calls'] %}
                {%- set arguments = call['function']['arguments'] %}
                {%- if arguments is mapping %}
                    {%- set args = arguments %}
                {%- elif arguments is string and parse_json is defined %}
                    {%- set args = parse_json(arguments) %}
                {%- else %}
                    {%- set args = {'arguments': arguments} %}
                {%- endif %}
                {%- if args is not mapping %}
                    {{- raise_exception('the DeepSeek-V3.2 chat format needs a tool call\'s arguments to be a JSON object') }}
                {%- endif %}
                {{- ('\n' if not loop.first else '') + '<｜DSML｜invoke name="' + call['function']['name'] + '">\n' }}
                {%- for key, value in args.items() %}
                    {{- ('\n' if not loop.first else '') + '<｜DSML｜parameter name="' + key + '" string="' }}
                    {{- ('true">' + value) if value is string else ('false">' + value | tojson) }}
                    {{- '</｜DSML｜parameter>' }}
                {%- endfor %}
                {{- '\n</｜DSML｜invoke>' }}
            {%- endfor %}
            {{- '\n</｜DSML｜function_calls>' }}
        {%- endif %}
        {{- '<｜end▁of▁sentence｜>' }}
    {%- else %}
        {{- raise_exception("the DeepSeek-V3.2 chat format has no role '" ~ role ~ "'") }}
    {%- endif %}
{%- endfor %}
)";

}  // namespace

std::string_view builtin_chat_format_name(BuiltinChatFormat format) {
  switch (format) {
    case BuiltinChatFormat::kDeepSeekLLM: return "deepseek-llm";
    case BuiltinChatFormat::kDeepSeekCoder: return "deepseek-coder";
    case BuiltinChatFormat::kDeepSeekV3: return "deepseek-v3";
    case BuiltinChatFormat::kDeepSeekR1: return "deepseek-r1";
    case BuiltinChatFormat::kDeepSeekV32: return "deepseek-v32";
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
    case BuiltinChatFormat::kDeepSeekV32: return kDeepSeekV32;
  }
  fail(ErrorCode::kInternal, "unknown built-in chat format {}", static_cast<int>(format));
}

}  // namespace duet
