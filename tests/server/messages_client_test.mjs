// Anthropic's Messages API (/v1/messages) through the official anthropic client, against a server
// with --tool-call-parser deepseek_v3 on a model with random weights. What a message says is
// checked against what it means: the same generation, from the same prompt tokens, as the chat
// request with the same conversation (the openai client, temperature 0); a stream that adds up to
// the message; stop sequences; a forced tool use whose input ajv validates, and its result sent
// back; count_tokens; errors in Anthropic's shape.
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import Ajv2020 from "ajv/dist/2020.js";
import assert from "node:assert/strict";

const anthropic = new Anthropic({ baseURL: process.env.DUET_BASE, apiKey: "none", maxRetries: 0 });
const openai = new OpenAI({ baseURL: `${process.env.DUET_BASE}/v1`, apiKey: "none", maxRetries: 0 });
const model = process.env.DUET_MODEL;
const ajv = new Ajv2020({ allErrors: true, strict: false });
let checks = 0;
const ok = (name) => { checks++; console.log(`ok ${name}`); };
const textOf = (m) => m.content.filter((b) => b.type === "text").map((b) => b.text).join("");

// A message and the chat request it means: the same tokens in, the same text out.
const system = "You are terse.";
const messages = [
  { role: "user", content: "Name a color." },
  { role: "assistant", content: [{ type: "text", text: "Blue." }] },
  { role: "user", content: [{ type: "text", text: "And " }, { type: "text", text: "another?" }] },
];
const m = await anthropic.messages.create({ model, max_tokens: 8, temperature: 0, system, messages });
const chat = await openai.chat.completions.create({
  model, max_tokens: 8, temperature: 0,
  messages: [{ role: "system", content: system }, { role: "user", content: "Name a color." },
    { role: "assistant", content: "Blue." }, { role: "user", content: "And another?" }],
});
assert.match(m.id, /^msg_/);
assert.equal(m.type, "message");
assert.equal(m.role, "assistant");
assert.equal(m.model, model);
assert.equal(textOf(m), chat.choices[0].message.content);
assert.equal(m.usage.input_tokens, chat.usage.prompt_tokens);
assert.equal(m.usage.output_tokens, chat.usage.completion_tokens);
assert.equal(m.stop_reason, chat.choices[0].finish_reason === "length" ? "max_tokens" : "end_turn");
ok(`a message is the chat completion of the same conversation (${m.usage.input_tokens} tokens in, stop_reason ${m.stop_reason})`);

// Streamed: the events add up to the message.
const stream = anthropic.messages.stream({ model, max_tokens: 8, temperature: 0, system, messages });
const kinds = [];
stream.on("streamEvent", (e) => kinds.push(e.type));
const streamed = await stream.finalMessage();
assert.equal(kinds[0], "message_start");
assert.equal(kinds[kinds.length - 1], "message_stop");
assert.ok(kinds.includes("content_block_start") && kinds.includes("content_block_delta") && kinds.includes("message_delta"));
assert.equal(textOf(streamed), textOf(m));
assert.equal(streamed.stop_reason, m.stop_reason);
assert.equal(streamed.usage.output_tokens, m.usage.output_tokens);
ok(`a stream of ${kinds.length} events adds up to the same message`);

// A stop sequence: the text up to its first place, stop_reason stop_sequence.
const full = textOf(m);
const stop = [...full].slice(2, 4).join("");
const stopped = await anthropic.messages.create({ model, max_tokens: 8, temperature: 0, system, messages, stop_sequences: [stop, "never here"] });
assert.equal(stopped.stop_reason, "stop_sequence");
assert.equal(stopped.stop_sequence, stop);
assert.equal(textOf(stopped), full.slice(0, full.indexOf(stop)));
ok("a stop sequence ends the text where it first comes, and is named");

// A max_tokens past the context (coding agents ask for 32,000, streamed, as the client wants for
// that much) is the rest of the context: the answer comes (a regex ends it early).
const ceiling = await anthropic.messages.stream({ model, max_tokens: 32000, temperature: 0, system, messages,
  guided_regex: "[a-z]{3}" }).finalMessage();
assert.match(textOf(ceiling), /^[a-z]{3}$/);
assert.equal(ceiling.stop_reason, "end_turn");
assert.equal(ceiling.usage.input_tokens, m.usage.input_tokens);
ok("a max_tokens past the context is the rest of it");

