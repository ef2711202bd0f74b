// fragscope report: owned script, inlined by crates/report. No external resource, no
// network request: everything it draws comes from the JSON in #fragscope-data, which
// crates/report computed (curves per bucket, allocator states at chosen moments).
// Views: figures, timeline (zoom/pan/search/click), allocator state (slider, hover,
// click), fragmentation over time, what-if, findings, and a table of files (ranks).
'use strict';
(function () {
  const DATA = JSON.parse(document.getElementById('fragscope-data').textContent);
  const main = document.getElementById('main');
  const detail = document.getElementById('detail-body');
  const T0 = performance.now();
  const api = (window.fragscope = { ready: false, drawMs: {}, firstPaintMs: null });

  // ---------- helpers ----------
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === 'class') e.className = v;
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v);
    }
    for (const k of kids) if (k != null) e.append(k instanceof Node ? k : String(k));
    return e;
  }
  function f64(b64) {
    if (!b64) return new Float64Array(0);
    const s = atob(b64);
    const u = new Uint8Array(s.length);
    for (let i = 0; i < s.length; i++) u[i] = s.charCodeAt(i);
    return new Float64Array(u.buffer);
  }
  function concatF64(a, b) {
    const r = new Float64Array(a.length + b.length);
    r.set(a); r.set(b, a.length);
    return r;
  }
  // Sizes as every CLI command prints them (PyTorch's `format_size`, the analysis crate's
  // `oom_message::format_size`): "512 bytes", "1.50 KiB" up to 1 MiB, "12.50 MiB" up to
  // 1 GiB, then GiB; two decimals rounded as Rust rounds them (an exact tie to the even
  // digit: 7.125 GiB is "7.12 GiB" there, where toFixed would say 7.13).
  function bytes(n) {
    if (n == null || isNaN(n)) return '—';
    const sign = n < 0 ? '-' : '', v = Math.abs(n);
    if (v <= 1024) return sign + Math.round(v) + ' bytes';
    const [u, name] = v <= 1048576 ? [1024, 'KiB'] : v <= 1073741824 ? [1048576, 'MiB'] : [1073741824, 'GiB'];
    const q = v / u;
    // q is a tie in the third decimal exactly when 8q is an odd integer (q = odd/200 in
    // binary needs 25 | odd); q·100 is then exact.
    let h;
    if (Number.isInteger(q * 8) && (q * 8) % 2 === 1) { h = Math.floor(q * 100); if (h % 2 === 1) h += 1; return sign + (h / 100).toFixed(2) + ' ' + name; }
    return sign + q.toFixed(2) + ' ' + name;
  }
  const pct = (x) => (x == null || isNaN(x) ? '—' : (100 * x).toFixed(1) + '%');
  const hex = (a) => '0x' + Math.round(a).toString(16);
  function color(i) {
    if (i < 0) return '#9ca3af';
    // Golden-angle hues, skipping the reds of the reserved curve.
    const h = 20 + ((i * 137.508) % 300);
    return `hsl(${h.toFixed(0)},62%,${52 + (i % 3) * 6}%)`;
  }
  function fig(key, value, label, shown) {
    return el('div', { class: 'fig', 'data-fig': key, 'data-value': String(value) }, el('b', {}, shown), el('span', {}, label));
  }
  function canvas(cls, h) {
    const c = el('canvas', { class: cls });
    c.style.height = h + 'px';
    return c;
  }
  function ctxOf(c) {
    const dpr = window.devicePixelRatio || 1;
    const w = c.clientWidth || 800, h = c.clientHeight;
    if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
      c.width = Math.round(w * dpr);
      c.height = Math.round(h * dpr);
    }
    const g = c.getContext('2d');
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    return { g, w, h };
  }
  function timed(name, fn) {
    const t = performance.now();
    fn();
    api.drawMs[name] = performance.now() - t;
  }

  // ---------- per-file decoding ----------
  function stackOf(file, i) {
    if (i == null || i < 0 || !file.stacks[i]) return null;
    return file.stacks[i].map((k) => file.frames[k]);
  }
  // A stack's call site: the analysis crate's `attribution::site_of`, the name `analyze`,
  // `diff` and every other output give it (computed in Rust, one per stack).
  function siteName(file, i) {
    if (i == null || i < 0 || !file.stacks[i]) return '<no stack>';
    return file.sites[i];
  }
  // The frames of a stack as shown (innermost first). By default as PyTorch's memory_viz
  // shows them: without the allocator's and the interpreter's own C++ frames (the
  // unwinder, CapturedTraceback, the dispatcher's boxing and registration, CPython's call
  // machinery), and with a frame repeated several times in a row (recursion) written
  // once with "<repeats N times>". The toggle under the stack shows every frame.
  const OMIT_FUNCTIONS = ['unwind::unwind', 'CapturedTraceback::gather', 'gather_with_cpp', '_start', '__libc_start_main', 'PyEval_', 'PyObject_', 'PyFunction_'];
  const OMIT_FILES = ['core/boxing', '/Register', '/Redispatch', 'pythonrun.c', 'Modules/main.c', 'Objects/call.c', 'Objects/methodobject.c', 'pycore_ceval.h', 'ceval.c', 'cpython/abstract.h'];
  function frameParts(f) {
    // `file:line:name`; the file may hold ':' (a Windows drive), the name too (C++).
    const m = /^(.*?):(-?\d+):(.*)$/s.exec(f);
    return m ? { file: m[1], name: m[3] } : { file: f, name: '' };
  }
  function shownFrames(frames, all) {
    if (all) return frames.slice();
    const kept = frames.filter((f) => { const p = frameParts(f); return !OMIT_FUNCTIONS.some((x) => p.name.includes(x)) && !OMIT_FILES.some((x) => p.file.includes(x)); });
    const out = [];
    for (let i = 0; i < kept.length;) {
      let j = i + 1;
      while (j < kept.length && kept[j] === kept[i]) j++;
      if (j - i <= 2) for (let k = i; k < j; k++) out.push(kept[k]);
      else out.push(kept[i], `<repeats ${j - i - 1} times>`);
      i = j;
    }
    return out;
  }
  function decodeDevice(dev) {
    if (dev._c) return dev._c;
    const c = dev.curves;
    const k = c.site_stacks.length;
    const lvl0 = {
      n: c.n, first: f64(c.first), time: f64(c.time), alloc: f64(c.allocated), req: f64(c.requested),
      res: f64(c.reserved), maxreq: f64(c.max_request), sites: f64(c.sites), amax: f64(c.amax), pick: null,
    };
    // Role bytes (DeviceData.roles): at each bucket's allocated maximum, and the most of
    // each role in the bucket.
    const roles = dev.roles ? dev.roles.roles : [], R = roles.length;
    lvl0.rat = dev.roles ? f64(dev.roles.at_amax) : new Float64Array(0);
    lvl0.rmax = dev.roles ? f64(dev.roles.max) : new Float64Array(0);
    // Coarser levels by pairwise maxima (sites follow the bucket with more allocated).
    const levels = [lvl0];
    while (levels[levels.length - 1].n > 64) {
      const p = levels[levels.length - 1], n = Math.ceil(p.n / 2);
      const q = { n, first: new Float64Array(n), time: new Float64Array(n), alloc: new Float64Array(n), req: new Float64Array(n),
        res: new Float64Array(n), maxreq: new Float64Array(n), sites: new Float64Array(n * k), amax: new Float64Array(n), pick: new Int32Array(n),
        rat: new Float64Array(n * R), rmax: new Float64Array(n * R) };
      for (let i = 0; i < n; i++) {
        const a = 2 * i, b = Math.min(2 * i + 1, p.n - 1);
        q.first[i] = p.first[a];
        q.time[i] = isNaN(p.time[a]) ? p.time[b] : p.time[a];
        const m = p.alloc[b] > p.alloc[a] ? b : a;
        q.alloc[i] = p.alloc[m];
        q.amax[i] = p.amax[m]; q.pick[i] = m;
        for (let j = 0; j < k; j++) q.sites[i * k + j] = p.sites[m * k + j];
        for (let j = 0; j < R; j++) { q.rat[i * R + j] = p.rat[m * R + j]; q.rmax[i * R + j] = Math.max(p.rmax[a * R + j], p.rmax[b * R + j]); }
        q.req[i] = Math.max(p.req[a], p.req[b]);
        q.res[i] = Math.max(p.res[a], p.res[b]);
        q.maxreq[i] = Math.max(p.maxreq[a], p.maxreq[b]);
      }
      levels.push(q);
    }
    // Allocations live before the trace (alloc state 0) first: they sit at the bottom.
    const allocs = concatF64(f64(dev.initial_allocations), f64(dev.allocations));
    const requests = f64(dev.requests);
    const moments = dev.moments.map((m) => ({ state: m.state, kinds: m.kinds, segs: f64(m.segments), blocks: f64(m.blocks), coarse: !!m.figures }));
    // A coarse keyframe (small neighbouring blocks merged to fit the size budget) comes
    // with its exact figures; the others' are summed from their blocks.
    dev.moments.forEach((m, i) => { moments[i].fig = m.figures ? Object.assign({ fsf: m.figures.free > 0 ? 1 - m.figures.largest / m.figures.free : 0 }, m.figures) : momentFigures(moments[i]); });
    const so = dev.state_ops || { exact: false, first: 0, ops: '', count: 0 };
    // Allocations drawn one by one on the timeline, largest first (the order N cuts).
    const na = allocs.length / AL;
    const order = Array.from({ length: na }, (_, i) => i).sort((a, b) => allocs[b * AL + 1] - allocs[a * AL + 1] || a - b);
    // The event list's entries (windows of the trace, DeviceData.event_list).
    const events = (dev.event_list || []).map((w) => ({ first: w.first, E: f64(w.entries) }));
    // The segment timeline's segments (DeviceData.segments), laid out when first shown.
    const sa = f64(dev.segments), nsa = sa.length / AL;
    const segs = { A: sa, n: nsa, total: dev.segment_count || 0, order: Array.from({ length: nsa }, (_, i) => i).sort((a, b) => sa[b * AL + 1] - sa[a * AL + 1] || a - b), pts: null };
    dev._c = { events, k, roles, R, segs, levels, states: c.states, allocs, na, order, requests, moments, ops: f64(so.ops), exact: so.exact, first: so.first,
      clock: clockOf(lvl0, c.states, [f64(c.gap_from), f64(c.gap_to), f64(c.gap_t0), f64(c.gap_t1)]) };
    return dev._c;
  }
  // Trace entry i of the event list, or null when it is not embedded.
  const ACTIONS = ['alloc', 'free_requested', 'free_completed', 'segment_alloc', 'segment_free', 'segment_map', 'segment_unmap', 'snapshot', 'oom', 'annotate', 'user_defined'];
  const EV = 5;
  function eventAt(c, i) {
    for (const w of c.events) {
      const k = i - w.first;
      if (k >= 0 && k < w.E.length / EV) { const o = k * EV; return { i, action: ACTIONS[w.E[o]] || '?', addr: w.E[o + 1], size: w.E[o + 2], stream: w.E[o + 3], stack: w.E[o + 4] }; }
    }
    return null;
  }
  function describeEvent(e) {
    const st = streamName(DATA.files[S.file], e.stream);
    if (e.action === 'oom') return `oom: request ${bytes(e.size)} on stream ${st}, CUDA free ${bytes(e.addr)}`;
    return `${e.action} ${hex(e.addr)} ${bytes(e.size)}${e.stream ? ' stream ' + st : ''}`;
  }
  // A stream id from the page's arrays: itself, or (≥ 2^53, which an f64 cannot hold)
  // −(index + 1) into the file's table of their decimal text.
  function streamName(file, v) {
    return v >= 0 ? String(v) : (file.streams || [])[-v - 1] ?? '?';
  }
  // Values per allocation record (DeviceData.allocations): address, size, requested,
  // alloc state, free state (−1: live at the end), stack, alloc time_us, free time_us.
  const AL = 8;
  // Values per state delta record (StateOps.ops): event, kind, address, size, a, b, stack.
  const OP = 7;

  // Wall clock: the time of a trace state, from the finest level's first timed event of
  // each bucket (exact per state on traces of ≤ 8192 events, interpolated between
  // buckets on longer ones), and back.
  // The longest pause of each bucket adds two exact knots around it (Curves.gap_*).
  function clockOf(L, states, gaps) {
    const pts = [];
    for (let i = 0; i < L.n; i++) if (!isNaN(L.time[i])) pts.push([Math.max(1, L.first[i]), L.time[i]]);
    const [gf, gt, g0, g1] = gaps;
    for (let i = 0; i < gf.length; i++) if (gf[i] >= 1) pts.push([gf[i], g0[i]], [gt[i], g1[i]]);
    pts.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    const ks = [], ts = [];
    let last = -Infinity;
    for (const [k, t] of pts) {
      // Times are recorded in order; a file where they are not gets a monotone axis.
      last = Math.max(last, t);
      if (ks.length && ks[ks.length - 1] === k) { ts[ts.length - 1] = last; continue; }
      ks.push(k); ts.push(last);
    }
    if (ks.length < 2 || ts[ts.length - 1] <= ts[0]) return null;
    const KS = Float64Array.from(ks), KT = Float64Array.from(ts), m = KS.length;
    const at = (s) => {
      if (s <= KS[0]) return KT[0];
      if (s >= KS[m - 1]) return KT[m - 1];
      let lo = 0, hi = m - 1;
      while (hi - lo > 1) { const h = (lo + hi) >> 1; if (KS[h] <= s) lo = h; else hi = h; }
      return KT[lo] + ((KT[hi] - KT[lo]) * (s - KS[lo])) / (KS[hi] - KS[lo]);
    };
    const inv = (t) => {
      if (t <= KT[0]) return 0;
      if (t >= KT[m - 1]) return states;
      let lo = 0, hi = m - 1;
      while (hi - lo > 1) { const h = (lo + hi) >> 1; if (KT[h] <= t) lo = h; else hi = h; }
      return KT[hi] > KT[lo] ? KS[lo] + ((KS[hi] - KS[lo]) * (t - KT[lo])) / (KT[hi] - KT[lo]) : KS[lo];
    };
    return { at, inv, t0: KT[0], t1: KT[m - 1], exact: L.n === states, KS, KT };
  }

  // The allocator state at trace state s: from the nearest keyframe at or before it plus
  // the events' deltas (exact), or the nearest keyframe (when the file was too long for
  // deltas: `snapped` says so).
  function stateOf(c, s) {
    const K = c.moments;
    s = Math.max(c.first, Math.min(c.states - 1, Math.round(s)));
    if (c._st && c._st.asked === s) return c._st;
    let lo = 0, hi = K.length - 1;
    while (lo < hi) { const h = (lo + hi + 1) >> 1; if (K[h].state <= s) lo = h; else hi = h - 1; }
    let out;
    if (K[lo].state === s) out = K[lo];
    else if (!c.exact) {
      const j = lo + 1 < K.length && K[lo + 1].state - s < s - K[lo].state ? lo + 1 : lo;
      out = K[j];
    } else out = applyOps(c, K[lo], s);
    const r = Object.assign({}, out, { asked: s, snapped: out.state !== s });
    c._st = r;
    return r;
  }
  function applyOps(c, key, s) {
    const segs = new Map(), blocks = new Map();
    for (let i = 0; i < key.segs.length; i += 4) segs.set(key.segs[i], [key.segs[i], key.segs[i + 1], key.segs[i + 2], key.segs[i + 3]]);
    for (let i = 0; i < key.blocks.length; i += 6) blocks.set(key.blocks[i + 1], [key.blocks[i + 1], key.blocks[i + 2], key.blocks[i + 3], key.blocks[i + 4], key.blocks[i + 5]]);
    const O = c.ops, n = O.length / OP;
    let lo = 0, hi = n;
    while (lo < hi) { const h = (lo + hi) >> 1; if (O[h * OP] < key.state) lo = h + 1; else hi = h; }
    for (let r = lo; r < n && O[r * OP] < s; r++) {
      const o = r * OP, kind = O[o + 1], addr = O[o + 2], size = O[o + 3];
      if (kind === 0) blocks.delete(addr);
      else if (kind === 1) blocks.set(addr, [addr, size, O[o + 4], O[o + 5], O[o + 6]]);
      else if (kind === 2) { segs.delete(addr); for (const a of Array.from(blocks.keys())) if (a >= addr && a < addr + size) blocks.delete(a); }
      else segs.set(addr, [addr, size, O[o + 4], O[o + 5]]);
    }
    const sl = Array.from(segs.values()).sort((a, b) => a[0] - b[0]);
    const bl = Array.from(blocks.values()).sort((a, b) => a[0] - b[0]);
    const S4 = new Float64Array(sl.length * 4), B6 = new Float64Array(bl.length * 6);
    sl.forEach((x, i) => S4.set(x, 4 * i));
    let si = 0;
    bl.forEach((b, i) => {
      while (si + 1 < sl.length && sl[si + 1][0] <= b[0]) si++;
      B6.set([si, b[0], b[1], b[2], b[3], b[4]], 6 * i);
    });
    const m = { state: s, kinds: [], segs: S4, blocks: B6 };
    m.fig = momentFigures(m);
    return m;
  }

  function momentFigures(m) {
    let reserved = 0, allocated = 0, pending = 0, free = 0, largest = 0, slack = 0;
    for (let i = 0; i < m.segs.length; i += 4) reserved += m.segs[i + 1];
    for (let i = 0; i < m.blocks.length; i += 6) {
      const size = m.blocks[i + 2], st = m.blocks[i + 4];
      if (st === 0) { free += size; largest = Math.max(largest, size); }
      else if (st === 1) { allocated += size; slack += Math.max(0, size - m.blocks[i + 3]); }
      else pending += size;
    }
    return { reserved, allocated, pending, free, largest, slack, fsf: free > 0 ? 1 - largest / free : 0, blocks: m.blocks.length / 6 };
  }

  // ---------- page state ----------
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

  // ---------- predict (fragscope predict --report) ----------
  // Each recording's reserved and allocated curves and the curves predicted at sizes
  // nobody recorded, on one chart per device, x = the position in each run's own trace.
  function predictView(P) {
    const sec = el('section', { id: 'predict' });
    sec.append(el('h2', {}, 'Recorded and predicted memory'));
    sec.append(el('p', { class: 'note', id: 'predict-label' }, 'Dashed curves are predictions, not recordings: the trace of the largest recording with each allocation\u2019s size fitted as a function of the size parameter, replayed through fragscope\u2019s model of the caching allocator' +
      ' (its settings and the state before the trace included). Solid curves are the recordings. x: the position in each run\u2019s own trace; each curve is the maximum of its bucket, so its highest point is the run\u2019s peak.'));
    if (P.note) sec.append(el('p', { class: 'note', id: 'predict-note' }, P.note + '.'));
    const runs = [];
    P.recorded.forEach((r, i) => runs.push({ kind: 'recorded', size: r.size, device: r.device, label: `recorded at ${r.size} (${r.file})`, curve: r.curve, colour: `hsl(215,70%,${28 + (i % 4) * 12}%)`, dash: [] }));
    P.predicted.forEach((p, i) => runs.push({ kind: 'predicted', size: p.prediction.at, device: p.prediction.device, label: `predicted at ${p.prediction.at}`, curve: p.curve, colour: `hsl(${(20 + i * 47) % 360 < 200 ? (20 + i * 47) % 360 : (20 + i * 47) % 360 + 60},85%,45%)`, dash: [6, 4], p: p.prediction, template: p.template_size }));
    for (const r of runs) {
      if (!r.curve) continue;
      r.first = f64(r.curve.first); r.res = f64(r.curve.reserved); r.alloc = f64(r.curve.allocated);
      const mx = (a) => { let m = 0; for (const v of a) if (!isNaN(v)) m = Math.max(m, v); return m; };
      r.peakRes = mx(r.res); r.peakAlloc = mx(r.alloc);
    }
    api.predictCurves = () => runs.map((r) => ({ kind: r.kind, size: r.size, device: r.device, drawn: !!r.curve, reserved: r.curve ? r.peakRes : null, allocated: r.curve ? r.peakAlloc : null }));
    const devices = [...new Set(runs.map((r) => r.device))];
    for (const d of devices) {
      const mine = runs.filter((r) => r.device === d);
      const cv = canvas('predict-chart', 320);
      cv.dataset.device = String(d);
      const show = { res: true, alloc: true };
      const boxes = el('span', {});
      for (const [k, name] of [['res', 'reserved'], ['alloc', 'allocated']]) {
        const b = el('input', { type: 'checkbox', id: `predict-${k}-${d}` });
        b.checked = true;
        b.addEventListener('change', () => { show[k] = b.checked; draw(); });
        boxes.append(el('label', {}, b, name + ' '));
      }
      const legend = el('div', { class: 'legend note' });
      for (const r of mine) legend.append(el('i', { style: `background:${r.colour}` }), (r.curve ? '' : '(not drawn) ') + r.label + (r.kind === 'predicted' ? ' (prediction)' : ''));
      const cap = mine.map((r) => (r.p ? r.p.capacity : null)).find((x) => x != null);
      const draw = () => {
        const { g, w, h } = ctxOf(cv);
        const L = 64, T = 12, B = 18, pw = w - L - 8, ph = h - T - B;
        let ymax = 1;
        for (const r of mine) if (r.curve) ymax = Math.max(ymax, show.res ? r.peakRes : 0, show.alloc ? r.peakAlloc : 0);
        // The capacity is drawn when it is near the curves; far above them it would
        // flatten them, and is named at the top instead.
        const capIn = cap != null && cap <= 1.5 * ymax;
        if (capIn) ymax = Math.max(ymax, cap);
        ymax *= 1.05;
        const Y = (v) => T + ph - (v / ymax) * ph;
        g.fillStyle = '#667085'; g.strokeStyle = '#e4e7ec'; g.font = '10px sans-serif'; g.lineWidth = 1;
        for (let t = 0; t <= 4; t++) { const v = (ymax / 1.05) * (t / 4), y = Y(v); g.beginPath(); g.moveTo(L, y); g.lineTo(L + pw, y); g.stroke(); g.fillText(bytes(v), 2, y + 3); }
        for (let t = 0; t <= 4; t++) { const x = L + (pw * t) / 4; g.fillText(`${25 * t}%`, Math.min(x, w - 30), h - 4); }
        if (cap != null && !capIn) { g.fillStyle = '#b42318'; g.fillText(`capacity ${bytes(cap)} (above the chart)`, L + 4, T + 8); }
        if (capIn) {
          g.strokeStyle = '#b42318'; g.setLineDash([2, 2]); g.beginPath(); g.moveTo(L, Y(cap)); g.lineTo(L + pw, Y(cap)); g.stroke(); g.setLineDash([]);
          g.fillStyle = '#b42318'; g.fillText(`capacity ${bytes(cap)}`, L + 4, Y(cap) - 3);
        }
        for (const r of mine) {
          if (!r.curve) continue;
          const n = r.curve.n, E = r.curve.entries;
          const X = (pos) => L + (pos / E) * pw;
          for (const [k, arr, width, alpha] of [['res', r.res, 2, 1], ['alloc', r.alloc, 1.2, 0.65]]) {
            if (!show[k]) continue;
            g.strokeStyle = r.colour; g.globalAlpha = alpha; g.lineWidth = width; g.setLineDash(r.dash); g.beginPath();
            let open = false;
            for (let i = 0; i < n; i++) {
              if (isNaN(arr[i])) { open = false; continue; }
              const xa = X(r.first[i]), xb = X(i + 1 < n ? r.first[i + 1] : E);
              if (!open) { g.moveTo(xa, Y(arr[i])); open = true; } else g.lineTo(xa, Y(arr[i]));
              g.lineTo(xb, Y(arr[i]));
            }
            g.stroke();
          }
          g.globalAlpha = 1; g.setLineDash([]);
          if (r.p && r.p.oom) {
            const x = X(r.p.oom.index);
            g.strokeStyle = r.colour; g.lineWidth = 2; g.beginPath(); g.moveTo(x, T); g.lineTo(x, T + ph); g.stroke();
            g.fillStyle = r.colour; g.font = 'bold 11px sans-serif';
            const t = `predicted OOM at ${r.size}: ${bytes(r.p.oom.requested)}`, tw = g.measureText(t).width;
            g.fillText(t, x + 4 + tw > w ? x - 4 - tw : x + 4, T + 12);
          }
        }
        cv.dataset.ymax = String(ymax);
      };
      views['predict-' + d] = draw;
      sec.append(el('h3', {}, `cuda:${d}`), el('div', { class: 'controls' }, 'show', boxes), cv, legend);
    }
    // The figures: each run's drawn peaks (the curves' highest buckets).
    const t = el('table', { id: 'predict-table' }, el('tr', {}, ...['', 'size', 'device', 'peak reserved', 'peak allocated', 'first OOM', 'extrapolated share', 'replayed from'].map((x) => el('th', {}, x))));
    for (const r of runs) {
      const o = r.p && r.p.oom;
      t.append(el('tr', { 'data-kind': r.kind, 'data-size': String(r.size), 'data-device': String(r.device), 'data-peak-reserved': r.curve ? String(r.peakRes) : '', 'data-peak-allocated': r.curve ? String(r.peakAlloc) : '' },
        el('td', {}, r.kind === 'predicted' ? 'prediction' : 'recording'), el('td', { class: 'n' }, String(r.size)), el('td', { class: 'n' }, 'cuda:' + r.device),
        el('td', { class: 'n' }, r.curve ? bytes(r.peakRes) : r.p ? bytes(r.p.peak_reserved) : '—'), el('td', { class: 'n' }, r.curve ? bytes(r.peakAlloc) : r.p ? bytes(r.p.peak_allocated) : '—'),
        el('td', {}, r.p ? (o ? `entry ${o.index}: ${bytes(o.requested)}${o.site ? ' at ' + o.site : ''}` : r.p.capacity != null ? 'none (fits)' : 'none (no capacity given)') : ''),
        el('td', { class: 'n' }, r.p ? pct(r.p.extrapolated_share) : ''), el('td', {}, r.kind === 'predicted' ? `size ${r.template}` : '')));
    }
    sec.append(el('h3', {}, 'Peaks'), t);
    const fits = (P.json && P.json.fits) || [];
    for (const f of fits) sec.append(el('p', { class: 'note' }, `cuda:${f.device}: ${f.aligned_in_all} of ${f.requests} allocations aligned in every recording (${pct(f.aligned_fraction)}); ${f.unexplained_total} follow no law` + (f.notes.length ? '; ' + f.notes.join('; ') : '')));
    return sec;
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
    flameRoots.length = 0;
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
      if (end) for (let i = 3; i < end.segs.length; i += 4) if (end.segs[i] & 2) { expandable = true; break; }
      const useRp = rp && rp.state > 0 && !expandable;
      S.state = pre ? pre.state : useRp ? rp.state : ap ? ap.state : rp ? rp.state : c.states - 1;
      layoutAllocs(c, S.n);
      main.append(timelineView(file, dev, c), stateView(file, dev, c), fragView(file, dev, c), whatIfView(file, dev), findingsView(file, dev));
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
    if (s) {
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
      figs.append(fig('profiler_peak_reserved_bytes', p.peak_reserved_bytes ?? 'null', `profiler peak reserved (device ${p.device})`, bytes(p.peak_reserved_bytes)),
        fig('profiler_peak_allocated_bytes', p.peak_allocated_bytes ?? 'null', `profiler peak allocated (device ${p.device})`, bytes(p.peak_allocated_bytes)));
    }
    sec.append(figs);
    if (file.budget_note) sec.append(el('p', { class: 'note', id: 'budget-note' }, file.budget_note + '.'));
    return sec;
  }

  // ---------- 1. timeline ----------
  function levelFor(c, w) {
    const span = (S.x1 - S.x0) / c.states;
    let L = 0;
    while (L < c.levels.length - 1 && c.levels[L].n * span > w) L++;
    return L;
  }
  // The x axis: trace states in event order, or placed by wall-clock time (then a pause
  // between events shows as a gap). `S.x0`/`S.x1` are always trace states.
  const timeAxis = () => S.axis === 'time' && S.c && S.c.clock;
  function xOf(state, w) {
    if (timeAxis()) {
      const k = S.c.clock, a = k.at(S.x0), b = k.at(S.x1);
      return b > a ? ((k.at(state) - a) / (b - a)) * w : 0;
    }
    return ((state - S.x0) / (S.x1 - S.x0)) * w;
  }
  function stateAt(x, w) {
    if (timeAxis()) {
      const k = S.c.clock, a = k.at(S.x0), b = k.at(S.x1);
      return Math.max(S.x0, Math.min(S.x1, k.inv(a + (x / w) * (b - a))));
    }
    return S.x0 + (x / w) * (S.x1 - S.x0);
  }
  function bucketRange(lv, c) {
    // Buckets whose states intersect [x0, x1].
    let i0 = 0, i1 = lv.n - 1;
    const f = lv.first;
    let lo = 0, hi = lv.n - 1;
    while (lo < hi) { const m = (lo + hi + 1) >> 1; if (f[m] <= S.x0) lo = m; else hi = m - 1; }
    i0 = lo;
    lo = i0; hi = lv.n - 1;
    while (lo < hi) { const m = (lo + hi) >> 1; if (f[m] >= S.x1) hi = m; else lo = m + 1; }
    i1 = hi;
    return [i0, i1];
  }

  // The stacking of lives (allocations, or segments) as memory_viz draws them: rows `ids`
  // of A (AL numbers each: size at 1, made at state 3, freed at state 4 or -1); each starts
  // on top of those live when it is made and drops by the size of any below it that is
  // freed. Returns the events (state, made?, row) in order, and per row the bottom of its
  // polygon from each state on ([state, offset, state, offset, ...]).
  function stackLives(A, ids) {
    const ev = [];
    for (const i of ids) {
      ev.push([A[i * AL + 3], 1, i]);
      if (A[i * AL + 4] >= 0) ev.push([A[i * AL + 4], 0, i]);
    }
    ev.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    const pts = new Map(), live = [];
    let total = 0;
    for (const [s, add, i] of ev) {
      const size = A[i * AL + 1];
      if (add) { pts.set(i, [s, total]); live.push(i); total += size; continue; }
      const p = live.indexOf(i);
      if (p < 0) continue;
      live.splice(p, 1);
      total -= size;
      for (let q = p; q < live.length; q++) { const P = pts.get(live[q]); P.push(s, P[P.length - 1] - size); }
    }
    return { ev, pts };
  }
  // Stacked by allocation, as PyTorch's memory_viz draws it: the N largest allocations
  // each get a polygon; one made while others are live sits on top of them, and when one
  // below it is freed it drops by that size. Everything else allocated is one summarised
  // band above them (allocated − the drawn allocations live at each bucket's maximum).
  // Points: per drawn allocation, [state, offset, state, offset, ...] (bottom of the
  // polygon from that state on); it ends at its free state or the end of the trace.
  function layoutAllocs(c, N) {
    const A = c.allocs;
    N = Math.max(0, Math.min(N, c.na));
    const drawn = c.order.slice(0, N);
    const { ev, pts } = stackLives(A, drawn);
    // Drawn bytes live at each bucket's allocated maximum, finest level by one sweep, then
    // the coarser levels follow the bucket they took their maximum from.
    const L0 = c.levels[0];
    const d0 = new Float64Array(L0.n);
    let e = 0, run = 0;
    for (let b = 0; b < L0.n; b++) {
      while (e < ev.length && ev[e][0] <= L0.amax[b]) { run += (ev[e][1] ? 1 : -1) * A[ev[e][2] * AL + 1]; e++; }
      d0[b] = run;
    }
    L0.drawn = d0;
    for (let l = 1; l < c.levels.length; l++) {
      const q = c.levels[l], p = c.levels[l - 1];
      q.drawn = new Float64Array(q.n);
      for (let i = 0; i < q.n; i++) q.drawn[i] = p.drawn[q.pick[i]];
    }
    c.drawn = drawn; c.pts = pts; c.N = N;
    let np = 0;
    for (const P of pts.values()) np += P.length / 2;
    c.points = np;
  }
  // The segments stacked as the allocations are (layoutAllocs), every embedded one drawn.
  function layoutSegments(c) {
    const G = c.segs;
    if (G.pts) return G;
    G.pts = stackLives(G.A, G.order).pts; G.drawn = G.order; G.sel = -1;
    return G;
  }
  function livesOffset(G, i, s, states) {
    const A = G.A, P = G.pts.get(i);
    const end = A[i * AL + 4] >= 0 ? A[i * AL + 4] : states;
    if (!P || s < P[0] || s >= end) return null;
    let off = P[1];
    for (let k = 2; k < P.length && P[k] <= s; k += 2) off = P[k + 1];
    return off;
  }
  // For the tests: the segments' stacked height at state s (all drawn ones live there).
  api.segmentsAt = (s) => { const c = S.c, G = layoutSegments(c); let t = 0; for (const i of G.drawn) { if (livesOffset(G, i, s, c.states) != null) t += G.A[i * AL + 1]; } return { bytes: t, drawn: G.n, total: G.total }; };
  // Bottom of drawn allocation i at state s (null when not live there).
  function allocOffset(c, i, s) {
    const A = c.allocs, P = c.pts.get(i);
    const end = A[i * AL + 4] >= 0 ? A[i * AL + 4] : c.states;
    if (!P || s < P[0] || s >= end) return null;
    let off = P[1];
    for (let k = 2; k < P.length && P[k] <= s; k += 2) off = P[k + 1];
    return off;
  }

  // ---------- roles ----------
  const ROLE_COLOUR = { parameters: '#4f46e5', gradients: '#f59e0b', optimizer_state: '#a855f7', activations: '#14b8a6', temporaries: '#f472b6', inputs: '#84cc16', other: '#78716c' };
  const ROLE_LABEL = { parameters: 'parameters', gradients: 'gradients', optimizer_state: 'optimizer state', activations: 'activations', temporaries: 'temporaries', inputs: 'inputs', other: 'other' };
  const roleColour = (r) => ROLE_COLOUR[r] || '#9ca3af';
  // The analysis' figures of a role (confidence and evidence), null without them.
  function roleFigures(file, name) {
    const a = analysisDev(file);
    return a && a.roles && a.roles.by_role ? a.roles.by_role[name] || null : null;
  }
  // Each drawn role's bytes at the allocated peak and its most at any moment, read from
  // the drawn buckets (the finest level): the bucket holding the allocated peak (the
  // first with the most allocated) gives "at peak", the buckets' maxima give "max".
  function roleTotals(c) {
    const L = c.levels[0], R = c.R;
    let p = 0;
    for (let i = 1; i < L.n; i++) if (L.alloc[i] > L.alloc[p]) p = i;
    return c.roles.map((name, j) => {
      let max = 0;
      for (let i = 0; i < L.n; i++) max = Math.max(max, L.rmax[i * R + j]);
      return { role: name, at_peak: L.n ? L.rat[p * R + j] : 0, max, peak_state: L.amax[p] };
    });
  }
  api.roleTotals = () => (S.c && S.c.R ? roleTotals(S.c) : []);
  function roleLegend(file, dev, c) {
    const box = el('div', { id: 'role-legend', class: 'note' });
    if (!c.R) return box;
    const a = analysisDev(file);
    const steps = a && a.roles ? a.roles.steps : '';
    const t = el('table', { id: 'role-table' }, el('tr', {}, el('th', {}, 'role'), el('th', { class: 'n' }, 'at the allocated peak'), el('th', { class: 'n' }, 'most at any moment'), el('th', { class: 'n' }, 'confidence')));
    for (const r of roleTotals(c)) {
      const f = roleFigures(file, r.role);
      t.append(el('tr', { 'data-role': r.role, 'data-at-peak': String(r.at_peak), 'data-max': String(r.max) },
        el('td', {}, el('i', { style: `display:inline-block;width:10px;height:10px;margin-right:4px;background:${roleColour(r.role)}` }), ROLE_LABEL[r.role] || r.role),
        el('td', { class: 'n' }, bytes(r.at_peak)), el('td', { class: 'n' }, bytes(r.max)), el('td', { class: 'n' }, f ? f.confidence.toFixed(2) : '—')));
    }
    box.append(t, el('div', {}, 'Tensor bytes (requests) by role, as summary and analyze count them' + (steps ? ` (${steps})` : '') +
      '; the light band above them is the rest of allocated (blocks\u2019 rounding). Roles are inferred from phases, lifetimes and sizes: click a band for the evidence.'));
    return box;
  }

  function timelineView(file, dev, c) {
    const sec = el('section', { id: 'timeline' });
    sec.append(el('h2', {}, '1. Active memory over time'));
    const cv = canvas('tl', 300);
    const info = el('span', { id: 'tl-range' });
    const mode = el('select', { id: 'tl-stack' }, el('option', { value: 'allocation' }, 'allocation'), el('option', { value: 'site' }, 'call site'),
      c.R ? el('option', { value: 'role' }, 'role') : null, c.segs.n ? el('option', { value: 'segment' }, 'segment (reserved)') : null);
    if ((S.stack === 'role' && !c.R) || (S.stack === 'segment' && !c.segs.n)) S.stack = 'allocation';
    mode.value = S.stack;
    const roleBox = roleLegend(file, dev, c);
    const nIn = el('input', { type: 'range', min: '0', max: String(c.na), value: String(Math.min(S.n, c.na)), id: 'tl-n', title: 'allocations drawn one by one' });
    const nLabel = el('span', { id: 'tl-n-label' });
    const bands = el('input', { type: 'range', min: '0', max: String(c.k), value: String(S.bands), id: 'tl-bands' });
    const showMode = () => {
      const byAlloc = S.stack === 'allocation', byRole = S.stack === 'role';
      nIn.style.display = byAlloc ? '' : 'none'; bands.style.display = byAlloc || byRole ? 'none' : '';
      nLabel.textContent = byAlloc ? `largest ${c.N} of ${c.na} allocations drawn` : byRole ? 'tensor bytes by role (at each bucket\u2019s allocated maximum)'
        : S.stack === 'segment' ? `segments reserved from CUDA, stacked: the largest ${c.segs.n} of ${c.segs.total}` + (c.segs.n < c.segs.total ? ' (the reserved curve counts them all)' : '') : `${S.bands} of ${c.k} call sites`;
      if (S.stack === 'segment') bands.style.display = 'none';
      roleBox.style.display = byRole ? '' : 'none';
    };
    mode.addEventListener('change', () => { S.stack = mode.value; showMode(); redrawAll(); });
    nIn.addEventListener('input', () => { S.n = +nIn.value; layoutAllocs(c, S.n); showMode(); redrawAll(); });
    bands.addEventListener('input', () => { S.bands = +bands.value; showMode(); redrawAll(); });
    api.setStack = (m) => { S.stack = m; mode.value = m; showMode(); redrawAll(); return mode.value; };
    api.setAllocations = (n) => { S.n = n; nIn.value = String(n); layoutAllocs(c, n); showMode(); redrawAll(); return c.N; };
    const colourSel = el('select', { id: 'tl-colour', title: 'colour of the allocations and blocks' }, el('option', { value: 'site' }, 'call site'), el('option', { value: 'allocation' }, 'allocation'));
    colourSel.value = S.colour;
    colourSel.addEventListener('change', () => { S.colour = colourSel.value; redrawAll(); });
    const axis = el('select', { id: 'tl-axis' }, el('option', { value: 'events' }, 'event order'), el('option', { value: 'time' }, 'wall clock'));
    axis.value = S.axis;
    if (!c.clock) { axis.disabled = true; axis.title = 'the trace records no times'; }
    axis.addEventListener('change', () => { S.axis = axis.value; redrawAll(); });
    const zoomBy = (f, at) => {
      const mid = at == null ? (S.x0 + S.x1) / 2 : at;
      if (timeAxis()) {
        // Zoom in time: the span of wall-clock time shown scales by f around `at`.
        const k = c.clock, a = k.at(S.x0), b = k.at(S.x1), tm = k.at(mid);
        const span = Math.min(k.t1 - k.t0, (b - a) * f);
        let t0 = tm - (tm - a) * (span / Math.max(b - a, 1e-9));
        t0 = Math.max(k.t0, Math.min(t0, k.t1 - span));
        let x0 = t0 <= k.t0 ? 0 : k.inv(t0), x1 = t0 + span >= k.t1 ? c.states : k.inv(t0 + span);
        if (x1 - x0 < 4) { const m = (x0 + x1) / 2; x0 = Math.max(0, m - 2); x1 = Math.min(c.states, x0 + 4); }
        S.x0 = x0; S.x1 = x1;
        redrawTimed();
        return;
      }
      let span = Math.max(4, (S.x1 - S.x0) * f);
      span = Math.min(span, c.states);
      let x0 = mid - (mid - S.x0) * (span / (S.x1 - S.x0));
      x0 = Math.max(0, Math.min(x0, c.states - span));
      S.x0 = x0; S.x1 = x0 + span;
      redrawTimed();
    };
    api.zoom = (f, at) => zoomBy(f, at);
    api.view = () => ({ x0: S.x0, x1: S.x1, states: c.states });
    api.setAxis = (a) => { S.axis = a; axis.value = a; redrawAll(); return S.axis; };
    // Plot x (pixels from the plot's left edge, plot width) of a trace state, and the
    // wall-clock time the page gives a state.
    api.xOfState = (s) => { const w = cv.clientWidth - TL_LEFT; return { x: xOf(s, w), w }; };
    api.timeOfState = (s) => (c.clock ? c.clock.at(s) : null);
    sec.append(el('div', { class: 'controls' },
      el('button', { id: 'zoom-in', onclick: () => zoomBy(0.5) }, 'zoom in'),
      el('button', { id: 'zoom-out', onclick: () => zoomBy(2) }, 'zoom out'),
      el('button', { id: 'zoom-reset', onclick: () => { S.x0 = 0; S.x1 = c.states; redrawTimed(); } }, 'reset'),
      'x axis', axis, 'stacked by', mode, 'coloured by', colourSel, nIn, bands, nLabel, info));
    showMode();
    if (c.states === 1) sec.append(el('p', { class: 'note' }, 'No trace was recorded (state only): the timeline has one point, the snapshot itself. Record with torch.cuda.memory._record_memory_history() for the history.'));
    // The minimap: the whole trace, with the window shown, while zoomed in; a click or a
    // drag on it moves the window there.
    const mini = canvas('tl-mini', 44);
    mini.id = 'tl-minimap';
    mini.title = 'the whole trace (event order); the window shown is outlined: click or drag to move it';
    const moveTo = (e) => {
      const r = mini.getBoundingClientRect(), span = S.x1 - S.x0;
      const s = ((e.clientX - r.left - mini.clientLeft - TL_LEFT) / (mini.clientWidth - TL_LEFT)) * c.states;
      S.x0 = Math.max(0, Math.min(s - span / 2, c.states - span)); S.x1 = S.x0 + span;
      redrawTimed();
    };
    mini.addEventListener('mousedown', moveTo);
    mini.addEventListener('mousemove', (e) => { if (e.buttons & 1) moveTo(e); });
    sec.append(mini, cv, roleBox);
    // What the filled areas are, for the mode shown (set at each drawing).
    const restNote = el('span', { id: 'tl-rest-note' });
    const legendFor = () => {
      const [swatch, text] = {
        allocation: ['#cbd5e1', 'the rest of allocated (summarised) · allocations coloured by ' + (S.colour === 'allocation' ? 'allocation' : 'call site')],
        site: ['#cbd5e1', 'the rest of allocated (outside the call sites drawn) · bands coloured by call site'],
        role: ['#e2e8f0', 'allocated above the tensors\u2019 requests (rounding) · bands coloured by role (table below)'],
        segment: [null, 'segments coloured by ' + (S.colour === 'allocation' ? 'segment' : 'the call site that reserved them')],
      }[S.stack] || [null, ''];
      restNote.textContent = '';
      if (swatch) restNote.append(el('i', { style: `background:${swatch}` }));
      restNote.append(text);
    };
    sec.append(el('div', { class: 'legend note' }, el('i', { style: 'background:var(--res)' }), 'reserved', el('i', { style: 'background:var(--alloc)' }), 'allocated',
      el('i', { style: 'background:var(--req)' }), 'requested', restNote,
      ' · wheel: zoom, drag: pan, click: what is there and its stack · ',
      `${c.states - 1} events, finest level ${c.levels[0].n} buckets (max of each)` + (c.clock && !c.clock.exact ? '; wall clock interpolated inside buckets' : '')));
    let drag = null;
    cv.addEventListener('wheel', (e) => { e.preventDefault(); const r = cv.getBoundingClientRect(); zoomBy(e.deltaY < 0 ? 0.7 : 1 / 0.7, stateAt(e.clientX - r.left - cv.clientLeft - TL_LEFT, cv.clientWidth - TL_LEFT)); }, { passive: false });
    cv.addEventListener('mousedown', (e) => { drag = { x: e.clientX, x0: S.x0, x1: S.x1, moved: false }; });
    window.addEventListener('mouseup', () => { setTimeout(() => (drag = null), 0); });
    cv.addEventListener('mousemove', (e) => {
      if (!drag || !(e.buttons & 1)) return;
      const r = cv.getBoundingClientRect();
      if (Math.abs(e.clientX - drag.x) > 3) drag.moved = true;
      const span = drag.x1 - drag.x0;
      if (timeAxis()) {
        const k = c.clock, a = k.at(drag.x0), b = k.at(drag.x1), dt = ((e.clientX - drag.x) / (r.width - TL_LEFT)) * (b - a);
        const t0 = Math.max(k.t0, Math.min(a - dt, k.t1 - (b - a)));
        S.x0 = t0 <= k.t0 ? 0 : k.inv(t0); S.x1 = t0 + (b - a) >= k.t1 ? c.states : Math.max(S.x0 + 1, k.inv(t0 + (b - a)));
      } else {
        const d = ((e.clientX - drag.x) / (r.width - TL_LEFT)) * span;
        S.x0 = Math.max(0, Math.min(drag.x0 - d, c.states - span)); S.x1 = S.x0 + span;
      }
      redrawTimed();
    });
    cv.addEventListener('click', (e) => {
      if (drag && drag.moved) return;
      // Inside the border, in the drawing's own size (ctxOf draws clientWidth wide).
      const r = cv.getBoundingClientRect();
      timelineClick(file, dev, c, e.clientX - r.left - cv.clientLeft, e.clientY - r.top - cv.clientTop, cv.clientWidth, cv.clientHeight);
    });
    views.timeline = () => { drawTimeline(file, dev, c, cv, info); drawMinimap(c, mini); legendFor(); };
    return sec;
  }
  const TL_TOP = 16, TL_BOTTOM = 18, TL_LEFT = 64, PHASE_ROWS = 4;
  function tlGeom(c, w, h) {
    const lv = c.levels[levelFor(c, w - TL_LEFT)];
    const [i0, i1] = bucketRange(lv, c);
    let ymax = 1;
    for (let i = i0; i <= i1; i++) ymax = Math.max(ymax, lv.res[i], lv.alloc[i], lv.req[i]);
    return { lv, i0, i1, ymax: ymax * 1.05, pw: w - TL_LEFT, ph: h - TL_TOP - TL_BOTTOM };
  }
  // An allocation's colour: its call site's, or (colour mode "allocation", as memory_viz
  // draws them) one of its own, from its address and alloc event.
  function allocColour(c, i) {
    return S.colour === 'allocation' ? color(Math.abs(Math.round(c.allocs[i * AL] / 512) * 31 + c.allocs[i * AL + 3]) % 9973) : color(c.allocs[i * AL + 5]);
  }
  api.allocColours = () => (S.c && S.c.drawn ? S.c.drawn.map((i) => ({ index: i, stack: S.c.allocs[i * AL + 5], colour: allocColour(S.c, i) })) : []);
  // Whether an allocation is dimmed by the current highlight (search or click).
  function dimAlloc(c, i) {
    if (S.hitAllocs) return !S.hitAllocs.has(i);
    return S.highlight ? !S.highlight.has(c.allocs[i * AL + 5]) : false;
  }
  // For the tests: the phase labels drawn (boxes in canvas pixels).
  let phaseLabels = [];
  api.phaseLabels = () => phaseLabels;
  api.bytes = (n) => bytes(n);
  function drawTimeline(file, dev, c, cv, info) {
    phaseLabels = [];
    const { g, w, h } = ctxOf(cv);
    const G = tlGeom(c, w, h), { lv, i0, i1, ymax, pw, ph } = G;
    const Y = (v) => TL_TOP + ph - (v / ymax) * ph;
    const X = (s) => TL_LEFT + xOf(s, pw);
    const next = (i) => (i + 1 < lv.n ? lv.first[i + 1] : c.states);
    const k = c.k;
    g.save();
    g.beginPath(); g.rect(TL_LEFT, 0, pw, h); g.clip();
    // Phases: nested scopes shaded, each depth's names on a line of its own (the first
    // PHASE_ROWS depths; deeper ones are shaded only), a name only where it fits.
    let labelled = 0;
    for (const p of dev.phases) {
      if (p.end < S.x0 || p.start > S.x1) continue;
      const a = Math.max(TL_LEFT, X(p.start)), b = Math.min(w, X(p.end + 1));
      g.fillStyle = p.depth % 2 ? 'rgba(148,163,184,0.10)' : 'rgba(99,102,241,0.08)';
      g.fillRect(a, TL_TOP, Math.max(1, b - a), ph);
      g.fillStyle = '#475467'; g.font = '10px sans-serif';
      if (b - a > 30 && p.depth < PHASE_ROWS) {
        const text = p.name.slice(0, Math.floor((b - a) / 6)), y = TL_TOP + 10 + p.depth * 11;
        g.fillText(text, a + 2, y);
        phaseLabels.push({ x: a + 2, y: y - 9, w: Math.min(g.measureText(text).width, b - a - 2), h: 11, depth: p.depth });
      }
    }
    // Wall clock: pauses (consecutive events far apart in time) shaded, so they read as
    // gaps rather than as memory held. Only where the knots are consecutive states.
    let gaps = 0;
    if (timeAxis()) {
      const { KS, KT } = c.clock;
      g.fillStyle = 'rgba(100,116,139,0.13)'; g.font = '10px sans-serif';
      for (let i = 0; i + 1 < KS.length; i++) {
        if (KS[i + 1] < S.x0 || KS[i] > S.x1 || KS[i + 1] - KS[i] > 1) continue;
        const xa = X(KS[i]), xb = X(KS[i + 1]);
        if (xb - xa < 12) continue;
        gaps++;
        g.fillRect(xa, TL_TOP, xb - xa, ph);
        if (xb - xa > 70) { g.fillStyle = '#475467'; g.fillText(`no event for ${((KT[i + 1] - KT[i]) / 1e6).toFixed(3)} s`, xa + 3, TL_TOP + 22); g.fillStyle = 'rgba(100,116,139,0.13)'; }
      }
    }
    cv.dataset.gaps = String(gaps);
    const hl = S.highlight || S.hitAllocs;
    if (S.stack === 'allocation') {
      // The summarised band (bucket level), then each drawn allocation (its own steps).
      g.fillStyle = '#cbd5e1'; g.globalAlpha = hl ? 0.4 : 1;
      for (let i = i0; i <= i1; i++) {
        const rest = lv.alloc[i] - lv.drawn[i];
        if (rest <= 0) continue;
        // Whole pixels, so that adjacent buckets leave no seam.
        const xa = Math.floor(Math.max(TL_LEFT, X(lv.first[i]))), xb = Math.ceil(Math.min(w, X(next(i))));
        g.fillRect(xa, Y(lv.drawn[i] + rest), Math.max(1, xb - xa), Y(lv.drawn[i]) - Y(lv.drawn[i] + rest));
      }
      const A = c.allocs;
      let shown = 0;
      for (const i of c.drawn) {
        const a = A[i * AL + 3], end = A[i * AL + 4] >= 0 ? A[i * AL + 4] : c.states;
        if (end < S.x0 || a > S.x1) continue;
        const P = c.pts.get(i), size = A[i * AL + 1];
        g.fillStyle = allocColour(c, i);
        g.globalAlpha = dimAlloc(c, i) ? 0.2 : 1;
        shown++;
        // Level of detail: steps narrower than a pixel are merged into one rectangle
        // spanning their offsets (an allocation dropping many times inside one pixel
        // column), so a redraw costs pixels, not steps.
        let q = 0;
        if (P.length > 2 && P[2] < S.x0) { let lo = 0, hi = P.length / 2 - 1; while (lo < hi) { const h = (lo + hi + 1) >> 1; if (P[2 * h] <= S.x0) lo = h; else hi = h - 1; } q = 2 * lo; }
        let rx = -1, rxb = 0, rlo = 0, rhi = 0;
        const flush = () => { if (rx >= 0) g.fillRect(rx, Y(rhi), Math.max(0.7, rxb - rx), Math.max(0.5, Y(rlo) - Y(rhi))); rx = -1; };
        for (; q < P.length; q += 2) {
          const sa = P[q];
          if (sa > S.x1) break;
          const sb = q + 2 < P.length ? P[q + 2] : end;
          if (sb < S.x0) continue;
          const xa = Math.max(TL_LEFT, X(sa)), xb = Math.min(w, X(sb)), off = P[q + 1];
          if (rx >= 0 && xa - rx < 1) { rxb = xb; rlo = Math.min(rlo, off); rhi = Math.max(rhi, off + size); continue; }
          flush();
          rx = xa; rxb = xb; rlo = off; rhi = off + size;
        }
        flush();
        if (i === S.sel) {
          g.globalAlpha = 1; g.strokeStyle = '#111'; g.lineWidth = 1.5;
          for (let q = 0; q < P.length; q += 2) {
            const sb = q + 2 < P.length ? P[q + 2] : end, off = P[q + 1];
            g.strokeRect(Math.max(TL_LEFT, X(P[q])), Y(off + size), Math.max(1, Math.min(w, X(sb)) - Math.max(TL_LEFT, X(P[q]))), Math.max(1, Y(off) - Y(off + size)));
          }
        }
      }
      g.globalAlpha = 1;
      cv.dataset.allocsShown = String(shown);
    } else if (S.stack === 'segment') {
      // Each segment (or mapped range of an expandable one) one polygon over its life, as
      // memory_viz's Active Cached Segment Timeline stacks them.
      const G = layoutSegments(c), A = G.A;
      let shown = 0;
      for (const i of G.drawn) {
        const a = A[i * AL + 3], end = A[i * AL + 4] >= 0 ? A[i * AL + 4] : c.states;
        if (end < S.x0 || a > S.x1) continue;
        const P = G.pts.get(i), size = A[i * AL + 1];
        g.fillStyle = S.colour === 'allocation' ? color(Math.abs(Math.round(A[i * AL] / 512) * 31 + a) % 9973) : color(A[i * AL + 5]);
        g.globalAlpha = S.highlight && !S.highlight.has(A[i * AL + 5]) ? 0.2 : 1;
        shown++;
        for (let q = 0; q < P.length; q += 2) {
          const sb = q + 2 < P.length ? P[q + 2] : end;
          if (sb < S.x0 || P[q] > S.x1) continue;
          const xa = Math.max(TL_LEFT, X(P[q])), xb = Math.min(w, X(sb)), off = P[q + 1];
          g.fillRect(xa, Y(off + size), Math.max(0.7, xb - xa), Math.max(0.5, Y(off) - Y(off + size)));
        }
        if (i === G.sel) {
          g.globalAlpha = 1; g.strokeStyle = '#111'; g.lineWidth = 1.5;
          for (let q = 0; q < P.length; q += 2) {
            const sb = q + 2 < P.length ? P[q + 2] : end, off = P[q + 1];
            g.strokeRect(Math.max(TL_LEFT, X(P[q])), Y(off + size), Math.max(1, Math.min(w, X(sb)) - Math.max(TL_LEFT, X(P[q]))), Math.max(1, Y(off) - Y(off + size)));
          }
        }
      }
      g.globalAlpha = 1;
      cv.dataset.segmentsShown = String(shown);
    } else if (S.stack === 'role') {
      // Stacked roles (tensor bytes at the bucket's allocated maximum), then the rest of
      // allocated there (blocks' rounding above their requests).
      const R = c.R;
      for (let i = i0; i <= i1; i++) {
        const xa = Math.floor(Math.max(TL_LEFT, X(lv.first[i]))), xb = Math.ceil(Math.min(w, X(next(i))));
        const bw = Math.max(1, xb - xa);
        let base = 0;
        for (let j = 0; j < R; j++) {
          const v = lv.rat[i * R + j];
          if (v <= 0) continue;
          g.globalAlpha = S.highlightRole != null && S.highlightRole !== j ? 0.25 : 1;
          g.fillStyle = roleColour(c.roles[j]);
          g.fillRect(xa, Y(base + v), bw, Y(base) - Y(base + v));
          base += v;
        }
        g.globalAlpha = 1;
        const rest = lv.alloc[i] - base;
        if (rest > 0) { g.fillStyle = '#e2e8f0'; g.fillRect(xa, Y(base + rest), bw, Y(base) - Y(base + rest)); }
      }
    } else {
      // Stacked call-site bands, then the rest of allocated.
      for (let i = i0; i <= i1; i++) {
        const xa = Math.max(TL_LEFT, X(lv.first[i])), xb = Math.min(w, X(next(i)));
        const bw = Math.max(1, xb - xa);
        let base = 0;
        for (let j = 0; j < S.bands && j < k; j++) {
          const v = lv.sites[i * k + j];
          if (v <= 0) continue;
          const si = dev.curves.site_stacks[j];
          g.globalAlpha = S.highlight && !S.highlight.has(si) ? 0.25 : 1;
          g.fillStyle = color(si);
          g.fillRect(xa, Y(base + v), bw, Y(base) - Y(base + v));
          base += v;
        }
        g.globalAlpha = hl ? 0.25 : 1;
        const rest = lv.alloc[i] - base;
        if (rest > 0) { g.fillStyle = '#cbd5e1'; g.fillRect(xa, Y(base + rest), bw, Y(base) - Y(base + rest)); }
        g.globalAlpha = 1;
      }
    }
    // Curves (step lines at bucket maxima).
    const line = (arr, col, dash) => {
      g.strokeStyle = col; g.lineWidth = 1.5; g.setLineDash(dash || []); g.beginPath();
      for (let i = i0; i <= i1; i++) {
        const xa = Math.max(TL_LEFT, X(lv.first[i])), xb = Math.min(w, X(next(i)));
        if (i === i0) g.moveTo(xa, Y(arr[i])); else g.lineTo(xa, Y(arr[i]));
        g.lineTo(xb, Y(arr[i]));
      }
      g.stroke(); g.setLineDash([]);
    };
    line(lv.res, '#ef4444');
    line(lv.req, '#10b981', [4, 3]);
    line(lv.alloc, '#1d4ed8');
    // Search hits: lifetimes of matching allocations.
    for (const hit of S.hits) {
      if (hit.free >= 0 && hit.free < S.x0) continue;
      const a = Math.max(TL_LEFT, X(hit.alloc)), b = Math.min(w, X(hit.free < 0 ? c.states : hit.free));
      g.fillStyle = 'rgba(234,88,12,0.8)'; g.fillRect(a, TL_TOP + ph - 4, Math.max(2, b - a), 4);
    }
    // The OOM: a red line at the failed request, labelled with it.
    const ao = analysisDev(file);
    cv.dataset.oomX = '';
    if (ao && ao.oom) {
      const o = ao.oom, x = X(o.event_index);
      if (o.event_index >= S.x0 - 1 && o.event_index <= S.x1) {
        g.strokeStyle = '#b42318'; g.lineWidth = 2; g.beginPath(); g.moveTo(x, TL_TOP); g.lineTo(x, TL_TOP + ph); g.stroke();
        const label = `OOM: ${bytes(o.request_bytes)} requested`;
        g.font = 'bold 11px sans-serif'; g.fillStyle = '#b42318';
        const lw = g.measureText(label).width;
        g.fillText(label, x + 4 + lw > w ? x - 4 - lw : x + 4, TL_TOP + ph - 6);
        cv.dataset.oomX = String(x);
      }
    }
    // The state view's position.
    if (c.moments.length) {
      const x = X(stateOf(c, S.state).state);
      g.strokeStyle = '#111'; g.setLineDash([2, 2]); g.beginPath(); g.moveTo(x, TL_TOP); g.lineTo(x, TL_TOP + ph); g.stroke(); g.setLineDash([]);
    }
    g.restore();
    axes(g, w, h, ph, ymax, c, lv, pw);
    info.textContent = `events ${Math.floor(S.x0)}–${Math.ceil(S.x1) - 1}`;
    cv.dataset.x0 = S.x0; cv.dataset.x1 = S.x1; cv.dataset.buckets = i1 - i0 + 1;
    cv.dataset.level = c.levels.indexOf(lv); cv.dataset.axis = timeAxis() ? 'time' : 'events'; cv.dataset.ymax = String(ymax);
    cv.dataset.peakReserved = Math.max(...Array.from(c.levels[c.levels.length - 1].res));
    cv.dataset.peakAllocated = Math.max(...Array.from(c.levels[c.levels.length - 1].alloc));
  }
  // The whole trace at the level that fits the minimap's width: reserved and allocated,
  // and the window the timeline shows.
  function drawMinimap(c, mini) {
    const zoomed = S.x0 > 0 || S.x1 < c.states;
    mini.style.display = zoomed ? '' : 'none';
    mini.dataset.zoomed = zoomed ? '1' : '0';
    if (!zoomed) return;
    const { g, w, h } = ctxOf(mini);
    const pw = w - TL_LEFT;
    let L = 0;
    while (L < c.levels.length - 1 && c.levels[L].n > pw) L++;
    const lv = c.levels[L];
    let ymax = 1;
    for (let i = 0; i < lv.n; i++) ymax = Math.max(ymax, lv.res[i], lv.alloc[i]);
    const X = (s) => TL_LEFT + (s / c.states) * pw, Y = (v) => h - 2 - (v / ymax) * (h - 6);
    for (const [arr, col] of [[lv.res, '#ef4444'], [lv.alloc, '#1d4ed8']]) {
      g.strokeStyle = col; g.lineWidth = 1; g.beginPath();
      for (let i = 0; i < lv.n; i++) {
        const xa = X(lv.first[i]), xb = X(i + 1 < lv.n ? lv.first[i + 1] : c.states);
        if (i === 0) g.moveTo(xa, Y(arr[i])); else g.lineTo(xa, Y(arr[i]));
        g.lineTo(xb, Y(arr[i]));
      }
      g.stroke();
    }
    const a = X(S.x0), b = Math.max(a + 2, X(S.x1));
    g.fillStyle = 'rgba(100,116,139,0.18)';
    g.fillRect(TL_LEFT, 0, a - TL_LEFT, h); g.fillRect(b, 0, w - b, h);
    g.strokeStyle = '#111'; g.lineWidth = 1.5; g.strokeRect(a, 1, b - a, h - 2);
    g.fillStyle = '#667085'; g.font = '10px sans-serif'; g.fillText('whole trace', 2, 12);
    mini.dataset.x0 = String(S.x0); mini.dataset.x1 = String(S.x1); mini.dataset.boxX = String(a); mini.dataset.boxW = String(b - a);
  }
  function axes(g, w, h, ph, ymax, c, lv, pw) {
    g.fillStyle = '#667085'; g.strokeStyle = '#e4e7ec'; g.font = '10px sans-serif'; g.lineWidth = 1;
    for (let t = 0; t <= 4; t++) {
      const v = (ymax / 1.05) * (t / 4), y = TL_TOP + ph - (v / ymax) * ph;
      g.beginPath(); g.moveTo(TL_LEFT, y); g.lineTo(w, y); g.stroke();
      g.fillText(bytes(v), 2, y + 3);
    }
    const k = timeAxis() ? c.clock : null;
    for (let t = 0; t <= 5; t++) {
      const x = TL_LEFT + (pw * t) / 5;
      if (c.states < 6 && t > 0) break;
      let label;
      if (k) {
        // Evenly spaced in time: seconds since the first timed event.
        const a = k.at(S.x0), b = k.at(S.x1);
        label = ((a + ((b - a) * t) / 5 - k.t0) / 1e6).toFixed(b - a < 5e3 ? 6 : b - a < 5e6 ? 3 : 1) + ' s';
      } else {
        const s = S.x0 + ((S.x1 - S.x0) * t) / 5;
        label = String(Math.min(Math.floor(s), c.states - 1));
      }
      g.fillText(label, Math.max(0, Math.min(x, w - g.measureText(label).width - 2)), h - 4);
    }
  }
  function timelineClick(file, dev, c, x, y, w, h) {
    if (x < TL_LEFT) return;
    const G = tlGeom(c, w, h), { lv, ymax, ph } = G;
    const s = stateAt(x - TL_LEFT, w - TL_LEFT);
    let lo = 0, hi = lv.n - 1;
    while (lo < hi) { const m = (lo + hi + 1) >> 1; if (lv.first[m] <= s) lo = m; else hi = m - 1; }
    const v = ((TL_TOP + ph - y) / ph) * ymax;
    // Linked by time: the state view moves to the clicked event.
    if (c.moments.length) {
      S.state = Math.floor(s);
      const sl = document.getElementById('moment');
      if (sl) sl.value = String(stateOf(c, S.state).state);
    }
    const head = el('div', {}, el('div', {}, `Event ${Math.floor(s)}: allocated ${bytes(lv.alloc[lo])}, requested ${bytes(lv.req[lo])}, reserved ${bytes(lv.res[lo])} (maxima of this bucket)`));
    if (S.stack === 'allocation') {
      let hit = -1;
      for (const i of c.drawn) {
        const off = allocOffset(c, i, s);
        if (off != null && v >= off && v < off + c.allocs[i * AL + 1]) { hit = i; break; }
      }
      if (hit >= 0) { allocInfo(file, c, hit, head); return; }
      S.sel = -1;
      redrawAll();
      detail.textContent = '';
      detail.append(head, el('p', { class: 'note' }, v < lv.alloc[lo] ? 'Grey band: allocations smaller than the drawn ones (raise the number drawn to see them one by one).' : 'Click an allocation for its stack.'));
      return;
    }
    if (S.stack === 'segment') {
      const G = layoutSegments(c), A = G.A;
      let hit = -1;
      for (const i of G.drawn) {
        const off = livesOffset(G, i, s, c.states);
        if (off != null && v >= off && v < off + A[i * AL + 1]) { hit = i; break; }
      }
      G.sel = hit;
      detail.textContent = '';
      detail.append(head);
      if (hit < 0) { S.highlight = null; redrawAll(); detail.append(el('p', { class: 'note' }, 'Click a segment for its address, life and stack.')); return; }
      const o = hit * AL, si = A[o + 5];
      S.highlight = new Set([si]);
      redrawAll();
      const made = A[o + 3] > 0 ? `reserved at event ${A[o + 3] - 1}` : 'reserved before the trace';
      const gone = A[o + 4] >= 0 ? `released at event ${A[o + 4] - 1}` : 'still reserved at the end';
      showStack(file, si, `Segment ${hex(A[o])}: ${bytes(A[o + 1])}, ${made}, ${gone}`, head);
      detail.append(el('div', { id: 'segment-info', class: 'note', 'data-addr': String(A[o]), 'data-size': String(A[o + 1]) }, 'The stack that reserved it (cudaMalloc or, for an expandable segment, the mapping).'));
      return;
    }
    if (S.stack === 'role') {
      let base = 0, hit = -1;
      for (let j = 0; j < c.R; j++) {
        const b = lv.rat[lo * c.R + j];
        if (v >= base && v < base + b) { hit = j; break; }
        base += b;
      }
      S.highlightRole = hit >= 0 ? hit : null;
      redrawAll();
      detail.textContent = '';
      detail.append(head);
      if (hit < 0) { detail.append(el('p', { class: 'note' }, v < lv.alloc[lo] ? 'Light band: allocated bytes above the tensors\u2019 requests (block rounding).' : 'Click a coloured band for its role.')); return; }
      const name = c.roles[hit], rb = roleFigures(file, name);
      detail.append(el('div', { id: 'role-info', 'data-role': name }, el('b', {}, ROLE_LABEL[name] || name), `: ${bytes(lv.rat[lo * c.R + hit])} here (at this bucket\u2019s allocated maximum), at most ${bytes(lv.rmax[lo * c.R + hit])} in it`));
      if (rb) {
        detail.append(el('p', { class: 'note' }, `confidence ${rb.confidence.toFixed(2)}; what decided it:`));
        const t = el('table', {}, el('tr', {}, el('th', {}, 'evidence'), el('th', { class: 'n' }, 'blocks'), el('th', { class: 'n' }, 'conf')));
        for (const e of rb.evidence) t.append(el('tr', {}, el('td', {}, e.evidence), el('td', { class: 'n' }, String(e.blocks)), el('td', { class: 'n' }, e.confidence.toFixed(2))));
        detail.append(t);
      }
      detail.append(el('button', { onclick: () => { S.highlightRole = null; redrawAll(); } }, 'clear highlight'));
      return;
    }
    let base = 0, hit = null;
    for (let j = 0; j < S.bands && j < c.k; j++) {
      const b = lv.sites[lo * c.k + j];
      if (v >= base && v < base + b) { hit = j; break; }
      base += b;
    }
    redrawAll();
    if (hit != null) {
      const si = dev.curves.site_stacks[hit];
      // Linked by call site: the state view dims every block of other sites.
      S.highlight = new Set([si]);
      redrawAll();
      showStack(file, si, `Call site ${siteName(file, si)}: ${bytes(lv.sites[lo * c.k + hit])} live here`, head);
      detail.append(el('button', { onclick: () => { S.highlight = null; redrawAll(); } }, 'clear highlight'));
    } else {
      detail.textContent = '';
      detail.append(head, el('p', { class: 'note' }, v < lv.alloc[lo] ? 'Grey band: allocations outside the top call sites.' : 'Click a coloured band for its stack.'));
    }
  }
  // One allocation of the timeline: address, size, its alloc and free events and times,
  // and its whole stack; its call site is highlighted in both views.
  function allocInfo(file, c, i, extra) {
    const A = c.allocs, o = i * AL;
    S.sel = i;
    S.highlight = new Set([A[o + 5]]);
    redrawAll();
    const t0 = c.clock ? c.clock.t0 : NaN;
    const when = (t) => (isNaN(t) ? '' : isNaN(t0) ? ` (time ${t} µs)` : ` (t = ${((t - t0) / 1e6).toFixed(6)} s)`);
    const freed = A[o + 4] >= 0 ? `freed at event ${A[o + 4] - 1}${when(A[o + 7])}` : 'still allocated at the end of the trace';
    const head = el('div', { id: 'alloc-info', 'data-alloc-addr': String(A[o]), 'data-alloc-size': String(A[o + 1]), 'data-alloc-request': String(A[o + 2]),
      'data-alloc-state': String(A[o + 3]), 'data-free-state': String(A[o + 4]), 'data-alloc-index': String(i) },
    el('div', {}, `Allocation ${hex(A[o])}: ${bytes(A[o + 1])} (request ${bytes(A[o + 2])}, ${A[o + 2]} B)`),
    el('div', {}, `${A[o + 3] > 0 ? `allocated at event ${A[o + 3] - 1}${when(A[o + 6])}` : 'allocated before the trace began'}; ${freed}`));
    showStack(file, A[o + 5], 'Allocated at ' + siteName(file, A[o + 5]), extra ? el('div', {}, extra, head) : head);
    detail.append(el('button', { onclick: () => { S.highlight = null; S.sel = -1; redrawAll(); } }, 'clear highlight'));
  }
  // For the tests: the drawn allocations visible now, each with a point inside it (page
  // pixels relative to the canvas) on its widest step.
  api.allocBoxes = () => {
    const c = S.c, cv = document.querySelector('canvas.tl');
    if (!c || !cv || !c.drawn) return [];
    const w = cv.clientWidth, h = cv.clientHeight, G = tlGeom(c, w, h);
    const Y = (v) => TL_TOP + G.ph - (v / G.ymax) * G.ph, X = (s) => TL_LEFT + xOf(s, G.pw);
    const out = [];
    for (const i of c.drawn) {
      const A = c.allocs, P = c.pts.get(i), end = A[i * AL + 4] >= 0 ? A[i * AL + 4] : c.states, size = A[i * AL + 1];
      let best = null;
      for (let q = 0; q < P.length; q += 2) {
        const sa = Math.max(P[q], S.x0), sb = Math.min(q + 2 < P.length ? P[q + 2] : end, S.x1);
        if (sb <= sa) continue;
        const xa = X(sa), xb = X(sb), ya = Y(P[q + 1] + size), yb = Y(P[q + 1]);
        if (!best || (xb - xa) * (yb - ya) > best.area) best = { area: (xb - xa) * (yb - ya), x: (xa + xb) / 2, y: (ya + yb) / 2, w: xb - xa, h: yb - ya };
      }
      if (best) out.push({ index: i, addr: A[i * AL], size, stack: A[i * AL + 5], ...best, x: best.x + cv.clientLeft, y: best.y + cv.clientTop });
    }
    return out;
  };
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

  // ---------- 2. allocator state ----------
  function stateView(file, dev, c) {
    const sec = el('section', { id: 'state' });
    sec.append(el('h2', {}, '2. Allocator state at a moment'));
    if (!c.moments.length) {
      sec.append(el('p', { class: 'note' }, 'No allocator state to show: ' + (dev.moments_note || 'no segments.')));
      views.state = () => {};
      return sec;
    }
    // Any trace state from the first one that can be rebuilt to the end (the slider, the
    // number box and the arrows step one event).
    const last = c.states - 1;
    const slider = el('input', { type: 'range', min: String(c.first), max: String(last), value: String(S.state), id: 'moment' });
    const box = el('input', { type: 'number', min: String(c.first), max: String(last), value: String(S.state), id: 'state-input', style: 'width:8em' });
    const label = el('span', { id: 'moment-label' });
    const go = (v) => { S.state = Math.max(c.first, Math.min(last, Math.round(+v))); redrawAll(); };
    slider.addEventListener('input', () => go(slider.value));
    box.addEventListener('change', () => go(box.value));
    api.setState = (v) => { go(v); return stateOf(c, S.state).state; };
    const jumps = el('span', {});
    const names = { oom: 'OOM', reserved_peak: 'reserved peak', allocated_peak: 'allocated peak', end: 'end' };
    for (const kind of ['oom', 'reserved_peak', 'allocated_peak', 'end']) {
      const m = c.moments.find((m) => m.kinds.includes(kind));
      if (m) jumps.append(el('button', { 'data-jump': kind, onclick: () => go(m.state) }, names[kind]));
    }
    const step = (d) => { const cur = stateOf(c, S.state); go(c.exact ? cur.state + d : (c.moments[Math.max(0, Math.min(c.moments.length - 1, c.moments.indexOf(c.moments.find((m) => m.state === cur.state)) + d))] || cur).state); };
    const figs = el('div', { class: 'figs', id: 'moment-figs' });
    views.stateControls = () => { const st = stateOf(c, S.state).state; slider.value = String(st); box.value = String(st); };
    sec.append(el('div', { class: 'controls' }, 'trace state', slider, el('button', { id: 'state-prev', onclick: () => step(-1) }, '◀'), box,
      el('button', { id: 'state-next', onclick: () => step(1) }, '▶'), jumps), el('div', { class: 'controls' }, label), figs);
    if (dev.moments_note) sec.append(el('p', { class: 'note' }, dev.moments_note));
    sec.append(el('p', { class: 'note', id: 'state-mode' }, c.states === 1 ? 'No trace was recorded: the state view shows the snapshot\u2019s own state.' : c.exact
      ? `Every event from ${c.first} to ${last} can be shown: the page rebuilds the state from the nearest of ${c.moments.length} keyframes and the events' changes.`
      : `This trace is too long to embed every event's changes: the view snaps to the nearest of ${c.moments.length} keyframes (about every ${Math.round(c.states / Math.max(1, c.moments.length))} events) and says which event it shows.`));
    // The event list (memory_viz's): the trace entries around the state shown, the one
    // that made it highlighted; arrow keys step, a click goes to an entry, hovering one
    // shows its stack.
    const list = el('div', { id: 'events', class: 'events', tabindex: '0', title: 'trace entries: ↑/↓ step, click: go, hover: stack' });
    list.addEventListener('keydown', (e) => {
      if (e.key === 'ArrowDown' || e.key === 'ArrowRight') { e.preventDefault(); step(1); }
      else if (e.key === 'ArrowUp' || e.key === 'ArrowLeft') { e.preventDefault(); step(-1); }
    });
    api.stepEvent = (d) => { step(d); return stateOf(c, S.state).state; };
    keyStep = (e) => {
      if (e.target !== document.body) return;
      if (e.key === 'ArrowDown') { e.preventDefault(); step(1); }
      else if (e.key === 'ArrowUp') { e.preventDefault(); step(-1); }
    };
    views.events = () => {
      list.textContent = '';
      const cur = stateOf(c, S.state).state - 1;
      let shown = 0;
      for (let i = Math.max(0, cur - 6); i <= Math.min(c.states - 2, cur + 8); i++) {
        const e = eventAt(c, i);
        const row = el('div', { class: 'ev' + (i === cur ? ' cur' : '') + (e && e.action === 'oom' ? ' oom' : ''), 'data-event': String(i),
          onclick: () => go(i + 1), onmouseenter: () => { if (e && e.stack >= -1) showStack(file, e.stack, `Event ${i}: ${describeEvent(e)}`); } },
        el('span', { class: 'n' }, String(i)), ' ', e ? describeEvent(e) : '(not embedded: the page lists the entries around the OOM, the peaks and the end)');
        list.append(row);
        shown++;
      }
      if (!shown) list.append(el('div', { class: 'note' }, 'No trace entry.'));
      list.dataset.current = String(cur);
    };
    const cv = canvas('st', 200);
    sec.append(el('h3', {}, 'Trace entries'), list);
    sec.append(cv, el('div', { class: 'legend note' }, el('i', { style: 'background:#e5e7eb' }), 'free', el('i', { style: 'background:var(--pend)' }), 'pending free',
      el('i', { style: 'background:#64748b' }), 'rounding slack (block − request); allocated blocks coloured by call site · hover a free block: which requests it could serve · click a block: its stack'));
    let rects = [];
    cv.addEventListener('mousemove', (e) => {
      const r = cv.getBoundingClientRect();
      const b = pick(rects, e.clientX - r.left, e.clientY - r.top);
      cv.style.cursor = b ? 'pointer' : 'default';
      if (b && b.st === 0) freeBlockInfo(file, dev, c, b);
    });
    cv.addEventListener('click', (e) => {
      const r = cv.getBoundingClientRect();
      const b = pick(rects, e.clientX - r.left, e.clientY - r.top);
      if (b) blockInfo(file, c, b);
    });
    api.blockRects = () => rects.map((b) => ({ x: b.x, y: b.y, w: b.w, h: b.h, state: b.st, stack: b.stack, addr: b.addr }));
    views.state = () => { rects = drawState(file, dev, c, cv, label, figs); };
    return sec;
  }
  function pick(rects, x, y) {
    for (const b of rects) if (x >= b.x && x < b.x + Math.max(b.w, 1) && y >= b.y && y < b.y + b.h) return b;
    return null;
  }
  function drawState(file, dev, c, cv, label, figs) {
    const m = stateOf(c, S.state);
    const segs = m.segs, blocks = m.blocks;
    const nseg = segs.length / 4;
    let maxSeg = 0, total = 0;
    for (let i = 0; i < nseg; i++) { maxSeg = Math.max(maxSeg, segs[4 * i + 1]); total += segs[4 * i + 1]; }
    // Segments laid left to right in address order, wrapping at a row width of at least
    // the largest segment, so a few hundred segments fit in ~60 rows. A segment larger
    // than 1/24 of everything (an expandable segment is often the whole reservation)
    // does not set the width: it wraps over rows of its own, as a long text does.
    // Whole bytes, so that offsets split into rows exactly (sizes are below 2^53).
    const rowBytes = Math.ceil(Math.max(total / 60, Math.min(maxSeg, total / 24))) || 1;
    const place = [];
    let row = 0, used = 0;
    for (let i = 0; i < nseg; i++) {
      const sz = segs[4 * i + 1];
      if (sz > rowBytes) {
        if (used > 0) row++;
        place.push([row, 0, true]);
        const n = Math.ceil(sz / rowBytes);
        row += n - 1; used = sz - (n - 1) * rowBytes + rowBytes * 0.004;
        continue;
      }
      if (used > 0 && used + sz > rowBytes) { row++; used = 0; }
      place.push([row, used, false]); used += sz + rowBytes * 0.004;
    }
    const rows = nseg ? row + 1 : 0;
    // The pieces [row, offset in the row, length] of the bytes [o, o + len) of segment si.
    const pieces = (si, o, len) => {
      const [r0, off0, wraps] = place[si];
      if (!wraps) return [[r0, off0 + o, len]];
      const out = [];
      while (len > 0) {
        const r = Math.floor(o / rowBytes), x = o - r * rowBytes, n = Math.max(1, Math.min(len, rowBytes - x));
        out.push([r0 + r, x, n]);
        o += n; len -= n;
      }
      return out;
    };
    // Thinner rows when there are many, so the view stays within ~700 px.
    const rowH = Math.max(3, Math.min(14, Math.floor(700 / Math.max(rows, 1)) - 3)), gap = rowH > 6 ? 3 : 1;
    cv.style.height = Math.max(40, rows * (rowH + gap) + 6) + 'px';
    const { g, w } = ctxOf(cv);
    const sx = (w - 4) / (rowBytes * 1.004);
    const rects = [];
    for (let i = 0; i < nseg; i++) {
      g.fillStyle = '#f1f5f9';
      for (const [r, off, len] of pieces(i, 0, segs[4 * i + 1])) g.fillRect(2 + off * sx, 3 + r * (rowH + gap), Math.max(1, len * sx), rowH);
    }
    for (let i = 0; i < blocks.length; i += 6) {
      const si = blocks[i], o = blocks[i + 1] - segs[4 * si];
      const st = blocks[i + 4], stack = blocks[i + 5];
      // State 3: several small blocks merged (a coarse keyframe), shaded by the share
      // of their bytes allocated.
      const fill = st === 0 ? '#e5e7eb' : st === 2 ? '#f59e0b' : st === 3 ? `rgba(71,85,105,${(0.15 + 0.75 * blocks[i + 3] / Math.max(1, blocks[i + 2])).toFixed(2)})`
        : S.colour === 'allocation' ? color(Math.round(blocks[i + 1] / 512) % 9973) : color(stack);
      g.globalAlpha = S.highlight && (st === 1 || st === 2) && !S.highlight.has(stack) ? 0.2 : 1;
      // Rounding slack (block − request) at the block's end: the last bytes.
      const slackFrom = st === 1 && blocks[i + 3] < blocks[i + 2] ? o + blocks[i + 3] : Infinity;
      let p = o; // offset in the segment of the piece's first byte
      for (const [r, off, len] of pieces(si, o, blocks[i + 2])) {
        const x = 2 + off * sx, bw = len * sx, y = 3 + r * (rowH + gap);
        g.fillStyle = fill;
        g.fillRect(x, y, Math.max(bw - (bw > 3 ? 1 : 0), 0.6), rowH);
        const a = Math.max(slackFrom, p), b = p + len;
        if (b > a && bw > 2) { g.fillStyle = 'rgba(30,41,59,0.55)'; g.fillRect(x + (a - p) * sx, y + rowH / 2, (b - a) * sx, rowH / 2); }
        rects.push({ x, y, w: bw, h: rowH, st, stack, i, seg: si, addr: blocks[i + 1] });
        p += len;
      }
      g.globalAlpha = 1;
    }
    // Segment outlines, over the blocks (each segment's pieces).
    g.strokeStyle = '#94a3b8'; g.lineWidth = 1;
    for (let i = 0; i < nseg; i++) for (const [r, off, len] of pieces(i, 0, segs[4 * i + 1])) g.strokeRect(2 + off * sx + 0.5, 3 + r * (rowH + gap) + 0.5, Math.max(1, len * sx - 1), rowH - 1);
    cv.dataset.rows = String(rows);
    const f = m.fig;
    const kinds = m.kinds.filter((k) => k !== 'step').join(', ');
    const ev = m.state > 0 ? eventAt(c, m.state - 1) : null;
    const after = m.state === 0 ? 'before the first event' : `after event ${m.state - 1}${ev ? ': ' + describeEvent(ev) : ''}`;
    label.textContent = `trace state ${m.state} of ${c.states - 1} (${after})${kinds ? ' — ' + kinds.replace(/_/g, ' ') : ''}` +
      (m.snapped ? ` — snapped from ${m.asked} to the nearest keyframe, event state ${m.state}` : '') +
      (m.coarse ? ` — ${m.fig.blocks} blocks drawn as ${blocks.length / 6} (small neighbouring blocks merged, grey by their allocated share; figures exact)` : '');
    cv.dataset.state = String(m.state); cv.dataset.asked = String(m.asked); cv.dataset.snapped = m.snapped ? '1' : '0'; cv.dataset.blocks = String(m.fig.blocks);
    cv.dataset.records = String(blocks.length / 6); cv.dataset.coarse = m.coarse ? '1' : '0';
    figs.textContent = '';
    figs.append(fig('moment_reserved_bytes', f.reserved, 'reserved', bytes(f.reserved)), fig('moment_allocated_bytes', f.allocated, 'allocated', bytes(f.allocated)),
      fig('moment_pending_bytes', f.pending, 'pending free', bytes(f.pending)), fig('moment_free_bytes', f.free, 'free in cache', bytes(f.free)),
      fig('moment_largest_free_bytes', f.largest, 'largest free block', bytes(f.largest)), fig('moment_fsf', f.fsf, 'free-space fragmentation', pct(f.fsf)),
      fig('moment_slack_bytes', f.slack, 'rounding slack', bytes(f.slack)), fig('moment_segments', nseg, 'segments', String(nseg)));
    return rects;
  }
  function blockInfo(file, c, b) {
    const m = stateOf(c, S.state), B = m.blocks, i = b.i;
    if (B[i + 4] === 3) {
      detail.textContent = '';
      detail.append(el('div', { 'data-merged': String(B[i + 5]) }, `${B[i + 5]} neighbouring blocks ${hex(B[i + 1])}–${hex(B[i + 1] + B[i + 2])}, ${bytes(B[i + 2])}: ${bytes(B[i + 3])} allocated, ${bytes(B[i + 2] - B[i + 3])} free or pending`),
        el('p', { class: 'note' }, 'This state has too many blocks for the page\u2019s size budget: small neighbouring blocks are drawn merged. Blocks drawn alone are exact.'));
      return;
    }
    const st = ['free', 'allocated', 'pending free'][B[i + 4]];
    const head = el('div', {}, el('div', {}, `${st} block ${hex(B[i + 1])}, ${bytes(B[i + 2])}` + (B[i + 4] === 1 ? ` (request ${bytes(B[i + 3])}, slack ${bytes(B[i + 2] - B[i + 3])})` : '')),
      el('div', { class: 'note' }, `segment ${hex(m.segs[4 * b.seg])}, ${bytes(m.segs[4 * b.seg + 1])}, stream ${streamName(file, m.segs[4 * b.seg + 2])}${m.segs[4 * b.seg + 3] & 1 ? ', small pool' : ', large pool'}${m.segs[4 * b.seg + 3] & 2 ? ', expandable' : ''}${m.segs[4 * b.seg + 3] & 4 ? ', private pool' : ''}`));
    if (B[i + 4] === 0) { detail.textContent = ''; detail.append(head); return; }
    // Linked by call site: the timeline dims the other sites' bands.
    S.highlight = new Set([B[i + 5]]);
    redrawAll();
    showStack(file, B[i + 5], 'Allocated at ' + siteName(file, B[i + 5]), head);
    detail.append(el('button', { onclick: () => { S.highlight = null; redrawAll(); } }, 'clear highlight'));
  }
  function freeBlockInfo(file, dev, c, b) {
    const m = stateOf(c, S.state), B = m.blocks, size = B[b.i + 2];
    const small = m.segs[4 * b.seg + 3] & 1;
    // PyTorch serves requests ≤ 1 MiB from the small pool, larger ones from the large pool.
    let n = 0, kinds = 0, biggest = 0;
    for (let i = 0; i < c.requests.length; i += 2) {
      const r = c.requests[i];
      if ((small ? r <= 1048576 : r > 1048576) && r <= size) { n += c.requests[i + 1]; kinds++; biggest = r; }
    }
    detail.textContent = '';
    detail.append(el('div', {}, `free block ${hex(B[b.i + 1])}, ${bytes(size)} in a ${small ? 'small' : 'large'}-pool segment`),
      el('p', { 'data-free-serves': String(n) }, n ? `It could have served ${n} of the trace's requests (${kinds} distinct sizes, the largest ${bytes(biggest)}): those of its pool and stream no larger than it.` : 'No request recorded in the trace was small enough and of its pool.'));
  }

  // ---------- 3. fragmentation over time ----------
  function fragView(file, dev, c) {
    const sec = el('section', { id: 'fragmentation' });
    sec.append(el('h2', {}, '3. Fragmentation over time'));
    const a = analysisDev(file);
    const cv = canvas('fr', 180);
    sec.append(cv, el('div', { class: 'legend note' }, el('i', { style: 'background:#7c3aed' }), 'fragmentation 1 − allocated/reserved (bucket maxima)',
      el('i', { style: 'background:#0ea5e9' }), 'largest free block, at the captured moments only (dots; right scale)', el('i', { style: 'background:#f97316' }), 'largest request in the bucket (right scale)'));
    if (a) {
      const p = a.fragmentation.pinned_segments;
      const at = a.fragmentation.at_reserved_peak;
      sec.append(el('div', { class: 'figs' },
        fig('fragmentation_at_reserved_peak', a.fragmentation.timeline.fragmentation_at_reserved_peak ?? 'null', 'fragmentation at the reserved peak', pct(a.fragmentation.timeline.fragmentation_at_reserved_peak)),
        at ? fig('largest_free_at_reserved_peak', at.largest_free_block_bytes, 'largest free block at the reserved peak', bytes(at.largest_free_block_bytes)) : null,
        p ? fig('pinned_segments', p.segments ?? p.count ?? 0, 'pinned segments (one live block keeps them)', String(p.segments ?? p.count ?? 0)) : null));
    }
    views.frag = () => drawFrag(c, cv);
    return sec;
  }
  function drawFrag(c, cv) {
    const { g, w, h } = ctxOf(cv);
    const lv = c.levels[levelFor(c, w - TL_LEFT)];
    const [i0, i1] = bucketRange(lv, c);
    const ph = h - TL_TOP - TL_BOTTOM, pw = w - TL_LEFT;
    const X = (s) => TL_LEFT + xOf(s, pw);
    const next = (i) => (i + 1 < lv.n ? lv.first[i + 1] : c.states);
    g.strokeStyle = '#7c3aed'; g.lineWidth = 1.5; g.beginPath();
    for (let i = i0; i <= i1; i++) {
      const f = lv.res[i] > 0 ? Math.max(0, 1 - lv.alloc[i] / lv.res[i]) : 0;
      const y = TL_TOP + ph * (1 - f);
      if (i === i0) g.moveTo(Math.max(TL_LEFT, X(lv.first[i])), y); else g.lineTo(X(lv.first[i]), y);
      g.lineTo(Math.min(w, X(next(i))), y);
    }
    g.stroke();
    let bmax = 1;
    for (let i = i0; i <= i1; i++) bmax = Math.max(bmax, lv.maxreq[i]);
    for (const m of c.moments) bmax = Math.max(bmax, m.fig.largest);
    const YB = (v) => TL_TOP + ph * (1 - v / (bmax * 1.05));
    g.fillStyle = 'rgba(249,115,22,0.7)';
    for (let i = i0; i <= i1; i++) if (lv.maxreq[i] > 0) g.fillRect(Math.max(TL_LEFT, X(lv.first[i])), YB(lv.maxreq[i]) - 1, Math.max(1.5, X(next(i)) - X(lv.first[i])), 2);
    // The largest free block is known only at the captured moments (keyframes): a dot
    // each, not a line (nothing is known between them).
    g.fillStyle = '#0ea5e9';
    let dots = 0;
    for (const m of c.moments) if (m.state >= S.x0 && m.state <= S.x1) { g.beginPath(); g.arc(X(m.state), YB(m.fig.largest), 3, 0, 2 * Math.PI); g.fill(); dots++; }
    cv.dataset.freeDots = String(dots);
    // Two scales: fragmentation on the left, bytes (largest free block, largest request)
    // on the right.
    g.fillStyle = '#667085'; g.font = '10px sans-serif';
    g.fillText('100%', 2, TL_TOP + 3); g.fillText('50%', 2, TL_TOP + ph / 2 + 3); g.fillText('0%', 2, TL_TOP + ph + 3);
    for (const f of [0, 0.5, 1]) { const v = bmax * 1.05 * f, label = bytes(v); g.fillText(label, w - g.measureText(label).width - 3, YB(v) + (f === 1 ? 9 : f === 0 ? -2 : 3)); }
    g.fillText('left: fragmentation · right: bytes', TL_LEFT + 4, TL_TOP - 4);
    cv.dataset.x0 = S.x0; cv.dataset.x1 = S.x1;
  }

  // ---------- 4. what-if ----------
  function whatIfView(file, dev) {
    const sec = el('section', { id: 'whatif' });
    sec.append(el('h2', {}, '4. What if: the replay under other settings'));
    const a = analysisDev(file);
    const r = a && a.recommendations;
    if (!r || !r.baseline) {
      sec.append(el('p', { class: 'note' }, (r && r.note) || 'No replay was run for this device (replays run on devices with an OOM; `fragscope analyze --what-if` runs them everywhere).'));
      return sec;
    }
    const rows = [Object.assign({ setting: 'recorded settings', baseline: true }, r.baseline)].concat(r.recommended || []);
    const peak = Math.max(...rows.map((x) => x.peak_reserved_bytes || 0), 1);
    const t = el('table', {}, el('tr', {}, el('th', {}, 'setting'), el('th', { class: 'n' }, 'peak reserved'), el('th', {}, ''), el('th', { class: 'n' }, 'cudaMalloc'), el('th', {}, 'OOM')));
    for (const x of rows) {
      const oom = x.baseline ? (x.ooms ? `OOM at event ${x.first_oom_index}` : 'no OOM') : x.avoids_oom ? 'gets past the OOM' : x.avoids_oom === false ? 'still OOMs' : '';
      t.append(el('tr', { 'data-setting': x.setting }, el('td', {}, x.setting), el('td', { class: 'n' }, bytes(x.peak_reserved_bytes)),
        el('td', {}, el('span', { class: 'bar', style: `width:${(200 * (x.peak_reserved_bytes || 0)) / peak}px;background:${x.baseline ? '#ef4444' : '#7c3aed'}` })),
        el('td', { class: 'n' }, x.cuda_mallocs ?? '—'), el('td', {}, oom)));
    }
    if (dev.whatif && dev.whatif.length) sec.append(whatIfChart(dev, r.capacity_bytes));
    sec.append(t, el('p', { class: 'note' }, `Capacity ${bytes(r.capacity_bytes)}. ` + (r.recommended || []).map((x) => `${x.setting}: ${x.reason}.`).join(' ')));
    return sec;
  }
  // Reserved curves of the replays, each against the fraction of its own trace (a replay
  // makes its own segment events); × marks the first OOM of each.
  function whatIfChart(dev, capacity) {
    const PALETTE = ['#ef4444', '#0ea5e9', '#8b5cf6', '#f97316', '#65a30d', '#14b8a6', '#ca8a04', '#ec4899', '#6366f1', '#78716c'];
    const curves = dev.whatif.map((w, i) => ({ ...w, xs: f64(w.x), ys: f64(w.reserved), col: PALETTE[i % PALETTE.length] }));
    const cv = canvas('wi', 220);
    cv.dataset.curves = String(curves.length);
    const legend = el('div', { class: 'legend note' });
    for (const c of curves) legend.append(el('i', { style: `background:${c.col}` }), `${c.setting} (peak ${bytes(c.peak_reserved_bytes)}${c.first_oom_index != null ? ', OOM at event ' + c.first_oom_index : ''})`);
    legend.append(' · x: share of each replay’s own trace; dashed: device capacity');
    views.whatif = () => {
      const { g, w, h } = ctxOf(cv);
      const ph = h - TL_TOP - TL_BOTTOM, pw = w - TL_LEFT;
      let ymax = Math.max(1, capacity || 0);
      for (const c of curves) for (const y of c.ys) ymax = Math.max(ymax, y);
      ymax *= 1.05;
      const Y = (v) => TL_TOP + ph - (v / ymax) * ph, X = (f) => TL_LEFT + f * pw;
      g.font = '10px sans-serif'; g.fillStyle = '#667085';
      for (let t = 0; t <= 4; t++) { const v = (ymax / 1.05) * (t / 4); g.fillText(bytes(v), 2, Y(v) + 3); }
      if (capacity) { g.strokeStyle = '#111'; g.setLineDash([5, 4]); g.beginPath(); g.moveTo(TL_LEFT, Y(capacity)); g.lineTo(w, Y(capacity)); g.stroke(); g.setLineDash([]); }
      // The recorded settings last, on top: the alternatives often follow it for a while.
      const marks = [];
      for (const c of [...curves.slice(1), curves[0]]) {
        g.strokeStyle = c.col; g.lineWidth = c === curves[0] ? 2.5 : 1.5; g.beginPath();
        for (let i = 0; i < c.ys.length; i++) { const x = X(c.xs[i]), y = Y(c.ys[i]); if (i) g.lineTo(x, y); else g.moveTo(x, y); }
        g.stroke();
        if (c.first_oom_index != null) {
          // Kept inside the plot (an OOM at the last event is at the right edge).
          const x = Math.max(TL_LEFT + 6, Math.min(w - 7, X(c.first_oom_index / Math.max(1, dev.events)))), y = Math.max(TL_TOP + 6, Y(c.ys.reduce((a, b) => Math.max(a, b), 0)));
          marks.push(x);
          g.lineWidth = 2; g.beginPath(); g.moveTo(x - 5, y - 5); g.lineTo(x + 5, y + 5); g.moveTo(x + 5, y - 5); g.lineTo(x - 5, y + 5); g.stroke();
        }
      }
      cv.dataset.oomMarks = JSON.stringify(marks);
      cv.dataset.width = String(w);
    };
    return el('div', {}, cv, legend);
  }

  // ---------- 5. findings ----------
  function findingsView(file, dev) {
    const sec = el('section', { id: 'findings' });
    sec.append(el('h2', {}, '5. Findings'));
    const a = analysisDev(file);
    if (!a) { sec.append(el('p', { class: 'note' }, 'No analysis for this device.')); return sec; }
    const ul = el('ul', { id: 'finding-list' });
    for (const f of a.findings) ul.append(el('li', { 'data-kind': f.kind }, el('span', { class: 'sev-' + f.severity }, f.severity), ' ', f.headline));
    sec.append(ul);
    if (a.oom) sec.append(el('p', {}, el('b', {}, 'OOM: '), a.oom.explanation || a.oom.verdict));
    if (a.leak_steps && !a.leak_steps.can_tell) sec.append(el('p', { class: 'note', id: 'leak-cannot-tell' }, 'Leaks: ' + a.leak_steps.reason));
    if (a.leak_suspects.length) {
      const t = el('table', { id: 'leaks' }, el('tr', {}, el('th', {}, 'leak suspect'), el('th', { class: 'n' }, 'growth / step'), el('th', { class: 'n' }, 'first → last'), el('th', { class: 'n' }, 'confidence'), el('th', {}, 'live bytes at each step end')));
      for (const l of a.leak_suspects) {
        const curve = (dev.leaks || []).find((c) => c.site === l.site);
        const spark = curve ? sparkline(f64(curve.bytes)) : null;
        t.append(el('tr', {}, el('td', { title: l.stack }, l.site), el('td', { class: 'n' }, bytes(l.growth_bytes_per_step)), el('td', { class: 'n' }, `${bytes(l.first_bytes)} → ${bytes(l.last_bytes)}`), el('td', { class: 'n' }, pct(l.confidence)), el('td', {}, spark)));
      }
      sec.append(el('h3', {}, `Leak suspects (over ${a.leak_steps.steps} training steps)`), t);
    }
    for (const [key, p] of [['allocated peak', a.peaks.allocated_peak], ['reserved peak', a.peaks.reserved_peak]]) {
      if (!p) continue;
      sec.append(el('h3', {}, `Live at the ${key} (${bytes(p.live_bytes)} in ${p.live_blocks} blocks${p.event_index != null ? ', event ' + p.event_index : ''})`));
      sec.append(flame(p));
    }
    return sec;
  }
  // A small curve of a leak suspect's live bytes per step (its samples in data-*).
  function sparkline(ys) {
    const cv = el('canvas', { class: 'spark', 'data-samples': String(ys.length), 'data-first': String(ys[0] ?? ''), 'data-last': String(ys[ys.length - 1] ?? '') });
    cv.style.width = '220px'; cv.style.height = '28px';
    views['spark' + Math.random()] = () => {
      const { g, w, h } = ctxOf(cv);
      const m = Math.max(1, ...ys);
      g.strokeStyle = '#b42318'; g.lineWidth = 1.5; g.beginPath();
      ys.forEach((y, i) => { const x = 2 + (i / Math.max(1, ys.length - 1)) * (w - 4), yy = h - 2 - (y / m) * (h - 4); if (i) g.lineTo(x, yy); else g.moveTo(x, yy); });
      g.stroke();
    };
    return cv;
  }
  // For the tests: the names of the flame graphs' boxes.
  const flameRoots = [];
  api.flameNames = () => { const out = []; const walk = (n) => { out.push(n.name); for (const k of n.kids.values()) walk(k); }; flameRoots.forEach(walk); return out; };
  // Icicle of live bytes by folded stack, outer frames on top.
  function flame(p) {
    const root = { name: 'all', bytes: 0, kids: new Map() };
    for (const s of p.sites) {
      root.bytes += s.bytes;
      let n = root;
      // "…" in a folded stack stands for library frames between two user frames: no level.
      for (const fr of (s.stack || s.site).split(';').filter((x) => x !== '…')) {
        if (!n.kids.has(fr)) n.kids.set(fr, { name: fr, bytes: 0, kids: new Map() });
        n = n.kids.get(fr); n.bytes += s.bytes;
      }
    }
    if (p.other_sites_bytes) root.kids.set('(other sites)', { name: `(${p.other_sites} other sites)`, bytes: p.other_sites_bytes, kids: new Map() }), (root.bytes += p.other_sites_bytes);
    flameRoots.push(root);
    const div = el('div', { class: 'flame' });
    const cv = canvas('fl', 10);
    div.append(cv);
    let depth = 0;
    (function d(n, k) { depth = Math.max(depth, k); for (const c of n.kids.values()) d(c, k + 1); })(root, 0);
    depth = Math.min(depth, 40);
    cv.style.height = (depth + 1) * 16 + 'px';
    const boxes = [];
    views['flame' + Math.random()] = () => {
      const { g, w } = ctxOf(cv);
      boxes.length = 0;
      (function d(n, x, k, span) {
        if (k > depth) return;
        g.fillStyle = k === 0 ? '#94a3b8' : `hsl(${(n.name.length * 37 + k * 13) % 50 + 10},80%,${60 + (k % 3) * 5}%)`;
        g.fillRect(x, k * 16, Math.max(span - 1, 0.5), 15);
        boxes.push({ x, y: k * 16, w: span, n });
        if (span > 40) { g.fillStyle = '#111'; g.font = '10px sans-serif'; g.fillText(`${n.name.replace(/^.*\//, '')} ${bytes(n.bytes)}`.slice(0, Math.floor(span / 6)), x + 2, k * 16 + 11); }
        let cx = x;
        for (const c of n.kids.values()) { const s = (span * c.bytes) / (n.bytes || 1); d(c, cx, k + 1, s); cx += s; }
      })(root, 0, 0, w);
    };
    cv.addEventListener('click', (e) => {
      const r = cv.getBoundingClientRect(), x = e.clientX - r.left, y = e.clientY - r.top;
      const b = boxes.find((b) => x >= b.x && x < b.x + b.w && y >= b.y && y < b.y + 16);
      if (b) { detail.textContent = ''; detail.append(el('h3', {}, b.n.name), el('p', {}, `${bytes(b.n.bytes)} live under this frame`)); }
    });
    return div;
  }

  // ---------- 6. several files ----------
  function ranksView() {
    const sec = el('section', { id: 'ranks' });
    sec.append(el('h2', {}, `6. ${DATA.files.length} files side by side`));
    const rows = DATA.files.map((f, i) => {
      const peaks = (f.analysis.devices || []).map((d) => d.fragmentation.timeline.peak_reserved.bytes);
      const alloc = (f.analysis.devices || []).map((d) => d.fragmentation.timeline.peak_allocated.bytes);
      return { i, name: f.name, res: Math.max(0, ...peaks), alloc: Math.max(0, ...alloc), top: topSite(f) };
    });
    const sorted = rows.map((r) => r.res).sort((a, b) => a - b);
    const mid = sorted.length >> 1;
    const median = sorted.length ? (sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2) : 0;
    const maxRes = Math.max(1, ...rows.map((r) => r.res));
    const t = el('table', {}, el('tr', {}, el('th', {}, 'file'), el('th', { class: 'n' }, 'peak reserved'), el('th', {}, ''), el('th', { class: 'n' }, 'peak allocated'), el('th', {}, 'largest site at the allocated peak'), el('th', {}, '')));
    for (const r of rows) {
      const out = rows.length > 2 && median > 0 && r.res > 1.1 * median;
      t.append(el('tr', { 'data-file': String(r.i), 'data-peak-reserved': String(r.res), 'data-outlier': out ? '1' : '0', 'data-median': String(median) }, el('td', {}, el('a', { href: '#', onclick: (e) => { e.preventDefault(); choose(r.i); } }, r.name)),
        el('td', { class: 'n' }, bytes(r.res)), el('td', {}, el('span', { class: 'bar', style: `width:${(160 * r.res) / maxRes}px;background:${out ? '#ef4444' : '#3b82f6'}` })),
        el('td', { class: 'n' }, bytes(r.alloc)), el('td', {}, r.top), el('td', { class: 'sev-high' }, out ? `outlier: ${(r.res / median).toFixed(2)}× the median${whyOutlier(r.i)}` : '')));
    }
    sec.append(t);
    if (DATA.diff) sec.append(diffView(DATA.diff));
    return sec;
  }
  // Two runs compared: B − A at each device's peaks, and the call sites whose live bytes
  // at the allocated peak changed most (bars left: less in B, right: more in B).
  function diffView(d) {
    const div = el('div', { id: 'diff' });
    const [A, B] = DATA.files.map((f) => f.name.replace(/^.*\//, ''));
    div.append(el('h3', {}, `Compared: B = ${B} against A = ${A}`));
    for (const x of d.devices) {
      const sign = (v) => (v > 0 ? '+' : '') + bytes(v);
      div.append(el('p', { 'data-delta-peak-reserved': String(x.delta.peak_reserved), 'data-delta-peak-allocated': String(x.delta.peak_allocated) },
        `cuda:${x.a.device}: peak reserved ${bytes(x.a.peak_reserved)} → ${bytes(x.b.peak_reserved)} (${sign(x.delta.peak_reserved)}), peak allocated ${bytes(x.a.peak_allocated)} → ${bytes(x.b.peak_allocated)} (${sign(x.delta.peak_allocated)})`));
      const m = Math.max(1, ...x.sites.map((s) => Math.abs(s.delta)));
      const t = el('table', {}, el('tr', {}, el('th', {}, 'call site'), el('th', { class: 'n' }, 'A'), el('th', { class: 'n' }, 'B'), el('th', {}, 'B − A')));
      for (const s of x.sites) {
        const w = (120 * Math.abs(s.delta)) / m;
        const bar = el('span', { class: 'bar', style: `width:${w}px;background:${s.delta > 0 ? '#ef4444' : '#10b981'};margin-left:${s.delta > 0 ? 120 : 120 - w}px` });
        t.append(el('tr', { 'data-delta': String(s.delta) }, el('td', { title: s.stack }, s.site), el('td', { class: 'n' }, bytes(s.bytes_a)), el('td', { class: 'n' }, bytes(s.bytes_b)), el('td', {}, bar, ' ', sign(s.delta))));
      }
      div.append(t);
    }
    if (d.only_in_a.length || d.only_in_b.length) div.append(el('p', { class: 'note' }, `Devices only in A: ${d.only_in_a.join(', ') || 'none'}; only in B: ${d.only_in_b.join(', ') || 'none'}.`));
    return div;
  }
  // The call site whose live bytes at the allocated peak exceed most the median of the
  // same site in the other files.
  function whyOutlier(i) {
    const sites = (f) => {
      const m = new Map();
      for (const d of f.analysis.devices || []) for (const s of d.peaks.allocated_peak.sites) m.set(s.site, (m.get(s.site) || 0) + s.bytes);
      return m;
    };
    const mine = sites(DATA.files[i]);
    const others = DATA.files.filter((_, j) => j !== i).map(sites);
    let best = null;
    for (const [site, b] of mine) {
      const v = others.map((o) => o.get(site) || 0).sort((x, y) => x - y);
      const ex = b - v[Math.floor((v.length - 1) / 2)];
      if (!best || ex > best.ex) best = { site, ex };
    }
    return best && best.ex > 0 ? `; ${best.site} holds ${bytes(best.ex)} more than on the median file` : '';
  }
  function topSite(f) {
    const d = (f.analysis.devices || [])[0];
    const s = d && d.peaks.allocated_peak.sites[0];
    return s ? `${s.site} (${bytes(s.bytes)})` : '—';
  }

  // ---------- search ----------
  function search(q) {
    const file = DATA.files[S.file], dev = file.devices[S.dev];
    S.hits = []; S.highlight = null; S.hitAllocs = null; S.sel = -1;
    if (!dev || !q.trim()) { redrawAll(); return; }
    const c = decodeDevice(dev);
    const out = el('div', { class: 'hits', id: 'hits' });
    q = q.trim();
    if (/^0x[0-9a-f]+$/i.test(q)) {
      const a = parseInt(q, 16);
      const A = c.allocs;
      // The allocations (of the largest ones embedded) that covered the address: they
      // are highlighted on the timeline.
      S.hitAllocs = new Set();
      for (let i = 0; i < A.length; i += AL) {
        if (a >= A[i] && a < A[i] + A[i + 1]) { S.hits.push({ alloc: A[i + 3], free: A[i + 4], stack: A[i + 5], size: A[i + 1], addr: A[i] }); S.hitAllocs.add(i / AL); }
      }
      // Blocks holding it now (the state view's position), then at the keyframes.
      const cur = stateOf(c, S.state);
      let lines = 0;
      for (const m of [cur, ...c.moments.filter((m) => m.state !== cur.state)]) {
        for (let i = 0; i < m.blocks.length && lines < 50; i += 6) {
          if (a >= m.blocks[i + 1] && a < m.blocks[i + 1] + m.blocks[i + 2]) {
            lines++;
            out.append(el('div', { onclick: () => { S.state = m.state; redrawAll(); blockInfo(file, c, { i, seg: m.blocks[i] }); } },
              `event state ${m.state}${m === cur ? ' (shown now)' : ''}: ${['free', 'allocated', 'pending', 'merged'][m.blocks[i + 4]]} block ${hex(m.blocks[i + 1])} ${bytes(m.blocks[i + 2])}`));
          }
        }
      }
      for (const h of S.hits) out.prepend(el('div', { onclick: () => { const span = Math.max(8, (h.free < 0 ? c.states : h.free) - h.alloc); S.x0 = Math.max(0, h.alloc - span); S.x1 = Math.min(c.states, h.alloc + 2 * span); redrawAll(); showStack(file, h.stack, `${hex(h.addr)} ${bytes(h.size)}, events ${h.alloc}–${h.free < 0 ? 'end' : h.free}`); } },
        `allocation ${hex(h.addr)} ${bytes(h.size)} ${h.alloc > 0 ? 'at event ' + (h.alloc - 1) : 'from before the trace'}`));
    } else {
      const ql = q.toLowerCase();
      const match = new Set();
      file.stacks.forEach((s, i) => { if (s.some((k) => file.frames[k].toLowerCase().includes(ql))) match.add(i); });
      S.highlight = match;
      const A = c.allocs;
      for (let i = 0; i < A.length; i += AL) if (match.has(A[i + 5])) S.hits.push({ alloc: A[i + 3], free: A[i + 4], stack: A[i + 5], size: A[i + 1], addr: A[i] });
      out.append(el('div', {}, `${match.size} stacks contain “${q}”; ${S.hits.length} of the ${c.na} largest allocations come from them (highlighted on the timeline, their lifetimes marked under it).`));
      for (const si of Array.from(match).slice(0, 50)) out.append(el('div', { onclick: () => showStack(file, si, siteName(file, si)) }, siteName(file, si)));
    }
    detail.textContent = '';
    detail.append(el('h3', {}, `Search: ${q}`), out);
    out.dataset.count = String(out.children.length);
    out.dataset.allocs = String(S.hits.length);
    redrawAll();
  }
  document.getElementById('search').addEventListener('change', (e) => search(e.target.value));

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
  api.select = (file, dev) => { choose(file, dev); };
  api.selected = () => ({ file: S.file, dev: S.dev, device: DATA.files[S.file].devices[S.dev] ? DATA.files[S.file].devices[S.dev].device : null,
    highlight: S.highlight ? S.highlight.size : 0, hits: S.hits.length, sel: S.sel, detail: detail.textContent, search: document.getElementById('search').value,
    role: S.highlightRole, segment: S.c && S.c.segs && S.c.segs.pts ? S.c.segs.sel : -1, stack: S.stack });
  api.allFiles = () => DATA.files;
  api.devices = () => DATA.files.map((f) => f.devices.map((d) => ({ device: d.device, moments: d.moments.length, events: d.events,
    exact: !!(d.state_ops && d.state_ops.exact), first: d.state_ops ? d.state_ops.first : 0, allocations: d.allocations.length ? decodeDevice(d).na : 0 })));
  api.points = () => (S.c ? S.c.points : 0);
  api.keyframes = () => (S.c ? S.c.moments.map((m) => m.state) : []);
  api.file = () => DATA.files[S.file];
  // For the tests: the drawn allocations' dimming (the search's highlight).
  api.dimmed = () => (S.c && S.c.drawn ? S.c.drawn.map((i) => ({ index: i, stack: S.c.allocs[i * AL + 5], dim: dimAlloc(S.c, i) })) : []);
  try {
    build();
    api.firstPaintMs = performance.now() - T0;
    api.sinceNavigationMs = performance.now();
    document.body.dataset.ready = '1';
    api.ready = true;
  } catch (e) {
    main.textContent = 'The report could not be drawn: ' + e.message;
    throw e;
  }
})();
