// Anthropic's Message Batches API (/v1/messages/batches) through the official anthropic client.
// A batch's results are what the same requests sent one by one answer (temperature 0: the same
// text and token counts), an errored request is errored in Anthropic's shape while the others
// succeed, the counts add up, pages follow after_id and before_id, a cancelled batch reports its
// unanswered requests as canceled, an ended batch is deleted (and gone), and the refusals.
import Anthropic from "@anthropic-ai/sdk";
import assert from "node:assert/strict";

const base = process.env.DUET_BASE;
const anthropic = new Anthropic({ baseURL: base, apiKey: "none", maxRetries: 0 });
const model = process.env.DUET_MODEL;
let checks = 0;
const ok = (name) => { checks++; console.log(`ok ${name}`); };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const textOf = (m) => m.content.filter((b) => b.type === "text").map((b) => b.text).join("");
const params = (text, maxTokens) => ({ model, max_tokens: maxTokens, temperature: 0, messages: [{ role: "user", content: text }] });
const ended = async (id) => {
  for (let i = 0; i < 600; i++) {
    const b = await anthropic.messages.batches.retrieve(id);
    if (b.processing_status === "ended") return b;
    await sleep(100);
  }
  throw new Error(`batch ${id} did not end`);
};
const results = async (id) => {
  const out = [];
  for await (const r of await anthropic.messages.batches.results(id)) out.push(r);
  return out;
};

// Three requests, one of them for a model the server does not serve.
const direct = [await anthropic.messages.create(params("Name a color.", 8)),
  await anthropic.messages.create(params("Count to three.", 12))];
const created = await anthropic.messages.batches.create({
  requests: [
    { custom_id: "color", params: params("Name a color.", 8) },
    { custom_id: "no-model", params: { ...params("Hi", 4), model: "no-such-model" } },
    { custom_id: "count_3", params: params("Count to three.", 12) },
  ],
});
assert.match(created.id, /^msgbatch_[0-9a-f]+$/);
assert.equal(created.type, "message_batch");
assert.equal(created.processing_status, "in_progress");
assert.equal(created.request_counts.processing + created.request_counts.succeeded + created.request_counts.errored, 3);
assert.equal(created.results_url, null);
assert.equal(created.ended_at, null);
const createdAt = Date.parse(created.created_at);
assert.ok(Math.abs(createdAt - Date.now()) < 60_000, created.created_at);
assert.equal(Date.parse(created.expires_at) - createdAt, 24 * 3600 * 1000);
ok("a new batch: in_progress, its 3 requests counted, RFC 3339 times 24 hours apart");

const done = await ended(created.id);
assert.deepEqual(done.request_counts, { processing: 0, succeeded: 2, errored: 1, canceled: 0, expired: 0 });
assert.ok(Date.parse(done.ended_at) >= createdAt);
assert.equal(done.results_url, `/v1/messages/batches/${created.id}/results`);
const got = await results(created.id);
assert.deepEqual(got.map((r) => r.custom_id), ["color", "no-model", "count_3"]);
for (const [i, r] of [got[0], got[2]].entries()) {
  assert.equal(r.result.type, "succeeded");
  const m = r.result.message;
  assert.equal(m.type, "message");
  assert.equal(textOf(m), textOf(direct[i]));
  assert.deepEqual([m.usage.input_tokens, m.usage.output_tokens], [direct[i].usage.input_tokens, direct[i].usage.output_tokens]);
  assert.equal(m.stop_reason, direct[i].stop_reason);
}
assert.equal(got[1].result.type, "errored");
assert.equal(got[1].result.error.type, "error");
assert.equal(got[1].result.error.error.type, "not_found_error");
assert.match(got[1].result.error.error.message, /no-such-model/);
ok(`ended: 2 succeeded as the requests sent one by one ("${textOf(direct[0])}"), 1 errored (not_found_error)`);

// Pages, newest first: after_id and before_id, has_more, first_id and last_id; the client's
// auto-pagination sees every batch once.
const second = await anthropic.messages.batches.create({ requests: [{ custom_id: "a", params: params("Hello", 2) }] });
await ended(second.id);
const first = await anthropic.messages.batches.list({ limit: 1 });
assert.deepEqual(first.data.map((b) => b.id), [second.id]);
assert.equal(first.has_more, true);
assert.equal(first.first_id, second.id);
assert.equal(first.last_id, second.id);
const next = await anthropic.messages.batches.list({ limit: 1, after_id: second.id });
assert.deepEqual(next.data.map((b) => b.id), [created.id]);
assert.equal(next.has_more, false);
const before = await anthropic.messages.batches.list({ limit: 5, before_id: created.id });
assert.deepEqual(before.data.map((b) => b.id), [second.id]);
assert.equal(before.has_more, false);
const seen = [];
for await (const b of anthropic.messages.batches.list({ limit: 1 })) seen.push(b.id);
assert.deepEqual(seen, [second.id, created.id]);
ok("list: pages by after_id and before_id, newest first; auto-pagination sees both");

