// Browser tests of the report page as a new user meets it (issue 22), in real headless
// Chromium: a page that never breaks whatever strings the file holds; the OOM first (the
// page opens on the device with the OOM, marks it in the switcher and says it in the
// header and on the timeline); selections that do not carry over to another device or
// file; a size budget; one call-site name everywhere; charts that do not mislead.
//
// Real files are looked up in ../shared/traces, then in crates/testdata/real (the
// licence-compatible ones the repository ships). A file in neither is skipped with a
// visible SKIPPED line, except under CI (`CI` set), where it fails.
//
// Run by .ci/test.d/browser.sh after `cargo build --release`; one test alone:
//   node --test --test-name-pattern hostile tests/browser/page.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, readFileSync, statSync } from 'node:fs';
import { join, resolve, dirname, basename } from 'node:path';
import { fileURLToPath } from 'node:url';
import { launch, open, scratchDir } from './chromium.mjs';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, '../..');
const BIN = process.env.FRAGSCOPE || join(ROOT, 'target/release/fragscope');
const DIRS = [process.env.TRACES || resolve(ROOT, '../shared/traces'), join(ROOT, 'crates/testdata/real')];
const OUT = scratchDir('fragscope-page-');

assert.ok(existsSync(BIN), `${BIN} missing: run cargo build --release first`);

/** A real file by name: its path, or null after a visible SKIPPED line (a failure under CI). */
function real(name) {
  for (const d of DIRS) {
    const p = join(d, name);
    if (existsSync(p) && statSync(p).isFile()) return p;
  }
  assert.ok(!process.env.CI, `${name}: not found in ${DIRS.join(' or ')} (CI needs the corpus)`);
  console.log(`# SKIPPED: ${name} is in the corpus only (${DIRS[0]} absent)`);
  return null;
}
function json(args) {
  return JSON.parse(execFileSync(BIN, args, { maxBuffer: 1 << 30 }).toString());
}
/** `fragscope report INPUTS -o OUT`, asserted to succeed; the output path. */
function report(inputs, out, extra = []) {
  const r = spawnSync(BIN, ['report', ...inputs, ...extra, '-o', out], { maxBuffer: 1 << 28 });
  assert.equal(r.status, 0, `report ${inputs.join(' ')}: ${r.stderr}`);
  return out;
}

let ctx;
before(async () => { ctx = await launch(); });
after(async () => { await ctx.close(); });

// ---------- defect 3: hostile strings ----------

test('hostile strings in every text field: the page loads, shows them as text and runs none of them', async () => {
  const made = JSON.parse(execFileSync('python3', [join(HERE, 'make_hostile.py'), join(OUT, 'hostile')]).toString());
  const [f0, f1] = made.files;
  const strings = made.strings;
  for (const inputs of [[f0], [f1], [f0, f1]]) {
    const out = report(inputs, join(OUT, `hostile-${inputs.length}-${basename(inputs[0]).slice(0, 1)}.html`));
    const where = inputs.map((f) => basename(f)).join(' + ');
    const { page, errors, requests } = await open(ctx, out);
    assert.deepEqual(errors, [], `${where}: console errors`);
    assert.deepEqual(requests, ['file://' + out], `${where}: the only request is the page itself`);
    // Nothing of the data became markup: the page's own two scripts, no image, title intact.
    assert.equal(await page.evaluate(() => document.scripts.length), 2, `${where}: scripts`);
    assert.equal(await page.evaluate(() => document.querySelectorAll('img, iframe, object').length), 0, `${where}: injected elements`);
    const title = await page.title();
    if (inputs.length === 1) assert.equal(title, 'fragscope report: ' + inputs[0], `${where}: title`);
    else assert.equal(title, `fragscope report: ${inputs.length} files`);
    // The data reads back exactly: every frame string and every scope name.
    const data = await page.evaluate(() => window.fragscope.allFiles().map((f) => ({ name: f.name, frames: f.frames, phases: f.devices.map((d) => d.phases.map((p) => p.name)) })));
    data.forEach((f, i) => {
      assert.equal(f.name, inputs[i], `${where}: file name`);
      const text = f.frames.join('\n');
      for (const s of strings) assert.ok(text.includes(s), `${where}: frame text ${JSON.stringify(s.slice(0, 40))} kept`);
      assert.deepEqual([...f.phases[0]].sort(), [...strings].sort(), `${where}: scope names on cuda:0`);
    });
    // Shown as text: the file name in the heading (and the switcher), each device drawn.
    for (let fi = 0; fi < inputs.length; fi++) {
      for (let di = 0; di < 2; di++) {
        await page.evaluate(([a, b]) => window.fragscope.select(a, b), [fi, di]);
        assert.ok((await page.$eval('#figures h2', (x) => x.textContent)).includes(inputs[fi]), `${where}: file ${fi} name shown`);
      }
    }
    if (inputs.length > 1) {
      const names = await page.$$eval('#files button', (els) => els.map((e) => e.textContent));
      assert.deepEqual(names.map((n) => n.replace(/^[^\w{<$\]]*\s/, '')), inputs.map((f) => basename(f)).map((n) => n), `${where}: file switcher`);
    }
    // Searching for each string (frame text) finds the stacks holding it.
    await page.evaluate(() => window.fragscope.select(0, 0));
    for (const s of strings.filter((x) => !x.includes('\u0000'))) {
      await page.fill('#search', s);
      await page.press('#search', 'Enter');
      const hits = await page.$eval('#hits', (x) => x.textContent);
      assert.ok(hits.includes(`contain “${s.trim()}”`), `${where}: search ${JSON.stringify(s.slice(0, 40))}: ${hits.slice(0, 120)}`);
      assert.match(hits, /^[1-9]\d* stacks contain/, `${where}: search ${JSON.stringify(s.slice(0, 40))} finds stacks`);
    }
    // Stream ids an f64 cannot hold are shown exactly (cuda:1's stream is 2^63 + 1).
    await page.evaluate(() => window.fragscope.select(0, 1));
    assert.ok((await page.$eval('#events', (x) => x.textContent)).includes('stream 9223372036854775809'), `${where}: exact stream id`);
    assert.deepEqual(errors, [], `${where}: console errors after interaction`);
    assert.equal(await page.title(), title, `${where}: title unchanged after interaction`);
    await page.close();
  }
});

// ---------- defect 1: the OOM first ----------

/** The devices analyze finds an OOM on, in order. */
const oomDevicesOf = (ana) => ana.devices.filter((d) => d.oom).map((d) => d.device);

