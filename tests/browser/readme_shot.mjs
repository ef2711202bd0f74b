// node readme_shot.mjs REPORT.html OUT.png: the README's screenshot of a report: the
// first screen, with the largest allocated block of the state view clicked (its stack in
// the side panel).
import { launch, open } from './chromium.mjs';
import { resolve } from 'node:path';

const [file, out] = process.argv.slice(2);
const ctx = await launch();
const { page } = await open(ctx, resolve(file));
await page.setViewportSize({ width: 1280, height: 860 });
await page.evaluate(() => window.dispatchEvent(new Event('resize')));
const big = await page.evaluate(() => window.fragscope.blockRects().filter((b) => b.state === 1).sort((a, b) => b.w - a.w)[0]);
const box = await page.$eval('canvas.st', (c) => { const r = c.getBoundingClientRect(); return { x: r.left, y: r.top }; });
if (big) await page.mouse.click(box.x + big.x + big.w / 2, box.y + big.y + big.h / 2);
await page.screenshot({ path: out });
await ctx.close();
