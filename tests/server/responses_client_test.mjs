// The Responses API (/v1/responses) through the official openai client, against a server with
// --tool-call-parser deepseek_v3 on a model with random weights. What a response says is checked
// against what it means: the same generation as the chat request with the same conversation
// (temperature 0), streamed events that add up to the object, a conversation continued with
// previous_response_id equal to one sent whole, function calls whose arguments ajv validates,
// JSON under text.format, stored responses read, listed, deleted, and a background run cancelled.
import OpenAI from "openai";
import Ajv2020 from "ajv/dist/2020.js";
import assert from "node:assert/strict";

const client = new OpenAI({ baseURL: process.env.DUET_URL, apiKey: "none" });
const model = process.env.DUET_MODEL;
const ajv = new Ajv2020({ allErrors: true, strict: false });
let checks = 0;
const ok = (name) => { checks++; console.log(`ok ${name}`); };

const outputText = (r) => r.output.filter((i) => i.type === "message")
  .flatMap((i) => i.content).filter((c) => c.type === "output_text").map((c) => c.text).join("");

async function chatText(messages, max_tokens, extra = {}) {
  const c = await client.chat.completions.create({ model, messages, max_tokens, temperature: 0, ...extra });
  return c.choices[0].message.content;
}

// The events of a streamed response, checked for order: sequence numbers 0, 1, 2, ...; created
// first, one terminal event last; every delta belongs to an item that was added and not yet done.
async function streamed(body) {
  const s = await client.responses.create({ ...body, stream: true });
  const events = [];
  for await (const e of s) events.push(e);
  events.forEach((e, i) => assert.equal(e.sequence_number, i, `sequence of ${e.type}`));
  assert.equal(events[0].type, "response.created");
  assert.equal(events[1].type, "response.in_progress");
  const last = events[events.length - 1];
  assert.ok(["response.completed", "response.incomplete", "response.failed"].includes(last.type), last.type);
  const open = new Map();
  const items = [];
  for (const e of events.slice(2, -1)) {
    if (e.type === "response.output_item.added") {
      assert.equal(e.output_index, items.length);
      items.push({ ...e.item, text: "", arguments: "" });
      open.set(e.item.id, e.output_index);
    } else if (e.type === "response.output_item.done") {
      assert.ok(open.has(e.item.id), `done for an item not open: ${e.item.id}`);
      open.delete(e.item.id);
      items[e.output_index].done = e.item;
    } else if (e.type.endsWith(".delta")) {
      assert.ok(open.has(e.item_id), `${e.type} for an item not open`);
      const item = items[open.get(e.item_id)];
      if (e.type === "response.function_call_arguments.delta") item.arguments += e.delta;
      else item.text += e.delta;
    }
  }
  assert.equal(open.size, 0, "items left open");
  return { events, items, final: last.response };
}

const hi = [{ role: "user", content: "Hello, who are you?" }];

