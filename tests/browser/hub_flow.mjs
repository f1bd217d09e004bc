// A data scientist's path through the real hub, in Debian's Chromium (headless):
// log in, read the spawn page, (optionally) try a forbidden choice by a hand-made POST,
// pick an offering, submit, and wait for JupyterLab. Run by tests/e2e/test_hub_e2e.py,
// which does every assertion; this script only acts and prints one JSON line.
//
// env: BASE_URL, HUB_USER, SLUG, COUNT (optional), JS ("1"/"0"), FORBIDDEN (optional slug),
//      SCREENSHOTS (folder), SHOT_PREFIX, CHROMIUM.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";
import { CHROMIUM, CHROMIUM_ARGS, hubLogin } from "./browser.mjs";

const env = process.env;
const BASE = env.BASE_URL;
const USER = env.HUB_USER;
const JS = env.JS !== "0";
const PREFIX = env.SHOT_PREFIX || USER;
const out = { user: USER, js: JS, screenshots: [] };

const profile = mkdtempSync(join(tmpdir(), "gpuspawner-e2e-"));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS,
  viewport: { width: 1280, height: 900 }, javaScriptEnabled: JS,
});
context.setDefaultTimeout(60_000);
const page = context.pages()[0] || (await context.newPage());

async function shot(name, width) {
  if (width) await page.setViewportSize({ width, height: 900 });
  const path = join(env.SCREENSHOTS, `${PREFIX}-${name}.png`);
  await page.screenshot({ path, fullPage: true });
  out.screenshots.push(path);
}

async function readOptions() {
  return page.$$eval(".gs-option", (nodes) => nodes.map((n) => ({
    slug: n.dataset.slug,
    name: n.querySelector(".gs-name")?.textContent.trim(),
    availability: n.querySelector(".gs-avail")?.textContent.trim() || "",
    reason: n.querySelector(".gs-reason")?.textContent.trim() || "",
    disabled: n.querySelector('input[name="offering"]')?.disabled ?? null,
    description: n.querySelector(".gs-description")?.innerHTML || "",
  })));
}

try {
  await hubLogin(page, BASE, USER);

  await page.goto(`${BASE}/hub/spawn/${USER}`);
  out.options = await readOptions();
  out.scripts_in_options = await page.$$eval(".gs-option script, .gs-option img", (n) => n.length);
  await shot("spawn-page-1280", 1280);
  const top = join(env.SCREENSHOTS, `${PREFIX}-spawn-page-top.png`);
  await page.screenshot({ path: top, fullPage: true, clip: { x: 0, y: 0, width: 1280, height: 1650 } });
  out.screenshots.push(top);
  await shot("spawn-page-375", 375);
  await page.setViewportSize({ width: 1280, height: 900 });

  if (env.FORBIDDEN) {
    // A hand-made POST for an offering this user may not take, with the page's own xsrf token.
    const action = await page.getAttribute("#spawn_form", "action");
    const response = await context.request.post(new URL(action, BASE).href, {
      multipart: { offering: env.FORBIDDEN, [`count-${env.FORBIDDEN}`]: "1" },
    });
    const body = await response.text();
    const match = body.match(/class="spawn-error-msg[^"]*">([\s\S]*?)<\/p>/);
    out.forbidden = { status: response.status(), error: match ? match[1].replace(/\s+/g, " ").trim() : null };
    await page.goto(`${BASE}/hub/spawn/${USER}`);
  }

  await page.click(`.gs-option[data-slug="${env.SLUG}"] label`);
  if (env.COUNT) await page.selectOption(`select[name="count-${env.SLUG}"]`, env.COUNT);
  await Promise.all([page.waitForLoadState("load"), page.click('#spawn_form button[type="submit"]')]);
  out.after_submit = page.url();

  const deadline = Date.now() + 120_000;
  while (!/\/user\/[^/]+\/lab/.test(page.url()) && Date.now() < deadline) {
    if (JS) {
      await page.waitForURL(/\/user\/[^/]+\/lab/, { timeout: 120_000 }).catch(() => {});
    } else {
      // No JavaScript: the pending page cannot redirect by itself; reload as a person would.
      await page.waitForTimeout(1000);
      await page.goto(`${BASE}/user/${USER}/lab`).catch(() => {});
    }
  }
  out.final_url = page.url();
  out.title = await page.title();
  if (JS) {
    await page.waitForSelector("#jp-main-dock-panel, .jp-LabShell", { timeout: 60_000 }).catch(() => {});
    out.lab_rendered = (await page.$("#jp-main-dock-panel, .jp-LabShell")) !== null;
  }
  await shot("lab", 1280);
} catch (error) {
  out.error = String(error && error.stack || error);
  out.final_url = page.url();
  try { await shot("failure", 1280); } catch {}
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
console.log(JSON.stringify(out));
