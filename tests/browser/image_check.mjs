// Drives the spawn-page fragment with a KubeSpawner profile form in Debian's Chromium (headless):
// picks profiles and an image choice and reports what the GPU cards say after each, as one JSON
// line. Run by tests/browser/test_image_browser.py, which builds the page and asserts.
//
// env: PAGE (the page's HTML file), CHROMIUM (the browser).
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";
import { CHROMIUM, CHROMIUM_ARGS } from "./browser.mjs";

const profile = mkdtempSync(join(tmpdir(), "gpuspawner-chromium-"));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: CHROMIUM,
  headless: true,
  args: CHROMIUM_ARGS,
});
const seen = {};
try {
  const page = await context.newPage();
  await page.setContent(readFileSync(process.env.PAGE, "utf8"));
  const cards = () =>
    page.$$eval(".gs-option[data-slug]", (options) =>
      Object.fromEntries(
        options.map((o) => [
          o.getAttribute("data-slug"),
          {
            disabled: o.classList.contains("gs-disabled"),
            radioDisabled: o.querySelector("input.gs-radio").disabled,
            reason: o.querySelector("[data-gs-reason]").hidden
              ? ""
              : o.querySelector("[data-gs-reason]").textContent,
            avail: o.querySelector("[data-gs-avail]").textContent,
          },
        ]),
      ),
    );
  seen.start = await cards();
  await page.check("#profile-item-torch");
  seen.torch = await cards();
  await page.selectOption("#profile-option-torch--image", "old");
  seen.old = await cards();
  await page.check("#profile-item-cpu");
  seen.cpu = await cards();
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
process.stdout.write(JSON.stringify(seen) + "\n");
