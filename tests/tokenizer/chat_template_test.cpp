// The chat-template API and duet's built-in DeepSeek templates, against strings derived by hand
// from the published formats. (chat_template_cases_test checks the real published templates
// against Hugging Face's output when the shared test data is there.)
#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "duet/core/error.h"
#include "duet/formats/gguf.h"
#include "duet/formats/gguf_writer.h"
#include "duet/tokenizer/chat_template.h"
#include "duet/tokenizer/jinja/value.h"

namespace duet {
namespace {

using nlohmann::ordered_json;

// ---- the built-in DeepSeek chat templates, against strings derived from the published formats ----

const char* const kBos = "<｜begin▁of▁sentence｜>";
const char* const kEos = "<｜end▁of▁sentence｜>";

ordered_json vars(bool add_generation_prompt) {
  return {{"bos_token", kBos}, {"eos_token", kEos}, {"add_generation_prompt", add_generation_prompt}};
}

ordered_json conversation() {
  return ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "2+2?"}])");
}

TEST(BuiltinChatTemplateTest, DeepSeekLLM) {
  const ChatTemplate t = builtin_chat_template(BuiltinChatFormat::kDeepSeekLLM);
  EXPECT_EQ(t.render(conversation(), vars(true)),
            std::string(kBos) + "Be brief.\n\nUser: Hi\n\nAssistant: Hello!" + kEos + "User: 2+2?\n\nAssistant:");
  EXPECT_EQ(t.render(ordered_json::parse(R"([{"role": "user", "content": "Hi"}])"), vars(false)),
            std::string(kBos) + "User: Hi\n\n");
}

TEST(BuiltinChatTemplateTest, DeepSeekCoder) {
  const ChatTemplate t = builtin_chat_template(BuiltinChatFormat::kDeepSeekCoder);
  const std::string default_system =
      "You are an AI programming assistant, utilizing the Deepseek Coder model, developed by Deepseek Company, and you "
      "only answer questions related to computer science. For politically sensitive questions, security and privacy "
      "issues, and other non-computer science questions, you will refuse to answer\n";
  const ordered_json messages = ordered_json::parse(R"([
    {"role": "user", "content": "Write quicksort."},
    {"role": "assistant", "content": "def qs(a): ..."},
    {"role": "user", "content": "In C?"}])");
  EXPECT_EQ(t.render(messages, vars(true)), std::string(kBos) + default_system +
                                                "### Instruction:\nWrite quicksort.\n### Response:\ndef qs(a): ...\n<|EOT|>\n"
                                                "### Instruction:\nIn C?\n### Response:\n");
  // A system message replaces the default one.
  EXPECT_EQ(t.render(ordered_json::parse(R"([{"role": "system", "content": "Sys."}, {"role": "user", "content": "Q"}])"), vars(false)),
            std::string(kBos) + "Sys.### Instruction:\nQ\n");
}

TEST(BuiltinChatTemplateTest, DeepSeekV3AndR1) {
  const ChatTemplate v3 = builtin_chat_template(BuiltinChatFormat::kDeepSeekV3);
  const ChatTemplate r1 = builtin_chat_template(BuiltinChatFormat::kDeepSeekR1);
  const std::string body = std::string(kBos) + "Be brief.<｜User｜>Hi<｜Assistant｜>Hello!" + kEos + "<｜User｜>2+2?";
  EXPECT_EQ(v3.render(conversation(), vars(true)), body + "<｜Assistant｜>");
  EXPECT_EQ(r1.render(conversation(), vars(true)), body + "<｜Assistant｜><think>\n");
  EXPECT_EQ(v3.render(conversation(), vars(false)), body);
  // Earlier reasoning is dropped; several system messages are joined by a blank line.
  const ordered_json messages = ordered_json::parse(R"([
    {"role": "system", "content": "A"}, {"role": "system", "content": "B"},
    {"role": "user", "content": "Q"},
    {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nAnswer"}])");
  EXPECT_EQ(r1.render(messages, vars(false)), std::string(kBos) + "A\n\nB<｜User｜>Q<｜Assistant｜>\n\nAnswer" + kEos);
}

TEST(BuiltinChatTemplateTest, DeepSeekV3ToolCalls) {
  const ChatTemplate v3 = builtin_chat_template(BuiltinChatFormat::kDeepSeekV3);
  const ordered_json messages = ordered_json::parse(R"([
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}},
      {"type": "function", "function": {"name": "weather", "arguments": {"city": "Rome"}}}]},
    {"role": "tool", "content": "18C"},
    {"role": "tool", "content": "25C"},
    {"role": "assistant", "content": "Paris 18C, Rome 25C."},
    {"role": "user", "content": "Thanks"}])");
  EXPECT_EQ(v3.render(messages, vars(true)),
            std::string(kBos) +
                "<｜User｜>Weather in Paris and Rome?<｜Assistant｜><｜tool▁calls▁begin｜>"
                "<｜tool▁call▁begin｜>function<｜tool▁sep｜>weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n"
                "<｜tool▁call▁begin｜>function<｜tool▁sep｜>weather\n```json\n{\"city\": \"Rome\"}\n```<｜tool▁call▁end｜>"
                "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
                "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>18C<｜tool▁output▁end｜>\n"
                "<｜tool▁output▁begin｜>25C<｜tool▁output▁end｜><｜tool▁outputs▁end｜>"
                "Paris 18C, Rome 25C.<｜end▁of▁sentence｜><｜User｜>Thanks<｜Assistant｜>");
}

