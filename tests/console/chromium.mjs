// Debian's Chromium, headless, in a profile folder of its own, for the browser tests.
import {chromium} from "playwright-core";
import {mkdtempSync, rmSync} from "node:fs";
import {tmpdir} from "node:os";
import {join} from "node:path";

// Returns {context, close}: the browser context, and what ends it and removes its profile.
export async function launchChromium(name, options = {}) {
  const profile = mkdtempSync(join(tmpdir(), `duet-${name}-chromium-`));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
           "--disable-component-update", "--disable-sync"],
    ...options,
  });
  const close = async () => {
    await context.close();
    rmSync(profile, {recursive: true, force: true});
  };
  return {context, close};
}
