// duet's web console: a chat that streams from the server's own /v1/chat/completions (markdown
// and code rendered, DeepSeek-R1's reasoning folded apart from the answer, a stop button that
// aborts the request) and a live page of /metrics as charts. No libraries, nothing from a CDN:
// the page works offline, served from the binary.
"use strict";

const $ = (id) => document.getElementById(id);
const history = [];  // {role, content} of the conversation so far
let controller = null;  // the AbortController of the request in flight

// --- markdown (a safe subset: the text is escaped first, then marked up) ------------------------
function escapeHtml(s) {
  return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
}

function inline(s) {
  return s
    .replace(/`([^`]+)`/g, "<code>$1</code>")
    .replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>")
    .replace(/(^|[^*])\*([^*\s][^*]*)\*/g, "$1<em>$2</em>")
    .replace(/\[([^\]]+)\]\((https?:\/\/[^)\s]+)\)/g, '<a href="$2" rel="noopener noreferrer" target="_blank">$1</a>');
}

function renderMarkdown(text) {
  const out = [];
  const lines = text.split("\n");
  let para = [], list = null, i = 0;
  const flush = () => {
    if (para.length) out.push("<p>" + inline(escapeHtml(para.join("\n"))).replace(/\n/g, "<br>") + "</p>");
    para = [];
    if (list) out.push("<" + list.tag + ">" + list.items.map((x) => "<li>" + inline(escapeHtml(x)) + "</li>").join("") +
                       "</" + list.tag + ">");
    list = null;
  };
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(/^```\s*([\w+-]*)/);
    if (fence) {
      flush();
      const code = [];
      for (i++; i < lines.length && !/^```/.test(lines[i]); i++) code.push(lines[i]);
      const lang = fence[1] ? ' class="language-' + escapeHtml(fence[1]) + '"' : "";
      out.push("<pre><code" + lang + ">" + escapeHtml(code.join("\n")) + "</code></pre>");
      i++;  // the closing fence (or the end of a text still streaming)
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)/);
    const item = line.match(/^\s*(?:([-*+])|(\d+)[.)])\s+(.*)/);
    if (heading) {
      flush();
      out.push("<h" + heading[1].length + ">" + inline(escapeHtml(heading[2])) + "</h" + heading[1].length + ">");
    } else if (item) {
      if (para.length) flush();
      const tag = item[1] ? "ul" : "ol";
      if (list && list.tag !== tag) flush();
      if (!list) list = {tag, items: []};
      list.items.push(item[3]);
    } else if (line.trim() === "") {
      flush();
    } else {
      if (list) flush();
      para.push(line);
    }
    i++;
  }
  flush();
  return out.join("");
}

// --- chat ---------------------------------------------------------------------------------------
function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "message " + role;
  if (role === "user") div.textContent = text;
  $("messages").appendChild(div);
  div.scrollIntoView({block: "end"});
  return div;
}

// The assistant's reply: reasoning (reasoning_content, or text inside <think>...</think> when the
// server runs without --reasoning-parser) folded above the rendered answer.
function renderReply(div, reasoning, content, meta) {
  const think = content.match(/^\s*<think>([\s\S]*?)(<\/think>|$)([\s\S]*)/);
  if (think) {
    reasoning += think[1];
    content = think[3];
  }
  let html = "";
  if (reasoning) {
    const open = div.querySelector("details.reasoning")?.open ? " open" : "";
    html += '<details class="reasoning"' + open + "><summary>Reasoning</summary><div class=\"body\">" +
            escapeHtml(reasoning) + "</div></details>";
  }
  html += '<div class="content">' + renderMarkdown(content) + "</div>";
  if (meta) html += '<div class="meta">' + escapeHtml(meta) + "</div>";
  div.innerHTML = html;
}

function headers() {
  const h = {"Content-Type": "application/json"};
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function setBusy(busy, status) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
  $("status").textContent = status || "";
}

async function send(text) {
  history.push({role: "user", content: text});
  addMessage("user", text);
  const div = addMessage("assistant", "");
  div.dataset.state = "streaming";
  let reasoning = "", content = "", usage = null, finish = null;
  controller = new AbortController();
  setBusy(true, "generating...");
  const started = performance.now();
  try {
    const res = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      signal: controller.signal,
      body: JSON.stringify({
        messages: history,
        stream: true,
        stream_options: {include_usage: true},
        max_tokens: Number($("max-tokens").value) || 512,
        temperature: Number($("temperature").value),
      }),
    });
    if (!res.ok) {
      const body = await res.json().catch(() => ({}));
      throw new Error((body.error && body.error.message) || res.status + " " + res.statusText);
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffered = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffered += decoder.decode(value, {stream: true});
      let nl;
      while ((nl = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, nl).trim();
        buffered = buffered.slice(nl + 1);
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message || "the server reported an error");
        if (chunk.usage) usage = chunk.usage;
        for (const c of chunk.choices || []) {
          reasoning += (c.delta && c.delta.reasoning_content) || "";
          content += (c.delta && c.delta.content) || "";
          if (c.finish_reason) finish = c.finish_reason;
        }
        renderReply(div, reasoning, content, null);
      }
    }
    const secs = (performance.now() - started) / 1000;
    const tokens = usage ? usage.completion_tokens : null;
    renderReply(div, reasoning, content,
                (tokens !== null ? tokens + " tokens, " : "") + secs.toFixed(1) + " s" + (finish ? ", " + finish : ""));
    div.dataset.state = "done";
    setBusy(false, "");
  } catch (e) {
    if (e.name === "AbortError") {
      renderReply(div, reasoning, content, "stopped");
      div.dataset.state = "stopped";
      setBusy(false, "stopped");
    } else {
      div.classList.add("error");
      renderReply(div, reasoning, content + (content ? "\n\n" : "") + "Error: " + e.message, null);
      div.dataset.state = "error";
      setBusy(false, "error");
    }
  } finally {
    controller = null;
    history.push({role: "assistant", content});
  }
}

$("composer").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || controller) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) {
    ev.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => controller && controller.abort());
$("clear").addEventListener("click", () => {
  if (controller) controller.abort();
  history.length = 0;
  $("messages").innerHTML = "";
});
$("api-key").value = localStorage.getItem("duet-api-key") || "";
$("api-key").addEventListener("change", () => localStorage.setItem("duet-api-key", $("api-key").value));

// --- tabs and the model's name ------------------------------------------------------------------
for (const tab of document.querySelectorAll(".tab")) {
  tab.addEventListener("click", () => {
    for (const t of document.querySelectorAll(".tab")) t.classList.toggle("active", t === tab);
    for (const p of document.querySelectorAll(".page")) p.classList.toggle("hidden", p.id !== "page-" + tab.dataset.page);
  });
}
fetch("/v1/models", {headers: headers()}).then((r) => r.json()).then((j) => {
  if (j.data && j.data[0]) $("model").textContent = j.data[0].id + " (context " + j.data[0].max_model_len + ")";
}).catch(() => {});

// --- metrics ------------------------------------------------------------------------------------
// Prometheus text to {name: [{labels, value}]}.
function parseMetrics(text) {
  const out = {};
  for (const line of text.split("\n")) {
    const m = line.match(/^([a-zA-Z_:][\w:]*)(\{([^}]*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    for (const l of (m[3] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    (out[m[1]] = out[m[1]] || []).push({labels, value: Number(m[4])});
  }
  return out;
}

const sum = (ms, name) => (ms[name] || []).reduce((a, s) => a + s.value, 0);
const series = {throughput: [], ttft: [], kv: [], devices: {}};
const kPoints = 60;
let previous = null;

function push(arr, v) {
  arr.push(v);
  if (arr.length > kPoints) arr.shift();
}

function drawChart(canvas, lines, maxHint) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 28;
  ctx.clearRect(0, 0, w, h);
  let max = maxHint || 0;
  for (const l of lines) for (const v of l.values) max = Math.max(max, v);
  if (max <= 0) max = 1;
  ctx.strokeStyle = "#dde1e6";
  ctx.fillStyle = "#6b7580";
  ctx.font = "11px sans-serif";
  for (let k = 0; k <= 2; k++) {
    const y = pad / 2 + (h - pad) * (1 - k / 2);
    ctx.beginPath(); ctx.moveTo(pad, y); ctx.lineTo(w, y); ctx.stroke();
    ctx.fillText((max * k / 2).toPrecision(2), 0, y + 4);
  }
  const colors = ["#2f6fdf", "#d9822b", "#2aa876", "#c23b8a", "#7a5cd6"];
  lines.forEach((l, n) => {
    ctx.strokeStyle = colors[n % colors.length];
    ctx.beginPath();
    l.values.forEach((v, i) => {
      const x = pad + (w - pad) * i / (kPoints - 1);
      const y = pad / 2 + (h - pad) * (1 - v / max);
      i ? ctx.lineTo(x, y) : ctx.moveTo(x, y);
    });
    ctx.stroke();
    if (l.name) { ctx.fillStyle = ctx.strokeStyle; ctx.fillText(l.name, pad + 6 + 90 * n, 12); }
  });
}

async function pollMetrics() {
  try {
    const res = await fetch("/metrics");
    if (!res.ok) throw new Error(res.status);
    const ms = parseMetrics(await res.text());
    const now = performance.now() / 1000;
    const cur = {t: now, gen: sum(ms, "vllm:generation_tokens_total"),
                 ttftSum: sum(ms, "vllm:time_to_first_token_seconds_sum"),
                 ttftCount: sum(ms, "vllm:time_to_first_token_seconds_count")};
    if (previous) {
      const dt = Math.max(1e-3, cur.t - previous.t);
      push(series.throughput, (cur.gen - previous.gen) / dt);
      const n = cur.ttftCount - previous.ttftCount;
      push(series.ttft, n > 0 ? (cur.ttftSum - previous.ttftSum) / n : 0);
    }
    previous = cur;
    push(series.kv, sum(ms, "vllm:kv_cache_usage_perc"));
    for (const s of ms["duet:device_utilization_ratio"] || []) {
      push(series.devices[s.labels.device] = series.devices[s.labels.device] || [], s.value);
    }
    drawChart($("chart-throughput"), [{values: series.throughput}]);
    drawChart($("chart-ttft"), [{values: series.ttft}]);
    drawChart($("chart-kv"), [{values: series.kv}], 1);
    drawChart($("chart-devices"), Object.entries(series.devices).map(([name, values]) => ({name, values})), 1);
    const rows = [["requests running", sum(ms, "vllm:num_requests_running")],
                  ["requests waiting", sum(ms, "vllm:num_requests_waiting")],
                  ["generated tokens", sum(ms, "vllm:generation_tokens_total")],
                  ["prompt tokens", sum(ms, "vllm:prompt_tokens_total")],
                  ["requests", sum(ms, "duet:requests_total")],
                  ["failed requests", sum(ms, "duet:request_failures_total")],
                  ["KV fragmentation", sum(ms, "duet:kv_cache_fragmentation_ratio").toFixed(3)]];
    if (ms["duet:energy_joules_total"]) rows.push(["energy (J)", sum(ms, "duet:energy_joules_total").toFixed(1)]);
    $("metrics-table").tBodies[0].innerHTML =
        rows.map(([k, v]) => "<tr><td>" + escapeHtml(k) + "</td><td>" + escapeHtml(String(v)) + "</td></tr>").join("");
    document.body.dataset.metricsPolled = String(Number(document.body.dataset.metricsPolled || 0) + 1);
  } catch (e) {
    $("metrics-table").tBodies[0].innerHTML = "<tr><td>/metrics: " + escapeHtml(String(e)) + "</td></tr>";
  }
}
pollMetrics();
setInterval(pollMetrics, 2000);
