// Browser tests of `fragscope report` in real headless Chromium (Debian's, driven by
// playwright-core). Run by .ci/test.d/browser.sh after `cargo build --release`.
//
// On every real file (../shared/traces, else crates/testdata/real) that `fragscope summary` reads: the report loads with
// no console error and no request but the page itself; the figures it shows equal
// `summary --json` / `analyze --json` (and the state view's own sums of blocks at the end
// equal summary's totals); clicking a block shows its stack; the slider changes the state
// view; zoom changes the timeline. Files summary refuses must be refused by report too,
// with one line, exit 2 and no output file.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import { join, resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { launch, open, scratchDir } from './chromium.mjs';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const BIN = process.env.FRAGSCOPE || join(ROOT, 'target/release/fragscope');
// The real snapshots: the full corpus ../shared/traces when present; outside CI, without it
// (a fresh clone), the in-repository set crates/testdata/real/, and tests that need a
// corpus-only file are skipped by name. Under CI (`CI` set) a missing corpus fails.
const CORPUS = process.env.TRACES || resolve(ROOT, '../shared/traces');
const HAS_CORPUS = existsSync(CORPUS);
assert.ok(HAS_CORPUS || !process.env.CI, `${CORPUS} missing: CI must run the tests on the real snapshots there`);
const TRACES = HAS_CORPUS ? CORPUS : join(ROOT, 'crates/testdata/real');
if (!HAS_CORPUS) console.log(`# ${CORPUS} absent: testing on the in-repository snapshots ${TRACES}`);
/** The skip reason of a test that needs corpus files absent here (false: run it). */
const needs = (...names) => {
  const absent = names.filter((n) => !existsSync(join(TRACES, n)));
  if (absent.length === 0) return false;
  const why = `SKIPPED: needs ${absent.join(', ')}, only in the full corpus ${CORPUS} (absent)`;
  console.log(`# ${why}`);
  return why;
};
const OUT = scratchDir('fragscope-reports-');

assert.ok(existsSync(BIN), `${BIN} missing: run cargo build --release first`);

const files = readdirSync(TRACES)
  .filter((n) => !n.endsWith('.md') && statSync(join(TRACES, n)).isFile())
  .sort();
assert.ok(files.length >= (HAS_CORPUS ? 20 : 5), `expected the real files in ${TRACES}, found ${files.length}`);

function json(args) {
  return JSON.parse(execFileSync(BIN, args, { maxBuffer: 1 << 30 }).toString());
}
function report(inputs, out) {
  return spawnSync(BIN, ['report', ...inputs, '-o', out], { maxBuffer: 1 << 28 });
}

let ctx;
before(async () => { ctx = await launch(); });
after(async () => { await ctx.close(); });

/** Figures shown for the selected device: data-fig → data-value. */
async function figures(page) {
  return page.$$eval('[data-fig]', (els) => Object.fromEntries(els.map((e) => [e.dataset.fig, e.dataset.value])));
}
const num = (v) => (v === 'null' ? null : Number(v));

/** `fragscope report FILE --state-at N`: Rust's own state of each device at trace state N. */
function rustStateAt(path, n) {
  return json(['report', ...(path ? [path] : []), '--state-at', String(n)]).files[0].devices;
}

