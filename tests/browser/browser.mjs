// What the browser scripts here share: Debian's Chromium, headless and calling out to
// nothing; the hub's login form; waiting for a notification to finish sliding in.
export const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
export const CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync"];

/** Log in to the hub at `base` as `user` (the tests' DummyAuthenticator password). */
export async function hubLogin(page, base, user, password = "gpu") {
  await page.goto(`${base}/hub/login`);
  await page.fill("#username_input", user);
  await page.fill("#password_input", password);
  // wait for the POST's answer to take the page away from the login form (the form page is
  // already loaded, so waiting for "load" would return before the hub has set its cookie)
  await Promise.all([page.waitForURL((url) => !url.pathname.endsWith("/hub/login")), page.click("#login_submit")]);
}

/** Resolves once the element's animations (a notification sliding in) have finished. */
export function settled(locator) {
  return locator.evaluate((n) => Promise.all(n.getAnimations({ subtree: true }).map((a) => a.finished)));
}
