// Drives headless Chromium (the system's, through playwright-core) at the
// coordinator's status page and prints what a person would see, as JSON,
// for tests/py/status_page_test.py to judge.
//   node status_page_check.js PLAYWRIGHT_DIR URL SCREENSHOT_PATH|- SECONDS
"use strict";
const path = require("path");

const [moduleDir, url, screenshot, seconds] = process.argv.slice(2);
const { chromium } = require(path.join(moduleDir, "node_modules", "playwright-core"));

// Every point of every curve in a chart, and the workers' rows.
function read(page) {
  return page.evaluate(() => {
    const points = (id) => Array.from(document.querySelectorAll("#" + id + " polyline.curve"))
        .map((p) => ({ rank: p.dataset.rank, points: p.points.numberOfItems }));
    return {
      state: document.getElementById("job-state").textContent,
      workers: Array.from(document.querySelectorAll("#workers tbody tr")).map((tr) => ({
        id: tr.dataset.workerId,
        cells: Array.from(tr.cells).map((td) => td.textContent),
      })),
      loss: points("loss-chart"),
      rate: points("rate-chart"),
      jobs: Array.from(document.querySelectorAll("#jobs tbody tr")).map((tr) => ({
        id: tr.dataset.jobId,
        cells: Array.from(tr.cells).map((td) => td.textContent),
        allocation: tr.querySelectorAll("svg.allocation path.curve").length,
      })),
      phases: document.querySelectorAll("#breakdown rect.phase").length,
      generations: document.querySelectorAll("#timeline g.generation").length,
      changes: document.querySelectorAll("#changes tbody tr").length,
      banner: document.getElementById("conn").textContent,
      dataNote: document.getElementById("data-note").textContent,
      cards: Object.fromEntries(Array.from(document.querySelectorAll("#summary .card")).map(
          (c) => [c.querySelector(".label").textContent, c.querySelector(".value").textContent])),
    };
  });
}

(async () => {
  const deadline = Date.now() + 1000 * Number(seconds);
  const browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    args: ["--no-sandbox", "--headless"],
    timeout: 30000,
  });
  const result = { errors: [], foreign: [], reads: [] };
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 1000 } });
    page.on("console", (m) => { if (m.type() === "error") result.errors.push("console: " + m.text()); });
    page.on("pageerror", (e) => result.errors.push("page: " + e.message));
    page.on("requestfailed", (r) => result.errors.push("request failed: " + r.url()));
    page.on("request", (r) => { if (!r.url().startsWith(url)) result.foreign.push(r.url()); });
    await page.goto(url, { waitUntil: "load", timeout: 15000 });
    // First read: both workers shown and at least one point on the curves.
    let first;
    while (Date.now() < deadline) {
      first = await read(page);
      const plotted = first.loss.reduce((a, c) => a + c.points, 0);
      if (first.workers.length >= 2 && first.loss.length >= 2 && plotted > 0) break;
      await page.waitForTimeout(250);
    }
    result.reads.push(first);
    // Second read: once the curves have gained points (the job stepped).
    const total = (r) => r.loss.reduce((a, c) => a + c.points, 0);
    let second = first;
    while (Date.now() < deadline && total(second) < total(first) + 3) {
      await page.waitForTimeout(500);
      second = await read(page);
    }
    result.reads.push(second);
    if (screenshot !== "-") await page.screenshot({ path: screenshot, fullPage: true });
  } finally {
    await browser.close();
  }
  process.stdout.write(JSON.stringify(result) + "\n");
})().catch((e) => {
  process.stderr.write("status_page_check: " + (e && e.stack || e) + "\n");
  process.exit(1);
});
