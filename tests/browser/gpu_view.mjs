// The notebook's GPU view in a real JupyterLab, in Debian's Chromium (headless): open Lab,
// read the status-bar item, see the culler's warning, screenshot it, click Keep, and
// open the panel. Run by tests/browser/test_gpu_view_browser.py, which does every
// assertion; this script only acts and prints one JSON line.
//
// env: LAB_URL (…/user/ada/lab?token=…), SCREENSHOTS (folder), CHROMIUM.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";
import { CHROMIUM, CHROMIUM_ARGS, settled } from "./browser.mjs";

const env = process.env;
const out = { screenshots: [] };

const profile = mkdtempSync(join(tmpdir(), "gpuspawner-lab-"));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS,
  viewport: { width: 1280, height: 720 },
});
context.setDefaultTimeout(120_000);
const page = context.pages()[0] || (await context.newPage());
const item = page.locator("#gpuspawner-status");
const keep = item.locator("button.gpuspawner-keep");

try {
  await page.goto(env.LAB_URL);
  await item.locator(".gpuspawner-status-text", { hasText: "MIG 1g.10gb" }).waitFor();
  await keep.waitFor({ state: "visible" });
  out.text = (await item.locator(".gpuspawner-status-text").textContent()).trim();
  out.warningClass = await item.evaluate((n) => n.classList.contains("gpuspawner-mod-warning"));
  const toast = page.locator(".Toastify__toast", { hasText: "To free the GPU" });
  await toast.waitFor();
  // for the screenshot in docs/img: the launcher drawn, the notification done sliding in
  await page.locator(".jp-LauncherCard").first().waitFor();
  await settled(toast);
  out.toast = (await toast.textContent()).trim();
  out.toastHasKeep = (await toast.getByRole("button", { name: "Keep" }).count()) === 1;
  const shotPath = join(env.SCREENSHOTS, "user-gpu-view-warning.png");
  await page.screenshot({ path: shotPath });
  out.screenshots.push(shotPath);

  await keep.click();
  await keep.waitFor({ state: "hidden" });
  out.textAfterKeep = (await item.locator(".gpuspawner-status-text").textContent()).trim();
  out.warningClassAfterKeep = await item.evaluate((n) => n.classList.contains("gpuspawner-mod-warning"));
  await toast.waitFor({ state: "detached" });
  out.toastAfterKeep = await toast.count();

  await item.locator(".gpuspawner-status-text").click();
  const panel = page.locator(".jp-Dialog .gpuspawner-panel");
  await panel.waitFor();
  out.panel = (await panel.innerText()).trim();
  const panelPath = join(env.SCREENSHOTS, "user-gpu-view-panel.png");
  await page.screenshot({ path: panelPath });
  out.screenshots.push(panelPath);
  await page.locator(".jp-Dialog").getByRole("button", { name: "Close" }).click();

  // the culler reclaims the idle kernel: the next poll (every 15 s) announces it
  const put = await fetch(env.CULLER_URL, {
    method: "PUT",
    headers: { Authorization: `token ${env.TOKEN}`, "Content-Type": "application/json" },
    body: JSON.stringify({ action: "kernels", reclaimed: [env.KERNEL_ID], reason: "the kernel was idle for 30 minutes (limit 30)" }),
  });
  out.reclaimPut = put.status;
  const reclaimed = page.locator(".Toastify__toast", { hasText: "reclaimed for idleness" });
  await reclaimed.waitFor();
  out.reclaimedToast = (await reclaimed.textContent()).trim();
} catch (e) {
  out.error = String(e && e.stack || e);
  try {
    const errPath = join(env.SCREENSHOTS, "user-gpu-view-error.png");
    await page.screenshot({ path: errPath });
    out.screenshots.push(errPath);
  } catch {}
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
  console.log(JSON.stringify(out));
}
