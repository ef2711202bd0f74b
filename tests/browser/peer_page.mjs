// node peer_page.mjs PAGE.html MEMORYVIZ.js D3.mjs [TIMEOUT_S]: in-page timings of PyTorch's
// own viewer (the page `torch.cuda._memory_viz trace_plot` writes), for
// bench/bench_peer_viewer.py. The page imports MemoryViz.js from jsDelivr and d3 from
// Skypack; this machine is offline, so those three URLs are answered from local files
// (PyTorch's MemoryViz.js and one ES-module bundle of d3@5, which also serves the
// d3-axis/d3-scale/d3-zoom/d3-brush imports so that every import shares one d3-selection,
// as Skypack's shared dependencies do). Nothing else is answered.
//
// Prints JSON: firstDrawnMs (navigation start → the frame after the timeline's polygons
// exist, the page's clock), polygons (how many the SVG holds), zoom redraw times (a wheel
// event on the plot → the second animation frame after it: SVG redraws happen in the
// browser's paint, not in script, so the frame after is when the redraw is on screen),
// heapMB (JS heap after drawing), errors and failed requests. On a crash or a timeout:
// {"failed": "..."}. PEER_SHOT=FILE.png also saves a screenshot after the zoom steps.
import { launch } from './chromium.mjs';
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';

const [html, vizPath, d3Path, timeoutArg] = process.argv.slice(2);
const timeoutMs = 1000 * Number(timeoutArg || 600);
const file = resolve(html);
const viz = readFileSync(vizPath, 'utf8');
const d3 = readFileSync(d3Path, 'utf8');
const D3_URL = 'https://cdn.skypack.dev/d3@5';

const ctx = await launch();
const page = await ctx.newPage();
page.setDefaultTimeout(timeoutMs);
const errors = [], failed = [];
page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
page.on('pageerror', (e) => errors.push(String(e)));
page.on('requestfailed', (r) => failed.push(r.url()));
let crashed = false;
page.on('crash', () => { crashed = true; });
const js = (body) => ({ status: 200, body, headers: { 'content-type': 'text/javascript', 'access-control-allow-origin': '*' } });
await ctx.route('https://cdn.jsdelivr.net/**', (r) => r.request().url().endsWith('/torch/utils/viz/MemoryViz.js') ? r.fulfill(js(viz)) : r.abort());
await ctx.route('https://cdn.skypack.dev/**', (r) => {
  const url = r.request().url();
  if (url === D3_URL) return r.fulfill(js(d3));
  if (/\/d3-(axis|scale|zoom|brush)@1$/.test(url)) return r.fulfill(js(`export * from "${D3_URL}";`));
  return r.abort();
});

let out;
try {
  await page.goto('file://' + file, { timeout: timeoutMs });
  await page.waitForFunction(() => document.querySelectorAll('svg polygon').length > 1, null, { timeout: timeoutMs, polling: 100 });
  const first = await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => r(performance.now()))));
  const polygons = await page.evaluate(() => document.querySelectorAll('svg polygon').length);
  const box = await page.evaluate(() => {
    const r = document.querySelector('svg rect').getBoundingClientRect();
    return { x: r.x + r.width / 2, y: r.y + r.height / 2 };
  });
  const steps = [];
  for (const dy of [-300, -300, -300, -300, 300, 300, 300, 300, -600, 600]) {
    steps.push(await page.evaluate(({ x, y, dy }) => new Promise((res) => {
      const el = document.elementFromPoint(x, y);
      const t = performance.now();
      el.dispatchEvent(new WheelEvent('wheel', { deltaY: dy, clientX: x, clientY: y, bubbles: true, cancelable: true }));
      requestAnimationFrame(() => requestAnimationFrame(() => res(performance.now() - t)));
    }), { ...box, dy }));
  }
  if (process.env.PEER_SHOT) await page.screenshot({ path: process.env.PEER_SHOT });
  const heapMB = await page.evaluate(() => (performance.memory ? performance.memory.usedJSHeapSize / 1e6 : -1));
  const sorted = [...steps].sort((a, b) => a - b);
  out = {
    firstDrawnMs: first, polygons, zoomSteps: steps.length,
    zoomMedianMs: sorted[Math.floor(sorted.length / 2)], zoomMaxMs: sorted[sorted.length - 1],
    heapMB, errors: errors.length, failedRequests: failed.length,
  };
} catch (e) {
  out = { failed: crashed ? 'the page crashed' : String(e).split('\n')[0], errors: errors.slice(0, 3) };
}
console.log(JSON.stringify(out));
await ctx.close();
