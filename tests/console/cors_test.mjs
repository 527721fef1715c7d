// Cross-origin calls from a real browser (Debian's Chromium, headless, driven by playwright-core):
// a page of one server's origin calls two other servers, as a chat front end on its own host
// calls the API. The browser makes the preflight and enforces the answers; the page sees only
// what CORS lets through.
// usage: node cors_test.mjs PAGE_URL OPEN_URL CLOSED_URL API_KEY
//   PAGE_URL: where the page comes from; OPEN_URL: a server that allows PAGE_URL's origin and
//   wants API_KEY; CLOSED_URL: a server that allows another origin only.
import {launchChromium} from "./chromium.mjs";

const [pageUrl, openUrl, closedUrl, key] = process.argv.slice(2);
let failures = 0;
const pass = (m) => console.log("ok: " + m);
const fail = (m) => { console.log("FAIL: " + m); failures++; };
const check = (cond, m) => (cond ? pass(m) : fail(m));

const {context, close} = await launchChromium("cors");
try {
  const page = context.pages()[0] || await context.newPage();
  await page.goto(pageUrl + "/");
  // Runs in the page: a completion request to `url`, JSON with an Authorization header (so the
  // browser sends a preflight first). Returns what the page could see.
  const call = (url, auth, stream) => page.evaluate(async ([url, auth, stream]) => {
    try {
      const r = await fetch(url + "/v1/completions", {
        method: "POST",
        headers: {"Content-Type": "application/json", "Authorization": "Bearer " + auth},
        body: JSON.stringify({prompt: "Hello", max_tokens: 2, stream}),
      });
      const text = await r.text();
      return {status: r.status, text, requestId: r.headers.get("X-Request-Id")};
    } catch (e) {
      return {error: String(e)};
    }
  }, [url, auth, stream]);

  const ok = await call(openUrl, key, false);
  check(ok.status === 200 && JSON.parse(ok.text).choices?.length === 1,
        `a page of another origin calls an allowing server: ${ok.status ?? ok.error}`);
  check(typeof ok.requestId === "string" && ok.requestId.length > 0, `the page reads X-Request-Id: ${ok.requestId}`);
  const streamed = await call(openUrl, key, true);
  check(streamed.status === 200 && streamed.text.includes("data: [DONE]"),
        `and streams from it: ${streamed.status ?? streamed.error}`);
  const denied = await call(openUrl, "wrong-key", false);
  check(denied.status === 401 && JSON.parse(denied.text).error?.type === "authentication_error",
        `the page reads the error of a wrong key: ${denied.status ?? denied.error}`);
  const closed = await call(closedUrl, key, false);
  check(closed.error !== undefined && closed.status === undefined,
        `a server that allows another origin is closed to the page: ${closed.error ?? closed.status}`);
} catch (e) {
  fail(String(e));
} finally {
  await close();
}
process.exit(failures === 0 ? 0 : 1);
