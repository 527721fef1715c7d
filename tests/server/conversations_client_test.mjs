// OpenAI's Conversations API (/v1/conversations) and item references through the official openai
// client (its generic post/get/delete: this version has no conversations resource), against a
// model with random weights. What a conversation does is checked against what it means: a
// response that continues one is the same generation, from the same prompt tokens, as the
// response given all of its items as input (temperature 0), and its input and output items are
// added to the conversation in order; an item reference reads as the item it names.
import OpenAI from "openai";
import assert from "node:assert/strict";

const client = new OpenAI({ baseURL: process.env.DUET_URL, apiKey: "none" });
const model = process.env.DUET_MODEL;
let checks = 0;
const ok = (name) => { checks++; console.log(`ok ${name}`); };

const outputText = (r) => r.output.filter((i) => i.type === "message")
  .flatMap((i) => i.content).filter((c) => c.type === "output_text").map((c) => c.text).join("");
const settings = { model, max_output_tokens: 6, temperature: 0 };
// An error's status and param.
async function refused(promise) {
  try {
    await promise;
  } catch (e) {
    return [e.status, e.error?.param ?? e.param ?? null];
  }
  assert.fail("not refused");
}

// Made with two items and metadata, read back, its metadata changed.
const conv = await client.post("/conversations", {
  body: {
    items: [
      { type: "message", role: "system", content: "You answer in one word." },
      { type: "message", role: "user", content: "My name is Ada." },
    ],
    metadata: { topic: "names" },
  },
});
assert.match(conv.id, /^conv_/);
assert.equal(conv.object, "conversation");
assert.deepEqual(conv.metadata, { topic: "names" });
assert.deepEqual(await client.get(`/conversations/${conv.id}`), conv);
const updated = await client.post(`/conversations/${conv.id}`, { body: { metadata: { topic: "people" } } });
assert.deepEqual(updated.metadata, { topic: "people" });
let items = await client.get(`/conversations/${conv.id}/items`, { query: { order: "asc" } });
assert.equal(items.object, "list");
assert.deepEqual(items.data.map((i) => [i.type, i.role, i.content[0].type]),
  [["message", "system", "input_text"], ["message", "user", "input_text"]]);
ok("a conversation made with items and metadata, read back, its metadata updated");

// A response that continues it: the same generation from the same tokens as one given its items.
const question = { type: "message", role: "user", content: "What is my name?" };
const r1 = await client.responses.create({ ...settings, conversation: conv.id, input: [question] });
const whole = await client.responses.create({
  ...settings, store: false,
  input: [
    { type: "message", role: "system", content: "You answer in one word." },
    { type: "message", role: "user", content: "My name is Ada." },
    question,
  ],
});
assert.equal(r1.conversation.id, conv.id);
assert.equal(r1.usage.input_tokens, whole.usage.input_tokens);
assert.equal(outputText(r1), outputText(whole));
items = await client.get(`/conversations/${conv.id}/items`, { query: { order: "asc" } });
assert.equal(items.data.length, 4);
assert.equal(items.data[2].content[0].text, "What is my name?");
assert.equal(items.data[3].id, r1.output[r1.output.length - 1].id);
assert.equal(items.data[3].role, "assistant");
ok(`a response in the conversation is the one given its items (${r1.usage.input_tokens} input tokens), and adds its input and output`);

// The next turn continues from there, the assistant's answer included.
const r2 = await client.responses.create({ ...settings, conversation: { id: conv.id }, input: "And again?" });
const whole2 = await client.responses.create({
  ...settings, store: false,
  input: [
    { type: "message", role: "system", content: "You answer in one word." },
    { type: "message", role: "user", content: "My name is Ada." },
    question,
    { type: "message", role: "assistant", content: outputText(r1) },
    { type: "message", role: "user", content: "And again?" },
  ],
});
assert.equal(r2.usage.input_tokens, whole2.usage.input_tokens);
assert.equal(outputText(r2), outputText(whole2));
const desc = await client.get(`/conversations/${conv.id}/items`, { query: { limit: 2 } });
assert.equal(desc.data.length, 2);
assert.equal(desc.has_more, true);
assert.equal(desc.data[0].id, r2.output[r2.output.length - 1].id);  // newest first
ok("a second turn continues the first (its answer included); items listed newest first, in pages");

