// node first_screens.mjs OUTDIR NAME=REPORT.html ...: the first screen (1280×860, nothing
// clicked) of each report as OUTDIR/report-first-NAME.png, to look at (the pages open on
// the device with the OOM, with the verdict in the header). docs/ holds those of the
// built-in example and of files the repository may ship.
import { launch, open } from './chromium.mjs';
import { resolve, join } from 'node:path';

const [outDir, ...pairs] = process.argv.slice(2);
const ctx = await launch();
for (const pair of pairs) {
  const k = pair.indexOf('=');
  const name = pair.slice(0, k), file = pair.slice(k + 1);
  const { page, errors } = await open(ctx, resolve(file));
  await page.setViewportSize({ width: 1280, height: 860 });
  await page.evaluate(() => window.dispatchEvent(new Event('resize')));
  await page.screenshot({ path: join(outDir, `report-first-${name}.png`) });
  console.log(JSON.stringify({ name, errors, selected: await page.evaluate(() => window.fragscope.selected()) }));
  await page.close();
}
await ctx.close();
