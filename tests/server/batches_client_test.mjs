// OpenAI's Files and Batches APIs through the official openai client (DUET_URL), as a batch job
// would use them: upload a JSONL file, create a batch, poll it, read its output and error files,
// and check every answer against the same request sent directly; a batch that fails validation,
// one cancelled while it runs, the lists, deletion, and refusals; a file sent in parts through the
// Uploads API and run as a batch; files' expiry. DUET_DIR: a folder to write in.
import OpenAI, { NotFoundError, BadRequestError, toFile } from "openai";
import assert from "node:assert/strict";
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";

const client = new OpenAI({ baseURL: process.env.DUET_URL, apiKey: "none", maxRetries: 0 });
const dir = process.env.DUET_DIR;
let checks = 0;
const ok = (name) => { checks++; console.log(`ok ${name}`); };

const writeLines = (name, lines) => {
  const file = path.join(dir, name);
  fs.writeFileSync(file, lines.map((l) => JSON.stringify(l)).join("\n") + "\n");
  return file;
};
const poll = async (id, timeoutMs = 60000) => {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const b = await client.batches.retrieve(id);
    if (["completed", "failed", "cancelled", "expired"].includes(b.status)) return b;
    assert.ok(Date.now() < deadline, `batch ${id} still ${b.status}`);
    await new Promise((r) => setTimeout(r, 50));
  }
};
const fileLines = async (id) => (await (await client.files.content(id)).text()).trim().split("\n").map((l) => JSON.parse(l));

// A chat batch of eight greedy requests and one the server refuses (a bad temperature).
const prompts = ["Hello", "Tell me about rivers", "2 + 2 =", "def f(x):", "Why", "A list:", "Name three colours", "Once"];
const bodies = prompts.map((p) => ({
  model: "tiny", messages: [{ role: "user", content: p }], max_tokens: 8, temperature: 0, ignore_eos: true,
}));
const lines = bodies.map((body, i) => ({ custom_id: `q${i}`, method: "POST", url: "/v1/chat/completions", body }));
lines.splice(3, 0, {
  custom_id: "bad", method: "POST", url: "/v1/chat/completions",
  body: { model: "tiny", messages: [{ role: "user", content: "x" }], temperature: -3 },
});
const inputPath = writeLines("chat.jsonl", lines);
const input = await client.files.create({ file: fs.createReadStream(inputPath), purpose: "batch" });
assert.equal(input.object, "file");
assert.equal(input.purpose, "batch");
assert.equal(input.filename, "chat.jsonl");
assert.equal(input.bytes, fs.statSync(inputPath).size);
assert.equal((await client.files.retrieve(input.id)).id, input.id);
assert.equal(await (await client.files.content(input.id)).text(), fs.readFileSync(inputPath, "utf8"));
ok("files.create, retrieve and content give back the upload");

const created = await client.batches.create({
  input_file_id: input.id, endpoint: "/v1/chat/completions", completion_window: "24h", metadata: { job: "nightly" },
});
assert.equal(created.object, "batch");
assert.ok(["validating", "in_progress", "finalizing", "completed"].includes(created.status), created.status);
const done = await poll(created.id);
assert.equal(done.status, "completed", JSON.stringify(done));
assert.deepEqual(done.request_counts, { total: 9, completed: 8, failed: 1 });
assert.equal(done.metadata.job, "nightly");
assert.ok(done.completed_at >= done.in_progress_at && done.in_progress_at >= done.created_at);
const out = await fileLines(done.output_file_id);
const errors = await fileLines(done.error_file_id);
assert.deepEqual(out.map((l) => l.custom_id), prompts.map((_, i) => `q${i}`));
assert.equal(errors.length, 1);
assert.equal(errors[0].custom_id, "bad");
assert.equal(errors[0].response.status_code, 400);
assert.equal(errors[0].response.body.error.type, "invalid_request_error");
for (let i = 0; i < bodies.length; i++) {
  const direct = await client.chat.completions.create(bodies[i]);
  const got = out[i].response.body;
  assert.equal(out[i].response.status_code, 200);
  assert.ok(out[i].response.request_id.length > 0);
  assert.equal(out[i].error, null);
  assert.equal(got.choices[0].message.content, direct.choices[0].message.content, `q${i}`);
  assert.equal(got.usage.completion_tokens, 8);
  assert.equal(got.usage.prompt_tokens, direct.usage.prompt_tokens);
}
ok("a chat batch: output in the input's order, each answer the direct request's, the refused line in the error file");