async function checkDevice(page, name, fi, di, sum, ana, path) {
  const dev = (await page.evaluate(() => window.fragscope.devices()))[fi][di];
  const f = await figures(page);
  const s = sum.devices.find((d) => d.device === dev.device);
  const a = ana.devices.find((d) => d.device === dev.device);
  const where = `${name} device ${dev.device}`;
  if (s && sum.format === 'kineto') {
    // A torch.profiler trace holds no allocator state: the page says so, never 0 bytes.
    for (const k of ['reserved_bytes', 'allocated_bytes', 'active_bytes', 'segments', 'largest_free_block_bytes', 'free_space_fragmentation']) assert.equal(f[k], 'null', `${where}: ${k} not recorded`);
    assert.equal(num(f.trace_events), s.trace_events, `${where}: trace events`);
  } else if (s) {
    assert.equal(num(f.reserved_bytes), s.reserved_bytes, `${where}: reserved`);
    assert.equal(num(f.allocated_bytes), s.allocated_bytes, `${where}: allocated`);
    assert.equal(num(f.active_bytes), s.active_bytes, `${where}: active`);
    assert.equal(num(f.segments), s.segments, `${where}: segments`);
    assert.equal(num(f.largest_free_block_bytes), s.fragmentation.largest_free_block_bytes, `${where}: largest free`);
    assert.equal(num(f.free_space_fragmentation), s.fragmentation.free_space_fragmentation, `${where}: fsf`);
    assert.equal(num(f.trace_events), s.trace_events, `${where}: trace events`);
  }
  assert.ok(a, `${where}: analyze has the device`);
  const t = a.fragmentation.timeline;
  assert.equal(num(f.peak_reserved_bytes), t.peak_reserved.bytes, `${where}: peak reserved`);
  assert.equal(num(f.peak_allocated_bytes), t.peak_allocated.bytes, `${where}: peak allocated`);
  assert.equal(num(f.peak_fragmentation), a.peak_fragmentation, `${where}: peak fragmentation`);
  assert.equal(num(f.findings), a.findings.length, `${where}: findings`);
  const shown = await page.$$eval('#finding-list li', (els) => els.map((e) => e.textContent));
  assert.deepEqual(shown, a.findings.map((x) => `${x.severity} ${x.headline}`), `${where}: finding headlines`);
  // Leak suspects: the drawn per-step curve has a sample at each step boundary analyze
  // used (the first step's start, then each step's end) and starts and ends at analyze's
  // figures: its curve's first point, and the live bytes at the last step's end.
  const sparks = await page.$$eval('#leaks canvas.spark', (els) => els.map((e) => ({ first: Number(e.dataset.first), last: Number(e.dataset.last), n: Number(e.dataset.samples) })));
  assert.equal(sparks.length, a.leak_suspects.length, `${where}: one curve per leak suspect`);
  sparks.forEach((sp, k) => {
    const l = a.leak_suspects[k];
    assert.equal(sp.n, Math.min(a.leak_steps.boundaries.length, 4096), `${where}: ${l.site} samples`);
    assert.equal(l.curve[0].entry, a.leak_steps.boundaries[0], `${where}: ${l.site} curve starts at the first boundary`);
    assert.equal(sp.first, l.curve[0].bytes, `${where}: ${l.site} first`);
    assert.equal(sp.last, l.last_bytes, `${where}: ${l.site} last`);
  });
  // The drawn curves (the report's own walk, merged up to the coarsest zoom level) peak
  // where analyze's timeline does.
  const tl = await page.$eval('canvas.tl', (c) => ({ ...c.dataset }));
  assert.equal(Number(tl.peakReserved), t.peak_reserved.bytes, `${where}: curve's reserved peak`);
  // The allocated curve is the timeline's walk (a block's final size, else its rounded
  // request: `allocated_size_basis`); peak allocated is memory_stats' block peak, at or
  // above it (docs/glossary.md).
  assert.ok(Number(tl.peakAllocated) <= t.peak_allocated.bytes, `${where}: curve's allocated peak ${tl.peakAllocated} above peak allocated ${t.peak_allocated.bytes}`);

  if (dev.moments > 0) {
    // The state view at the end: its own sums over the drawn blocks equal summary's totals.
    await page.click('[data-jump="end"]');
    const e = await figures(page);
    if (s) {
      assert.equal(num(e.moment_reserved_bytes), s.reserved_bytes, `${where}: state view reserved at the end`);
      assert.equal(num(e.moment_allocated_bytes), s.allocated_bytes, `${where}: state view allocated at the end`);
      assert.equal(num(e.moment_largest_free_bytes), s.fragmentation.largest_free_block_bytes, `${where}: state view largest free`);
      assert.equal(num(e.moment_segments), s.segments, `${where}: state view segments`);
    }
    // Clicking a block shows its stack (a block with a recorded stack when there is one).
    const rects = await page.evaluate(() => window.fragscope.blockRects());
    const live = rects.filter((r) => r.state === 1 && r.w >= 2);
    const withStack = live.filter((r) => r.stack >= 0);
    const target = withStack[0] || live[0];
    if (target) {
      const box = await page.$eval('canvas.st', (c) => { const r = c.getBoundingClientRect(); return { x: r.left, y: r.top }; });
      await page.$eval('canvas.st', (c) => c.scrollIntoView());
      const b2 = await page.$eval('canvas.st', (c) => { const r = c.getBoundingClientRect(); return { x: r.left, y: r.top }; });
      await page.mouse.click(b2.x + target.x + Math.min(target.w / 2, 4), b2.y + target.y + target.h / 2);
      const stack = await page.$eval('#detail-body [data-stack]', (x) => ({ id: x.dataset.stack, text: x.textContent }));
      if (target.stack >= 0) {
        assert.equal(stack.id, String(target.stack), `${where}: clicked block's stack`);
        assert.ok(stack.text.trim().length > 0, `${where}: stack text shown`);
      } else {
        assert.equal(stack.id, 'none', `${where}: a block without stack says so`);
        console.log(`# ${where}: no block has a recorded stack; checked the "no stack" message`);
      }
      void box;
    } else {
      console.log(`# ${where}: no allocated block at the end to click`);
    }
    if (dev.events > 0) {
      // The state view reaches arbitrary events (not only the keyframes): what it shows
      // there equals Rust's own backward walk to that event (`report --state-at`). On a
      // trace too long to embed every event's changes it snaps to a keyframe and says so.
      const keys = await page.evaluate(() => window.fragscope.keyframes());
      for (const frac of [0.37, 0.61, 0.93]) {
        let asked = dev.first + Math.floor((dev.events - dev.first) * frac);
        while (keys.includes(asked) && asked < dev.events) asked++;
        await page.$eval('#moment', (x, v) => { x.value = String(v); x.dispatchEvent(new Event('input')); }, asked);
        const shown = await page.$eval('canvas.st', (c) => ({ state: Number(c.dataset.state), snapped: c.dataset.snapped === '1' }));
        if (dev.exact) assert.equal(shown.state, asked, `${where}: the slider reaches event state ${asked}`);
        else {
          assert.ok(shown.snapped || keys.includes(asked), `${where}: snapped`);
          assert.match(await page.$eval('#moment-label', (x) => x.textContent), new RegExp(`snapped from ${asked} to the nearest keyframe, event state ${shown.state}`));
        }
        const f = await figures(page);
        const r = rustStateAt(path, shown.state).find((x) => x.device === dev.device);
        assert.equal(num(f.moment_reserved_bytes), r.reserved_bytes, `${where}: reserved at state ${shown.state}`);
        assert.equal(num(f.moment_allocated_bytes), r.allocated_bytes, `${where}: allocated at state ${shown.state}`);
        assert.equal(num(f.moment_pending_bytes), r.pending_free_bytes, `${where}: pending free at state ${shown.state}`);
        assert.equal(num(f.moment_largest_free_bytes), r.largest_free_block_bytes, `${where}: largest free at state ${shown.state}`);
        assert.equal(num(f.moment_segments), r.segments, `${where}: segments at state ${shown.state}`);
        assert.equal(await page.$eval('canvas.st', (c) => Number(c.dataset.blocks)), r.blocks.length, `${where}: blocks at state ${shown.state}`);
      }
      console.log(`# ${where}: state view checked at 3 events against report --state-at (${dev.exact ? 'every event reachable' : 'keyframes only, snapped'})`);
      // Moving the slider changes the picture where the segments differ.
      const grab = () => page.$eval('canvas.st', (c) => ({ state: c.dataset.state, img: c.toDataURL() }));
      await page.click('[data-jump="end"]');
      const start = await grab();
      const startFigs = await figures(page);
      let changed = false;
      for (const k of keys) {
        if (changed) break;
        await page.$eval('#moment', (x, v) => { x.value = String(v); x.dispatchEvent(new Event('input')); }, k);
        const now = await grab();
        const f = await figures(page);
        if (now.state === start.state) continue;
        const segsDiffer = ['moment_reserved_bytes', 'moment_segments'].some((x) => f[x] !== startFigs[x]);
        if (segsDiffer) assert.ok(now.img !== start.img, `${where}: state ${k} has other segments but the same picture`);
        changed = now.img !== start.img;
      }
      if (!changed) console.log(`# ${where}: all keyframes have the same layout; slider checked for position only`);
    } else {
      console.log(`# ${where}: no trace, one state only; slider not exercised`);
    }
  } else {
    const note = await page.$eval('#state', (x) => x.textContent);
    assert.match(note, /No allocator state/, `${where}: says why there is no state view`);
    console.log(`# ${where}: no segments, state view absent (${note.slice(0, 80)})`);
  }

  if (dev.allocations > 0) await checkAllocations(page, where, dev, path, a);
  else console.log(`# ${where}: no allocation in the trace; the timeline stacks nothing one by one`);

  if (dev.events >= 8) {
    const v0 = await page.$eval('canvas.tl', (c) => ({ x0: +c.dataset.x0, x1: +c.dataset.x1, img: c.toDataURL() }));
    await page.click('#zoom-in');
    const v1 = await page.$eval('canvas.tl', (c) => ({ x0: +c.dataset.x0, x1: +c.dataset.x1, img: c.toDataURL() }));
    assert.ok(Math.abs((v1.x1 - v1.x0) - (v0.x1 - v0.x0) / 2) < 1e-6, `${where}: zoom in halves the span`);
    assert.notEqual(v1.img, v0.img, `${where}: zoom redraws the timeline`);
    await page.click('#zoom-reset');
  } else {
    console.log(`# ${where}: ${dev.events} trace events, zoom not exercised`);
  }
}

