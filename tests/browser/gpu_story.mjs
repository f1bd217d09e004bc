// The whole GPU-view story on the demo stack, in Debian's Chromium (headless), for several
// users at once, each in their own browser context: log in, pick an offering on the spawn
// page, land in JupyterLab, open a notebook and run a cell, then go idle and watch the
// status bar count down until the culler warns. A user with KEEP false does nothing: the
// kernel is reclaimed, the notebook says so, and the hub's home page says why. A user with
// KEEP "button" clicks Keep on the warning, one with KEEP "cell" runs a cell instead; both
// then watch past the moment the culler had named.
// Run by tests/e2e/test_gpu_view_story.py, which does every assertion; this script only
// acts, records what a person would see, and prints one JSON line.
//
// env: BASE_URL, USERS (JSON: [{"user": "student1", "slug": "...", "keep": false | "button" | "cell"}, ...]),
//      SCREENSHOTS (folder), CHROMIUM, WAIT_S (the longest wait for the culler, seconds).
import { chromium } from "playwright-core";
import { CHROMIUM, CHROMIUM_ARGS, hubLogin, settled } from "./browser.mjs";
import { join } from "node:path";

const env = process.env;
const BASE = env.BASE_URL;
const USERS = JSON.parse(env.USERS);
const WAIT_MS = Number(env.WAIT_S || 300) * 1000;

const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS });

/** Click a notification's "Why?" until the panel opens: a click that lands while JupyterLab
 * re-renders its notifications can be lost (the button keeps focus, nothing else happens), as a
 * person would click again. Three tries, then the panel's own wait fails with its error. */
async function why(toast, panel) {
  for (let i = 0; i < 2; i++) {
    await toast.getByRole("button", { name: "Why?" }).click();
    try {
      await panel.waitFor({ timeout: 20_000 });
      return;
    } catch {
      if ((await toast.count()) === 0) break;
    }
  }
  if ((await toast.count()) > 0) await toast.getByRole("button", { name: "Why?" }).click();
  await panel.waitFor();
}