// An embeddings batch: the vectors of the direct request.
const embInput = await client.files.create({
  file: fs.createReadStream(writeLines("emb.jsonl", [
    { custom_id: "e1", method: "POST", url: "/v1/embeddings", body: { model: "tiny", input: ["first", "second"] } },
  ])),
  purpose: "batch",
});
const emb = await poll((await client.batches.create({ input_file_id: embInput.id, endpoint: "/v1/embeddings", completion_window: "24h" })).id);
assert.equal(emb.status, "completed");
assert.equal(emb.error_file_id, null);
const embOut = (await fileLines(emb.output_file_id))[0].response.body;
const embDirect = await client.embeddings.create({ model: "tiny", input: ["first", "second"] });
assert.equal(embOut.data.length, 2);
for (let i = 0; i < 2; i++) {
  embOut.data[i].embedding.forEach((v, j) => assert.ok(Math.abs(v - embDirect.data[i].embedding[j]) < 1e-6));
}
ok("an embeddings batch gives the direct request's vectors");

// Validation: a line for another endpoint fails the batch before anything runs, naming the line.
const mixed = await client.files.create({
  file: fs.createReadStream(writeLines("mixed.jsonl", [
    lines[0], { custom_id: "c", method: "POST", url: "/v1/completions", body: { model: "tiny", prompt: "x" } },
  ])),
  purpose: "batch",
});
const failed = await poll((await client.batches.create({ input_file_id: mixed.id, endpoint: "/v1/chat/completions", completion_window: "24h" })).id);
assert.equal(failed.status, "failed");
assert.equal(failed.errors.data[0].line, 2);
assert.equal(failed.errors.data[0].code, "invalid_url");
assert.equal(failed.output_file_id, null);
ok("a line for another endpoint fails the batch, naming line 2");

// Cancelled while it runs (the server runs two sequences at once): fewer than all lines answered.
const longLines = [];
for (let i = 0; i < 40; i++) {
  longLines.push({ custom_id: `l${i}`, method: "POST", url: "/v1/completions",
                   body: { model: "tiny", prompt: `story ${i}`, max_tokens: 400, temperature: 0, ignore_eos: true } });
}
const longInput = await client.files.create({ file: fs.createReadStream(writeLines("long.jsonl", longLines)), purpose: "batch" });
const running = await client.batches.create({ input_file_id: longInput.id, endpoint: "/v1/completions", completion_window: "24h" });
for (let b = running; b.status !== "in_progress"; b = await client.batches.retrieve(running.id)) {
  assert.ok(["validating", "in_progress"].includes(b.status), b.status);
  await new Promise((r) => setTimeout(r, 20));
}
const cancelling = await client.batches.cancel(running.id);
assert.ok(["cancelling", "cancelled"].includes(cancelling.status), cancelling.status);
const cancelled = await poll(running.id);
assert.equal(cancelled.status, "cancelled");
assert.ok(cancelled.request_counts.completed + cancelled.request_counts.failed < 40, JSON.stringify(cancelled.request_counts));
await assert.rejects(client.batches.cancel(running.id), BadRequestError);
ok(`cancelled while running: ${cancelled.request_counts.completed} of 40 lines answered`);

// The lists, newest first.
const batchList = await client.batches.list({ limit: 2 });
assert.deepEqual(batchList.data.map((b) => b.id), [running.id, failed.id]);
assert.equal(batchList.has_more, true);
const files = await client.files.list({ purpose: "batch" });
const ids = files.data.map((f) => f.id);
for (const f of [input, embInput, mixed, longInput]) assert.ok(ids.includes(f.id), f.id);
assert.ok(files.data.every((f) => f.purpose === "batch"));
ok("batches.list and files.list");