// A plain answer is the chat answer to the same conversation; instructions are the system message.
{
  const r = await client.responses.create({ model, input: "Hello, who are you?", max_output_tokens: 12, temperature: 0 });
  assert.match(r.id, /^resp_/);
  assert.equal(r.object, "response");
  assert.equal(r.model, model);
  assert.equal(r.output.length, 1);
  assert.equal(r.output[0].type, "message");
  assert.equal(r.output[0].role, "assistant");
  assert.equal(r.output_text, await chatText(hi, 12));
  assert.equal(r.usage.output_tokens, 12);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.equal(r.status, "incomplete");  // max_output_tokens reached
  assert.equal(r.incomplete_details.reason, "max_output_tokens");
  const withInstructions = await client.responses.create({ model, instructions: "Answer in French.", input: hi,
                                                           max_output_tokens: 10, temperature: 0 });
  assert.equal(withInstructions.instructions, "Answer in French.");
  assert.equal(withInstructions.output_text,
               await chatText([{ role: "system", content: "Answer in French." }, ...hi], 10));
  ok("a response is the chat completion of the same conversation");

  // A stop string ends it: completed.
  const stopped = await client.responses.create({ model, input: "Hello, who are you?", max_output_tokens: 40,
                                                  temperature: 0, stop: [" "] });
  assert.equal(stopped.status, "completed");
  assert.equal(stopped.incomplete_details, null);
  assert.equal(stopped.output[0].status, "completed");
  ok("completed when the model stops");

  // Streamed: the events add up to the same text and the same final object.
  const s = await streamed({ model, input: "Hello, who are you?", max_output_tokens: 12, temperature: 0 });
  assert.equal(s.items.length, 1);
  assert.equal(s.items[0].text, r.output_text);
  assert.equal(s.items[0].done.content[0].text, r.output_text);
  assert.equal(s.events.at(-1).type, "response.incomplete");
  assert.equal(outputText(s.final), r.output_text);
  assert.equal(s.final.usage.output_tokens, 12);
  ok(`streamed events (${s.events.length}) add up to the response`);

  // The client's stream helper accumulates them too.
  const helper = client.responses.stream({ model, input: "Hello, who are you?", max_output_tokens: 40, temperature: 0,
                                           stop: [" "] });
  let deltas = "";
  helper.on("response.output_text.delta", (e) => { deltas += e.delta; });
  const final = await helper.finalResponse();
  assert.equal(final.status, "completed");
  assert.equal(outputText(final), stopped.output_text);
  assert.equal(deltas, stopped.output_text);
  ok("responses.stream() helper");
}

// A conversation continued with previous_response_id is the chat of the whole conversation; a
// stored response is read back, its input listed, and deleted.
{
  const first = await client.responses.create({ model, instructions: "Be brief.", input: "Name a colour.",
                                                max_output_tokens: 6, temperature: 0 });
  const second = await client.responses.create({ model, previous_response_id: first.id, input: "And another?",
                                                 max_output_tokens: 6, temperature: 0 });
  assert.equal(second.previous_response_id, first.id);
  // The instructions are not carried over (as OpenAI documents).
  assert.equal(second.output_text, await chatText([
    { role: "user", content: "Name a colour." }, { role: "assistant", content: first.output_text },
    { role: "user", content: "And another?" }], 6));
  const third = await client.responses.create({ model, previous_response_id: second.id, instructions: "Be brief.",
                                                input: [{ role: "user", content: [{ type: "input_text", text: "Why?" }] }],
                                                max_output_tokens: 6, temperature: 0 });
  assert.equal(third.output_text, await chatText([
    { role: "system", content: "Be brief." },
    { role: "user", content: "Name a colour." }, { role: "assistant", content: first.output_text },
    { role: "user", content: "And another?" }, { role: "assistant", content: second.output_text },
    { role: "user", content: "Why?" }], 6));
  ok("previous_response_id continues the conversation");

  const got = await client.responses.retrieve(second.id);
  const plain = ({ output_text, ...rest }) => JSON.parse(JSON.stringify(rest));  // the client adds output_text
  assert.deepEqual(plain(got), plain(second));
  const items = await client.responses.inputItems.list(third.id);
  assert.equal(items.data.length, 1);
  assert.equal(items.data[0].type, "message");
  assert.equal(items.data[0].content[0].text, "Why?");
  await client.responses.del(first.id);
  await assert.rejects(client.responses.retrieve(first.id), (e) => e.status === 404);
  // Its successors hold their own conversation: they go on after it is gone.
  const fourth = await client.responses.create({ model, previous_response_id: second.id, input: "Thanks.",
                                                 max_output_tokens: 4, temperature: 0 });
  assert.equal(fourth.status, "incomplete");
  await assert.rejects(
    client.responses.create({ model, previous_response_id: first.id, input: "x", max_output_tokens: 2 }),
    (e) => e.status === 404 && e.param === "previous_response_id");
  // store: false is not kept.
  const unstored = await client.responses.create({ model, input: "x", max_output_tokens: 2, store: false });
  assert.equal(unstored.store, false);
  await assert.rejects(client.responses.retrieve(unstored.id), (e) => e.status === 404);
  ok("stored responses: retrieve, input items, delete, store false");
}

