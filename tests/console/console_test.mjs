// The web console in a real browser: Debian's Chromium, headless, driven by playwright-core.
// Types a message, sees the reply stream in, presses stop (the request is aborted on the server),
// checks the markdown and reasoning rendering of the page's own code, opens the metrics page, and
// saves screenshots. Every request the page makes goes to the server itself (it works offline).
// usage: node console_test.mjs BASE_URL OUT_DIR
import {launchChromium} from "./chromium.mjs";
import {join} from "node:path";

const [base, outDir] = process.argv.slice(2);
let failures = 0;
const pass = (m) => console.log("ok: " + m);
const fail = (m) => { console.log("FAIL: " + m); failures++; };
const check = (cond, m) => (cond ? pass(m) : fail(m));

async function abortedRequests() {
  const text = await (await fetch(base + "/metrics")).text();
  const m = text.match(/^vllm:request_success_total\{[^}]*finished_reason="abort"[^}]*\} (\S+)/m);
  return m ? Number(m[1]) : -1;
}

const {context, close} = await launchChromium("console", {viewport: {width: 1100, height: 800}});
try {
  const page = context.pages()[0] || await context.newPage();
  const foreign = [];
  page.on("request", (r) => { if (!r.url().startsWith(base)) foreign.push(r.url()); });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));

  await page.goto(base + "/");
  check((await page.title()) === "duet", "the console page loads at /");
  await page.waitForFunction(() => document.getElementById("model").textContent.length > 0, null, {timeout: 10000});
  pass("the model's name is shown: " + await page.textContent("#model"));

  // Type a message and watch the reply stream in.
  const abortedBefore = await abortedRequests();
  await page.fill("#max-tokens", "3000");
  await page.fill("#temperature", "0");
  await page.fill("#prompt", "Tell me a long story about two engines playing one piece.");
  await page.click("#send");
  const reply = page.locator(".message.assistant").last();
  await page.waitForFunction(() => {
    const m = [...document.querySelectorAll(".message.assistant")].pop();
    return m && m.textContent.length > 0;
  }, null, {timeout: 20000});
  const first = (await reply.textContent()).length;
  await page.waitForFunction((n) => [...document.querySelectorAll(".message.assistant")].pop().textContent.length > n,
                             first, {timeout: 10000});
  check(await reply.getAttribute("data-state") === "streaming", "the reply streams in (" + first + " characters, then more)");
  check(await page.isEnabled("#stop") && !(await page.isEnabled("#send")), "stop is enabled while streaming, send is not");

  // Stop: the stream ends at once, the page says so, the server aborts the request.
  await page.click("#stop");
  await page.waitForFunction(() => [...document.querySelectorAll(".message.assistant")].pop().dataset.state === "stopped",
                             null, {timeout: 5000});
  const stopped = (await reply.textContent()).length;
  await page.waitForTimeout(700);
  check((await reply.textContent()).length === stopped, "no more text after stop");
  check((await page.textContent("#status")) === "stopped" && await page.isEnabled("#send"), "the page says stopped");
  let aborted = -1;
  for (let i = 0; i < 50 && (aborted = await abortedRequests()) <= abortedBefore; i++) await page.waitForTimeout(100);
  check(aborted === abortedBefore + 1, `the server aborted the request (abort count ${abortedBefore} -> ${aborted})`);
  await page.screenshot({path: join(outDir, "console-chat.png"), fullPage: true});
  pass("screenshot " + join(outDir, "console-chat.png"));

  // The page's rendering: markdown (escaped first) with code blocks, reasoning folded apart.
  const html = await page.evaluate(() =>
    renderMarkdown("# Title\nSome **bold** and `x < y`.\n\n```python\nif a < b:\n    pass\n```\n- one\n- two\n<script>bad()</script>"));
  check(html.includes("<h1>Title</h1>") && html.includes("<strong>bold</strong>") && html.includes("<code>x &lt; y</code>"),
        "markdown: heading, bold, inline code");
  check(html.includes('<pre><code class="language-python">if a &lt; b:\n    pass</code></pre>'), "markdown: a code block");
  check(html.includes("<ul><li>one</li><li>two</li></ul>") && !html.includes("<script>"), "markdown: a list, and no raw HTML");
  const folded = await page.evaluate(() => {
    const div = document.createElement("div");
    renderReply(div, "", "<think>Let me think about it.</think>The answer is **4**.", null);
    const d = div.querySelector("details.reasoning");
    return {open: d && d.open, reasoning: d && d.textContent, answer: div.querySelector(".content").innerHTML};
  });
  check(folded.open === false && folded.reasoning.includes("Let me think") && folded.answer === "<p>The answer is <strong>4</strong>.</p>",
        "<think> reasoning is folded apart from the answer");
  const parsed = await page.evaluate(() => {
    const div = document.createElement("div");
    renderReply(div, "step one", "done", "3 tokens");
    return div.querySelector("details.reasoning .body").textContent + "|" + div.querySelector(".content").textContent;
  });
  check(parsed === "step one|done", "reasoning_content is folded apart from the answer");

  // The metrics page: charts drawn from /metrics.
  await page.click("#tab-metrics");
  const polled = Number(await page.evaluate(() => document.body.dataset.metricsPolled || 0));
  await page.waitForFunction((n) => Number(document.body.dataset.metricsPolled || 0) >= n + 2, polled, {timeout: 10000});
  check(await page.isVisible("#chart-throughput") && await page.isVisible("#chart-devices"), "the metrics page shows its charts");
  const rows = await page.textContent("#metrics-table");
  check(/generated tokens\d+/.test(rows), "the metrics table shows the generated tokens");
  await page.screenshot({path: join(outDir, "console-metrics.png"), fullPage: true});

  check(foreign.length === 0, "every request went to the server itself" + (foreign.length ? ": " + foreign.join(", ") : ""));
  check(errors.length === 0, "no script errors" + (errors.length ? ": " + errors.join("; ") : ""));
} finally {
  await close();
}
console.log(`${failures} failure(s)`);
process.exit(failures ? 1 : 0);