/** Click the tallest drawn allocation: its address, size and events, and its whole stack. */
async function clickAllocation(page, where, dev, path) {
  // The tallest one at least 3 px wide, clicked at a whole page pixel inside it (mouse
  // positions are whole pixels; on a 48 GiB scale a 30 MiB allocation is under one).
  const tl = await page.$eval('canvas.tl', (c) => { const r = c.getBoundingClientRect(); return { x: r.left, y: r.top }; });
  const boxes = await page.evaluate(() => window.fragscope.allocBoxes());
  const big = boxes
    .filter((b) => b.w >= 3)
    .map((b) => ({ ...b, py: Math.ceil(tl.y + b.y - b.h / 2 + 0.01) }))
    .filter((b) => b.py + 0.5 < tl.y + b.y + b.h / 2)
    .sort((x, y) => y.h - x.h)[0];
  if (!big) {
    console.log(`# ${where}: no drawn allocation covers a whole pixel row at this scale (${boxes.length} drawn); click not exercised here`);
    return;
  }
  await page.mouse.click(Math.round(tl.x + big.x), big.py);
  const info = await page.$eval('#alloc-info', (x) => ({ ...x.dataset }));
  assert.equal(Number(info.allocIndex), big.index, `${where}: the clicked allocation is shown`);
  const stack = await page.$eval('#detail-body [data-stack]', (x) => ({ id: x.dataset.stack, text: x.textContent }));
  if (big.stack >= 0) {
    const frames = await page.evaluate((si) => { const f = window.fragscope.file(); return f.stacks[si].map((k) => f.frames[k]); }, big.stack);
    assert.equal(stack.id, String(big.stack), `${where}: the allocation's stack`);
    // memory_viz's filter hides the allocator's frames; the toggle shows every frame.
    if (await page.$('#all-frames')) await page.check('#all-frames');
    const all = await page.$eval('#detail-body [data-stack]', (x) => x.textContent);
    assert.equal(all, frames.length ? frames.join('\n') : '(the recorded stack has no frames)', `${where}: every frame shown`);
    if (await page.$('#all-frames')) await page.uncheck('#all-frames');
  } else {
    assert.equal(stack.id, 'none', `${where}: an allocation without stack says so`);
  }
  // Rust's backward walk has an allocated block of that request at that address just
  // after the allocation (when the walk reaches back that far).
  if (Number(info.allocState) >= dev.first) {
    const r = rustStateAt(path, Number(info.allocState)).find((x) => x.device === dev.device);
    const block = r.blocks.find((b) => b[0] === Number(info.allocAddr));
    assert.ok(block, `${where}: a block at ${info.allocAddr} after its alloc`);
    assert.equal(block[3], 1, `${where}: that block is allocated`);
    assert.equal(block[2], Number(info.allocRequest), `${where}: with the request shown`);
  }
}

