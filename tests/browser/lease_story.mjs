// A GPU lease in the browser (issue #28), on the demo stack, in Debian's Chromium (headless):
// USER starts SLUG from the spawn page and lands in JupyterLab; the GPU panel (a click on the
// status item) shows the lease and links "Extend it on the hub"; on that hub page USER clicks
// Extend and reads what was granted; back in JupyterLab, the lease's warning arrives as a
// notification with no Keep (activity cannot prevent it) and no Extend (none left).
// Run by tests/e2e/test_leases.py, which does every assertion; this script only acts, records
// what USER saw, and prints one JSON line.
//
// env: BASE_URL, SLUG, USER, SCREENSHOTS, CHROMIUM.
import { chromium } from "playwright-core";
import { CHROMIUM, CHROMIUM_ARGS, hubLogin, settled } from "./browser.mjs";
import { join } from "node:path";

const env = process.env;
const BASE = env.BASE_URL;
const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS });
const out = { screenshots: [] };
const context = await browser.newContext({ viewport: { width: 1280, height: 720 } });
context.setDefaultTimeout(120_000);
const page = await context.newPage();
const shot = async (name) => {
  const path = join(env.SCREENSHOTS, `lease-${name}.png`);
  await page.screenshot({ path });
  out.screenshots.push(path);
};

try {
  await hubLogin(page, BASE, env.USER);
  await page.goto(`${BASE}/hub/spawn`);
  await page.click(`.gs-option[data-slug="${env.SLUG}"] label`);
  await Promise.all([page.waitForURL((url) => !url.pathname.endsWith("/hub/spawn")), page.click('#spawn_form button[type="submit"]')]);
  await page.waitForURL(/\/user\/[^/]+\/lab/, { timeout: 180_000, waitUntil: "commit" });
  const labUrl = page.url();
  const item = page.locator("#gpuspawner-status");
  await item.waitFor();

  // the panel shows the lease once the culler has told the notebook (it reads the status afresh)
  const deadline = Date.now() + 90_000;
  for (;;) {
    await item.locator(".gpuspawner-status-text").click();
    const dialog = page.locator(".jp-Dialog");
    await dialog.waitFor();
    const lease = dialog.locator(".gpuspawner-lease");
    if ((await lease.count()) > 0) {
      out.panelLease = (await lease.textContent()).trim();
      out.extendHref = await lease.locator("a").getAttribute("href");
      await shot("panel");
      await dialog.getByRole("button", { name: "Close" }).click();
      break;
    }
    await dialog.getByRole("button", { name: /Close|OK/ }).first().click();
    if (Date.now() > deadline) throw new Error("the GPU panel never showed the lease");
    await page.waitForTimeout(2000);
  }

  // "Extend it on the hub": the hub's page, in the same browser (its session)
  await page.goto(new URL(out.extendHref, BASE).href);
  out.leasePageBefore = (await page.locator("#gpuspawner-leases").textContent()).replace(/\s+/g, " ").trim();
  await Promise.all([page.waitForLoadState("load"), page.click(".gpuspawner-extend")]);
  await page.locator("#gpuspawner-lease-message").waitFor();
  out.message = (await page.locator("#gpuspawner-lease-message").textContent()).trim();
  out.extendButtonsAfter = await page.locator(".gpuspawner-extend").count();
  await shot("extended");

  // back to work: the lease's warning reaches JupyterLab, with no Keep and no Extend left
  await page.goto(labUrl);
  const toast = page.locator(".Toastify__toast", { hasText: "To free the GPU" });
  await toast.waitFor({ timeout: 240_000 });
  await settled(toast);
  out.warningToast = (await toast.textContent()).trim();
  out.toastButtons = await toast.getByRole("button").allTextContents();
  out.statusWarning = await item.evaluate((n) => n.classList.contains("gpuspawner-mod-warning"));
  out.keepVisible = await item.locator(".gpuspawner-keep").isVisible();
  await shot("warning");
} catch (err) {
  out.error = String(err && err.stack ? err.stack : err);
  out.url = page.url();
  out.pageText = (await page.locator("body").textContent().catch(() => "")).slice(0, 2000);
} finally {
  console.log(JSON.stringify(out));
  await browser.close();
}