// DeepSeek-V3.2's published encoding (its encoding_dsv32.py, as vLLM applies it to a request):
// expected strings rendered by that script.
TEST(BuiltinChatTemplateTest, DeepSeekV32ChatAndThinking) {
  const ChatTemplate t = builtin_chat_template(BuiltinChatFormat::kDeepSeekV32);
  EXPECT_EQ(builtin_chat_format_name(BuiltinChatFormat::kDeepSeekV32), "deepseek-v32");
  ordered_json thinking = vars(true);
  thinking["thinking"] = true;
  EXPECT_EQ(t.render(conversation(), vars(true)),
            std::string(kBos) + "Be brief.<｜User｜>Hi<｜Assistant｜></think>Hello!" + kEos +
                "<｜User｜>2+2?<｜Assistant｜></think>");
  // Thinking: the last user turn opens <think>; earlier reasoning is left out, the reasoning of
  // an answer after the last user turn is kept (also as vLLM's "reasoning").
  const ordered_json earlier = ordered_json::parse(R"([{"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello!", "reasoning_content": "greet"}, {"role": "user", "content": "2+2?"}])");
  EXPECT_EQ(t.render(earlier, thinking),
            std::string(kBos) + "<｜User｜>Hi<｜Assistant｜></think>Hello!" + kEos + "<｜User｜>2+2?<｜Assistant｜><think>");
  for (const char* field : {"reasoning_content", "reasoning"}) {
    ordered_json last = ordered_json::parse(R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}])");
    last[1][field] = "greet";
    EXPECT_EQ(t.render(last, thinking), std::string(kBos) + "<｜User｜>Hi<｜Assistant｜><think>greet</think>Hello!" + kEos);
  }
  ordered_json enable = vars(true);
  enable["enable_thinking"] = true;
  EXPECT_EQ(t.render(ordered_json::parse(R"([{"role": "user", "content": "Hi"}])"), enable),
            std::string(kBos) + "<｜User｜>Hi<｜Assistant｜><think>");
  // A developer message is a user turn; add_generation_prompt false leaves the last one open.
  EXPECT_EQ(t.render(ordered_json::parse(R"([{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "Hi"}])"),
                     vars(true)),
            std::string(kBos) + "<｜User｜>\n\n# The user's message is: Be terse.<｜Assistant｜></think><｜User｜>Hi<｜Assistant｜></think>");
  EXPECT_EQ(t.render(ordered_json::parse(R"([{"role": "user", "content": "Hi"}])"), vars(false)), std::string(kBos) + "<｜User｜>Hi");
}