// Deletion, and refusals.
const deleted = await client.files.del(input.id);
assert.deepEqual([deleted.id, deleted.deleted], [input.id, true]);
await assert.rejects(client.files.retrieve(input.id), NotFoundError);
await assert.rejects(client.batches.create({ input_file_id: input.id, endpoint: "/v1/chat/completions", completion_window: "24h" }), NotFoundError);
await assert.rejects(client.batches.create({ input_file_id: mixed.id, endpoint: "/v1/models", completion_window: "24h" }), BadRequestError);
await assert.rejects(client.files.create({ file: fs.createReadStream(inputPath), purpose: "fine-tune" }), BadRequestError);
await assert.rejects(client.batches.retrieve("batch_none"), NotFoundError);
assert.equal((await client.batches.retrieve(done.id)).status, "completed");  // its input's deletion leaves it
ok("deletion and refusals");

// The Uploads API: the chat file in three parts, sent out of order and named in order.
const whole = fs.readFileSync(inputPath);
const upload = await client.uploads.create({ bytes: whole.length, filename: "parts.jsonl", mime_type: "text/jsonl", purpose: "batch" });
assert.equal(upload.status, "pending");
const cuts = [0, 100, 333, whole.length];
const pieces = [];
for (const i of [2, 0, 1]) {
  const part = await client.uploads.parts.create(upload.id, { data: await toFile(whole.subarray(cuts[i], cuts[i + 1]), `p${i}`) });
  assert.equal(part.object, "upload.part");
  pieces[i] = part.id;
}
const md5 = crypto.createHash("md5").update(whole).digest("hex");
await assert.rejects(client.uploads.complete(upload.id, { part_ids: pieces, md5: "0".repeat(32) }), BadRequestError);
await assert.rejects(client.uploads.complete(upload.id, { part_ids: pieces.slice(1) }), BadRequestError);
const completed = await client.uploads.complete(upload.id, { part_ids: pieces, md5 });
assert.equal(completed.status, "completed");
assert.equal(completed.file.bytes, whole.length);
assert.equal(completed.file.filename, "parts.jsonl");
assert.equal(await (await client.files.content(completed.file.id)).text(), whole.toString("utf8"));
const fromParts = await poll((await client.batches.create({
  input_file_id: completed.file.id, endpoint: "/v1/chat/completions", completion_window: "24h",
})).id);
assert.deepEqual(fromParts.request_counts, { total: 9, completed: 8, failed: 1 });
const dropped = await client.uploads.create({ bytes: 10, filename: "x.jsonl", mime_type: "text/jsonl", purpose: "batch" });
assert.equal((await client.uploads.cancel(dropped.id)).status, "cancelled");
await assert.rejects(client.uploads.parts.create(dropped.id, { data: await toFile(Buffer.from("x"), "x") }), BadRequestError);
await assert.rejects(client.uploads.complete("upload_none", { part_ids: [] }), NotFoundError);
ok("uploads.create, parts.create and complete make the file a batch runs; cancel; refusals");

// Expiry: a batch's files are kept 30 days unless expires_after says less.
const shortLived = await client.files.create({ file: fs.createReadStream(inputPath), purpose: "batch",
                                               expires_after: { anchor: "created_at", seconds: 3600 } });
assert.equal(shortLived.expires_at - shortLived.created_at, 3600);
assert.equal(completed.file.expires_at - completed.file.created_at, 30 * 24 * 3600);
const outFile = await client.files.retrieve(fromParts.output_file_id);
assert.equal(outFile.expires_at - outFile.created_at, 30 * 24 * 3600);
await assert.rejects(client.files.create({ file: fs.createReadStream(inputPath), purpose: "batch",
                                           expires_after: { anchor: "created_at", seconds: 10 } }), BadRequestError);
await assert.rejects(client.batches.create({ input_file_id: shortLived.id, endpoint: "/v1/chat/completions", completion_window: "24h",
                                             output_expires_after: { anchor: "created_at", seconds: 60 } }), BadRequestError);
ok("expires_after on files, 30 days by default, refusals");

console.log(`${checks} checks passed`);
