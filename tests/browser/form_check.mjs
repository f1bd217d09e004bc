// Drives the spawn-page fragment in Debian's Chromium (headless) through playwright-core.
// Run by tests/unit/test_form_browser.py, which serves the pages and does every assertion;
// this script only acts and reports what it saw as one JSON line on stdout.
//
// env: BASE_URL (the test's page server), SCREENSHOTS (a folder), CHROMIUM (the browser).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";
import { CHROMIUM, CHROMIUM_ARGS } from "./browser.mjs";

const BASE = process.env.BASE_URL;
const SHOTS = process.env.SCREENSHOTS;
const WIDE = { width: 1280, height: 900 };
const NARROW = { width: 375, height: 812 };
const screenshots = [];

// A fresh browser profile (--user-data-dir, which Playwright passes) per context.
async function browser(options) {
  const profile = mkdtempSync(join(tmpdir(), "gpuspawner-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: CHROMIUM_ARGS,
    viewport: WIDE,
    ...options,
  });
  context.setDefaultTimeout(30_000);
  return {
    context,
    async close() {
      await context.close();
      rmSync(profile, { recursive: true, force: true });
    },
  };
}

const option = (slug) => `.gs-option[data-slug="${slug}"]`;
const radio = (slug) => `${option(slug)} input[name="offering"]`;
const nameOf = (slug) => `${option(slug)} .gs-name`;
const countOf = (slug) => `select[name="count-${slug}"]`;

async function checked(page) {
  const boxes = page.locator('input[name="offering"]');
  for (let i = 0; i < (await boxes.count()); i += 1) {
    if (await boxes.nth(i).isChecked()) {
      return boxes.nth(i).getAttribute("value");
    }
  }
  return null;
}

async function visibleText(page, selector) {
  const node = page.locator(selector);
  return (await node.isVisible()) ? (await node.textContent()).trim() : "";
}

async function shot(page, name) {
  const path = join(SHOTS, name);
  await page.screenshot({ path, fullPage: true });
  screenshots.push(path);
}

async function submit(page) {
  await page.click('button[type="submit"]');
  await page.locator("#started").waitFor();
  return true;
}

// Clicking a disabled option (its label, forced past Playwright's checks) changes nothing.
async function disabledCheck(page) {
  await page.click(nameOf("a100-mig-3g-20gb"), { force: true });
  return {
    radioDisabled: await page.locator(radio("a100-mig-3g-20gb")).isDisabled(),
    checkedAfterClick: await checked(page),
    reasonVisible: await visibleText(page, `${option("a100-mig-3g-20gb")} [data-gs-reason]`),
  };
}

// Hold the page's refresh fetches until release() is called, so the test acts first.
async function holdRefresh(page) {
  let release;
  const gate = new Promise((resolve) => {
    release = resolve;
  });
  await page.route(
    (url) => url.pathname.startsWith("/hub/spawn/"),
    async (route) => {
      if (route.request().resourceType() === "fetch") {
        await gate;
      }
      await route.continue();
    },
  );
  return release;
}

async function state(page) {
  return page.evaluate(() => {
    const out = { avail: {}, disabled: {}, reason: {}, optionClass: {} };
    document.querySelectorAll(".gs-option[data-slug]").forEach((node) => {
      const slug = node.getAttribute("data-slug");
      const avail = node.querySelector("[data-gs-avail]");
      const reason = node.querySelector("[data-gs-reason]");
      out.avail[slug] = avail.hidden ? "" : avail.textContent.trim();
      out.reason[slug] = reason.hidden ? "" : reason.textContent.trim();
      out.disabled[slug] = node.querySelector('input[name="offering"]').disabled;
      out.optionClass[slug] = node.classList.contains("gs-disabled");
    });
    const picked = document.querySelector('input[name="offering"]:checked');
    out.checked = picked ? picked.value : null;
    const count = document.querySelector('select[name="count-h100"]');
    out.count = count ? count.value : null;
    out.refreshes = Number(document.querySelector("[data-gpuspawner]").getAttribute("data-gs-refreshes") || 0);
    const notice = document.querySelector("[data-gs-notice]");
    out.notice = notice && !notice.hidden ? notice.textContent.trim() : "";
    return out;
  });
}

