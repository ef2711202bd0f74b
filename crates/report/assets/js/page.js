// page.js: the page state (which file and device, the selections), choosing a file or
// device, the header's verdict, the page's layout (build) and figures, the details pane's
// stacks, and redrawing.
// Page state. `state`: the trace state the state view shows; `stack`: the timeline
// stacked by allocation (`n` of them drawn) or by call site (`bands` of them).
const S = { file: 0, dev: null, allFrames: false, colour: 'site', x0: 0, x1: 1, axis: 'events', bands: 12, stack: 'allocation', n: 200, state: 0, highlight: null, hits: [], hitAllocs: null, sel: -1, highlightRole: null, c: null };
const views = {};

// The analysis of device index di of a file (null when it was not analysed).
function analysisOf(file, di) {
  const d = file.devices[di];
  return d && file.analysis.devices ? file.analysis.devices.find((x) => x.device === d.device) || null : null;
}
// The device a file opens on: the one with the OOM (the first, when several), else the
// one with the most severe findings (high, then medium), else the first.
function openingDevice(file) {
  let best = 0, key = null;
  file.devices.forEach((d, i) => {
    const a = analysisOf(file, i);
    const f = a ? a.findings : [];
    const k = [a && a.oom ? 1 : 0, f.filter((x) => x.severity === 'high').length, f.filter((x) => x.severity === 'medium').length];
    if (!key || k[0] > key[0] || (k[0] === key[0] && (k[1] > key[1] || (k[1] === key[1] && k[2] > key[2])))) { best = i; key = k; }
  });
  return best;
}
const oomDevices = (file) => file.devices.map((d, i) => ({ d, i, a: analysisOf(file, i) })).filter((x) => x.a && x.a.oom);
// Switching file or device: nothing selected on one carries over to the other (the
// highlight, the clicked allocation, the search's hits, the details pane, the state
// view's position all start afresh).
function choose(fi, di) {
  S.file = fi;
  S.dev = di == null ? openingDevice(DATA.files[fi]) : di;
  S.highlight = null; S.hits = []; S.hitAllocs = null; S.sel = -1; S.highlightRole = null;
  if (S.c && S.c.segs) S.c.segs.sel = -1;
  const q = document.getElementById('search');
  if (q) q.value = '';
  detail.textContent = DETAIL_HINT;
  build();
}
const DETAIL_HINT = detail.textContent;
// The header's verdict: the OOM of this file (device, request, why), or that it had none.
function verdictLine(file) {
  const v = document.getElementById('verdict');
  v.textContent = '';
  v.className = '';
  const ooms = oomDevices(file);
  if (!ooms.length) {
    const any = file.devices.some((_, i) => analysisOf(file, i));
    v.textContent = any ? 'no OOM recorded' : '';
    v.dataset.oom = '0';
    return;
  }
  const { d, i, a } = ooms[0], o = a.oom;
  v.className = 'oom';
  v.dataset.oom = String(ooms.length);
  v.dataset.device = String(d.device);
  v.title = o.explanation || '';
  v.append(el('b', {}, `OOM on cuda:${d.device}`), ` at event ${o.event_index}: ${o.verdict}, request ${bytes(o.request_bytes)}, CUDA free ${bytes(o.device_free_bytes)}` +
    (ooms.length > 1 ? ` (also on ${ooms.slice(1).map((x) => 'cuda:' + x.d.device).join(', ')})` : ''));
  if (S.dev !== i) v.append(' ', el('button', { id: 'verdict-go', onclick: () => choose(S.file, i) }, 'show'));
}

