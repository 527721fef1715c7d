// Several models behind one server, through the official openai client (DUET_URL): the models
// listed, greedy answers of each (written to DUET_OUT so the script can compare them with servers
// of one model each), requests to both at once, streamed and not, and an unknown model refused.
// DUET_MODELS: the served names, comma separated.
import OpenAI from "openai";
import assert from "node:assert/strict";
import fs from "node:fs";

const client = new OpenAI({ baseURL: process.env.DUET_URL, apiKey: "none", maxRetries: 0 });
const names = process.env.DUET_MODELS.split(",");
let checks = 0;
const ok = (name) => { checks++; console.log(`ok ${name}`); };
const prompts = ["Hello there", "The cache holds", "def add(a, b):"];

const list = await client.models.list();
const listed = list.data.map((m) => m.id);
assert.deepEqual([...listed].sort(), [...names].sort(), `listed ${listed}`);
for (const m of list.data) assert.ok(m.max_model_len > 0, JSON.stringify(m));
ok(`models listed: ${listed.join(", ")}`);

const out = {};
for (const model of names) {
  for (const prompt of prompts) {
    const r = await client.completions.create({ model, prompt, max_tokens: 12, temperature: 0, ignore_eos: true });
    assert.equal(r.model, model);
    assert.equal(r.usage.completion_tokens, 12);
    out[`${model} ${prompt}`] = r.choices[0].text;
  }
  const chat = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "Hi" }], max_tokens: 8, temperature: 0,
  });
  assert.equal(chat.model, model);
  out[`${model} chat`] = chat.choices[0].message.content;
  ok(`greedy answers of ${model}`);
}

// Both models at once: 6 streams each.
const streams = [];
for (const model of names) {
  for (let i = 0; i < 6; i++) {
    streams.push((async () => {
      const s = await client.completions.create({
        model, prompt: prompts[i % prompts.length], max_tokens: 20, temperature: 0, ignore_eos: true, stream: true,
      });
      let text = "", finish = null;
      for await (const chunk of s) {
        assert.equal(chunk.model, model);
        text += chunk.choices[0]?.text ?? "";
        finish = chunk.choices[0]?.finish_reason ?? finish;
      }
      assert.equal(finish, "length");
      return text;
    })());
  }
}
const texts = await Promise.all(streams);
assert.equal(texts.length, 6 * names.length);
ok(`${texts.length} concurrent streams over ${names.length} models`);

await assert.rejects(client.completions.create({ model: "nope", prompt: "x", max_tokens: 2 }),
                     (e) => e.status === 404 && /nope/.test(e.message));
ok("an unknown model is a 404");
fs.writeFileSync(process.env.DUET_OUT, JSON.stringify(out, null, 1));
console.log(`${checks} checks`);