async function withJavaScript(results) {
  const { context, close } = await browser({});
  try {
    // Pick, count, submit.
    let page = await context.newPage();
    await page.goto(`${BASE}/hub/spawn/submit`);
    const js = { disabled: await disabledCheck(page) };
    await page.click(nameOf("a100-mig-2g-10gb"));
    await page.keyboard.press("ArrowDown");
    js.disabled.arrowFrom2g = await checked(page);
    await page.click(nameOf("cpu"));
    await page.selectOption(countOf("h100"), "4");
    js.countPicksOption = await checked(page);
    await page.click(nameOf("cpu"));
    await page.click(`${option("h100")} .gs-details`);
    js.checkedAfterClick = await checked(page);
    await page.selectOption(countOf("h100"), "2");
    js.countAfterSelect = await page.locator(countOf("h100")).inputValue();
    await page.mouse.move(0, 0);
    await shot(page, "spawn-form-1280.png");
    js.submitted = await submit(page);
    results.js = js;
    await page.close();

    // Live refresh, with the user's choice becoming unavailable meanwhile.
    page = await context.newPage();
    let release = await holdRefresh(page);
    await page.goto(`${BASE}/hub/spawn/live?_xsrf=abc`);
    await page.click(nameOf("h100"));
    await page.selectOption(countOf("h100"), "4");
    const before = await state(page);
    release();
    await page.waitForFunction(() => Number(document.querySelector("[data-gpuspawner]").getAttribute("data-gs-refreshes") || 0) >= 1);
    const after = await state(page);
    await page.mouse.move(0, 0);
    await shot(page, "spawn-form-live-1280.png");
    results.live = { before, after, submitted: await submit(page) };
    await page.close();

    // Moving away from a choice that became unavailable disables it.
    page = await context.newPage();
    release = await holdRefresh(page);
    await page.goto(`${BASE}/hub/spawn/live2`);
    await page.click(nameOf("h100"));
    release();
    await page.waitForFunction(() => Number(document.querySelector("[data-gpuspawner]").getAttribute("data-gs-refreshes") || 0) >= 1);
    const live2 = { checkedAfterRefresh: await checked(page) };
    await page.click(nameOf("t4-shared"));
    live2.checkedAfterMove = await checked(page);
    live2.h100DisabledAfterMove = await page.locator(radio("h100")).isDisabled();
    live2.h100CountDisabledAfterMove = await page.locator(countOf("h100")).isDisabled();
    results.live2 = live2;
    await page.close();

    // A phone.
    page = await context.newPage();
    await page.setViewportSize(NARROW);
    await page.goto(`${BASE}/hub/spawn/submit`);
    await page.click(nameOf("a100-mig-1g-5gb"));
    const narrow = await page.evaluate(() => {
      const name = document.querySelector('.gs-option[data-slug="t4-shared"] .gs-name').getBoundingClientRect();
      const badge = document.querySelector('.gs-option[data-slug="t4-shared"] [data-gs-avail]').getBoundingClientRect();
      return {
        scrollWidth: document.documentElement.scrollWidth,
        clientWidth: document.documentElement.clientWidth,
        badgeBelowName: badge.top >= name.bottom - 1,
      };
    });
    await page.keyboard.press("Shift+Tab");
    await page.keyboard.press("Tab");
    narrow.focusVisible = await page.evaluate(() => {
      const active = document.activeElement;
      if (!active || !active.matches('input[name="offering"]:focus-visible')) {
        return false;
      }
      const style = getComputedStyle(active.closest(".gs-option"));
      return style.outlineStyle !== "none" && parseFloat(style.outlineWidth) > 0;
    });
    await shot(page, "spawn-form-375.png");
    results.narrow = narrow;
    await page.close();

    // An error from the hub, on a phone.
    page = await context.newPage();
    await page.setViewportSize(NARROW);
    await page.goto(`${BASE}/hub/spawn/error`);
    results.error = await page.evaluate(() => {
      const alert = document.querySelector('.gpuspawner [role="alert"]');
      const first = document.querySelector(".gs-option");
      return {
        alert: alert.textContent.trim(),
        alertAboveFirstOption: alert.getBoundingClientRect().bottom <= first.getBoundingClientRect().top,
        checked: document.querySelector('input[name="offering"]:checked').value,
        count: document.querySelector('select[name="count-h100"]').value,
      };
    });
    await shot(page, "spawn-form-error-375.png");
    await page.close();

    // Dark theme (JupyterHub follows prefers-color-scheme).
    page = await context.newPage();
    await page.emulateMedia({ colorScheme: "dark" });
    await page.goto(`${BASE}/hub/spawn/submit`);
    await page.click(nameOf("h100"));
    await page.mouse.move(0, 0);
    await shot(page, "spawn-form-1280-dark.png");
    await page.close();
  } finally {
    await close();
  }
}

async function withoutJavaScript(results) {
  const { context, close } = await browser({ javaScriptEnabled: false, viewport: NARROW });
  try {
    const page = await context.newPage();
    await page.goto(`${BASE}/hub/spawn/submit?nojs=1`);
    const nojs = {
      scriptsRan: (await page.locator("[data-gpuspawner][data-gs-started]").count()) > 0,
      statusVisible: await page.locator("[data-gs-status]").isVisible(),
      disabled: await disabledCheck(page),
    };
    await page.click(nameOf("h100"));
    await page.selectOption(countOf("h100"), "2");
    await shot(page, "spawn-form-nojs-375.png");
    nojs.submitted = await submit(page);
    results.nojs = nojs;
  } finally {
    await close();
  }
}

const results = {};
try {
  await withJavaScript(results);
  await withoutJavaScript(results);
  results.screenshots = screenshots;
  process.stdout.write(`${JSON.stringify(results)}\n`);
} catch (error) {
  process.stderr.write(`${error.stack || error}\n${JSON.stringify(results)}\n`);
  process.exit(1);
}