// Function tools: forced calls come back as function_call items with valid arguments; streamed
// argument deltas add up to the same call; the results go back as function_call_output items.
{
  const tools = [
    { type: "function", name: "get_weather", description: "Current weather in a city",
      parameters: { type: "object", properties: { city: { type: "string", maxLength: 12 }, unit: { enum: ["c", "f"] } },
                    required: ["city"], additionalProperties: false } },
    { type: "function", name: "get_time", description: "Local time in a time zone",
      parameters: { type: "object", properties: { tz: { type: "string", maxLength: 12 } }, required: ["tz"],
                    additionalProperties: false } },
  ];
  const validators = Object.fromEntries(tools.map((t) => [t.name, ajv.compile(t.parameters)]));
  for (const seed of [1, 2]) {
    const body = { model, input: "What is the weather in Paris?", tools, tool_choice: "required", max_output_tokens: 400,
                   temperature: 1.0, seed, parallel_tool_calls: false };
    const r = await client.responses.create(body);
    const calls = r.output.filter((i) => i.type === "function_call");
    assert.equal(calls.length, 1, JSON.stringify(r.output));
    for (const c of calls) {
      assert.match(c.call_id, /^call_[0-9a-f]{24}$/);
      assert.match(c.id, /^fc_/);
      const validate = validators[c.name];
      assert.ok(validate, `unknown function ${c.name}`);
      assert.ok(validate(JSON.parse(c.arguments)), `${c.name}(${c.arguments}): ${ajv.errorsText(validate.errors)}`);
    }
    const s = await streamed(body);
    const sc = s.items.filter((i) => i.type === "function_call");
    assert.deepEqual(sc.map((c) => [c.name, c.arguments]), calls.map((c) => [c.name, c.arguments]));
    assert.deepEqual(sc.map((c) => c.done.arguments), calls.map((c) => c.arguments));
    const named = await client.responses.create({ ...body, tool_choice: { type: "function", name: "get_time" } });
    assert.deepEqual(named.output.filter((i) => i.type === "function_call").map((c) => c.name), ["get_time"]);

    // The round trip: the call and its output go back as input items; the prompt is the chat
    // prompt of the same exchange (the same answer at temperature 0).
    const next = await client.responses.create({
      model, tools, max_output_tokens: 8, temperature: 0,
      input: [{ role: "user", content: "What is the weather in Paris?" }, calls[0],
              { type: "function_call_output", call_id: calls[0].call_id, output: "sunny, 21 C" }] });
    const chat = await client.chat.completions.create({
      model, max_tokens: 8, temperature: 0, tools: tools.map(({ type, ...f }) => ({ type, function: f })),
      messages: [{ role: "user", content: "What is the weather in Paris?" },
                 { role: "assistant", content: null, tool_calls: [{ id: calls[0].call_id, type: "function",
                   function: { name: calls[0].name, arguments: calls[0].arguments } }] },
                 { role: "tool", tool_call_id: calls[0].call_id, content: "sunny, 21 C" }] });
    assert.equal(next.usage.input_tokens, chat.usage.prompt_tokens);
    assert.equal(outputText(next), chat.choices[0].message.content ?? "");
  }
  ok("function calls (required, named, streamed, round trip)");
}

// text.format json_schema: the answer is JSON valid under the schema.
{
  const schema = { type: "object", properties: { name: { type: "string", maxLength: 10 }, age: { type: "integer" } },
                   required: ["name", "age"], additionalProperties: false };
  const validate = ajv.compile(schema);
  for (const seed of [1, 2, 3]) {
    const r = await client.responses.create({ model, input: "Describe a person as JSON.", max_output_tokens: 400,
                                              temperature: 1.0, seed,
                                              text: { format: { type: "json_schema", name: "person", schema, strict: true } } });
    assert.equal(r.status, "completed");
    assert.ok(validate(JSON.parse(r.output_text)), `${r.output_text}: ${ajv.errorsText(validate.errors)}`);
    assert.equal(r.text.format.name, "person");
  }
  ok("text.format json_schema");
}

