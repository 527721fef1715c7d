// /v1/embeddings through the official openai client (which asks for base64 and decodes it) and
// as floats: unit-length vectors of the model's hidden size, the same input giving the same
// vector alone or in a list, token ids the same as their text, chat messages the same as their
// rendering, and a generation that runs beside embedding requests giving the text it gives alone.
import OpenAI from "openai";
import assert from "node:assert/strict";

const client = new OpenAI({ baseURL: process.env.DUET_URL, apiKey: "none" });
const model = process.env.DUET_MODEL;
const size = Number(process.env.DUET_HIDDEN);
let checks = 0;
const ok = (name) => { checks++; console.log(`ok ${name}`); };
const close = (a, b, tol = 1e-5) => a.length === b.length && a.every((x, i) => Math.abs(x - b[i]) <= tol);

const texts = ["The weather in Paris", "A recipe for bread", "The weather in Paris"];
const r = await client.embeddings.create({ model, input: texts });
assert.equal(r.object, "list");
assert.equal(r.model, model);
assert.equal(r.data.length, 3);
r.data.forEach((d, i) => {
  assert.equal(d.index, i);
  assert.equal(d.embedding.length, size);
  const norm = Math.sqrt(d.embedding.reduce((s, x) => s + x * x, 0));
  assert.ok(Math.abs(norm - 1) < 1e-5, `norm ${norm}`);
});
assert.ok(close(r.data[0].embedding, r.data[2].embedding), "the same text, the same vector");
assert.ok(!close(r.data[0].embedding, r.data[1].embedding, 1e-3), "other texts, other vectors");
assert.ok(r.usage.prompt_tokens > 0 && r.usage.total_tokens === r.usage.prompt_tokens);
ok("a list of texts (base64 through the client)");

// As floats (the client passes encoding_format through), one at a time: the same vectors.
for (let i = 0; i < 2; i++) {
  const f = await client.embeddings.create({ model, input: texts[i], encoding_format: "float" });
  assert.ok(close(f.data[0].embedding, r.data[i].embedding), `input ${i} alone and as floats`);
}
ok("floats, one at a time");

// Token ids: those /tokenize gives for the text.
const base = process.env.DUET_URL.replace(/\/v1$/, "");
const tok = await (await fetch(`${base}/tokenize`, { method: "POST", headers: { "Content-Type": "application/json" },
                                                     body: JSON.stringify({ prompt: texts[1] }) })).json();
const byIds = await client.embeddings.create({ model, input: [tok.tokens], encoding_format: "float" });
assert.ok(close(byIds.data[0].embedding, r.data[1].embedding));
ok("token ids");

// vLLM's chat form: messages rendered by the chat template, without the generation prompt.
const conversation = [{ role: "system", content: "Be brief." }, { role: "user", content: texts[0] }];
const post = async (path, body) => (await fetch(`${base}${path}`, {
  method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) })).json();
const rendered = await post("/tokenize", { messages: conversation, add_generation_prompt: false });
const viaChat = await post("/v1/embeddings", { model, messages: conversation });
const viaIds = await client.embeddings.create({ model, input: rendered.tokens, encoding_format: "float" });
assert.equal(viaChat.usage.prompt_tokens, rendered.count);
assert.ok(close(viaChat.data[0].embedding, viaIds.data[0].embedding));
const both = await fetch(`${base}/v1/embeddings`, { method: "POST", headers: { "Content-Type": "application/json" },
  body: JSON.stringify({ model, messages: conversation, input: "x" }) });
assert.equal(both.status, 400);
ok("messages, rendered by the chat template");

// A generation beside embedding requests: the same text at temperature 0.
const messages = [{ role: "user", content: "Tell me a story." }];
const alone = await client.chat.completions.create({ model, messages, max_tokens: 200, temperature: 0, ignore_eos: true });
const running = client.chat.completions.create({ model, messages, max_tokens: 200, temperature: 0, ignore_eos: true });
const beside = [];
for (let i = 0; i < 8; i++) beside.push(client.embeddings.create({ model, input: [`${i} ${texts[1]}`, texts[0]] }));
const [mixed, ...embedded] = await Promise.all([running, ...beside]);
assert.equal(mixed.choices[0].message.content, alone.choices[0].message.content);
for (const e of embedded) assert.ok(close(e.data[1].embedding, r.data[0].embedding));
ok("a generation beside embedding requests");

for (const [body, param] of [
  [{ input: "" }, "input"],
  [{ input: [] }, "input"],
  [{ input: [1, -2] }, "input"],
  [{ input: "x", dimensions: 7 }, "dimensions"],
  [{ input: "x", encoding_format: "hex" }, "encoding_format"],
  [{ input: "word ".repeat(20000) }, "input"],
]) {
  await assert.rejects(client.embeddings.create({ model, ...body }), (e) => e.status === 400 && e.param === param,
                       JSON.stringify(body).slice(0, 80));
}
const cut = await client.embeddings.create({ model, input: "word ".repeat(20000), truncate_prompt_tokens: 50 });
assert.equal(cut.usage.prompt_tokens, 50);
ok("refusals, and truncate_prompt_tokens");

console.log(`${checks} checks passed`);
