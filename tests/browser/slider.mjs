// tests/browser/slider.mjs URL ROUND OUT: open dsviz --serve's page URL in
// Debian's chromium (headless, through playwright-core), move the round
// slider to ROUND as a user does (the page submits its form on change), and
// write to OUT, as JSON: the URL the browser ended on, the page's heading
// and the titles of the drawn exchanges. Exit 0, or 1 with the reason.
import { chromium } from "playwright-core";
import { writeFileSync } from "node:fs";

const [url, round, out] = process.argv.slice(2);
if (!url || !round || !out) {
  console.error("usage: slider.mjs URL ROUND OUT");
  process.exit(2);
}
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu"],
});
try {
  const page = await browser.newPage();
  await page.goto(url, { timeout: 30000 });
  const slider = page.locator('input[type="range"][name="round"]');
  await Promise.all([
    page.waitForURL((u) => u.searchParams.get("round") === round, { timeout: 30000 }),
    slider.fill(round),
  ]);
  const result = {
    url: page.url(),
    heading: await page.locator("h1").first().innerText(),
    slider: await slider.inputValue(),
    titles: await page.locator("svg path title").allTextContents(),
  };
  writeFileSync(out, JSON.stringify(result));
} catch (e) {
  console.error(`slider.mjs: ${e.message}`);
  process.exitCode = 1;
} finally {
  await browser.close();
}