/** The timeline stacked by allocation: N adjustable, a click shows one allocation. */
async function checkAllocations(page, where, dev, path, a) {
  await page.$eval('canvas.tl', (c) => c.scrollIntoView());
  // N is adjustable: none drawn, then all embedded.
  await page.$eval('#tl-n', (x) => { x.value = '0'; x.dispatchEvent(new Event('input')); });
  const none = await page.$eval('canvas.tl', (c) => ({ shown: Number(c.dataset.allocsShown), img: c.toDataURL() }));
  assert.equal(none.shown, 0, `${where}: N = 0 draws no allocation`);
  await page.$eval('#tl-n', (x, v) => { x.value = String(v); x.dispatchEvent(new Event('input')); }, dev.allocations);
  const all = await page.$eval('canvas.tl', (c) => ({ shown: Number(c.dataset.allocsShown), img: c.toDataURL() }));
  assert.ok(all.shown > 0, `${where}: N = ${dev.allocations} draws allocations`);
  assert.match(await page.$eval('#tl-n-label', (x) => x.textContent), new RegExp(`largest ${dev.allocations} of ${dev.allocations} allocations`));
  assert.notEqual(all.img, none.img, `${where}: N changes the picture`);
  await clickAllocation(page, where, dev, path);
  await page.$eval('#tl-n', (x) => { x.value = '200'; x.dispatchEvent(new Event('input')); });
  // Wall clock: where the trace has times, points are placed by time.
  const clock = await page.evaluate(() => window.fragscope.timeOfState(1));
  if (clock == null) {
    assert.ok(await page.$eval('#tl-axis', (x) => x.disabled), `${where}: no times, wall clock disabled`);
    console.log(`# ${where}: the trace records no times; wall-clock axis disabled`);
    return;
  }
  await page.selectOption('#tl-axis', 'time');
  assert.equal(await page.$eval('canvas.tl', (c) => c.dataset.axis), 'time', `${where}: wall-clock axis on`);
  const t = a.fragmentation.timeline;
  const pts = [t.peak_allocated, t.peak_reserved].filter((p) => p.event_index != null && p.time_us != null);
  const exactClock = dev.events + 1 <= 8192;
  const t0 = await page.evaluate(() => window.fragscope.timeOfState(0));
  const t1 = await page.evaluate((n) => window.fragscope.timeOfState(n), dev.events);
  let differs = false;
  for (const p of pts) {
    const st = p.event_index + 1;
    const tt = await page.evaluate((s) => window.fragscope.timeOfState(s), st);
    if (exactClock) assert.equal(tt, p.time_us, `${where}: time of event ${p.event_index}`);
    const x = await page.evaluate((s) => window.fragscope.xOfState(s), st);
    assert.ok(Math.abs(x.x / x.w - (tt - t0) / (t1 - t0)) < 1e-9, `${where}: event ${p.event_index} placed by time`);
    if (Math.abs(x.x / x.w - st / dev.events) > 0.01) differs = true;
  }
  // Pauses between events are shaded as gaps (codeloc's device 0 waits 0.44 s after its
  // first events; decomfl, 23 k events in 8192 buckets, pauses 0.245 s: screenshots
  // show both).
  const gaps = await page.$eval('canvas.tl', (c) => Number(c.dataset.gaps));
  if ((where.startsWith('codeloc') && dev.device === 0) || where.startsWith('decomfl')) assert.ok(gaps > 0, `${where}: pauses shown as gaps`);
  console.log(`# ${where}: ${gaps} pauses shaded on the wall-clock axis`);
  console.log(`# ${where}: wall-clock axis checked at ${pts.length} peaks${exactClock ? ' (times exact)' : ' (interpolated inside buckets)'}; ${differs ? 'positions differ from event order' : 'times nearly uniform here'}`);
  await page.selectOption('#tl-axis', 'events');
}