async function checkOomFirst(page, where, ana) {
  const ooms = oomDevicesOf(ana);
  const sel = await page.evaluate(() => window.fragscope.selected());
  const verdict = await page.$eval('#verdict', (x) => ({ text: x.textContent, oom: Number(x.dataset.oom), device: x.dataset.device }));
  const marked = await page.$$eval('#devsel button', (els) => els.filter((e) => e.dataset.oom === '1').map((e) => ({ device: Number(e.dataset.device), text: e.textContent })));
  if (!ooms.length) {
    assert.equal(verdict.oom, 0, `${where}: no OOM in the header`);
    assert.match(verdict.text, /no OOM recorded/, `${where}: the header says there is no OOM`);
    assert.deepEqual(marked, [], `${where}: no device marked`);
    return;
  }
  const first = ana.devices.find((d) => d.oom);
  assert.equal(sel.device, first.device, `${where}: opens on cuda:${first.device}, the device with the OOM`);
  if (ana.devices.length > 1) {
    assert.deepEqual(marked.map((m) => m.device), ooms, `${where}: the OOM devices are marked in the switcher`);
    for (const m of marked) assert.match(m.text, /^⚠ cuda:/, `${where}: marked button text`);
  }
  assert.equal(verdict.oom, ooms.length, `${where}: the header counts the OOM devices`);
  assert.equal(Number(verdict.device), first.device, `${where}: the header names the OOM device`);
  const o = first.oom;
  assert.ok(verdict.text.includes(`OOM on cuda:${first.device} at event ${o.event_index}: ${o.verdict}`), `${where}: verdict in the header: ${verdict.text}`);
  const shown = await page.evaluate((n) => window.fragscope.bytes(n), o.request_bytes);
  assert.ok(verdict.text.includes(`request ${shown}`), `${where}: the request in the header`);
  // On the timeline: a mark at the OOM entry.
  const tl = await page.$eval('canvas.tl', (c) => c.dataset.oomX);
  const x = await page.evaluate((s) => window.fragscope.xOfState(s), o.event_index);
  assert.ok(tl !== '' && Math.abs(Number(tl) - (x.x + 64)) < 1e-6, `${where}: OOM marked on the timeline at event ${o.event_index} (${tl} vs ${x.x + 64})`);
}

test('OOM first: a 3-GPU file opens on the device with the OOM, marks it and says it in the header and on the timeline', async (t) => {
  const path = real('codeloc-qwen3-gnn-expandable-oom-3gpu.pickle');
  if (!path) return t.skip('corpus file absent');
  const ana = json(['analyze', '--json', path]).files[0];
  assert.ok(oomDevicesOf(ana).length > 0 && ana.devices.find((d) => d.oom).device !== ana.devices[0].device, 'the OOM is not on the first device');
  const out = report([path], join(OUT, 'codeloc.html'));
  const { page, errors } = await open(ctx, out);
  await checkOomFirst(page, 'codeloc', ana);
  await page.screenshot({ path: join(OUT, 'codeloc-first-screen.png') });
  assert.deepEqual(errors, []);
  await page.close();
});

test('OOM first: single-device OOM files, the built-in example, and a file without OOM', async () => {
  const cases = [['example', null], ['flexgen', real('flexgen-opt-oom-v2.0-history-format.pickle')], ['nuggets', real('nuggets-mini-snapshot-trimmed.pickle')],
    ['effdl-4gpu', real('effdl-aphelack-customfsdp-4gpu.pickle')]].filter(([n, p]) => n === 'example' || p);
  for (const [name, path] of cases) {
    const ana = json(['analyze', '--json', ...(path ? [path] : [])]).files[0];
    const out = report(path ? [path] : [], join(OUT, `oom-${name}.html`));
    const { page, errors } = await open(ctx, out);
    await checkOomFirst(page, name, ana);
    assert.deepEqual(errors, [], `${name}: console errors`);
    await page.close();
  }
});

// ---------- defect 2: selections do not carry over ----------

async function selectSomething(page, where) {
  // A search by frame text (highlights on the timeline and the state view) and a click
  // on the largest drawn allocation.
  const frame = await page.evaluate(() => { const f = window.fragscope.file(); const s = f.stacks.find((x) => x.length); return s ? f.frames[s[0]] : null; });
  if (frame) {
    await page.fill('#search', frame.slice(-20));
    await page.press('#search', 'Enter');
  }
  const boxes = (await page.evaluate(() => window.fragscope.allocBoxes())).filter((b) => b.w >= 3 && b.h >= 3).sort((a, b) => b.area - a.area);
  if (boxes.length) {
    const tl = await page.$eval('canvas.tl', (c) => { c.scrollIntoView(); const r = c.getBoundingClientRect(); return { x: r.left, y: r.top }; });
    await page.mouse.click(tl.x + boxes[0].x, tl.y + boxes[0].y);
  }
  const sel = await page.evaluate(() => window.fragscope.selected());
  assert.ok(sel.highlight > 0 || sel.hits > 0 || sel.sel >= 0, `${where}: something selected before switching`);
  return sel;
}
async function assertFresh(page, where) {
  const sel = await page.evaluate(() => window.fragscope.selected());
  assert.equal(sel.highlight, 0, `${where}: no highlight carried over`);
  assert.equal(sel.hits, 0, `${where}: no search hits carried over`);
  assert.equal(sel.sel, -1, `${where}: no allocation selected`);
  assert.equal(sel.search, '', `${where}: search box cleared`);
  assert.match(sel.detail, /^Click a band/, `${where}: details pane back to its hint`);
  const dims = await page.evaluate(() => window.fragscope.dimmed());
  assert.ok(dims.every((d) => !d.dim), `${where}: no allocation drawn dimmed`);
  assert.equal(sel.role, null, `${where}: no role band highlighted`);
  assert.equal(sel.segment, -1, `${where}: no segment selected`);
}
/** Stacked by role, zoomed on the allocated peak, a click on the middle of its largest band. */
async function clickLargestRole(page) {
  await page.evaluate(() => window.fragscope.setStack('role'));
  const rows = await page.evaluate(() => window.fragscope.roleTotals());
  const big = rows.reduce((m, r) => (r.at_peak > (m ? m.at_peak : 0) ? r : m), null);
  if (!big) return null;
  const peak = big.peak_state;
  await page.evaluate((s) => window.fragscope.zoom(0.01, s + 0.5), peak);
  const { x } = await page.evaluate((s) => window.fragscope.xOfState(s + 0.5), peak);
  const box = await page.$eval('canvas.tl', (c) => { c.scrollIntoView(); const r = c.getBoundingClientRect(); return { left: r.left + c.clientLeft, top: r.top + c.clientTop, h: c.clientHeight, ymax: Number(c.dataset.ymax) }; });
  const below = rows.slice(0, rows.indexOf(big)).reduce((t, r) => t + r.at_peak, 0);
  const ph = box.h - 16 - 18;
  await page.mouse.click(box.left + 64 + x, box.top + 16 + ph - ((below + big.at_peak / 2) / box.ymax) * ph);
  return big.role;
}

test('selections reset when switching GPU (multi-device) or file (diff report)', async () => {
  // Two-device files: the 3-GPU OOM file of the corpus, and the fuzz's two-device file.
  const made = JSON.parse(execFileSync('python3', [join(HERE, 'make_hostile.py'), join(OUT, 'hostile-switch')]).toString());
  for (const [name, path] of [['codeloc 3gpu', real('codeloc-qwen3-gnn-expandable-oom-3gpu.pickle')], ['two-device', made.files[0]]]) {
    if (!path) continue;
    const out = report([path], join(OUT, `switch-gpu-${name.slice(0, 3)}.html`));
    const { page, errors } = await open(ctx, out);
    const n = await page.$$eval('#devsel button', (els) => els.length);
    assert.ok(n > 1, `${name}: several devices`);
    for (let k = 0; k < n; k++) {
      await page.evaluate((d) => window.fragscope.select(0, d), k);
      await selectSomething(page, `${name} device ${k}`);
      await page.click(`#devsel button:nth-child(${((k + 1) % n) + 1})`);
      assert.equal((await page.evaluate(() => window.fragscope.selected())).dev, (k + 1) % n, `${name}: switched`);
      await assertFresh(page, `${name}: device ${(k + 1) % n} after device ${k}`);
    }
    assert.deepEqual(errors, []);
    await page.close();
  }

  const a = real('effdl-course-liger-ce.pickle'), b = real('decomfl-opt-zeroth-order-windows.pickle');
  const two = report([a, b], join(OUT, 'switch-file.html'));
  const p2 = await open(ctx, two);
  await selectSomething(p2.page, 'diff A');
  await p2.page.click('#files button:nth-child(2)');
  await assertFresh(p2.page, 'diff: file B after file A');
  assert.equal((await p2.page.evaluate(() => window.fragscope.selected())).file, 1);
  // A role band of B highlighted, then back to A: nothing of B's carries over either.
  const role = await clickLargestRole(p2.page);
  assert.ok(role, 'diff B: a role band to click');
  assert.equal((await p2.page.evaluate(() => window.fragscope.selected())).role != null, true, 'diff B: the role band highlighted');
  await p2.page.click('#files button:nth-child(1)');
  await assertFresh(p2.page, 'diff: file A after file B');
  assert.equal((await p2.page.evaluate(() => window.fragscope.selected())).file, 0);
  assert.deepEqual(p2.errors, []);
  await p2.page.close();
});