// Item references: an item of the conversation, and of a previous response, read as the item.
const all = (await client.get(`/conversations/${conv.id}/items`, { query: { order: "asc", limit: 100 } })).data;
const referenced = await client.responses.create({
  ...settings, store: false, conversation: conv.id, input: [{ type: "item_reference", id: all[1].id }],
});
const spelled = await client.responses.create({
  ...settings, store: false, input: [...all, { type: "message", role: "user", content: "My name is Ada." }],
});
assert.equal(referenced.usage.input_tokens, spelled.usage.input_tokens);
assert.equal(outputText(referenced), outputText(spelled));
const grown = (await client.get(`/conversations/${conv.id}/items`, { query: { order: "asc", limit: 100 } })).data;
assert.equal(grown.length, all.length + 1);  // the answer; the item referenced is there already
assert.equal(new Set(grown.map((i) => i.id)).size, grown.length);
const first = await client.responses.create({ ...settings, input: "Say a word." });
const byRef = await client.responses.create({
  ...settings, store: false, previous_response_id: first.id,
  input: [{ type: "item_reference", id: first.output[first.output.length - 1].id }],
});
const byText = await client.responses.create({
  ...settings, store: false, previous_response_id: first.id,
  input: [{ type: "message", role: "assistant", content: outputText(first) }],
});
assert.equal(byRef.usage.input_tokens, byText.usage.input_tokens);
assert.deepEqual(await refused(client.responses.create({
  ...settings, input: [{ type: "item_reference", id: "msg_nothing" }],
})), [400, "input"]);
ok("item references to a conversation's item and to a previous response's output read as those items");

// Items added, read and deleted by id.
const added = await client.post(`/conversations/${conv.id}/items`, {
  body: { items: [{ type: "message", role: "user", content: "An aside." }] },
});
assert.equal(added.data.length, 1);
const aside = added.data[0];
assert.deepEqual(await client.get(`/conversations/${conv.id}/items/${aside.id}`), aside);
const after = await client.delete(`/conversations/${conv.id}/items/${aside.id}`);
assert.equal(after.id, conv.id);
assert.deepEqual(await refused(client.get(`/conversations/${conv.id}/items/${aside.id}`)), [404, "item_id"]);
ok("items added, read and deleted by id");

// Refusals, then the conversation deleted.
assert.deepEqual(await refused(client.responses.create({ ...settings, conversation: conv.id, previous_response_id: first.id,
  input: "x" })), [400, "conversation"]);
assert.deepEqual(await refused(client.post("/conversations", {
  body: { items: Array.from({ length: 21 }, () => ({ type: "message", role: "user", content: "x" })) },
})), [400, "items"]);
assert.deepEqual(await refused(client.post("/conversations", { body: { items: [{ type: "message", role: "pilot", content: "x" }] } })),
  [400, "items"]);
assert.deepEqual(await refused(client.post("/conversations", { body: { metadata: { k: 1 } } })), [400, "metadata"]);
const deleted = await client.delete(`/conversations/${conv.id}`);
assert.deepEqual(deleted, { id: conv.id, object: "conversation.deleted", deleted: true });
assert.deepEqual(await refused(client.get(`/conversations/${conv.id}`)), [404, "conversation_id"]);
assert.deepEqual(await refused(client.responses.create({ ...settings, conversation: conv.id, input: "x" })), [404, "conversation_id"]);
ok("refusals name their parameter; a deleted conversation is gone, for responses too");

console.log(`${checks} checks passed`);
