// The official openai npm client against a running `duet serve` (DUET_URL, DUET_KEY, DUET_MODEL).
import OpenAI from "openai";
import assert from "node:assert/strict";

const client = new OpenAI({ baseURL: process.env.DUET_URL, apiKey: process.env.DUET_KEY });
const model = process.env.DUET_MODEL;
let checks = 0;
const ok = (name) => { checks++; console.log(`ok ${name}`); };

// Chat, not streamed.
const chat = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Say hello" }], max_tokens: 8, temperature: 0,
});
assert.equal(chat.object, "chat.completion");
assert.equal(chat.choices[0].message.role, "assistant");
assert.equal(typeof chat.choices[0].message.content, "string");
assert.ok(["stop", "length"].includes(chat.choices[0].finish_reason));
assert.ok(chat.usage.completion_tokens >= 1 && chat.usage.completion_tokens <= 8);
ok("chat");

// Chat, streamed: the deltas add up to the same text as the non-streamed greedy answer.
const stream = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Say hello" }], max_tokens: 8, temperature: 0, stream: true,
  stream_options: { include_usage: true },
});
let streamed = "";
let finish = null;
let usage = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    streamed += c.delta.content ?? "";
    if (c.finish_reason) finish = c.finish_reason;
  }
}
assert.equal(streamed, chat.choices[0].message.content);
assert.equal(finish, chat.choices[0].finish_reason);
assert.equal(usage.completion_tokens, chat.usage.completion_tokens);
ok("chat stream");

// vLLM's continuous_usage_stats: every chunk carries the usage so far.
const counted = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Say hello" }], max_tokens: 8, temperature: 0, stream: true,
  stream_options: { include_usage: true, continuous_usage_stats: true },
});
const seen = [];
for await (const chunk of counted) seen.push(chunk.usage);
assert.ok(seen.length >= 3 && seen.every((u) => u && u.prompt_tokens === chat.usage.prompt_tokens), JSON.stringify(seen));
assert.ok(seen.every((u, i) => i === 0 || u.completion_tokens >= seen[i - 1].completion_tokens));
assert.equal(seen.at(-1).completion_tokens, chat.usage.completion_tokens);
ok("continuous usage stats");

// One model by its id.
const one = await client.models.retrieve(model);
assert.equal(one.id, model);
assert.equal(one.object, "model");
await assert.rejects(client.models.retrieve("no-such-model"), (e) => e.status === 404);
ok("models.retrieve");

// Completions, with logprobs.
const comp = await client.completions.create({
  model, prompt: "def main():", max_tokens: 6, temperature: 0, logprobs: 2, extra_body: { ignore_eos: true },
});
assert.equal(comp.object, "text_completion");
assert.equal(comp.choices[0].finish_reason, "length");
assert.equal(comp.choices[0].logprobs.tokens.length, 6);
assert.equal(comp.choices[0].logprobs.token_logprobs.length, 6);
for (const top of comp.choices[0].logprobs.top_logprobs) assert.ok(Object.keys(top).length >= 1 && Object.keys(top).length <= 2);
for (const lp of comp.choices[0].logprobs.token_logprobs) assert.ok(lp <= 0);
ok("completions with logprobs");

// Completions streamed: same text as not streamed.
const compStream = await client.completions.create({
  model, prompt: "def main():", max_tokens: 6, temperature: 0, stream: true, extra_body: { ignore_eos: true },
});
let compText = "";
for await (const chunk of compStream) for (const c of chunk.choices) compText += c.text;
assert.equal(compText, comp.choices[0].text);
ok("completions stream");

// Chat logprobs.
const chatLp = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "x" }], max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 3,
  extra_body: { ignore_eos: true },
});
const content = chatLp.choices[0].logprobs.content;
assert.equal(content.length, 4);
for (const t of content) {
  assert.equal(t.top_logprobs.length, 3);
  assert.ok(t.logprob <= 0 && Array.isArray(t.bytes));
}
ok("chat logprobs");

// n > 1: three different samples with a seed, reproducible.
const nreq = { model, prompt: "Once", max_tokens: 8, temperature: 1.0, n: 3, seed: 7, extra_body: { ignore_eos: true } };
const n1 = await client.completions.create(nreq);
const n2 = await client.completions.create(nreq);
assert.equal(n1.choices.length, 3);
assert.deepEqual(n1.choices.map((c) => c.index), [0, 1, 2]);
assert.deepEqual(n1.choices.map((c) => c.text), n2.choices.map((c) => c.text));
assert.equal(n1.usage.completion_tokens, 24);
ok("n > 1");

// stop: cut a greedy completion at a substring of its text.
const full = await client.completions.create({
  model, prompt: "The", max_tokens: 24, temperature: 0, extra_body: { ignore_eos: true },
});
const text = full.choices[0].text;
let stopAt = -1;
for (let i = 3; i + 2 <= text.length; i++) {
  const s = text.slice(i, i + 2);
  if (/^[\x21-\x7e]{2}$/.test(s) && text.indexOf(s) === i) { stopAt = i; break; }
}
assert.ok(stopAt > 0, `no stop candidate in ${JSON.stringify(text)}`);
const stopped = await client.completions.create({
  model, prompt: "The", max_tokens: 24, temperature: 0, stop: [text.slice(stopAt, stopAt + 2)], extra_body: { ignore_eos: true },
});
assert.equal(stopped.choices[0].text, text.slice(0, stopAt));
assert.equal(stopped.choices[0].finish_reason, "stop");
ok("stop");

// Errors surface as the client's typed errors.
await assert.rejects(client.completions.create({ model, prompt: "x", top_p: 3 }), (e) => e.status === 400);
await assert.rejects(client.completions.create({ model: "missing-model", prompt: "x" }), (e) => e.status === 404);
const bad = new OpenAI({ baseURL: process.env.DUET_URL, apiKey: "wrong" });
await assert.rejects(bad.completions.create({ model, prompt: "x" }), (e) => e.status === 401);
ok("errors");

console.log(`${checks} checks passed`);