// ---------- defect 4: a size budget independent of the input ----------

const MB = 1e6, PAGE_BUDGET = 25 * MB;

test('size budget: a state of 614 k blocks stays under 25 MB (coarse keyframes, exact figures)', async () => {
  const path = join(OUT, 'large-state.pickle');
  execFileSync('python3', [join(HERE, 'make_large_state.py'), path, '2400']);
  const sum = json(['summary', '--json', path]).files[0].devices[0];
  assert.ok(sum.blocks > 600000, `${sum.blocks} blocks`);
  const out = report([path], join(OUT, 'large-state.html'));
  const size = statSync(out).size;
  console.log(`# ${sum.blocks} blocks: page ${(size / MB).toFixed(1)} MB`);
  assert.ok(size < PAGE_BUDGET, `page of ${size} bytes over the budget`);
  const { page, errors } = await open(ctx, out);
  await page.click('[data-jump="end"]');
  const st = await page.$eval('canvas.st', (c) => ({ ...c.dataset }));
  assert.equal(st.coarse, '1', 'the end is drawn at a coarser level of detail');
  assert.equal(Number(st.blocks), sum.blocks, 'it still counts every block');
  assert.ok(Number(st.records) < sum.blocks, 'drawn as fewer records');
  const f = Object.fromEntries(await page.$$eval('#moment-figs [data-fig]', (els) => els.map((e) => [e.dataset.fig, Number(e.dataset.value)])));
  assert.equal(f.moment_reserved_bytes, sum.reserved_bytes);
  assert.equal(f.moment_allocated_bytes, sum.allocated_bytes);
  assert.equal(f.moment_largest_free_bytes, sum.fragmentation.largest_free_block_bytes);
  assert.equal(f.moment_segments, sum.segments);
  assert.match(await page.$eval('#moment-label', (x) => x.textContent), /blocks drawn as \d+ \(small neighbouring blocks merged/);
  assert.deepEqual(errors, []);
  await page.close();
});

test('size budget: six files on one page stay within it and say what they left out', async () => {
  const names = ['decomfl-opt-zeroth-order-windows.pickle', 'effdl-aphelack-customfsdp-4gpu.pickle', 'effdl-course-liger-ce.pickle',
    'flexgen-opt-oom-v2.0-history-format.pickle', 'nuggets-mini-snapshot-trimmed.pickle', 'verl-megatron-vllm-qwen2-private-pools-stateonly.pickle'];
  const paths = names.map(real);
  const out = report(paths, join(OUT, 'six.html'));
  const size = statSync(out).size;
  console.log(`# six files: page ${(size / MB).toFixed(1)} MB`);
  assert.ok(size < PAGE_BUDGET, `six files: ${size} bytes`);
  const { page, errors } = await open(ctx, out);
  let noted = 0;
  for (let i = 0; i < paths.length; i++) {
    await page.evaluate((k) => window.fragscope.select(k, null), i);
    const note = await page.$('#budget-note') ? await page.$eval('#budget-note', (x) => x.textContent) : null;
    // A note says what was cut, only where something was: decomfl's 23 k events do not
    // fit its share of the curve buckets.
    if (note) { assert.match(note, /^The page's size budget is shared by 6 files.*: cuda:\d+ shows /, `${names[i]}: note`); noted++; }
    if (names[i].startsWith('decomfl')) assert.ok(note && /curves in \d+ buckets/.test(note), `${names[i]}: says its curves were cut: ${note}`);
  }
  console.log(`# six files: ${noted} of 6 say what they left out`);
  assert.deepEqual(errors, []);
  await page.close();
});

// ---------- defect 6: one call-site name ----------

test('call sites: the page names a stack as analyze does; allocator frames hidden, with a toggle', async () => {
  const path = real('effdl-aphelack-customfsdp-4gpu.pickle');
  const ana = json(['analyze', '--json', path]).files[0];
  const out = report([path], join(OUT, 'sites.html'));
  const { page, errors } = await open(ctx, out);
  for (let di = 0; di < ana.devices.length; di++) {
    await page.evaluate((d) => window.fragscope.select(0, d), di);
    const dev = (await page.evaluate(() => window.fragscope.selected())).device;
    const a = ana.devices.find((d) => d.device === dev);
    const names = new Set(await page.evaluate(() => window.fragscope.file().sites));
    // Every call site analyze finds at the allocated peak is a name the page gives (the
    // page's state view holds every block live there, with its stack).
    for (const s of a.peaks.allocated_peak.sites.filter((x) => !x.site.startsWith('<'))) assert.ok(names.has(s.site), `cuda:${dev}: ${s.site} named so on the page`);
  }
  // The details of an allocation: named as analyze does, stack without the allocator's frames.
  const boxes = (await page.evaluate(() => window.fragscope.allocBoxes())).filter((b) => b.stack >= 0 && b.w >= 3 && b.h >= 3).sort((x, y) => y.area - x.area);
  assert.ok(boxes.length, 'an allocation with a stack to click');
  const tl = await page.$eval('canvas.tl', (c) => { c.scrollIntoView(); const r = c.getBoundingClientRect(); return { x: r.left, y: r.top }; });
  await page.mouse.click(tl.x + boxes[0].x, tl.y + boxes[0].y);
  const si = Number(await page.$eval('#detail-body [data-stack]', (x) => x.dataset.stack));
  const { site, frames } = await page.evaluate((k) => { const f = window.fragscope.file(); return { site: f.sites[k], frames: f.stacks[k].map((j) => f.frames[j]) }; }, si);
  assert.ok((await page.$eval('#detail-body h3', (x) => x.textContent)).endsWith(site), 'the title names the site');
  const shown = (await page.$eval('#detail-body [data-stack]', (x) => x.textContent)).split('\n');
  const omitted = /unwind::unwind|CapturedTraceback::gather|core\/boxing|\/Register|Objects\/methodobject\.c|ceval\.c/;
  assert.ok(shown.every((l) => !omitted.test(l)), 'no allocator or interpreter frame shown');
  assert.ok(shown.every((l) => frames.includes(l) || /^<repeats \d+ times>$/.test(l)), 'only frames of the stack');
  if (frames.some((l) => omitted.test(l))) {
    await page.check('#all-frames');
    assert.equal(await page.$eval('#detail-body [data-stack]', (x) => x.textContent), frames.join('\n'), 'the toggle shows every frame');
    await page.uncheck('#all-frames');
  } else console.log('# the clicked stack has no allocator frame; toggle not exercised');
  assert.deepEqual(errors, []);
  await page.close();
});

// ---------- one byte formatter ----------

test('byte formatter: bytes() gives the text of Rust\'s format_size on every value of its table', async () => {
  // crates/report/tests/format_size.json: (bytes, format_size's text), kept current by the
  // Rust test format_size_table_for_the_browser_test_is_what_rust_gives.
  const table = JSON.parse(readFileSync(join(ROOT, 'crates/report/tests/format_size.json'), 'utf8'));
  assert.ok(table.length > 500, `${table.length} values`);
  const { page, errors } = await open(ctx, report([], join(OUT, 'bytes-example.html')));
  const shown = await page.evaluate((t) => t.map(([n]) => window.fragscope.bytes(n)), table);
  const wrong = table.flatMap(([n, text], i) => (shown[i] === text ? [] : [`${n}: ${shown[i]} (Rust: ${text})`]));
  assert.deepEqual(wrong, [], 'bytes() and format_size disagree');
  assert.deepEqual(errors, []);
  await page.close();
});

// ---------- defect 7: charts that mislead ----------

test('charts: phase labels apart, what-if OOM marks inside, no "…" flame level, sizes as the CLI prints them', async () => {
  // Sizes: ties rounded as Rust's format_size rounds them.
  const { page, errors } = await open(ctx, report([], join(OUT, 'charts-example.html')));
  assert.equal(await page.evaluate(() => window.fragscope.bytes(7.125 * 2 ** 30)), '7.12 GiB');
  assert.equal(await page.evaluate(() => window.fragscope.bytes(0.375 * 2 ** 30 + 2 ** 30)), '1.38 GiB');
  assert.equal(await page.evaluate(() => window.fragscope.bytes(1024)), '1024 bytes');
  // What-if: every OOM mark inside the plot.
  const wi = await page.$eval('canvas.wi', (c) => ({ marks: JSON.parse(c.dataset.oomMarks || '[]'), w: Number(c.dataset.width) }));
  assert.ok(wi.marks.length > 0, 'the example has replays that run out');
  for (const x of wi.marks) assert.ok(x - 5 >= 64 && x + 5 <= wi.w, `mark at ${x} of ${wi.w}`);
  // Flame graphs: no level made of "…" alone.
  const fl = await page.evaluate(() => window.fragscope.flameNames());
  assert.ok(fl.length > 1 && !fl.includes('…'), 'no "…" level');
  // The largest free block: dots at the captured moments, no interpolated line.
  const dots = await page.$eval('canvas.fr', (c) => Number(c.dataset.freeDots));
  assert.equal(dots, (await page.evaluate(() => window.fragscope.keyframes())).length);
  assert.deepEqual(errors, []);
  await page.close();
  // Nested phases: labels of different depths do not overlap.
  const made = JSON.parse(execFileSync('python3', [join(HERE, 'make_hostile.py'), join(OUT, 'hostile-phases')]).toString());
  const p2 = await open(ctx, report([made.files[0]], join(OUT, 'phases.html')));
  await p2.page.evaluate(() => window.fragscope.select(0, 0));
  const labels = await p2.page.evaluate(() => window.fragscope.phaseLabels());
  assert.ok(new Set(labels.map((l) => l.depth)).size > 1, `nested labels drawn: ${JSON.stringify(labels)}`);
  for (let i = 0; i < labels.length; i++) for (let j = i + 1; j < labels.length; j++) {
    const a = labels[i], b = labels[j];
    const overlap = a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h;
    assert.ok(!overlap, `labels ${i} and ${j} overlap`);
  }
  await p2.page.close();
});

test('charts: an expandable-segment file draws its state in rows, and the outlier test uses the true median', async (t) => {
  const path = real('codeloc-qwen3-gnn-expandable-oom-3gpu.pickle');
  if (!path) return t.skip('corpus file absent');
  const { page, errors } = await open(ctx, report([path], join(OUT, 'expandable.html')));
  for (let di = 0; di < 3; di++) {
    await page.evaluate((d) => window.fragscope.select(0, d), di);
    const st = await page.$eval('canvas.st', (c) => ({ rows: Number(c.dataset.rows), h: c.clientHeight }));
    assert.ok(st.rows > 4, `cuda:${di}: the expandable segment wraps over ${st.rows} rows`);
  }
  assert.deepEqual(errors, []);
  await page.close();
});

test('ranks: the outlier test uses the median of an even number of files', async () => {
  const names = ['decomfl-opt-zeroth-order-windows.pickle', 'effdl-course-liger-ce.pickle', 'flexgen-opt-oom-v2.0-history-format.pickle', 'nuggets-mini-snapshot-trimmed.pickle'];
  const paths = names.map(real);
  const { page, errors } = await open(ctx, report(paths, join(OUT, 'four.html')));
  const rows = await page.$$eval('#ranks tr[data-file]', (els) => els.map((e) => ({ res: Number(e.dataset.peakReserved), out: e.dataset.outlier === '1', median: Number(e.dataset.median) })));
  const v = rows.map((r) => r.res).sort((a, b) => a - b);
  const median = (v[1] + v[2]) / 2;
  for (const r of rows) {
    assert.equal(r.median, median, 'the median of four is the mean of the middle two');
    assert.equal(r.out, r.res > 1.1 * median, `outlier flag of ${r.res}`);
  }
  assert.deepEqual(errors, []);
  await page.close();
});

// ---------- what memory_viz users rely on ----------

test('event list: the entries around the state shown, the OOM line, arrow keys step the state view', async () => {
  // The built-in example: a training loop that ends in an OOM.
  const ana = json(['analyze', '--json']).files[0];
  const o = ana.devices.find((d) => d.oom).oom;
  const { page, errors } = await open(ctx, report([], join(OUT, 'events.html')));
  // Opened at the OOM: the current entry is the one before it; the OOM line says the
  // request and CUDA's free memory.
  const at = await page.$eval('canvas.st', (c) => Number(c.dataset.state));
  assert.equal(at, o.event_index, 'the state view opens at the OOM');
  const cur = await page.$eval('#events .ev.cur', (x) => Number(x.dataset.event));
  assert.equal(cur, at - 1, 'the highlighted entry made the state shown');
  const oomRow = await page.$eval(`#events .ev[data-event="${o.event_index}"]`, (x) => x.textContent);
  const req = await page.evaluate((n) => window.fragscope.bytes(n), o.request_bytes);
  const free = await page.evaluate((n) => window.fragscope.bytes(n), o.device_free_bytes);
  assert.ok(oomRow.includes(`oom: request ${req}`) && oomRow.includes(`CUDA free ${free}`), `the OOM line: ${oomRow}`);
  // ↓ steps one entry (in the list or anywhere on the page), ↑ back; the label says what
  // the entry was.
  await page.focus('#events');
  await page.keyboard.press('ArrowUp');
  assert.equal(await page.$eval('canvas.st', (c) => Number(c.dataset.state)), at - 1, '↑ steps back one entry');
  const label = await page.$eval('#moment-label', (x) => x.textContent);
  const row = await page.$eval('#events .ev.cur', (x) => x.textContent.replace(/^\s*\d+\s*/, ''));
  assert.ok(label.includes(`after event ${at - 2}: ${row}`), `label says what event ${at - 2} was: ${label}`);
  await page.keyboard.press('ArrowDown');
  assert.equal(await page.$eval('canvas.st', (c) => Number(c.dataset.state)), at, '↓ steps forward');
  // Hovering an entry shows its stack.
  await page.hover(`#events .ev[data-event="${o.event_index}"]`);
  assert.match(await page.$eval('#detail-body h3', (x) => x.textContent), new RegExp(`^Event ${o.event_index}: oom`));
  assert.ok(await page.$('#detail-body [data-stack]'), 'its stack (or that there is none)');
  assert.deepEqual(errors, []);
  await page.close();
});

test('colour by allocation: each drawn allocation its own colour (by call site: one per site)', async () => {
  const { page, errors } = await open(ctx, report([], join(OUT, 'colours.html')));
  const bySite = await page.evaluate(() => window.fragscope.allocColours());
  const sameSite = (xs) => { const m = new Map(); for (const x of xs) { if (!m.has(x.stack)) m.set(x.stack, new Set()); m.get(x.stack).add(x.colour); } return m; };
  for (const [st, cols] of sameSite(bySite)) assert.equal(cols.size, 1, `stack ${st}: one colour by call site`);
  const before = await page.$eval('canvas.tl', (c) => c.toDataURL());
  await page.selectOption('#tl-colour', 'allocation');
  const byAlloc = await page.evaluate(() => window.fragscope.allocColours());
  const shared = [...sameSite(byAlloc)].filter(([, cols]) => cols.size > 1);
  assert.ok(shared.length > 0, 'allocations of one call site get different colours');
  assert.ok(new Set(byAlloc.map((x) => x.colour)).size > new Set(bySite.map((x) => x.colour)).size, 'more colours than call sites');
  assert.notEqual(await page.$eval('canvas.tl', (c) => c.toDataURL()), before, 'the timeline is redrawn');
  assert.deepEqual(errors, []);
  await page.close();
});

// ---------- issue 19: the timeline stacked by role ----------

test('timeline stacked by role: each role at the allocated peak and at most, as summary --json says', async () => {
  const cases = [['niu-train3 (3 steps, Adam)', real('grids/niu-train3-ctx100-fp32.pickle')], ['example', null],
    ['effdl-4gpu', real('effdl-aphelack-customfsdp-4gpu.pickle')]].filter(([n, p]) => n === 'example' || p);
  for (const [name, path] of cases) {
    const inputs = path ? [path] : [];
    const sum = json(['summary', '--json', ...inputs]).files[0];
    const { page, errors } = await open(ctx, report(inputs, join(OUT, `roles-${name.replace(/\W+/g, '-')}.html`)));
    const devs = await page.evaluate(() => window.fragscope.devices().length ? window.fragscope.file().devices.map((d) => d.device) : []);
    for (let di = 0; di < devs.length; di++) {
      await page.evaluate((i) => window.fragscope.select(0, i), di);
      const want = sum.devices.find((d) => d.device === devs[di]).roles;
      const where = `${name} cuda:${devs[di]}`;
      if (!want) { assert.equal(await page.$('#tl-stack option[value="role"]'), null, `${where}: no trace, no role mode`); continue; }
      assert.equal(await page.evaluate(() => window.fragscope.setStack('role')), 'role', `${where}: role mode offered`);
      assert.ok(await page.$eval('#role-legend', (x) => x.style.display !== 'none'), `${where}: the role table shows`);
      // The table's figures (read from the drawn buckets) against summary's, figure for figure.
      const rows = await page.$$eval('#role-table tr[data-role]', (rs) => rs.map((r) => ({ role: r.dataset.role, at_peak: Number(r.dataset.atPeak), max: Number(r.dataset.max), text: r.textContent })));
      const drawn = new Map(rows.map((r) => [r.role, r]));
      for (const [role, b] of Object.entries(want.by_role)) {
        const r = drawn.get(role);
        if (!r) { assert.equal(b.max, 0, `${where}: ${role} held bytes but has no band`); continue; }
        assert.equal(r.at_peak, b.at_peak, `${where}: ${role} at the peak`);
        assert.equal(r.max, b.max, `${where}: ${role} max`);
        const shown = await page.evaluate(([a, m]) => [window.fragscope.bytes(a), window.fragscope.bytes(m)], [b.at_peak, b.max]);
        assert.ok(r.text.includes(shown[0]) && r.text.includes(shown[1]), `${where}: ${role} printed as the CLI prints it: ${r.text}`);
      }
      assert.equal(await page.evaluate(() => window.fragscope.roleTotals()[0].peak_state), want.peak_state, `${where}: the peak bucket is the roles' peak state`);
      // Clicking the largest band at the peak says which role it is and why (zoomed in
      // there first, so that the peak's bucket is many pixels wide).
      const big = rows.reduce((m, r) => (r.at_peak > (m ? m.at_peak : 0) ? r : m), null);
      if (big) {
        await page.evaluate((s) => window.fragscope.zoom(0.01, s + 0.5), want.peak_state);
        const { x } = await page.evaluate((s) => window.fragscope.xOfState(s + 0.5), want.peak_state);
        const box = await page.$eval('canvas.tl', (c) => { const r = c.getBoundingClientRect(); return { left: r.left + c.clientLeft, top: r.top + c.clientTop, h: c.clientHeight, ymax: Number(c.dataset.ymax) }; });
        // Its middle: the bands below it (in the table's order) and half of it.
        const below = rows.slice(0, rows.indexOf(big)).reduce((t, r) => t + r.at_peak, 0);
        const ph = box.h - 16 - 18;
        await page.mouse.click(box.left + 64 + x, box.top + 16 + ph - ((below + big.at_peak / 2) / box.ymax) * ph);
        assert.equal(await page.$eval('#role-info', (e) => e.dataset.role), big.role, `${where}: the band clicked`);
        assert.ok(await page.$('#detail-body table'), `${where}: the evidence`);
      }
    }
    assert.deepEqual(errors, [], `${name}: console errors`);
    await page.close();
  }
});

// ---------- issue 20: predicted curves beside recorded ones ----------

test('predict --report: recorded and predicted curves, peaks as --json and analyze say, predictions labelled', async () => {
  const a = real('grids/niu-fwd-ctx100-fp32.pickle'), b = real('grids/niu-fwd-ctx150-fp32.pickle');
  if (!a || !b) return;
  const out = join(OUT, 'predict.html');
  const args = ['predict', a, b, '--sizes', '100,150', '--at', '200,600', '--capacity', 'A100-40GB'];
  const r = spawnSync(BIN, [...args, '--report', out], { maxBuffer: 1 << 28 });
  assert.equal(r.status, 0, `predict --report: ${r.stderr}`);
  const want = json([...args, '--json']);
  const { page, errors, requests } = await open(ctx, out);
  assert.deepEqual(requests, ['file://' + out], 'no request but the page');
  const curves = await page.evaluate(() => window.fragscope.predictCurves());
  for (const p of want.predictions) {
    const c = curves.find((x) => x.kind === 'predicted' && x.size === p.at && x.device === p.device);
    assert.ok(c && c.drawn, `prediction at ${p.at} drawn`);
    assert.equal(c.reserved, p.peak_reserved, `at ${p.at}: drawn peak reserved`);
    assert.equal(c.allocated, p.peak_allocated, `at ${p.at}: drawn peak allocated`);
    const row = await page.$eval(`#predict-table tr[data-kind="predicted"][data-size="${p.at}"]`, (x) => x.textContent);
    assert.ok(row.startsWith('prediction'), `the row says it is a prediction: ${row}`);
  }
  for (const [path, size] of [[a, 100], [b, 150]]) {
    const t = json(['analyze', '--json', path]).files[0].devices[0].fragmentation.timeline;
    const c = curves.find((x) => x.kind === 'recorded' && x.size === size);
    assert.equal(c.reserved, t.peak_reserved.bytes, `recorded ${size}: drawn peak reserved`);
    // The recorded curve is the timeline's walk; peak allocated (memory_stats' block peak)
    // is at or above it (docs/glossary.md).
    assert.ok(c.allocated <= t.peak_allocated.bytes && c.allocated >= t.peak_requested.bytes, `recorded ${size}: drawn peak allocated ${c.allocated} against ${t.peak_requested.bytes}..${t.peak_allocated.bytes}`);
  }
  assert.match(await page.$eval('#predict-label', (x) => x.textContent), /predictions, not recordings/);
  assert.equal(await page.$$eval('canvas.predict-chart', (cs) => cs.length), 1, 'one chart per device');
  assert.deepEqual(errors, []);
  await page.close();
});

// ---------- the minimap while zoomed ----------

test('minimap: shown only while zoomed, outlines the window, a click moves the window there', async () => {
  const { page, errors } = await open(ctx, report([], join(OUT, 'minimap.html')));
  const mini = () => page.$eval('#tl-minimap', (m) => ({ shown: m.style.display !== 'none', zoomed: m.dataset.zoomed, x0: Number(m.dataset.x0), x1: Number(m.dataset.x1), boxX: Number(m.dataset.boxX), boxW: Number(m.dataset.boxW), w: m.clientWidth }));
  assert.equal((await mini()).shown, false, 'hidden at the whole trace');
  const { states } = await page.evaluate(() => window.fragscope.view());
  await page.evaluate((s) => window.fragscope.zoom(0.1, s), states * 0.25);
  let m = await mini(), v = await page.evaluate(() => window.fragscope.view());
  assert.ok(m.shown && m.zoomed === '1', 'shown while zoomed');
  assert.deepEqual([m.x0, m.x1], [v.x0, v.x1], 'the outlined window is the timeline\u2019s');
  // The outline sits where the window is: its left edge at x0 / states of the plot's width.
  assert.ok(Math.abs(m.boxX - (64 + (v.x0 / states) * (m.w - 64))) < 0.01, 'outline placed by event order');
  // A click near the right end centres the window there (clamped to the trace's end).
  const box = await page.$eval('#tl-minimap', (c) => { const r = c.getBoundingClientRect(); return { left: r.left + c.clientLeft, top: r.top + c.clientTop, w: c.clientWidth }; });
  await page.mouse.click(box.left + box.w - 2, box.top + 10);
  const after = await page.evaluate(() => window.fragscope.view());
  assert.ok(Math.abs(after.x1 - after.x0 - (v.x1 - v.x0)) < 1e-6, 'the span is kept');
  assert.ok(Math.abs(after.x1 - states) < 1e-6, `moved to the end: ${after.x0}..${after.x1} of ${states}`);
  m = await mini();
  assert.deepEqual([m.x0, m.x1], [after.x0, after.x1], 'the outline follows');
  await page.click('#zoom-reset');
  assert.equal((await mini()).shown, false, 'hidden again after reset');
  assert.deepEqual(errors, []);
  await page.close();
});

// ---------- the segment timeline ----------

test('segment timeline: the stacked segments are the reserved bytes at the peak and at the end, as analyze and summary say', async () => {
  const cases = [['example', null], ['codeloc 3gpu (expandable)', real('codeloc-qwen3-gnn-expandable-oom-3gpu.pickle')],
    ['selectn multistream', real('selectn-llama7b-offload-multistream.pickle')], ['decomfl', real('decomfl-opt-zeroth-order-windows.pickle')]].filter(([n, p]) => n === 'example' || p);
  for (const [name, path] of cases) {
    const inputs = path ? [path] : [];
    const ana = json(['analyze', '--json', ...inputs]).files[0];
    const sum = json(['summary', '--json', ...inputs]).files[0];
    const { page, errors } = await open(ctx, report(inputs, join(OUT, `segments-${name.replace(/\W+/g, '-')}.html`)));
    const devs = await page.evaluate(() => window.fragscope.file().devices.map((d) => d.device));
    for (let di = 0; di < devs.length; di++) {
      await page.evaluate((i) => window.fragscope.select(0, i), di);
      const where = `${name} cuda:${devs[di]}`;
      const t = ana.devices.find((d) => d.device === devs[di]).fragmentation.timeline;
      if (t.reserved_source !== 'segments') continue;
      assert.equal(await page.evaluate(() => window.fragscope.setStack('segment')), 'segment', `${where}: segment mode offered`);
      const { states } = await page.evaluate(() => window.fragscope.view());
      const peakState = t.peak_reserved.event_index == null ? 0 : t.peak_reserved.event_index + 1;
      const atPeak = await page.evaluate((s) => window.fragscope.segmentsAt(s), peakState);
      if (atPeak.drawn < atPeak.total) { console.log(`# ${where}: ${atPeak.drawn} of ${atPeak.total} segments drawn; sums not compared`); continue; }
      assert.equal(atPeak.bytes, t.peak_reserved.bytes, `${where}: segments at the reserved peak`);
      const atEnd = await page.evaluate((s) => window.fragscope.segmentsAt(s), states - 1);
      assert.equal(atEnd.bytes, sum.devices.find((d) => d.device === devs[di]).reserved_bytes, `${where}: segments at the end`);
      assert.ok(Number(await page.$eval('canvas.tl', (c) => c.dataset.segmentsShown)) > 0, `${where}: segments drawn`);
    }
    assert.deepEqual(errors, [], `${name}: console errors`);
    await page.close();
  }
});

// ---------- issue 42 item 4: the what-if view, call-site colours, flame graphs, labels ----------

/** The table rows and the chart's curves of the what-if view. */
async function whatIfRows(page) {
  return page.evaluate(() => ({
    rows: Array.from(document.querySelectorAll('#whatif-table tr[data-setting]')).map((r) => ({ setting: r.dataset.setting, recommended: r.dataset.recommended === '1', peak: r.children[1].textContent })),
    curves: Number(document.querySelector('canvas.wi')?.dataset.curves ?? 0),
    none: document.querySelector('#whatif-none')?.textContent ?? null,
  }));
}

test('what-if: every replayed row in the table (as the chart), and report --what-if replays a file without OOM', async () => {
  // The built-in example runs out of memory: analyze replays the settings there.
  const ana = json(['analyze', '--json']).files[0].devices.find((d) => d.oom).recommendations;
  const { page, errors } = await open(ctx, report([], join(OUT, 'whatif-example.html')));
  const got = await whatIfRows(page);
  const want = ['recorded', ...ana.tried.map((t) => t.setting)];
  assert.ok(want.length > 2, `the example replays several settings: ${want}`);
  assert.deepEqual(got.rows.map((r) => r.setting), want, 'one row per replay, in analyze\u2019s order');
  assert.equal(got.curves, want.length, 'as many curves as rows');
  const rec = new Set(ana.recommended.map((r) => r.setting));
  for (const r of got.rows.slice(1)) assert.equal(r.recommended, rec.has(r.setting), `${r.setting}: recommended as analyze says`);
  const shownPeaks = await page.evaluate((xs) => xs.map((x) => window.fragscope.bytes(x)), [ana.baseline.peak_reserved_bytes, ...ana.tried.map((t) => t.peak_reserved_bytes)]);
  assert.deepEqual(got.rows.map((r) => r.peak), shownPeaks, 'each row\u2019s peak reserved is analyze\u2019s');
  assert.deepEqual(errors, []);
  await page.close();
  // A file without OOM: the page names the command that replays it, and that command does.
  const path = real('effdl-course-liger-ce.pickle');
  const plain = await open(ctx, report([path], join(OUT, 'whatif-plain.html')));
  const none = await whatIfRows(plain.page);
  assert.equal(none.rows.length, 0, 'no replay without --what-if');
  assert.ok(none.none && none.none.includes(`fragscope report --what-if ${path}`), `names the command: ${none.none}`);
  await plain.page.close();
  const wi = json(['analyze', '--what-if', '--json', path]).files[0].devices[0].recommendations;
  const withIt = await open(ctx, report([path], join(OUT, 'whatif-flag.html'), ['--what-if']));
  const rows = await whatIfRows(withIt.page);
  assert.deepEqual(rows.rows.map((r) => r.setting), ['recorded', ...wi.tried.map((t) => t.setting)], 'the replays analyze --what-if runs');
  assert.equal(rows.curves, rows.rows.length, 'each drawn');
  assert.deepEqual(withIt.errors, []);
  await withIt.page.close();
});

test('call-site colours: one colour per call site as analyze names it, whatever the stack above it', async () => {
  const path = real('effdl-aphelack-customfsdp-4gpu.pickle');
  const { page, errors } = await open(ctx, report([path], join(OUT, 'site-colours.html')));
  let shared = 0;
  const devs = await page.evaluate(() => window.fragscope.file().devices.length);
  for (let di = 0; di < devs; di++) {
    await page.evaluate((d) => window.fragscope.select(0, d), di);
    const cols = await page.evaluate(() => { const f = window.fragscope.file(); return window.fragscope.allocColours().map((x) => ({ ...x, site: x.stack >= 0 ? f.sites[x.stack] : '<no stack>' })); });
    const bySite = new Map();
    for (const x of cols) { if (!bySite.has(x.site)) bySite.set(x.site, { colours: new Set(), stacks: new Set() }); bySite.get(x.site).colours.add(x.colour); bySite.get(x.site).stacks.add(x.stack); }
    for (const [site, v] of bySite) {
      if (v.stacks.size > 1) shared++;
      assert.equal(v.colours.size, 1, `cuda:${di} ${site}: ${v.stacks.size} stacks, one colour (got ${[...v.colours]})`);
    }
  }
  assert.ok(shared > 0, 'some call site is reached by several stacks (else nothing was tested)');
  // A click on an allocation highlights its call site: every stack of it, as it is coloured.
  await page.evaluate(() => window.fragscope.select(0, 0));
  const sites = await page.evaluate(() => window.fragscope.file().sites);
  const boxes = (await page.evaluate(() => window.fragscope.allocBoxes())).filter((b) => b.stack >= 0 && b.w >= 3 && b.h >= 3);
  const stacksOf = (site) => new Set(boxes.filter((b) => sites[b.stack] === site).map((b) => b.stack));
  const target = boxes.sort((x, y) => y.area - x.area).find((b) => stacksOf(sites[b.stack]).size > 1);
  assert.ok(target, 'an allocation of a call site with several stacks to click');
  const tl = await page.$eval('canvas.tl', (c) => { c.scrollIntoView(); const r = c.getBoundingClientRect(); return { x: r.left, y: r.top }; });
  await page.mouse.click(tl.x + target.x, tl.y + target.y);
  const dims = await page.evaluate(() => window.fragscope.dimmed());
  const site = sites[target.stack];
  for (const d of dims) assert.equal(d.dim, sites[d.stack] !== site, `allocation ${d.index} (${sites[d.stack]}) dimmed only when not of ${site}`);
  assert.ok(dims.some((d) => d.dim), 'other call sites dimmed');
  assert.deepEqual(errors, []);
  await page.close();
});

test('flame graphs: rooted at the outermost frame, labels that never cut a size', async () => {
  for (const name of ['sketchkv-llama-kvquant-stateonly.pickle', 'effdl-aphelack-customfsdp-4gpu.pickle']) {
    const path = real(name);
    const { page, errors } = await open(ctx, report([path], join(OUT, `flame-${name}.html`)));
    const graphs = await page.evaluate(() => window.fragscope.flameRoots());
    assert.ok(graphs.length > 0, `${name}: flame graphs drawn`);
    for (const [i, g] of graphs.entries()) {
      const deeper = new Set(g.deeper);
      const twice = g.roots.filter((r) => deeper.has(r));
      assert.deepEqual(twice, [], `${name} graph ${i}: a root that is also drawn under a caller`);
    }
    const labels = await page.evaluate(() => window.fragscope.flameLabels());
    assert.ok(labels.length > 0, `${name}: labels drawn`);
    let shortened = 0;
    for (const l of labels) {
      const base = l.name.replace(/^.*\//, '');
      const whole = l.text === `${base} ${l.bytes}`;
      const cutName = l.text.endsWith(`\u2026 ${l.bytes}`) && base.startsWith(l.text.slice(0, -(l.bytes.length + 2)));
      const nameOnly = l.text.endsWith('\u2026') && base.startsWith(l.text.slice(0, -1));
      assert.ok(whole || cutName || nameOnly, `${name}: label "${l.text}" for ${base} ${l.bytes}`);
      assert.ok(l.w <= l.span - 2, `${name}: label "${l.text}" (${l.w} px) inside its box (${l.span} px)`);
      if (!whole) shortened++;
    }
    console.log(`# ${name}: ${labels.length} flame labels, ${shortened} shortened`);
    assert.deepEqual(errors, []);
    await page.close();
  }
});

/** Whether two label boxes overlap. */
const overlaps = (a, b) => a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h;
/** Whether the ticks are 0, s, 2s, ... for a round step s (1, 2, 2.5 or 5 × 10^k of a KiB/MiB/GiB unit or of bytes). */
function roundTicks(ticks) {
  if (ticks.length < 2 || ticks[0] !== 0) return false;
  const s = ticks[1];
  if (!ticks.every((v, i) => Math.abs(v - i * s) <= 1e-6 * s)) return false;
  return [1, 1024, 2 ** 20, 2 ** 30].some((u) => { const q = s / u, k = Math.pow(10, Math.floor(Math.log10(q))); return [1, 2, 2.5, 5, 10].some((m) => Math.abs(q - m * k) < 1e-9 * q); });
}

test('labels: phase and pause labels never overlap on either axis; byte axes at round values', async () => {
  const path = real('cs336-small-fwd-annotated.pickle');
  const inputs = path ? [path] : [];
  const { page, errors } = await open(ctx, report(inputs, join(OUT, 'labels.html')));
  for (const axis of ['events', 'time']) {
    await page.evaluate((a) => window.fragscope.setAxis(a), axis);
    const labels = await page.evaluate(() => window.fragscope.phaseLabels());
    if (path) assert.ok(labels.length > 1, `${axis}: phase labels drawn`);
    for (let i = 0; i < labels.length; i++) for (let j = i + 1; j < labels.length; j++) {
      assert.ok(!overlaps(labels[i], labels[j]), `${axis}: "${labels[i].text}" and "${labels[j].text}" overlap`);
    }
  }
  await page.evaluate(() => window.fragscope.setAxis('events'));
  const yt = JSON.parse(await page.$eval('canvas.tl', (c) => c.dataset.yTicks));
  assert.ok(roundTicks(yt), `timeline ticks at round values: ${yt}`);
  await page.evaluate(() => window.fragscope.zoom(0.37, 1000));
  const zt = JSON.parse(await page.$eval('canvas.tl', (c) => c.dataset.yTicks));
  assert.ok(roundTicks(zt), `zoomed timeline ticks at round values: ${zt}`);
  assert.deepEqual(errors, []);
  await page.close();
  // The what-if chart too (the example has one), and the tick maker on awkward maxima.
  const ex = await open(ctx, report([], join(OUT, 'labels-example.html')));
  const wt = JSON.parse(await ex.page.$eval('canvas.wi', (c) => c.dataset.yTicks));
  assert.ok(roundTicks(wt), `what-if ticks at round values: ${wt}`);
  for (const max of [514 * 2 ** 20 * 1.07, 56.91 * 2 ** 30, 3000, 1.5 * 2 ** 30, 999, 7]) {
    const t = await ex.page.evaluate((m) => window.fragscope.byteTicks(m, 4), max);
    assert.ok(roundTicks(t) && t[t.length - 1] <= max && t.length >= 3 && t.length <= 9, `ticks for ${max}: ${t}`);
  }
  await ex.page.close();
});

/** Pixel columns of the timeline where the fill does not reach the allocated curve. */
async function unfilledColumns(page) {
  return page.evaluate(() => {
    const cols = window.fragscope.allocatedColumns();
    const cv = document.querySelector('canvas.tl'), dpr = window.devicePixelRatio || 1;
    const img = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data;
    const bad = [];
    for (const col of cols) {
      if (col.bottom - col.y < 8) continue;
      // From 3 pixels under the curve (its line) to the bottom: a pixel is empty when
      // nothing opaque is drawn there or only the white-grey of the grid.
      let empty = 0, n = 0;
      for (let y = Math.ceil(col.y + 3); y < col.bottom - 1; y++) {
        const o = (Math.floor(y * dpr) * cv.width + Math.floor((col.x + 0.5) * dpr)) * 4;
        n++;
        if (img[o + 3] < 128 || Math.min(img[o], img[o + 1], img[o + 2]) > 215) empty++;
      }
      if (empty > 0.1 * n) bad.push(col.x);
    }
    return { columns: cols.length, bad };
  });
}

test('narrow peaks: the fill reaches the allocated curve in every pixel column, at every zoom level', async () => {
  const cases = [['example', []], ...['sqattn-qwen2-compress-segment-churn.pickle', 'decomfl-opt-zeroth-order-windows.pickle'].map((n) => [n, real(n)]).filter(([, p]) => p).map(([n, p]) => [n, [p]])];
  for (const [name, inputs] of cases) {
    const { page, errors } = await open(ctx, report(inputs, join(OUT, `filled-${name}.html`)));
    const { states } = await page.evaluate(() => window.fragscope.view());
    for (const [zoom, at] of [[1, 0], [0.25, states * 0.3], [0.02, states * 0.6]]) {
      await page.click('#zoom-reset');
      if (zoom < 1) await page.evaluate(([f, s]) => window.fragscope.zoom(f, s), [zoom, at]);
      for (const mode of ['allocation', 'site']) {
        await page.evaluate((m) => window.fragscope.setStack(m), mode);
        const r = await unfilledColumns(page);
        assert.ok(r.columns > 0, `${name}: columns`);
        assert.deepEqual(r.bad, [], `${name} zoom ${zoom} by ${mode}: ${r.bad.length} of ${r.columns} columns unfilled under the curve`);
      }
    }
    assert.deepEqual(errors, []);
    await page.close();
  }
});

test('not recorded: a torch.profiler trace says so for the state it does not hold, never 0 bytes', async (t) => {
  const path = real('kineto-hta-ddp-v100-rank1-profile-memory.json.gz');
  if (!path) return t.skip('corpus file absent');
  const sum = json(['summary', '--json', path]).files[0];
  const { page, errors } = await open(ctx, report([path], join(OUT, 'kineto.html')));
  const figs = await page.$$eval('#figures [data-fig]', (els) => Object.fromEntries(els.map((e) => [e.dataset.fig, { value: e.dataset.value, text: e.querySelector('b').textContent }])));
  for (const k of ['reserved_bytes', 'allocated_bytes', 'active_bytes', 'segments', 'largest_free_block_bytes', 'free_space_fragmentation']) {
    assert.deepEqual(figs[k], { value: 'null', text: 'not recorded' }, `${k}`);
  }
  const p = sum.profiler_totals[0];
  assert.equal(Number(figs.profiler_last_allocated_bytes.value), p.last_allocated_bytes, 'the profiler\u2019s allocated at the end, as summary says');
  assert.equal(figs.profiler_last_allocated_bytes.text, await page.evaluate((n) => window.fragscope.bytes(n), p.last_allocated_bytes));
  const peakNote = await page.$eval('#findings [data-peak="reserved peak"]', (e) => e.textContent);
  assert.match(peakNote, /^not recorded/, 'no flame graph of zeros at a peak the file gives only as a total');
  assert.deepEqual(errors, []);
  await page.close();
});

test('recording options: skip_actions notes, pinned host memory apart, live bytes by compile_context and user_metadata', async (t) => {
  const src = real('ckpttry-activation-ckpt-toy.pickle');
  if (!src) return t.skip('corpus file absent');
  // The real trace without its free_requested entries (skip_actions), every other alloc
  // in a compiled region and the rest with user metadata, and two pinned host blocks.
  const out = join(OUT, 'recopts.pickle');
  const script = `import pickle, sys
d = pickle.load(open(sys.argv[1], 'rb'))
n = 0
for t in d['device_traces']:
    t[:] = [e for e in t if e['action'] != 'free_requested']
    for e in t:
        if e['action'] == 'alloc':
            n += 1
            if n % 2: e['compile_context'] = 'Torch-Compiled Region: 0/0'
            else: e['user_metadata'] = 'phase=eval'
seg = lambda a, s, st: {'device': -1, 'address': a, 'total_size': s, 'allocated_size': s if st == 'active_allocated' else 0, 'active_size': s if st == 'active_allocated' else 0, 'requested_size': s, 'stream': 0, 'segment_type': 'small', 'segment_pool_id': (0, 0), 'is_expandable': False, 'frames': [], 'blocks': [{'address': a, 'size': s, 'requested_size': s, 'state': st, 'frames': []}]}
d['host_segments'] = [seg(1 << 40, 64 << 20, 'active_allocated'), seg((1 << 40) + (1 << 30), 16 << 20, 'inactive')]
d['host_traces'] = []
pickle.dump(d, open(sys.argv[2], 'wb'))`;
  execFileSync('python3', ['-c', script, src, out]);
  const ana = json(['analyze', '--json', out]).files[0].devices[0];
  const { page, errors } = await open(ctx, report([out], join(OUT, 'recopts.html')));
  const notes = await page.$$eval('#findings p.recording', (els) => els.map((e) => e.textContent));
  assert.ok(notes.some((n) => /free_requested entries were not recorded \(skip_actions\)/.test(n)), notes.join('\n'));
  assert.ok(notes.some((n) => /free_requested entries restored/.test(n)), notes.join('\n'));
  const host = await page.$eval('#host-memory', (e) => e.textContent);
  assert.match(host, /64\.00 MiB in use/);
  assert.match(host, /80\.00 MiB pinned/);
  const figs = await page.$$eval('#figures [data-fig]', (els) => Object.fromEntries(els.map((e) => [e.dataset.fig, e.dataset.value])));
  assert.equal(Number(figs.reserved_bytes), json(['summary', '--json', src]).files[0].devices[0].reserved_bytes, 'host memory never added to the device');
  for (const [k, by] of [['by_compile_context', 'compile_context'], ['by_user_metadata', 'user_metadata']]) {
    const want = ana.peaks.allocated_peak[k];
    assert.ok(want && want.length, `${k} in analyze --json`);
    const rows = await page.$$eval(`#findings table.by-context[data-by="${by}"][data-peak="allocated peak"] tr`, (trs) => trs.slice(1).map((tr) => [...tr.children].map((td) => td.textContent)));
    assert.deepEqual(rows.map((r) => r[0]), want.map((w) => w.name), `${by}: the rows analyze lists`);
    assert.deepEqual(rows.map((r) => Number(r[2])), want.map((w) => w.blocks));
  }
  assert.deepEqual(errors, []);
  await page.close();
});