async function story({ user, slug, keep }) {
  const out = { user, keep, texts: [], screenshots: [] };
  const context = await browser.newContext({ viewport: { width: 1280, height: 720 } });
  context.setDefaultTimeout(120_000);
  const page = await context.newPage();
  const item = page.locator("#gpuspawner-status");
  const text = item.locator(".gpuspawner-status-text");
  const shot = async (name) => {
    const path = join(env.SCREENSHOTS, `story-${user}-${name}.png`);
    await page.screenshot({ path });
    out.screenshots.push(path);
  };
  // what the user's own server says, read with the browser's own session (a GET needs no xsrf)
  // (JupyterHub's single-user server wants the _xsrf cookie echoed, as JupyterLab does)
  const serverGet = (path) => page.evaluate(async (url) => {
    const xsrf = (document.cookie.match(/(?:^|; )_xsrf=([^;]*)/) || [])[1] || "";
    const response = await fetch(url, { headers: { "X-XSRFToken": decodeURIComponent(xsrf) } });
    return { status: response.status, body: await response.json() };
  }, `${BASE}/user/${user}/${path}`).then((r) => {
    if (r.status !== 200) throw new Error(`GET ${path}: ${r.status} ${JSON.stringify(r.body)}`);
    return r.body;
  });
  let sampling = true;
  const sampler = (async () => {
    // every change of the status bar's text, with the time it was seen
    while (sampling) {
      const t = await text.textContent({ timeout: 1000 }).catch(() => null);
      if (t && (out.texts.length === 0 || out.texts[out.texts.length - 1].text !== t.trim())) {
        out.texts.push({ at: Date.now(), text: t.trim(), warning: await item.evaluate((n) => n.classList.contains("gpuspawner-mod-warning")).catch(() => null) });
      }
      await new Promise((r) => setTimeout(r, 1000));
    }
  })();
  try {
    await hubLogin(page, BASE, user);
    await page.goto(`${BASE}/hub/spawn/${user}`);
    await page.click(`.gs-option[data-slug="${slug}"] label`);
    await Promise.all([page.waitForLoadState("load"), page.click('#spawn_form button[type="submit"]')]);
    await page.waitForURL(/\/user\/[^/]+\/lab/, { timeout: 180_000 });
    await item.waitFor();

    // a notebook from the launcher, and one cell run in it
    await page.locator('.jp-LauncherCard[data-category="Notebook"]').first().click();
    const cell = page.locator(".jp-Notebook .jp-Cell .cm-content").first();
    await cell.click();
    await page.keyboard.type("x = 6 * 7");
    // run it in place; a press before the kernel is connected runs nothing, so press again
    const ran = page.locator(".jp-Notebook .jp-InputArea-prompt", { hasText: /\[\d+\]/ }).first();
    for (let attempt = 0; ; attempt++) {
      await cell.click();
      await page.keyboard.press("Control+Enter");
      if (await ran.waitFor({ timeout: 15_000 }).then(() => true, () => false)) break;
      if (attempt === 7) throw new Error("the first cell never ran");
    }
    out.cellRunAt = Date.now();
    const sessions = await serverGet("api/sessions");
    out.kernelId = sessions.length === 1 ? sessions[0].kernel.id : null;
    out.notebook = sessions.length === 1 ? sessions[0].path : null;

    // idle from here: the culler's warning reaches the status bar and a notification
    await item.locator("button.gpuspawner-keep").waitFor({ state: "visible", timeout: WAIT_MS });
    out.warnedAt = Date.now();
    const toast = page.locator(".Toastify__toast", { hasText: "To free the GPU" });
    await toast.waitFor();
    await settled(toast);
    out.warningToast = (await toast.textContent()).trim();
    out.statusWarned = await serverGet("api/gpuspawner/status");
    await shot("warning");

    if (keep === "button") {
      await toast.getByRole("button", { name: "Keep" }).click();
      await item.locator("button.gpuspawner-keep").waitFor({ state: "hidden" });
      out.keptAt = Date.now();
      out.textAfterKeep = (await text.textContent()).trim();
    } else if (keep === "cell") {
      await cell.click();
      await page.keyboard.press("Control+Enter");
      await page.locator(".jp-Notebook .jp-InputArea-prompt", { hasText: "[2]" }).first().waitFor();
      out.keptAt = Date.now();
    }
    if (keep) {
      // past the moment the culler had named, by four of its cycles: the kernel is read
      // from the server itself, so no poll of the status bar is waited for
      const actAt = Date.parse(out.statusWarned.culler.act_at);
      await page.waitForTimeout(Math.max(0, actAt - Date.now()) + 12_000);
      out.checkedAt = Date.now();
      out.kernelsAfter = (await serverGet("api/kernels")).map((k) => k.id);
      out.statusAfter = await serverGet("api/gpuspawner/status");
      out.reclaimedToasts = await page.locator(".Toastify__toast", { hasText: "reclaimed for idleness" }).count();
      await shot("kept");
    } else {
      // "Why?" opens the panel with the culler's reason in full
      const panel = page.locator(".jp-Dialog .gpuspawner-panel");
      await why(toast, panel);
      out.panel = (await panel.innerText()).trim();
      await page.locator(".jp-Dialog").getByRole("button", { name: "Close" }).click();
      const reclaimed = page.locator(".Toastify__toast", { hasText: "reclaimed for idleness" });
      await reclaimed.waitFor({ timeout: WAIT_MS });
      out.reclaimedAt = Date.now();
      await settled(reclaimed);
      out.reclaimedToast = (await reclaimed.textContent()).trim();
      await why(reclaimed, panel);
      out.panelAfterReclaim = (await panel.innerText()).trim();
      await page.locator(".jp-Dialog").getByRole("button", { name: /Close|OK/ }).first().click();
      out.kernelsAfter = (await serverGet("api/kernels")).map((k) => k.id);
      await shot("reclaimed");
    }
    sampling = false;
    await sampler;
    await page.goto(`${BASE}/hub/home`);
    const box = page.locator("#gpuspawner-culler-actions");
    out.homeActions = (await box.count()) ? (await box.innerText()).trim() : null;
    await shot("home");
  } catch (e) {
    out.error = String((e && e.stack) || e);
    // where the user was stuck and what the page said, for the test's message
    out.errorUrl = page.url();
    out.errorPage = await page.locator("body").innerText({ timeout: 5000 }).then((t) => t.slice(0, 1500), () => null);
    try { await shot("error"); } catch {}
  } finally {
    sampling = false;
    await sampler.catch(() => {});
    await context.close();
  }
  return out;
}

const results = await Promise.all(USERS.map(story));
await browser.close();
console.log(JSON.stringify(results));
