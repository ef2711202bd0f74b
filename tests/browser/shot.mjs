// node shot.mjs REPORT.html OUT_PREFIX: screenshots of each view of a report, to look at.
import { launch, open } from './chromium.mjs';
import { resolve } from 'node:path';

const [file, prefix] = process.argv.slice(2);
const ctx = await launch();
const { page, errors, requests } = await open(ctx, resolve(file));
await page.screenshot({ path: `${prefix}-full.png`, fullPage: true });
for (const id of ['timeline', 'state', 'fragmentation', 'whatif', 'fit', 'findings', 'ranks']) {
  const s = await page.$('#' + id);
  if (s) await s.screenshot({ path: `${prefix}-${id}.png` });
}
console.log(JSON.stringify({ errors, requests, firstPaintMs: await page.evaluate(() => window.fragscope.firstPaintMs) }));
await ctx.close();