for (const name of files) {
  test(`report of ${name}`, async () => {
    const path = join(TRACES, name);
    const out = join(OUT, name + '.html');
    const probe = spawnSync(BIN, ['summary', '--json', path], { maxBuffer: 1 << 30 });
    if (probe.status !== 0) {
      // Not a snapshot fragscope reads: report must refuse it the same way.
      const r = report([path], out);
      assert.equal(r.status, 2, `${name}: report exit code`);
      const err = r.stderr.toString().trim().split('\n');
      assert.equal(err.length, 1, `${name}: one line`);
      assert.match(err[0], /^error: /);
      assert.ok(!existsSync(out), `${name}: no output file left`);
      console.log(`# ${name}: not a snapshot (${err[0]}); refused with exit 2`);
      return;
    }
    const sum = JSON.parse(probe.stdout.toString()).files[0];
    const ana = json(['analyze', '--json', path]).files[0];
    const r = report([path], out);
    assert.equal(r.status, 0, `${name}: ${r.stderr}`);
    const { page, errors, requests } = await open(ctx, out);
    assert.deepEqual(errors, [], `${name}: console errors`);
    const devices = (await page.evaluate(() => window.fragscope.devices()))[0];
    assert.equal(devices.length, ana.devices.length, `${name}: devices shown`);
    if (devices.length === 0) {
      const text = await page.$eval('#main', (x) => x.textContent);
      assert.match(text, /no device/, `${name}: says there is no device`);
    }
    for (let di = 0; di < devices.length; di++) {
      await page.evaluate((d) => window.fragscope.select(0, d), di);
      await checkDevice(page, name, 0, di, sum, ana, path);
    }
    assert.deepEqual(errors, [], `${name}: console errors after interaction`);
    assert.deepEqual(requests, ['file://' + out], `${name}: the only request is the page itself`);
    await page.close();
  });
}

test('built-in example: what-if curves drawn, search by frame text and by address', async () => {
  const ex = join(OUT, 'example.html');
  assert.equal(report([], ex).status, 0);
  const ana = json(['analyze', '--json']).files[0].devices[0];
  const { page, errors, requests } = await open(ctx, ex);
  // One curve per replay analyze ran (the recorded settings and each alternative tried).
  const curves = await page.$eval('canvas.wi', (c) => Number(c.dataset.curves));
  assert.equal(curves, 1 + ana.recommendations.tried.length);
  await page.fill('#search', 'attention');
  await page.press('#search', 'Enter');
  const hits = await page.$eval('#hits', (x) => x.textContent);
  assert.match(hits, /[1-9]\d* stacks contain “attention”/);
  // Search by frame text highlights exactly the drawn allocations whose stack has it.
  const dims = await page.evaluate(() => { const f = window.fragscope.file(); return window.fragscope.dimmed().map((d) => ({ ...d, has: d.stack >= 0 && f.stacks[d.stack].some((k) => f.frames[k].toLowerCase().includes('attention')) })); });
  assert.ok(dims.some((d) => d.has), 'some drawn allocation comes from an "attention" frame');
  for (const d of dims) assert.equal(d.dim, !d.has, `allocation ${d.index}: dimmed unless its stack has the text`);
  // Search by address highlights the allocations that covered it.
  const box = (await page.evaluate(() => window.fragscope.allocBoxes())).sort((x, y) => y.area - x.area)[0];
  await page.fill('#search', '0x' + (box.addr + 256).toString(16));
  await page.press('#search', 'Enter');
  const dimA = await page.evaluate(() => window.fragscope.dimmed());
  assert.equal(dimA.find((d) => d.index === box.index).dim, false, 'the allocation at the address is highlighted');
  const covered = await page.evaluate((a) => { const f = window.fragscope.file(); return window.fragscope.dimmed().filter((d) => !d.dim).length; }, box.addr);
  assert.ok(covered >= 1 && covered < dimA.length, `address search highlights ${covered} of ${dimA.length}`);
  // An address inside the largest allocated block at the end finds that block.
  await page.click('[data-jump="end"]');
  const big = await page.evaluate(() => window.fragscope.blockRects().filter((b) => b.state === 1).sort((a, b) => b.w - a.w)[0]);
  assert.ok(big, 'an allocated block to look for');
  const hex = '0x' + (big.addr + 512).toString(16);
  await page.fill('#search', hex);
  await page.press('#search', 'Enter');
  const found = await page.$eval('#hits', (x) => x.textContent);
  assert.ok(found.includes('allocated block 0x' + big.addr.toString(16)), `search ${hex}: ${found.slice(0, 200)}`);
  // Hovering a free block says which recorded requests it could have served.
  const free = await page.evaluate(() => window.fragscope.blockRects().filter((b) => b.state === 0).sort((a, b) => b.w - a.w)[0]);
  const st = await page.$eval('canvas.st', (c) => { c.scrollIntoView(); const r = c.getBoundingClientRect(); return { x: r.left, y: r.top }; });
  await page.mouse.move(st.x + free.x + free.w / 2, st.y + free.y + free.h / 2);
  assert.ok(Number(await page.$eval('#detail-body [data-free-serves]', (x) => x.dataset.freeServes)) > 0, 'the largest free block could serve requests');
  // Linked views: a click on the timeline moves the state view to the nearest moment, and
  // a click on a call-site band dims the other sites' blocks.
  await page.click('[data-jump="end"]');
  const endState = await page.$eval('canvas.st', (c) => c.dataset.state);
  await page.selectOption('#tl-stack', 'site');
  const tl = await page.$eval('canvas.tl', (c) => { c.scrollIntoView(); const r = c.getBoundingClientRect(); return { x: r.left, y: r.top, w: r.width, h: r.height }; });
  await page.mouse.click(tl.x + 64 + (tl.w - 64) * 0.45, tl.y + tl.h - 24);
  assert.notEqual(await page.$eval('canvas.st', (c) => c.dataset.state), endState, 'timeline click moves the state view');
  assert.ok(await page.$('#detail-body [data-stack]'), 'a band clicked shows its stack');
  await page.selectOption('#tl-stack', 'allocation');
  // Everything the real files are checked for, on the example too (it has the OOM and a
  // leak suspect that no real file has).
  const sum = json(['summary', '--json']).files[0];
  const all = json(['analyze', '--json']).files[0];
  assert.ok(all.devices[0].leak_suspects.length > 0 && all.devices[0].oom, 'the example has a leak suspect and an OOM');
  await page.evaluate(() => window.fragscope.select(0, 0));
  await checkDevice(page, 'example', 0, 0, sum, all, null);
  assert.deepEqual(errors, []);
  assert.deepEqual(requests, ['file://' + ex]);
  await page.close();
});

