// Speculative decoding through the official openai client (DUET_URL, DUET_MODEL): greedy and
// seeded completions and chats over prompts that repeat themselves, streamed and not, written to
// DUET_OUT as JSON so that a run with drafts can be compared with one without.
import OpenAI from "openai";
import assert from "node:assert/strict";
import fs from "node:fs";

const client = new OpenAI({ baseURL: process.env.DUET_URL, apiKey: "none" });
const model = process.env.DUET_MODEL;
const prompts = [
  "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return",
  "for i in range(10):\n    print(i)\nfor i in range(10):\n    print(",
  "the cache holds the blocks; the cache holds the",
  "x = 1\ny = 2\nx = 1\ny = 2\nx = 1\n",
];
const out = {};
let checks = 0;
const ok = (name) => { checks++; console.log(`ok ${name}`); };

const jobs = [];
prompts.forEach((prompt, i) => {
  for (const sampling of [{ temperature: 0 }, { temperature: 0.8, top_k: 5, seed: 100 + i }]) {
    const tag = `${i}-${sampling.temperature}`;
    const body = { model, prompt, max_tokens: 40, ignore_eos: true, ...sampling };
    jobs.push((async () => {
      const r = await client.completions.create(body);
      assert.equal(r.choices[0].finish_reason, "length");
      assert.equal(r.usage.completion_tokens, 40);
      out[`completion ${tag}`] = r.choices[0].text;
      const s = await client.completions.create({ ...body, stream: true });
      let text = "";
      for await (const chunk of s) text += chunk.choices[0]?.text ?? "";
      assert.equal(text, r.choices[0].text, "streamed text differs from the whole one");
      ok(`completion ${tag}`);
    })());
    jobs.push((async () => {
      const r = await client.chat.completions.create({
        model, messages: [{ role: "user", content: prompt }], max_tokens: 32, ...sampling,
      });
      out[`chat ${tag}`] = r.choices[0].message.content;
      ok(`chat ${tag}`);
    })());
  }
});
await Promise.all(jobs);
fs.writeFileSync(process.env.DUET_OUT, JSON.stringify(out, null, 1));
console.log(`${checks} checks`);
