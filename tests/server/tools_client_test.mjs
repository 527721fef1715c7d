// Tool calls through the official openai client against a server with --tool-call-parser
// (DUET_PARSER: deepseek_v3, deepseek_v31 or deepseek_v32) and --enable-auto-tool-choice, on a model with random
// weights: forced calls (required, named, parallel or not) come out in DeepSeek's markup and are
// parsed into tool_calls whose arguments ajv validates against each function's parameters;
// streamed deltas add up to the same calls; the conversation goes round with the results; and
// with tool_choice auto, markup forced by a grammar is read back as tool calls.
import OpenAI from "openai";
import Ajv2020 from "ajv/dist/2020.js";
import assert from "node:assert/strict";

const client = new OpenAI({ baseURL: process.env.DUET_URL, apiKey: "none" });
const model = process.env.DUET_MODEL;
const parser = process.env.DUET_PARSER ?? "deepseek_v3";
const ajv = new Ajv2020({ allErrors: true, strict: false });
let checks = 0;
const ok = (name) => { checks++; console.log(`ok ${name}`); };

const tools = [
  { type: "function", function: { name: "get_weather", description: "Current weather in a city",
    parameters: { type: "object", properties: { city: { type: "string", maxLength: 16 }, unit: { enum: ["c", "f"] } },
                  required: ["city"], additionalProperties: false } } },
  { type: "function", function: { name: "get_time", description: "Local time in a time zone",
    parameters: { type: "object", properties: { tz: { type: "string", pattern: "^[A-Z][a-z]{2,8}/[A-Z][a-z]{2,8}$" } },
                  required: ["tz"] } } },
];
const validators = Object.fromEntries(tools.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));
const messages = [{ role: "user", content: "What is the weather in Paris, and the time in Tokyo?" }];

function checkCalls(calls, label) {
  assert.ok(Array.isArray(calls) && calls.length >= 1, `${label}: no tool calls`);
  for (const c of calls) {
    assert.equal(c.type, "function", label);
    assert.match(c.id, /^call_[0-9a-f]{24}$/, label);
    const validate = validators[c.function.name];
    assert.ok(validate, `${label}: unknown function ${c.function.name}`);
    const args = JSON.parse(c.function.arguments);
    assert.ok(validate(args), `${label}: ${c.function.name}(${c.function.arguments}): ${ajv.errorsText(validate.errors)}`);
  }
}