test('a state budget too small for every event: the state view snaps to keyframes and says so', async () => {
  const path = join(TRACES, 'decomfl-opt-zeroth-order-windows.pickle');
  const out = join(OUT, 'snapped.html');
  const r = spawnSync(BIN, ['report', path, '--state-budget', '30000', '-o', out]);
  assert.equal(r.status, 0, String(r.stderr));
  const sum = json(['summary', '--json', path]).files[0];
  const ana = json(['analyze', '--json', path]).files[0];
  const { page, errors, requests } = await open(ctx, out);
  const dev = (await page.evaluate(() => window.fragscope.devices()))[0][0];
  assert.equal(dev.exact, false, 'no per-event changes within this budget');
  assert.ok(dev.moments > 24, `${dev.moments} keyframes`);
  assert.match(await page.$eval('#state-mode', (x) => x.textContent), /snaps to the nearest of \d+ keyframes/);
  await checkDevice(page, 'decomfl (budget 30000)', 0, 0, sum, ana, path);
  assert.deepEqual(errors, []);
  assert.deepEqual(requests, ['file://' + out]);
  await page.close();
});

test('two files side by side, compared', { skip: needs('cs336-2.7b-fwd-ctx128-bf16.pickle', 'cs336-2.7b-fwd-ctx128-fp32.pickle') }, async () => {
  const two = join(OUT, 'two.html');
  const a = join(TRACES, 'cs336-2.7b-fwd-ctx128-bf16.pickle');
  const b = join(TRACES, 'cs336-2.7b-fwd-ctx128-fp32.pickle');
  assert.equal(report([a, b], two).status, 0);
  const { page, errors, requests } = await open(ctx, two);
  const rows = await page.$$eval('#ranks tr[data-file]', (els) => els.map((e) => Number(e.dataset.peakReserved)));
  const peaks = [a, b].map((f) => Math.max(...json(['analyze', '--json', f]).files[0].devices.map((d) => d.fragmentation.timeline.peak_reserved.bytes)));
  assert.deepEqual(rows, peaks);
  // The comparison drawn is `fragscope diff`'s.
  const d = json(['diff', '--json', a, b]);
  const shown = await page.$$eval('#diff [data-delta-peak-reserved]', (els) => els.map((e) => Number(e.dataset.deltaPeakReserved)));
  assert.deepEqual(shown, d.devices.map((x) => x.delta.peak_reserved));
  const sites = await page.$$eval('#diff tr[data-delta]', (els) => els.map((e) => Number(e.dataset.delta)));
  assert.deepEqual(sites, d.devices.flatMap((x) => x.sites.map((s) => s.delta)));
  assert.ok(sites.length > 0, 'the diff lists call sites');
  await page.click('#files button:nth-child(2)');
  assert.match(await page.$eval('#figures h2', (x) => x.textContent), /fp32/);
  assert.deepEqual(errors, []);
  assert.deepEqual(requests, ['file://' + two]);
  await page.close();
});

test('a file that cannot be written leaves nothing behind', () => {
  const r = report([], join(OUT, 'no-such-dir', 'r.html'));
  assert.equal(r.status, 2);
  assert.match(r.stderr.toString(), /^error: cannot write/);
  assert.ok(!existsSync(join(OUT, 'no-such-dir')));
});

