// node bench_page.mjs REPORT.html: in-page timings of a report, for bench/bench_report.py.
// Prints JSON: firstDrawnMs (navigation start → first complete drawing, the page's own
// clock), scriptMs (the report script's run up to that drawing), zoom redraw times
// (each zoom step's redraw, measured in the page around the drawing code).
import { launch, open } from './chromium.mjs';
import { resolve } from 'node:path';

const file = resolve(process.argv[2]);
const ctx = await launch();
const { page, errors, requests } = await open(ctx, file);
const first = await page.evaluate(() => ({ at: window.fragscope.sinceNavigationMs, run: window.fragscope.firstPaintMs }));
const steps = [];
for (const f of [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 2, 2, 2, 0.25, 0.25, 0.25, 0.25, 4, 4, 4, 4]) {
  steps.push(await page.evaluate((f) => { window.fragscope.zoom(f); return window.fragscope.lastZoomMs; }, f));
}
const sorted = [...steps].sort((a, b) => a - b);
console.log(JSON.stringify({
  firstDrawnMs: first.at, scriptMs: first.run, zoomSteps: steps.length,
  zoomMedianMs: sorted[Math.floor(sorted.length / 2)], zoomMaxMs: sorted[sorted.length - 1],
  errors: errors.length, otherRequests: requests.filter((r) => r !== 'file://' + file).length,
}));
await ctx.close();