// Logprobs on request, the same as the chat API's.
{
  const r = await client.responses.create({ model, input: "Hello, who are you?", max_output_tokens: 5, temperature: 0,
                                            top_logprobs: 2, include: ["message.output_text.logprobs"] });
  const c = await client.chat.completions.create({ model, messages: hi, max_tokens: 5, temperature: 0, logprobs: true,
                                                   top_logprobs: 2 });
  const lp = r.output[0].content[0].logprobs;
  assert.equal(lp.length, 5);
  assert.deepEqual(lp.map((t) => t.token), c.choices[0].logprobs.content.map((t) => t.token));
  assert.equal(lp[0].top_logprobs.length, 2);
  ok("logprobs");
}

// Background: answered at once, read while it runs, cancelled.
{
  const r = await client.responses.create({ model, input: "Count.", max_output_tokens: 30000, background: true,
                                            ignore_eos: true, temperature: 1.0 });
  assert.equal(r.background, true);
  assert.ok(["queued", "in_progress"].includes(r.status), r.status);
  let now = await client.responses.retrieve(r.id);
  for (let i = 0; i < 200 && now.usage.output_tokens === 0; i++) {
    await new Promise((res) => setTimeout(res, 10));
    now = await client.responses.retrieve(r.id);
  }
  assert.equal(now.status, "in_progress");
  assert.ok(now.usage.output_tokens > 0);
  await assert.rejects(client.responses.create({ model, previous_response_id: r.id, input: "x", max_output_tokens: 2 }),
                       (e) => e.status === 400);
  await client.responses.cancel(r.id);
  const after = await client.responses.retrieve(r.id);
  assert.equal(after.status, "cancelled");
  assert.ok(after.usage.output_tokens < 30000);
  ok(`background run cancelled after ${after.usage.output_tokens} tokens`);

  // Deleted while it runs: it stops, and does not come back when it has.
  const doomed = await client.responses.create({ model, input: "Count.", max_output_tokens: 30000, background: true,
                                                 ignore_eos: true });
  await new Promise((res) => setTimeout(res, 50));
  await client.responses.del(doomed.id);
  await new Promise((res) => setTimeout(res, 500));
  await assert.rejects(client.responses.retrieve(doomed.id), (e) => e.status === 404);
  ok("a background run deleted while it runs stays deleted");

  // ignore_eos: an end of text sampled within the 5 tokens would make it "completed" (it happened once).
  const done = await client.responses.create({ model, input: "Count.", max_output_tokens: 5, background: true,
                                               ignore_eos: true });
  let polled = done;
  for (let i = 0; i < 500 && ["queued", "in_progress"].includes(polled.status); i++) {
    await new Promise((res) => setTimeout(res, 10));
    polled = await client.responses.retrieve(done.id);
  }
  assert.equal(polled.status, "incomplete");
  assert.equal(polled.usage.output_tokens, 5);
  ok("background run polled to its end");
}

// Refusals name the parameter.
for (const [body, param] of [
  [{ input: "x", messages: [] }, "messages"],
  [{ input: 5 }, "input"],
  [{}, "input"],
  [{ input: "x", tools: [{ type: "web_search_preview" }] }, "tools"],
  [{ input: [{ role: "user", content: [{ type: "input_image", image_url: "https://example.com/a.png" }] }] }, "input"],
  [{ input: "x", max_output_tokens: 1000000 }, "max_output_tokens"],
  [{ input: "x", text: { format: { type: "json_schema", name: "x" } } }, "text"],
  [{ input: "x", background: true, store: false }, "background"],
  [{ input: "x", metadata: { a: 5 } }, "metadata"],
]) {
  await assert.rejects(client.responses.create({ model, ...body }),
                       (e) => e.status === 400 && e.param === param, JSON.stringify(body));
}
ok("refusals");

console.log(`${checks} checks passed`);