async function streamed(body) {
  const s = await client.chat.completions.create({ ...body, stream: true });
  const calls = [];
  let content = "", finish = null;
  for await (const chunk of s) {
    for (const c of chunk.choices) {
      content += c.delta.content ?? "";
      for (const d of c.delta.tool_calls ?? []) {
        if (d.id) calls[d.index] = { id: d.id, type: d.type, function: { name: d.function.name, arguments: "" } };
        calls[d.index].function.arguments += d.function?.arguments ?? "";
      }
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { content, calls, finish };
}

if (parser === "none") {
  // Without a tool-call parser, as vLLM does: a named function's arguments, or for required a
  // JSON list of calls, forced as JSON; auto is refused.
  for (const seed of [1, 2, 3]) {
    const named = await client.chat.completions.create({ model, messages, tools, max_tokens: 300, temperature: 1.0,
      seed, tool_choice: { type: "function", function: { name: "get_weather" } } });
    assert.equal(named.choices[0].message.tool_calls.length, 1);
    assert.equal(named.choices[0].message.tool_calls[0].function.name, "get_weather");
    checkCalls(named.choices[0].message.tool_calls, "named (JSON)");
    const body = { model, messages, tools, tool_choice: "required", max_tokens: 600, temperature: 1.0, seed };
    const required = await client.chat.completions.create(body);
    checkCalls(required.choices[0].message.tool_calls, "required (JSON)");
    const s = await streamed(body);
    assert.deepEqual(s.calls.map((c) => [c.function.name, c.function.arguments]),
                     required.choices[0].message.tool_calls.map((c) => [c.function.name, c.function.arguments]));
    const namedStream = await streamed({ model, messages, tools, max_tokens: 300, temperature: 1.0, seed,
                                         tool_choice: { type: "function", function: { name: "get_weather" } } });
    assert.equal(namedStream.calls[0].function.arguments, named.choices[0].message.tool_calls[0].function.arguments);
  }
  ok("named and required as JSON");
  try {
    await client.chat.completions.create({ model, messages, tools, max_tokens: 5 });
    assert.fail("auto accepted without a parser");
  } catch (e) {
    assert.equal(e.status, 400);
    assert.equal(e.param, "tool_choice");
  }
  ok("auto needs a parser");
  console.log(`${checks} checks passed`);
  process.exit(0);
}

// tool_choice required, parallel calls allowed: not streamed, then streamed with the same seed.
await Promise.all([1, 2, 3, 4].map(async (seed) => {
  const body = { model, messages, tools, tool_choice: "required", max_tokens: 600, temperature: 1.0, seed };
  const r = await client.chat.completions.create(body);
  const msg = r.choices[0].message;
  // A random model may go on calling; the end of max_tokens then closes the list ("length").
  assert.ok(["tool_calls", "length"].includes(r.choices[0].finish_reason), JSON.stringify(r.choices[0]));
  assert.equal(msg.content, null);
  checkCalls(msg.tool_calls, `required seed ${seed}`);
  const s = await streamed(body);
  assert.equal(s.finish, r.choices[0].finish_reason);
  assert.equal(s.content, "");
  assert.deepEqual(s.calls.map((c) => [c.function.name, c.function.arguments]),
                   msg.tool_calls.map((c) => [c.function.name, c.function.arguments]), `seed ${seed}`);
  checkCalls(s.calls, `required streamed seed ${seed}`);
}));
ok("tool_choice required (parallel), streamed and not");

// A named function (called once), and parallel_tool_calls false: exactly one call.
for (const seed of [5, 6]) {
  const named = await client.chat.completions.create({ model, messages, tools, max_tokens: 400, temperature: 1.0, seed,
    tool_choice: { type: "function", function: { name: "get_time" } } });
  assert.equal(named.choices[0].message.tool_calls.length, 1);
  assert.equal(named.choices[0].message.tool_calls[0].function.name, "get_time");
  checkCalls(named.choices[0].message.tool_calls, "named");
  const single = await client.chat.completions.create({ model, messages, tools, tool_choice: "required",
    parallel_tool_calls: false, max_tokens: 400, temperature: 1.0, seed });
  assert.equal(single.choices[0].message.tool_calls.length, 1);
  checkCalls(single.choices[0].message.tool_calls, "single");
}
ok("named function and parallel_tool_calls false");

// The round trip: the calls and their results go back; the model answers in text.
const first = await client.chat.completions.create({ model, messages, tools, tool_choice: "required", max_tokens: 600,
  temperature: 1.0, seed: 9 });
const calls = first.choices[0].message.tool_calls;
const history = [...messages, { role: "assistant", content: null, tool_calls: calls },
                 ...calls.map((c, i) => ({ role: "tool", tool_call_id: c.id, content: JSON.stringify({ result: i }) }))];
const answer = await client.chat.completions.create({ model, messages: history, tools, tool_choice: "none",
  max_tokens: 8, temperature: 0 });
assert.equal(typeof answer.choices[0].message.content, "string");
assert.equal(answer.choices[0].message.tool_calls, undefined);
// ...and again with tool_choice auto (the random model writes text, no markup).
const again = await client.chat.completions.create({ model, messages: history, tools, max_tokens: 8, temperature: 0 });
assert.equal(typeof again.choices[0].message.content, "string");
ok("tool results round trip");

// tool_choice auto: markup that a grammar forces (as a model would write it) becomes tool calls,
// the text before it content.
const markup = parser === "deepseek_v3"
  ? '"<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\\n```json\\n{\\"tz\\": \\"Asia/Tokyo\\"}\\n```<｜tool▁call▁end｜>"'
  : '"<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\\"tz\\": \\"Asia/Tokyo\\"}<｜tool▁call▁end｜>"';
const dsml = '"\\n\\n<｜DSML｜function_calls>\\n<｜DSML｜invoke name=\\"get_time\\">\\n' +
  '<｜DSML｜parameter name=\\"tz\\" string=\\"true\\">Asia/Tokyo</｜DSML｜parameter>\\n</｜DSML｜invoke>\\n</｜DSML｜function_calls>"';
const grammar = parser === "deepseek_v32"
  ? `root ::= "Let me check." ${dsml}\n`
  : `root ::= "Let me check." "<｜tool▁calls▁begin｜>" call "<｜tool▁calls▁end｜>"\ncall ::= ${markup}\n`;
const autoBody = { model, messages, tools, max_tokens: 400, temperature: 1.0, seed: 1, guided_grammar: grammar };
const auto = await client.chat.completions.create(autoBody);
assert.equal(auto.choices[0].message.content, "Let me check.");
assert.equal(auto.choices[0].finish_reason, "tool_calls");
assert.deepEqual(auto.choices[0].message.tool_calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)]),
                 [["get_time", { tz: "Asia/Tokyo" }]]);
const autoStream = await streamed(autoBody);
assert.equal(autoStream.content, "Let me check.");
assert.equal(autoStream.finish, "tool_calls");
assert.equal(autoStream.calls[0].function.arguments, auto.choices[0].message.tool_calls[0].function.arguments);
ok("tool_choice auto reads the markup");

// Errors name the field.
for (const [body, param] of [
  [{ tools, tool_choice: { type: "function", function: { name: "nope" } } }, "tool_choice"],
  [{ tools: [{ type: "function", function: { name: "bad name!" } }] }, "tools"],
  [{ tools: [{ type: "function", function: { name: "f", parameters: { type: "object", properties: { a: { not: {} } } } } }],
     tool_choice: "required" }, "tools"],
  [{ tool_choice: "required" }, "tool_choice"],
  [{ tools, tool_choice: "required", response_format: { type: "json_object" } }, "tool_choice"],
  [{ messages: [{ role: "assistant", content: null, tool_calls: [{ function: { name: 3 } }] }] }, "messages"],
]) {
  try {
    await client.chat.completions.create({ model, messages, max_tokens: 5, ...body });
    assert.fail(`accepted ${JSON.stringify(body)}`);
  } catch (e) {
    assert.equal(e.status, 400, `${JSON.stringify(body)}: ${e}`);
    assert.equal(e.param, param, `${JSON.stringify(body)}: ${e.message}`);
  }
}
ok("errors name the field");
console.log(`${checks} checks passed`);