// A forced tool use: its input fits the schema; the result sent back reads as the chat's tool turn.
const schema = {
  type: "object",
  properties: { city: { type: "string", maxLength: 12 }, days: { type: "integer", minimum: 1, maximum: 7 } },
  required: ["city", "days"],
  additionalProperties: false,
};
const tools = [{ name: "get_weather", description: "The weather in a city.", input_schema: schema }];
const used = await anthropic.messages.create({
  model, max_tokens: 400, temperature: 0, tools, tool_choice: { type: "tool", name: "get_weather" },
  messages: [{ role: "user", content: "Weather in Oslo?" }],
});
const call = used.content.find((b) => b.type === "tool_use");
assert.ok(call, JSON.stringify(used.content));
assert.equal(used.stop_reason, "tool_use");
assert.equal(call.name, "get_weather");
assert.match(call.id, /^toolu_/);
assert.ok(ajv.validate(schema, call.input), JSON.stringify(ajv.errors));
// Streamed, the tool use's input comes as input_json_delta pieces that make the same object.
const toolStream = anthropic.messages.stream({
  model, max_tokens: 400, temperature: 0, tools, tool_choice: { type: "tool", name: "get_weather" },
  messages: [{ role: "user", content: "Weather in Oslo?" }],
});
let pieces = 0;
toolStream.on("streamEvent", (e) => { if (e.type === "content_block_delta" && e.delta.type === "input_json_delta") pieces++; });
const streamedUse = (await toolStream.finalMessage()).content.find((b) => b.type === "tool_use");
assert.deepEqual(streamedUse.input, call.input);
assert.ok(pieces > 1, `${pieces} input_json_delta events`);
const turn = [
  { role: "user", content: "Weather in Oslo?" },
  { role: "assistant", content: [call] },
  { role: "user", content: [{ type: "tool_result", tool_use_id: call.id, content: "Sunny, 21 C." }] },
];
const after = await anthropic.messages.create({ model, max_tokens: 6, temperature: 0, tools, messages: turn });
const chatAfter = await openai.chat.completions.create({
  model, max_tokens: 6, temperature: 0,
  tools: [{ type: "function", function: { name: "get_weather", description: "The weather in a city.", parameters: schema } }],
  messages: [
    { role: "user", content: "Weather in Oslo?" },
    { role: "assistant", content: null,
      tool_calls: [{ id: call.id, type: "function", function: { name: "get_weather", arguments: JSON.stringify(call.input) } }] },
    { role: "tool", tool_call_id: call.id, content: "Sunny, 21 C." },
  ],
});
assert.equal(after.usage.input_tokens, chatAfter.usage.prompt_tokens);
const counted = await anthropic.messages.countTokens({ model, tools, messages: turn });
assert.equal(counted.input_tokens, after.usage.input_tokens);
ok(`a forced tool use fits its schema (${JSON.stringify(call.input)}; streamed in ${pieces} pieces), and its result reads as the chat's tool turn; count_tokens agrees`);

// Errors in Anthropic's shape, as the client reads them.
async function refusal(body) {
  try {
    await anthropic.messages.create(body);
  } catch (e) {
    return [e.status, e.error?.type, e.error?.error?.type];
  }
  assert.fail("not refused");
}
assert.deepEqual(await refusal({ model, messages }), [400, "error", "invalid_request_error"]);
assert.deepEqual(await refusal({ model, max_tokens: 4, messages: [{ role: "user", content: [{ type: "image", source: {} }] }] }),
  [400, "error", "invalid_request_error"]);
assert.deepEqual(await refusal({ model: "no-such-model", max_tokens: 4, messages }), [404, "error", "not_found_error"]);
assert.deepEqual(await refusal({ model, max_tokens: 4, messages: [{ role: "tool", content: "x" }] }), [400, "error", "invalid_request_error"]);
ok("errors come in Anthropic's shape (a missing max_tokens, an image, an unknown model, a bad role)");

// The models, as Anthropic's client reads them (it sends anthropic-version); the openai client's
// list keeps OpenAI's shape.
const listed = [];
for await (const mo of anthropic.models.list()) listed.push(mo);
assert.equal(listed.length, 1);
assert.equal(listed[0].type, "model");
assert.equal(listed[0].id, model);
assert.equal(listed[0].display_name, model);
assert.ok(Math.abs(Date.parse(listed[0].created_at) - Date.now()) < 60_000, listed[0].created_at);
assert.deepEqual(await anthropic.models.retrieve(model), listed[0]);
await assert.rejects(anthropic.models.retrieve("no-such-model"), (e) => e.status === 404 && e.error?.error?.type === "not_found_error");
const openaiModels = await openai.models.list();
assert.equal(openaiModels.data[0].object, "model");
assert.equal(openaiModels.data[0].id, model);
ok("models.list and models.retrieve in Anthropic's shape; a missing model is Anthropic's not_found_error");

console.log(`${checks} checks passed`);