// Cancelled while it runs: what was answered stays, the rest is canceled. A running batch cannot
// be deleted.
// The first 4 requests are short; the other 20 run 2,000 tokens each (ignore_eos, one of the
// chat API's extra fields), and are cut short.
const many = Array.from({ length: 24 }, (_, i) => ({
  custom_id: `r${i}`,
  params: i < 4 ? params(`Hello ${i}.`, 2) : { ...params(`Tell a long story ${i}.`, 2000), ignore_eos: true },
}));
const running = await anthropic.messages.batches.create({ requests: many });
await assert.rejects(anthropic.messages.batches.delete(running.id), (e) => e.status === 400 && /cancel it/.test(e.message));
for (let i = 0; i < 600 && (await anthropic.messages.batches.retrieve(running.id)).request_counts.succeeded < 4; i++) {
  await sleep(20);
}
const canceling = await anthropic.messages.batches.cancel(running.id);
assert.ok(["canceling", "ended"].includes(canceling.processing_status), canceling.processing_status);
assert.ok(canceling.cancel_initiated_at !== null);
const canceled = await ended(running.id);
const c = canceled.request_counts;
assert.equal(c.processing, 0);
assert.equal(c.succeeded + c.errored + c.canceled, 24);
assert.ok(c.succeeded >= 4 && c.canceled > 0, JSON.stringify(c));
const canceledResults = await results(running.id);
assert.equal(canceledResults.length, 24);
assert.equal(canceledResults.filter((r) => r.result.type === "canceled").length, c.canceled);
assert.equal(canceledResults.filter((r) => r.result.type === "succeeded").length, c.succeeded);
assert.deepEqual(canceledResults.slice(0, 4).map((r) => r.result.type), ["succeeded", "succeeded", "succeeded", "succeeded"]);
for (const r of canceledResults) if (r.result.type === "succeeded") assert.ok(r.result.message.stop_reason !== null);
await assert.rejects(anthropic.messages.batches.cancel(running.id), (e) => e.status === 400);
ok(`cancelled while running: ${c.succeeded} succeeded, ${c.errored} errored, ${c.canceled} canceled`);

// Deleted once ended: gone from retrieve and the list.
const deleted = await anthropic.messages.batches.delete(running.id);
assert.deepEqual(deleted, { id: running.id, type: "message_batch_deleted" });
await assert.rejects(anthropic.messages.batches.retrieve(running.id), (e) => e.status === 404 && e.error?.error?.type === "not_found_error");
const all = [];
for await (const b of anthropic.messages.batches.list()) all.push(b.id);
assert.ok(!all.includes(running.id));
ok("an ended batch deleted: 404 after, not listed");

// Refusals, in Anthropic's shape.
const refuse = async (body, pattern) => {
  await assert.rejects(anthropic.messages.batches.create(body), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.error?.error?.type, "invalid_request_error");
    assert.match(e.error.error.message, pattern);
    return true;
  });
};
await refuse({ requests: [] }, /one at least/);
await refuse({ requests: [{ custom_id: "x", params: params("a", 1) }, { custom_id: "x", params: params("b", 1) }] }, /used twice/);
await refuse({ requests: [{ custom_id: "bad id!", params: params("a", 1) }] }, /custom_id/);
await refuse({ requests: [{ custom_id: "s", params: { ...params("a", 1), stream: true } }] }, /not streamed/);
await assert.rejects(anthropic.messages.batches.retrieve("msgbatch_0123"), (e) => e.status === 404);
await assert.rejects(anthropic.messages.batches.retrieve("batch_0123"), (e) => e.status === 404);
// The results of a batch still running: 400, read without the client (it checks results_url itself).
const slow = await anthropic.messages.batches.create({ requests: many.slice(4, 8) });
const early = await fetch(`${base}/v1/messages/batches/${slow.id}/results`);
assert.equal(early.status, 400);  // four requests of 2,000 tokens: far from ended
assert.equal((await early.json()).error.type, "invalid_request_error");
await anthropic.messages.batches.cancel(slow.id);
await ended(slow.id);
ok("refusals: no requests, a repeated or malformed custom_id, a stream, unknown ids, results before the end");

console.log(`${checks} checks passed`);