test('report --fit: the make-it-fit view draws fit --json, card by card', async () => {
  const f = join(ROOT, 'crates/testdata/h200/gpt-s512-b16.pickle.gz');
  const out = join(OUT, 'fit.html');
  const r = spawnSync(BIN, ['report', f, '--fit', '10GB,H100-80GB', '-o', out]);
  assert.equal(r.status, 0, String(r.stderr));
  const want = json(['fit', f, '--capacity', '10GB,H100-80GB', '--json']).files[0].devices[0].cards;
  const { page, errors, requests } = await open(ctx, out);
  const cards = await page.$$eval('#fit .fit-card', (els) => els.map((c) => ({
    capacity: c.dataset.capacity,
    fits: c.dataset.fits === '1',
    verdict: c.querySelector('.fit-verdict').textContent,
    rows: [...c.querySelectorAll('tr[data-rank]')].map((t) => ({ rank: Number(t.dataset.rank), model: t.dataset.model === '1', reserved: Number(t.dataset.peakReserved), allocated: Number(t.dataset.peakAllocated), margin: Number(t.dataset.margin), kind: t.lastChild.textContent })),
  })));
  assert.deepEqual(cards.map((c) => c.capacity), want.map((c) => c.capacity));
  for (const [c, w] of cards.map((c, i) => [c, want[i]])) {
    assert.equal(c.verdict, w.verdict);
    assert.equal(c.fits, w.fits_as_recorded);
    assert.deepEqual(c.rows, w.options.map((o) => ({ rank: o.rank, model: o.model, reserved: o.peak_reserved, allocated: o.peak_allocated, margin: o.margin, kind: o.model ? 'model' : 'replay' })));
  }
  // The 10 GB card needs a change; its options say which are models of the change.
  assert.equal(cards[0].fits, false);
  assert.ok(cards[0].rows.length > 0 && cards[0].rows.some((o) => o.model), 'a model of a change among the options');
  assert.match(await page.$eval('#fit', (x) => x.textContent), /CUDA context/);
  assert.deepEqual(errors, []);
  assert.deepEqual(requests, ['file://' + out]);
  await page.close();
  // A bad capacity: one line, exit 2, no page; without --fit, no view.
  const bad = spawnSync(BIN, ['report', f, '--fit', '40 potatoes', '-o', join(OUT, 'nofit.html')]);
  assert.equal(bad.status, 2);
  assert.equal(bad.stderr.toString().trim().split('\n').length, 1, String(bad.stderr));
  assert.ok(!existsSync(join(OUT, 'nofit.html')));
  const empty = spawnSync(BIN, ['report', f, '--fit', '', '-o', join(OUT, 'nofit.html')]);
  assert.equal(empty.status, 2);
  assert.match(empty.stderr.toString(), /^error: --fit needs the device size/);
  const plain = join(OUT, 'plain.html');
  assert.equal(report([f], plain).status, 0);
  const p2 = await open(ctx, plain);
  assert.equal(await p2.page.$('#fit'), null, 'no fit view without --fit');
  await p2.page.close();
});

test('the drawn allocated curve and the peak allocated figure agree, or the page says by how much', async () => {
  // decomfl: block remainders put peak allocated 4.29 MB above the trace's sizes; the GPT
  // recording: the two agree, and no note is shown.
  for (const [f, differs] of [[join(ROOT, 'crates/testdata/real/decomfl-opt-zeroth-order-windows.pickle'), true], [join(ROOT, 'crates/testdata/h200/gpt-s256-b8.pickle.gz'), false]]) {
    const out = join(OUT, 'basis.html');
    assert.equal(report([f], out).status, 0);
    const t = json(['analyze', '--json', f]).files[0].devices[0].fragmentation.timeline;
    const drawn = Math.max(...t.series.map((p) => p.allocated));
    const { page, errors } = await open(ctx, out);
    const peakDrawn = Number(await page.$eval('canvas.tl', (c) => c.dataset.peakAllocated));
    assert.equal(peakDrawn, drawn, `${f}: the curve drawn is analyze's series`);
    const note = await page.$('#alloc-basis');
    assert.equal(!!note, differs, `${f}: a note iff the curve is below peak allocated`);
    assert.equal(drawn < t.peak_allocated.bytes, differs);
    if (note) {
      assert.equal(Number(await note.evaluate((x) => x.dataset.peak)), t.peak_allocated.bytes);
      assert.equal(Number(await note.evaluate((x) => x.dataset.drawn)), drawn);
      assert.match(await note.textContent(), /below peak allocated .*max_memory_allocated/);
    }
    assert.deepEqual(errors, []);
    await page.close();
  }
});