TEST(BuiltinChatTemplateTest, DeepSeekV32ToolCallsInDsml) {
  const ChatTemplate t = builtin_chat_template(BuiltinChatFormat::kDeepSeekV32);
  ordered_json v = vars(true);
  v["tools"] = ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  const ordered_json messages = ordered_json::parse(R"([{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": "", "reasoning_content": "Need the tool.", "tool_calls": [{"id": "c1",
        "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 3}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "sunny"}])");
  // The request's tools come first, in a system part of their own, then the system message.
  const std::string tools_part = std::string(kBos) +
      "\n\n## Tools\n\nYou have access to a set of tools you can use to answer the user's question.\n"
      "You can invoke functions by writing a \"<｜DSML｜function_calls>\" block like the following as part of your reply "
      "to the user:\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"$FUNCTION_NAME\">\n<｜DSML｜parameter "
      "name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"$FUNCTION_NAME2\">\n...\n</｜DSML｜invoke>\n</｜DSML｜function_calls>\n\n"
      "String and scalar parameters should be specified as is without any escaping or quotes, while lists and objects "
      "should use JSON format. The \"string\" attribute should be set to \"true\" for string type parameters and "
      "\"false\" for other types (numbers, booleans, arrays, objects).\n\n"
      "If the thinking_mode is enabled, then after function results you should strongly consider outputting a thinking "
      "block. Here is an example:\n\n<｜DSML｜function_calls>\n...\n</｜DSML｜function_calls>\n\n<function_results>\n...\n"
      "</function_results>\n\n<think>...thinking about results</think>\n\n"
      "Here are the functions available in JSONSchema format:\n<functions>\n"
      "{\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}\n"
      "</functions>\n";
  const std::string calls =
      "\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜function_calls>" + std::string(kEos) +
      "\n\n<function_results>\n<result>sunny</result>\n</function_results>\n\n";
  EXPECT_EQ(t.render(messages, v), tools_part + "Be brief.<｜User｜>Weather?<｜Assistant｜></think>" + calls + "</think>");
  ordered_json thinking = v;
  thinking["thinking"] = true;
  EXPECT_EQ(t.render(messages, thinking),
            tools_part + "Be brief.<｜User｜>Weather?<｜Assistant｜><think>Need the tool.</think>" + calls + "<think>");
  // Arguments given as an object render the same; two results close the block after the second.
  ordered_json as_object = messages;
  as_object[2]["tool_calls"][0]["function"]["arguments"] = ordered_json::parse(R"({"city": "Paris", "days": 3})");
  EXPECT_EQ(t.render(as_object, v), t.render(messages, v));
  ordered_json two = messages;
  two[2]["tool_calls"].push_back(two[2]["tool_calls"][0]);
  two.push_back(ordered_json::parse(R"({"role": "tool", "content": "warm"})"));
  const std::string rendered = t.render(two, v);
  EXPECT_NE(rendered.find("</｜DSML｜invoke>\n<｜DSML｜invoke name=\"get_weather\">"), std::string::npos);
  const std::string results =
      "</｜DSML｜function_calls>" + std::string(kEos) +
      "\n\n<function_results>\n<result>sunny</result>\n<result>warm</result>\n</function_results>\n\n</think>";
  EXPECT_TRUE(rendered.ends_with(results)) << rendered;
}

TEST(BuiltinChatTemplateTest, DeepSeekV32RefusesWhatItCannotEncode) {
  const ChatTemplate t = builtin_chat_template(BuiltinChatFormat::kDeepSeekV32);
  const char* const call = R"({"role": "assistant", "content": null, "tool_calls": [{"type": "function",
      "function": {"name": "f", "arguments": "{}"}}]})";
  for (const auto& [messages, message] : std::vector<std::pair<std::string, std::string>>{
           {R"([{"role": "user", "content": "q"}, {"role": "tool", "content": "x"}])", "tool message only for a tool call"},
           {std::string(R"([{"role": "user", "content": "q"}, )") + call + R"(, {"role": "tool", "content": "x"},
              {"role": "tool", "content": "y"}])", "tool message only for a tool call"},
           {R"([{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
              "function": {"name": "f", "arguments": "[1]"}}]}])", "arguments to be a JSON object"},
           {R"([{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
              "function": {"name": "f", "arguments": "{no"}}]}])", "not JSON"},
           {R"([{"role": "developer", "content": ""}])", "needs text in a developer message"},
           {R"([{"role": "ipython", "content": "x"}])", "has no role 'ipython'"}}) {
    try {
      t.render(ordered_json::parse(messages), vars(true));
      FAIL() << messages;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

TEST(BuiltinChatTemplateTest, UnknownRolesAreClearErrors) {
  const ordered_json messages = ordered_json::parse(R"([{"role": "tool", "content": "x"}])");
  for (BuiltinChatFormat f : {BuiltinChatFormat::kDeepSeekLLM, BuiltinChatFormat::kDeepSeekCoder}) {
    try {
      builtin_chat_template(f).render(messages, vars(true));
      FAIL() << builtin_chat_format_name(f);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("has no role 'tool'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("raised an error"), std::string::npos) << e.what();
    }
  }
}

// ---- the ChatTemplate API ----

TEST(ChatTemplateTest, HuggingFaceDefaults) {
  const ChatTemplate t = ChatTemplate::parse(
      "{{ add_generation_prompt }} {{ tools is none }} {{ documents is none }} {{ messages|length }} {{ thinking }}");
  EXPECT_EQ(t.render(ordered_json::array({{{"role", "user"}, {"content", "x"}}}), ordered_json{{"thinking", true}}),
            "False True True 1 True");
}

TEST(ChatTemplateTest, ContentPartsAreJoinedUnlessTheTemplateLoopsOverThem) {
  const ordered_json messages = ordered_json::parse(
      R"([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])");
  EXPECT_EQ(ChatTemplate::parse("{{ messages[0].content }}").render(messages), "a\nb");
  const ChatTemplate looping = ChatTemplate::parse(
      "{% for part in messages[0]['content'] %}[{{ part.text }}]{% endfor %}");
  EXPECT_TRUE(looping.iterates_content());
  EXPECT_EQ(looping.render(messages), "[a][b]");
  // A model file's template with a long run of spaces where the loop's are: its detection
  // overflowed std::regex's stack and ended the process as the model loaded.
  const ChatTemplate spaced = ChatTemplate::parse("{% for " + std::string(200000, ' ') +
                                                  "part in messages[0]['content'] %}[{{ part.text }}]{% endfor %}");
  EXPECT_TRUE(spaced.iterates_content());
  EXPECT_EQ(spaced.render(messages), "[a][b]");
  const ordered_json image = ordered_json::parse(R"([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])");
  EXPECT_THROW(ChatTemplate::parse("{{ messages[0].content }}").render(image), Error);
}

TEST(ChatTemplateTest, BadInputIsAnError) {
  const ChatTemplate t = ChatTemplate::parse("{{ messages }}");
  EXPECT_THROW(t.render(ordered_json::object()), Error);
  EXPECT_THROW(t.render(ordered_json::array({1})), Error);
  try {
    ChatTemplate::parse("{% if %}", "my template");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("my template: syntax error at line 1, column 7"), std::string::npos) << e.what();
  }
}

// Client text beyond what a template may make (jinja::kMaxStringSize) is the request's error, as
// duet::Error, whether it comes as one string or as content parts that join past it.
TEST(ChatTemplateTest, TextPastTheTemplateLimitIsAnError) {
  const ChatTemplate t = ChatTemplate::parse("{{ messages[0].content|length }}");
  const size_t half = static_cast<size_t>(jinja::kMaxStringSize / 2);
  ordered_json one = ordered_json::array({{{"role", "user"}}});
  one[0]["content"] = std::string(2 * half + 1, 'x');
  ordered_json parts = ordered_json::array({{{"role", "user"}}});
  for (int i = 0; i < 2; ++i) {  // joined with a '\n'
    parts[0]["content"].push_back({{"type", "text"}});
    parts[0]["content"][i]["text"] = std::string(half, 'x');
  }
  for (const ordered_json* messages : {&one, &parts}) {
    try {
      t.render(*messages);
      FAIL() << "rendered " << messages->dump().size() << " bytes of messages";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("268435456"), std::string::npos) << e.what();
    }
  }
}

// ---- choosing a template for a model file ----

struct VocabFile {
  std::string name = "";
  std::string arch = "llama";
  std::string pre = "";
  std::string chat_template = "";
  std::vector<std::string> extra_tokens = {};
};

GgufFile write_vocab(const VocabFile& v) {
  static int counter = 0;
  const std::filesystem::path path =
      std::filesystem::path(DUET_BINARY_DIR) / ("chat_template_test_" + std::to_string(counter++) + ".gguf");
  GgufWriter w;
  w.set("general.architecture", GgufValue::str(v.arch));
  w.set("general.name", GgufValue::str(v.name));
  std::vector<std::string> tokens = {"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "a", "b"};
  tokens.insert(tokens.end(), v.extra_tokens.begin(), v.extra_tokens.end());
  w.set("tokenizer.ggml.model", GgufValue::str("gpt2"));
  if (!v.pre.empty()) w.set("tokenizer.ggml.pre", GgufValue::str(v.pre));
  w.set("tokenizer.ggml.tokens", GgufValue::string_array(tokens));
  w.set("tokenizer.ggml.bos_token_id", GgufValue::u32(0));
  w.set("tokenizer.ggml.eos_token_id", GgufValue::u32(1));
  if (!v.chat_template.empty()) w.set("tokenizer.chat_template", GgufValue::str(v.chat_template));
  w.write(path.string());
  return GgufFile::open(path.string());
}

TEST(ChatTemplateForTest, PicksTheBuiltinFormatFromMetadata) {
  const std::vector<std::string> v3_tokens = {"<｜User｜>", "<｜Assistant｜>"};
  EXPECT_EQ(builtin_chat_format_for(write_vocab({"DeepSeek-V3", "deepseek2", "deepseek-v3", "", v3_tokens})),
            BuiltinChatFormat::kDeepSeekV3);
  EXPECT_EQ(builtin_chat_format_for(write_vocab({"DeepSeek-R1", "deepseek2", "deepseek-v3", "", v3_tokens})),
            BuiltinChatFormat::kDeepSeekR1);
  EXPECT_EQ(builtin_chat_format_for(write_vocab({"DeepSeek R1 Distill Llama 8B", "llama", "llama-bpe", "", v3_tokens})),
            BuiltinChatFormat::kDeepSeekR1);
  EXPECT_EQ(builtin_chat_format_for(write_vocab({"model", "qwen2", "deepseek-r1-qwen", "", v3_tokens})),
            BuiltinChatFormat::kDeepSeekR1);
  EXPECT_EQ(builtin_chat_format_for(write_vocab({"DeepSeek-R10-like", "deepseek2", "deepseek-v3", "", v3_tokens})),
            BuiltinChatFormat::kDeepSeekV3);
  EXPECT_EQ(builtin_chat_format_for(write_vocab({"deepseek-coder-6.7b-instruct", "llama", "deepseek-coder"})),
            BuiltinChatFormat::kDeepSeekCoder);
  EXPECT_EQ(builtin_chat_format_for(write_vocab({"DeepSeek Coder 1.3B Instruct", "llama", ""})),
            BuiltinChatFormat::kDeepSeekCoder);
  EXPECT_EQ(builtin_chat_format_for(write_vocab({"DeepSeek-Coder-V2-Lite-Instruct", "deepseek2", "deepseek-llm"})),
            BuiltinChatFormat::kDeepSeekLLM);
  EXPECT_EQ(builtin_chat_format_for(write_vocab({"deepseek-llm-7b-chat", "llama", "deepseek-llm"})),
            BuiltinChatFormat::kDeepSeekLLM);
  EXPECT_EQ(builtin_chat_format_for(write_vocab({"DeepSeek-R1-like V3.2", "deepseek32", "deepseek-v3", "", v3_tokens})),
            BuiltinChatFormat::kDeepSeekV32);
}

TEST(ChatTemplateForTest, PrefersTheFilesTemplate) {
  const GgufFile with = write_vocab({"x", "llama", "deepseek-coder", "[{{ bos_token }}{{ messages[0].content }}]"});
  const ChatSpecialTokens tok = chat_special_tokens(with);
  EXPECT_EQ(tok.bos_token, "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(tok.eos_token, "<｜end▁of▁sentence｜>");
  const ordered_json messages = ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  EXPECT_EQ(chat_template_for(with).render(messages, {{"bos_token", tok.bos_token}}), "[<｜begin▁of▁sentence｜>hi]");
  const GgufFile without = write_vocab({"x", "llama", "deepseek-llm"});
  EXPECT_EQ(chat_template_for(without).render(messages, {{"bos_token", "<s>"}, {"add_generation_prompt", true}}),
            "<s>User: hi\n\nAssistant:");
  const GgufFile broken = write_vocab({"x", "llama", "", "{% if %}"});
  try {
    chat_template_for(broken);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.chat_template of " + broken.path() + ": syntax error"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace duet
