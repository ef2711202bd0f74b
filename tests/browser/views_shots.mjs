// node views_shots.mjs OUTDIR REPORT.html PREDICT.html: screenshots (1280×860) of the
// views added for issues 19, 20 and 22, to look at: OUTDIR/report-roles.png (the timeline
// stacked by role, zoomed on the allocated peak with the minimap shown, the lowest band
// there clicked: its evidence in the side panel) and OUTDIR/report-predict.png (the page
// of `fragscope predict --report`).
import { launch, open } from './chromium.mjs';
import { resolve, join } from 'node:path';

const [outDir, roles, predict] = process.argv.slice(2);
const ctx = await launch();
{
  const { page, errors } = await open(ctx, resolve(roles));
  await page.setViewportSize({ width: 1280, height: 860 });
  await page.evaluate(() => window.dispatchEvent(new Event('resize')));
  await page.evaluate(() => window.fragscope.setStack('role'));
  const peak = await page.evaluate(() => window.fragscope.roleTotals()[0].peak_state);
  const { states } = await page.evaluate(() => window.fragscope.view());
  await page.evaluate(([p, s]) => window.fragscope.zoom(0.6, p), [peak, states]);
  const { x } = await page.evaluate((s) => window.fragscope.xOfState(s + 0.5), peak);
  const box = await page.$eval('canvas.tl', (c) => { const r = c.getBoundingClientRect(); return { left: r.left + c.clientLeft, top: r.top + c.clientTop, h: c.clientHeight }; });
  await page.mouse.click(box.left + 64 + x, box.top + box.h - 30);
  await page.$eval('#timeline', (e) => e.scrollIntoView());
  await page.screenshot({ path: join(outDir, 'report-roles.png') });
  console.log(JSON.stringify({ roles, errors }));
  await page.close();
}
{
  const { page, errors } = await open(ctx, resolve(predict));
  await page.setViewportSize({ width: 1280, height: 860 });
  await page.evaluate(() => window.dispatchEvent(new Event('resize')));
  await page.screenshot({ path: join(outDir, 'report-predict.png') });
  console.log(JSON.stringify({ predict, errors }));
  await page.close();
}
await ctx.close();
