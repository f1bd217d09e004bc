// Fair turns in the browser (issue #28), on the demo stack, in Debian's Chromium (headless):
// HOLDER takes the only slice of SLUG from the spawn page, lands in JupyterLab and goes idle.
// WAITER asks for the same slice and waits in the hub's queue: the spawn-pending page says
// when an idle one will be reclaimed for them. The culler stops HOLDER's server, WAITER lands
// in JupyterLab, and HOLDER's hub home page says why the server was stopped.
// Run by tests/e2e/test_turns_story.py, which does every assertion; this script only acts,
// records what each person saw, and prints one JSON line.
//
// env: BASE_URL, SLUG, HOLDER, WAITER, SCREENSHOTS, CHROMIUM.
import { chromium } from "playwright-core";
import { CHROMIUM, CHROMIUM_ARGS, hubLogin } from "./browser.mjs";
import { join } from "node:path";

const env = process.env;
const BASE = env.BASE_URL;
const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS });
const out = { holder: { screenshots: [] }, waiter: { screenshots: [] } };

async function person(who, user) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 720 } });
  context.setDefaultTimeout(120_000);
  const page = await context.newPage();
  const shot = async (name) => {
    const path = join(env.SCREENSHOTS, `turns-${who}-${name}.png`);
    await page.screenshot({ path });
    out[who].screenshots.push(path);
  };
  await hubLogin(page, BASE, user);
  return { page, shot, context };
}

async function spawn(page) {
  await page.goto(`${BASE}/hub/spawn`);
  await page.click(`.gs-option[data-slug="${env.SLUG}"] label`);
  await Promise.all([page.waitForURL((url) => !url.pathname.endsWith("/hub/spawn")), page.click('#spawn_form button[type="submit"]')]);
}

let holder, waiter;
try {
  holder = await person("holder", env.HOLDER);
  await spawn(holder.page);
  await holder.page.waitForURL(/\/user\/[^/]+\/lab/, { timeout: 180_000, waitUntil: "commit" });
  await holder.page.locator("#gpuspawner-status").waitFor();
  await holder.shot("lab");
  // and goes away: an open JupyterLab tab in front polls the server, which jupyter_server
  // counts as activity (a tab in the background does not)
  await holder.page.goto(`${BASE}/hub/home`);

  waiter = await person("waiter", env.WAITER);
  await spawn(waiter.page);
  out.waiter.pendingUrl = waiter.page.url();
  // the event log is folded away on the page: read its text, as "Event log" unfolds it
  await waiter.page.waitForFunction(
    () => (document.querySelector("#progress-log")?.textContent || "").includes("will be reclaimed for you"),
    null,
    { timeout: 120_000, polling: 500 },
  );
  await waiter.page.click("#progress-details summary");
  out.waiter.progress = (await waiter.page.locator("#progress-log").textContent()).trim();
  await waiter.shot("told");

  await waiter.page.waitForURL(/\/user\/[^/]+\/lab/, { timeout: 240_000, waitUntil: "commit" });
  await waiter.page.locator("#gpuspawner-status").waitFor();
  out.waiter.landed = waiter.page.url();
  await waiter.shot("lab");

  const box = holder.page.locator("#gpuspawner-culler-actions");
  for (let i = 0; ; i++) {
    await holder.page.goto(`${BASE}/hub/home`);
    if ((await box.count()) && (await box.innerText()).includes("waiting for")) break;
    if (i === 30) throw new Error("the holder's home page never said why the server was stopped");
    await holder.page.waitForTimeout(2000);
  }
  out.holder.homeActions = (await box.innerText()).trim();
  await holder.shot("home");
} catch (e) {
  out.error = String((e && e.stack) || e);
  for (const [who, p] of [["holder", holder], ["waiter", waiter]]) {
    if (!p) continue;
    out[who].errorUrl = p.page.url();
    out[who].errorPage = await p.page.locator("body").innerText({ timeout: 5000 }).then((t) => t.slice(0, 1500), () => null);
    try { await p.shot("error"); } catch {}
  }
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