function build() {
  if (DATA.predict) {
    main.textContent = '';
    document.getElementById('verdict').textContent = 'predictions (a model of the runs, not recordings)';
    document.getElementById('search').style.display = 'none';
    detail.textContent = 'Solid: recordings; dashed: predictions. The table under the charts gives each run\u2019s peaks, read from the drawn curves; fragscope predict --json gives the same figures.';
    main.append(predictView(DATA.predict));
    redrawAll();
    return;
  }
  const nav = document.getElementById('files');
  nav.textContent = '';
  if (DATA.files.length > 1) {
    DATA.files.forEach((f, i) => {
      const oom = oomDevices(f).length > 0;
      nav.append(el('button', { class: (i === S.file ? 'on' : '') + (oom ? ' oom' : ''), 'data-oom': oom ? '1' : '0', title: f.name + (oom ? ' (OOM)' : ''), onclick: () => choose(i) },
        (oom ? '⚠ ' : '') + f.name.replace(/^.*\//, '')));
    });
  }
  const file = DATA.files[S.file];
  if (S.dev == null || S.dev >= file.devices.length) S.dev = openingDevice(file);
  const ds = document.getElementById('devsel');
  ds.textContent = '';
  if (file.devices.length > 1) {
    file.devices.forEach((d, i) => {
      const a = analysisOf(file, i), oom = !!(a && a.oom);
      ds.append(el('button', { class: (i === S.dev ? 'on' : '') + (oom ? ' oom' : ''), 'data-device': String(d.device), 'data-oom': oom ? '1' : '0',
        title: oom ? `OOM at event ${a.oom.event_index}: ${a.oom.verdict}` : `cuda:${d.device}`, onclick: () => choose(S.file, i) }, (oom ? '⚠ ' : '') + 'cuda:' + d.device));
    });
  }
  verdictLine(file);
  main.textContent = '';
  flameRoots.length = 0; flameLabels.length = 0;
  keyStep = null;
  for (const k of Object.keys(views)) delete views[k];
  if (DATA.files.length > 1) main.append(ranksView());
  main.append(figuresView(file));
  const dev = file.devices[S.dev];
  if (!dev) {
    main.append(el('p', { class: 'note' }, 'This file has no device with segments or trace events.'));
  } else {
    const c = decodeDevice(dev);
    S.x0 = 0; S.x1 = c.states; S.bands = Math.min(S.bands, c.k); S.c = c; S.sel = -1; S.hitAllocs = null;
    if (S.axis === 'time' && !c.clock) S.axis = 'events';
    // The state view opens at the OOM; else at the reserved peak, unless that is the
    // first state (reserved never grew: on an expandable segment mapped before the
    // trace, the "peak" is a tie held from the start) or the device uses expandable
    // segments (its reserved bytes say little): then at the allocated peak.
    const pre = c.moments.find((m) => m.kinds.includes('oom'));
    const rp = c.moments.find((m) => m.kinds.includes('reserved_peak'));
    const ap = c.moments.find((m) => m.kinds.includes('allocated_peak'));
    const end = c.moments[c.moments.length - 1];
    let expandable = false;
    if (end) for (let i = SEG.flags; i < end.segs.length; i += SEG.len) if (end.segs[i] & 2) { expandable = true; break; }
    const useRp = rp && rp.state > 0 && !expandable;
    S.state = pre ? pre.state : useRp ? rp.state : ap ? ap.state : rp ? rp.state : c.states - 1;
    layoutAllocs(c, S.n);
    main.append(timelineView(file, dev, c), stateView(file, dev, c), poolsView(file, dev), fragView(file, dev, c), whatIfView(file, dev));
    if (file.fit) main.append(fitView(file, dev));
    main.append(findingsView(file, dev));
  }
  redrawAll();
}

function summaryDev(file) {
  const d = file.devices[S.dev];
  return d && file.summary.devices ? file.summary.devices.find((x) => x.device === d.device) : null;
}
const analysisDev = (file) => analysisOf(file, S.dev);

// ---------- figures ----------
function figuresView(file) {
  const sec = el('section', { id: 'figures' });
  const title = file.example ? 'Built-in example (a toy training loop made by fragscope)' : file.name;
  sec.append(el('h2', {}, title + ' — ' + ({ dict: 'PyTorch 2.x snapshot', segment_list: 'PyTorch 1.13 snapshot', kineto: 'torch.profiler trace' }[file.summary.format] || file.summary.format)));
  const figs = el('div', { class: 'figs' });
  const s = summaryDev(file), a = analysisDev(file);
  // A torch.profiler trace records no allocator state (no segment, no block): what the
  // state at the end would say is not in the file, and is written so, never as 0 bytes.
  // The profiler's own figure of what was allocated at the end is shown beside it.
  const stateless = file.summary.format === 'kineto';
  const nr = (key, label) => fig(key, 'null', label, 'not recorded');
  if (s && stateless) {
    figs.append(
      nr('reserved_bytes', 'reserved at the end'), nr('allocated_bytes', 'allocated at the end'), nr('active_bytes', 'active at the end'),
      nr('segments', 'segments'), nr('largest_free_block_bytes', 'largest free block'), nr('free_space_fragmentation', 'free-space fragmentation'),
      fig('trace_events', s.trace_events, 'trace events', String(s.trace_events)),
    );
    for (const p of file.summary.profiler_totals || []) {
      if (p.device === s.device) figs.append(fig('profiler_last_allocated_bytes', p.last_allocated_bytes ?? 'null', `profiler: allocated at the end (device ${p.device})`, p.last_allocated_bytes == null ? 'not recorded' : bytes(p.last_allocated_bytes)));
    }
  } else if (s) {
    figs.append(
      fig('reserved_bytes', s.reserved_bytes, 'reserved at the end', bytes(s.reserved_bytes)),
      fig('allocated_bytes', s.allocated_bytes, 'allocated at the end', bytes(s.allocated_bytes)),
      fig('active_bytes', s.active_bytes, 'active at the end', bytes(s.active_bytes)),
      fig('segments', s.segments, 'segments', String(s.segments)),
      fig('largest_free_block_bytes', s.fragmentation.largest_free_block_bytes, 'largest free block', bytes(s.fragmentation.largest_free_block_bytes)),
      fig('free_space_fragmentation', s.fragmentation.free_space_fragmentation, 'free-space fragmentation', pct(s.fragmentation.free_space_fragmentation)),
      fig('trace_events', s.trace_events, 'trace events', String(s.trace_events)),
    );
  }
  if (a) {
    const t = a.fragmentation.timeline;
    figs.append(
      fig('peak_reserved_bytes', t.peak_reserved.bytes, 'peak reserved', bytes(t.peak_reserved.bytes)),
      fig('peak_allocated_bytes', t.peak_allocated.bytes, 'peak allocated', bytes(t.peak_allocated.bytes)),
      fig('peak_fragmentation', a.peak_fragmentation == null ? 'null' : a.peak_fragmentation, 'peak fragmentation (1 − peak alloc / peak reserved)', pct(a.peak_fragmentation)),
      fig('findings', a.findings.length, 'findings', String(a.findings.length)),
    );
  }
  for (const p of file.summary.profiler_totals || []) {
    const b = (v) => (v == null ? 'not recorded' : bytes(v));
    figs.append(fig('profiler_peak_reserved_bytes', p.peak_reserved_bytes ?? 'null', `profiler peak reserved (device ${p.device})`, b(p.peak_reserved_bytes)),
      fig('profiler_peak_allocated_bytes', p.peak_allocated_bytes ?? 'null', `profiler peak allocated (device ${p.device})`, b(p.peak_allocated_bytes)));
  }
  sec.append(figs);
  if (file.budget_note) sec.append(el('p', { class: 'note', id: 'budget-note' }, file.budget_note + '.'));
  return sec;
}

// A stack in the details pane: memory_viz's filtered frames ([shownFrames]) or, with
// the toggle, every recorded frame.
function stackBox(file, si) {
  const s = stackOf(file, si);
  if (!s) return el('p', { class: 'note', 'data-stack': 'none' }, 'No stack recorded for this block (record with torch.cuda.memory._record_memory_history(stacks="python")).');
  const box = el('div', {});
  const draw = () => {
    box.textContent = '';
    const shown = shownFrames(s, S.allFrames);
    const hidden = s.length - shown.filter((f) => !f.startsWith('<repeats ')).length;
    box.append(el('div', { class: 'stack', 'data-stack': String(si), 'data-all': S.allFrames ? '1' : '0' }, s.length ? shown.join('\n') : '(the recorded stack has no frames)'));
    if (s.length && (hidden > 0 || S.allFrames)) {
      box.append(el('label', { class: 'note' }, el('input', { type: 'checkbox', id: 'all-frames', ...(S.allFrames ? { checked: '' } : {}), onchange: (e) => { S.allFrames = e.target.checked; draw(); } }),
        S.allFrames ? ' every recorded frame' : ` every recorded frame (${hidden} allocator and interpreter frames and repeats hidden)`));
    }
  };
  draw();
  return box;
}
function showStack(file, si, title, extra) {
  detail.textContent = '';
  if (extra) detail.append(extra);
  detail.append(el('h3', {}, title), stackBox(file, si));
}

// ---------- drawing ----------
function redrawAll() {
  for (const [k, f] of Object.entries(views)) timed(k, f);
}
function redrawTimed() {
  const t = performance.now();
  for (const k of ['timeline', 'frag']) if (views[k]) views[k]();
  api.lastZoomMs = performance.now() - t;
}
window.addEventListener('resize', redrawAll);
// ↑/↓ anywhere on the page (outside a form field) step the state view by one entry.
let keyStep = null;
document.addEventListener('keydown', (e) => { if (keyStep) keyStep(e); });
