// node readme_shot.mjs REPORT.html OUT.png: the README's screenshot of a report: the
// first screen, with the tallest allocation of the timeline (stacked by allocation)
// clicked: its address, events and stack in the side panel, its call site highlighted in
// both views, and the state view moved to the clicked event.
import { launch, open } from './chromium.mjs';
import { resolve } from 'node:path';

const [file, out] = process.argv.slice(2);
const ctx = await launch();
const { page } = await open(ctx, resolve(file));
await page.setViewportSize({ width: 1280, height: 860 });
await page.evaluate(() => window.dispatchEvent(new Event('resize')));
const big = (await page.evaluate(() => window.fragscope.allocBoxes())).filter((b) => b.w >= 3).sort((a, b) => b.h - a.h)[0];
const box = await page.$eval('canvas.tl', (c) => { const r = c.getBoundingClientRect(); return { x: r.left, y: r.top }; });
if (big) await page.mouse.click(Math.round(box.x + big.x), Math.round(box.y + big.y));
await page.screenshot({ path: out });
await ctx.close();