test('private pools: each pool apart from the default pools, in a table, on the timeline and in the state view', async () => {
  // A small snapshot with a CUDA graph's pool (1, 0) and a MemPool (0, 1), pool ids on every
  // entry and segment (make_private_pools.py, which prints each pool's expected figures).
  const snap = join(OUT, 'private-pools.pickle');
  const expected = JSON.parse(execFileSync('python3', [join(ROOT, 'tests/browser/make_private_pools.py'), snap]).toString());
  const out = join(OUT, 'private-pools.html');
  const r = report([snap], out);
  assert.equal(r.status, 0, String(r.stderr));
  const want = json(['summary', '--json', snap]).files[0].private_pools[0].pools;
  const { page, errors, requests } = await open(ctx, out);
  const rows = await page.$$eval('#pools-table tr[data-pool]', (els) => els.map((t) => ({ pool: t.dataset.pool, reserved: Number(t.dataset.reserved),
    allocated: Number(t.dataset.allocated), free: Number(t.dataset.free), segments: Number(t.dataset.segments), peak: Number(t.dataset.peak), text: t.textContent })));
  assert.deepEqual(rows.map((x) => x.pool), ['0,0', '0,1', '1,0'], 'the default pools first, then each private pool by id');
  // The figures at the end are summary's (what PyTorch wrote on each pool's segments).
  for (const w of want) {
    const row = rows.find((x) => x.pool === w.pool.join(','));
    assert.deepEqual([row.reserved, row.allocated, row.free, row.segments], [w.reserved_bytes, w.allocated_bytes, w.cached_free_bytes, w.segments], `pool ${row.pool}`);
  }
  // Each pool's peak over the trace: the graph pool held 44 MiB before one segment went.
  for (const [pool, e] of Object.entries(expected)) {
    const row = rows.find((x) => x.pool === pool);
    assert.deepEqual([row.reserved, row.peak, row.segments], [e.reserved, e.peak, e.segments], `pool ${pool}`);
  }
  assert.match(rows[1].text, /MemPool \(0, 1\)/);
  assert.match(rows[2].text, /CUDA graph pool \(1, 0\)/);
  // The timeline draws each private pool's reserved line, whose highest value is the peak,
  // at the finest level and the coarsest; the legend names the private pools only.
  const lines = await page.evaluate(() => window.fragscope.poolLines());
  for (const l of lines) {
    assert.equal(l.max, expected[l.pool].peak, `line of ${l.pool}`);
    assert.equal(l.coarsest, expected[l.pool].peak, `coarsest line of ${l.pool}`);
  }
  assert.deepEqual(await page.$$eval('[data-pool-line]', (els) => els.map((e) => e.dataset.poolLine)), ['0,1', '1,0']);
  // The state view names the pool of a private-pool segment's block.
  await page.click('[data-jump="end"]');
  const m1 = 0x7f0000000000 + 66 * 2 ** 20;
  const target = await page.evaluate((a) => window.fragscope.blockRects().find((b) => b.addr === a), m1);
  assert.ok(target, 'the MemPool block drawn');
  await page.$eval('canvas.st', (c) => c.scrollIntoView());
  const st = await page.$eval('canvas.st', (c) => { const q = c.getBoundingClientRect(); return { x: q.left, y: q.top }; });
  await page.mouse.click(st.x + target.x + Math.min(target.w / 2, 4), st.y + target.y + target.h / 2);
  assert.match(await page.$eval('#detail-body', (x) => x.textContent), /segment 0x7f0004200000, 20\.00 MiB, .*MemPool \(0, 1\)/);
  // Stacked by segment, a private pool's segment names its pool in the state view's words
  // (the graph pool's released segment too); a default-pools segment names none.
  await page.$eval('canvas.tl', (c) => c.scrollIntoView());
  assert.equal(await page.evaluate(() => window.fragscope.setStack('segment')), 'segment');
  const segs = await page.evaluate(() => window.fragscope.segmentBoxes());
  const base = 0x7f0000000000, MiB = 2 ** 20;
  const segPool = { [base]: '', [base + 20 * MiB]: 'CUDA graph pool (1, 0)', [base + 40 * MiB]: 'CUDA graph pool (1, 0)', [base + 64 * MiB]: 'MemPool (0, 1)', [base + 66 * MiB]: 'MemPool (0, 1)' };
  assert.deepEqual(segs.map((b) => b.addr).sort((a, b) => a - b), Object.keys(segPool).map(Number), 'every segment drawn');
  for (const b of segs) {
    assert.ok(b.h >= 2 && b.w >= 2, `segment ${b.addr.toString(16)} big enough to click`);
    const tl = await page.$eval('canvas.tl', (c) => { const q = c.getBoundingClientRect(); return { x: q.left, y: q.top }; });
    await page.mouse.click(tl.x + b.x, tl.y + b.y);
    const info = await page.$eval('#segment-info', (x) => ({ addr: Number(x.dataset.addr), pool: x.dataset.pool }));
    assert.deepEqual(info, { addr: b.addr, pool: segPool[b.addr] }, `segment ${b.addr.toString(16)}`);
    const text = await page.$eval('#detail-body', (x) => x.textContent);
    if (info.pool) assert.ok(text.includes(`Segment 0x${b.addr.toString(16)}: `) && text.includes(`, ${info.pool}`), text);
    else assert.doesNotMatch(text, /pool \(/);
  }
  assert.deepEqual(errors, []);
  assert.deepEqual(requests, ['file://' + out]);
  await page.close();
  // A file with the default pools only shows no band.
  const plain = join(OUT, 'no-pools.html');
  assert.equal(report([join(ROOT, 'crates/testdata/real/decomfl-opt-zeroth-order-windows.pickle')], plain).status, 0);
  const p2 = await open(ctx, plain);
  assert.equal(await p2.page.$('#pools'), null);
  assert.equal(await p2.page.$('[data-pool-line]'), null);
  assert.deepEqual(p2.errors, []);
  await p2.page.close();
});
