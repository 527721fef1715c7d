// Structured output through the official openai client (DUET_URL, DUET_MODEL), every answer
// checked by ajv, a JSON Schema validator: each schema of schemas/ with several seeds, on a
// model with random weights (the grammar alone must make the output valid), streamed and not;
// then json_object, guided_choice, guided_regex and guided_grammar.
import OpenAI from "openai";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";

const client = new OpenAI({ baseURL: process.env.DUET_URL, apiKey: "none" });
const model = process.env.DUET_MODEL;
const seeds = (process.env.DUET_SEEDS ?? "1,2,3").split(",").map(Number);
const dir = path.join(path.dirname(new URL(import.meta.url).pathname), "schemas");
const ajv = new Ajv2020({ allErrors: true, strict: false });
addFormats(ajv);
let checks = 0;
const ok = (name) => { checks++; console.log(`ok ${name}`); };

async function answer(body, stream) {
  if (!stream) {
    const r = await client.chat.completions.create(body);
    return { text: r.choices[0].message.content, finish: r.choices[0].finish_reason };
  }
  const s = await client.chat.completions.create({ ...body, stream: true });
  let text = "", finish = null;
  for await (const chunk of s) {
    for (const c of chunk.choices) {
      text += c.delta.content ?? "";
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { text, finish };
}

const files = fs.readdirSync(dir).filter((f) => f.endsWith(".json")).sort();
const jobs = [];
for (const file of files) {
  const schema = JSON.parse(fs.readFileSync(path.join(dir, file), "utf8"));
  const validate = ajv.compile(schema);
  for (const seed of seeds) {
    const stream = seed % 2 === 0;
    jobs.push((async () => {
      const { text, finish } = await answer({
        model, messages: [{ role: "user", content: `Fill in ${file}` }], max_tokens: 2000, temperature: 1.0, seed,
        response_format: { type: "json_schema", json_schema: { name: file.replace(".json", ""), schema } },
      }, stream);
      assert.equal(finish, "stop", `${file} seed ${seed}: finish ${finish} after ${text.length} bytes: ${text}`);
      let value;
      try { value = JSON.parse(text); } catch (e) { assert.fail(`${file} seed ${seed}: not JSON: ${text}`); }
      assert.ok(validate(value), `${file} seed ${seed}: ${ajv.errorsText(validate.errors)}\n${text}`);
      return `${file} seed ${seed}${stream ? " streamed" : ""}`;
    })());
  }
}
for (const name of await Promise.all(jobs)) ok(name);

// Any JSON object.
for (const seed of seeds) {
  const { text, finish } = await answer({ model, messages: [{ role: "user", content: "JSON please" }], max_tokens: 1500,
                                          temperature: 1.0, seed, response_format: { type: "json_object" } }, false);
  assert.equal(finish, "stop", text);
  const v = JSON.parse(text);
  assert.ok(v !== null && typeof v === "object" && !Array.isArray(v), text);
}
ok("json_object");

// vLLM's guided_* fields (the client sends unknown fields as they are).
const choice = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Mood?" }], seed: 1,
  temperature: 1.0, max_tokens: 50, guided_choice: ["happy", "sad", "neither of them"] });
assert.ok(["happy", "sad", "neither of them"].includes(choice.choices[0].message.content), choice.choices[0].message.content);
ok("guided_choice");
const re = /^[A-Z]{2}-\d{3,5}$/;
for (const seed of seeds) {
  const r = await client.completions.create({ model, prompt: "Code:", seed, temperature: 1.0, max_tokens: 50,
    guided_regex: "[A-Z]{2}-\\d{3,5}" });
  assert.match(r.choices[0].text, re);
  assert.equal(r.choices[0].finish_reason, "stop");
}
ok("guided_regex (completions)");
const gbnf = 'root ::= "Answer: " item (", " item){0,2}\nitem ::= [a-z]{1,6} | [0-9]+';
for (const seed of seeds) {
  const r = await client.chat.completions.create({ model, messages: [{ role: "user", content: "List" }], seed,
    temperature: 1.0, max_tokens: 80, guided_grammar: gbnf });
  assert.match(r.choices[0].message.content, /^Answer: ([a-z]{1,6}|[0-9]+)(, ([a-z]{1,6}|[0-9]+)){0,2}$/);
}
ok("guided_grammar");

// n > 1 and greedy: every choice valid, and greedy repeatable.
const schema = JSON.parse(fs.readFileSync(path.join(dir, "sentiment.json"), "utf8"));
const validate = ajv.compile(schema);
const multi = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Rate" }], n: 3,
  seed: 5, temperature: 1.0, max_tokens: 500,
  response_format: { type: "json_schema", json_schema: { name: "s", schema } } });
assert.equal(multi.choices.length, 3);
for (const c of multi.choices) assert.ok(validate(JSON.parse(c.message.content)), c.message.content);
const g1 = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Rate" }], temperature: 0,
  max_tokens: 500, response_format: { type: "json_schema", json_schema: { name: "s", schema } } });
const g2 = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Rate" }], temperature: 0,
  max_tokens: 500, response_format: { type: "json_schema", json_schema: { name: "s", schema } } });
assert.equal(g1.choices[0].message.content, g2.choices[0].message.content);
if (g1.choices[0].finish_reason === "stop") assert.ok(validate(JSON.parse(g1.choices[0].message.content)));
ok("n > 1 and greedy");

// Errors name the field.
for (const [body, param] of [
  [{ response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "integer", multipleOf: 3 } } } }, "response_format"],
  [{ response_format: { type: "xml" } }, "response_format"],
  [{ guided_regex: "(?=a)b" }, "guided_regex"],
  [{ guided_grammar: "root ::= missing" }, "guided_grammar"],
  [{ guided_choice: [] }, "guided_choice"],
  [{ guided_json: { type: "object" }, guided_regex: "a" }, "guided_regex"],
  [{ response_format: { type: "json_object" }, use_beam_search: true, n: 2 }, "use_beam_search"],
]) {
  try {
    await client.chat.completions.create({ model, messages: [{ role: "user", content: "x" }], max_tokens: 5, ...body });
    assert.fail(`accepted ${JSON.stringify(body)}`);
  } catch (e) {
    assert.equal(e.status, 400, `${JSON.stringify(body)}: ${e}`);
    assert.equal(e.param, param, `${JSON.stringify(body)}: ${e.message}`);
  }
}
ok("errors name the field");

console.log(`${checks} checks passed`);
