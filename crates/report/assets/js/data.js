// data.js: the page's data (#fragscope-data, computed by crates/report) decoded: base64
// typed arrays, a device's curves and their coarser zoom levels, its allocations, the
// event list, the wall clock, and the allocator state at any trace state (keyframes and
// per-event deltas). Also the page-wide constants every module uses (DATA, the two
// panes, the test API `window.fragscope`).
const DATA = JSON.parse(document.getElementById('fragscope-data').textContent);
const main = document.getElementById('main');
const detail = document.getElementById('detail-body');
const T0 = performance.now();
const api = (window.fragscope = { ready: false, drawMs: {}, firstPaintMs: null });

// Record layouts. The page's large arrays are records of numbers; LAYOUT (written before
// the modules by build.rs, from crates/report/src/layout.rs: the list the Rust that writes
// the records is made from) names each kind's fields in order. layoutOf gives the index
// of each field the page reads, by name, and the record's length; a field the layout
// lacks stops the page here, at load, rather than reading the wrong values.
function layoutOf(kind, names) {
  const fields = LAYOUT[kind];
  if (!fields) throw new Error(`no record layout "${kind}"`);
  const ix = { len: fields.length };
  for (const n of names) {
    const i = fields.indexOf(n);
    if (i < 0) throw new Error(`record "${kind}" has no field "${n}"`);
    ix[n] = i;
  }
  return ix;
}
// A life on the timeline: an allocation (DeviceData.allocations, initial_allocations)
// or a segment (DeviceData.segments); start/end are trace states (end −1: live at the end).
const LIFE = layoutOf('life', ['address', 'size', 'requested', 'start', 'end', 'stack', 'start_time_us', 'end_time_us']);
const AL = LIFE.len;
// A keyframe's segments and blocks (Moment.segments, Moment.blocks).
const SEG = layoutOf('segment', ['address', 'size', 'stream', 'flags']);
const BLK = layoutOf('block', ['segment', 'address', 'size', 'requested', 'state', 'stack']);
// A change of the state made by one trace entry (StateOps.ops).
const OPR = layoutOf('state_op', ['event', 'kind', 'address', 'size', 'a', 'b', 'stack']);
// A trace entry of the event list (EventWindow.entries).
const EVR = layoutOf('event', ['action', 'address', 'size', 'stream', 'stack']);
// A request size and its count (DeviceData.requests).
const REQ = layoutOf('request', ['size', 'count']);
// A record of layout L from its fields by name (for records the page makes itself).
function record(L, fields) {
  const r = new Array(L.len).fill(NaN);
  for (const [k, v] of Object.entries(fields)) r[L[k]] = v;
  return r;
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
  // Each pool's reserved bytes (DeviceData.pools, only with private pools), the most of each bucket.
  lvl0.pools = (dev.pools || []).map((p) => f64(p.reserved));
  // Coarser levels by pairwise maxima (sites follow the bucket with more allocated).
  const levels = [lvl0];
  while (levels[levels.length - 1].n > 64) {
    const p = levels[levels.length - 1], n = Math.ceil(p.n / 2);
    const q = { n, first: new Float64Array(n), time: new Float64Array(n), alloc: new Float64Array(n), req: new Float64Array(n),
      res: new Float64Array(n), maxreq: new Float64Array(n), sites: new Float64Array(n * k), amax: new Float64Array(n), pick: new Int32Array(n),
      rat: new Float64Array(n * R), rmax: new Float64Array(n * R), pools: p.pools.map(() => new Float64Array(n)) };
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
      p.pools.forEach((v, j) => { q.pools[j][i] = Math.max(v[a], v[b]); });
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
  const order = Array.from({ length: na }, (_, i) => i).sort((a, b) => allocs[b * AL + LIFE.size] - allocs[a * AL + LIFE.size] || a - b);
  // The event list's entries (windows of the trace, DeviceData.event_list).
  const events = (dev.event_list || []).map((w) => ({ first: w.first, E: f64(w.entries) }));
  // The segment timeline's segments (DeviceData.segments), laid out when first shown.
  const sa = f64(dev.segments), nsa = sa.length / AL;
  const segs = { A: sa, n: nsa, total: dev.segment_count || 0, order: Array.from({ length: nsa }, (_, i) => i).sort((a, b) => sa[b * AL + LIFE.size] - sa[a * AL + LIFE.size] || a - b), pts: null };
  dev._c = { events, k, roles, R, segs, levels, states: c.states, allocs, na, order, requests, moments, ops: f64(so.ops), exact: so.exact, first: so.first,
    clock: clockOf(lvl0, c.states, [f64(c.gap_from), f64(c.gap_to), f64(c.gap_t0), f64(c.gap_t1)]) };
  return dev._c;
}
// Trace entry i of the event list, or null when it is not embedded.
const ACTIONS = ['alloc', 'free_requested', 'free_completed', 'segment_alloc', 'segment_free', 'segment_map', 'segment_unmap', 'snapshot', 'oom', 'annotate', 'user_defined'];
function eventAt(c, i) {
  for (const w of c.events) {
    const k = i - w.first, E = w.E;
    if (k >= 0 && k < E.length / EVR.len) {
      const o = k * EVR.len;
      return { i, action: ACTIONS[E[o + EVR.action]] || '?', addr: E[o + EVR.address], size: E[o + EVR.size], stream: E[o + EVR.stream], stack: E[o + EVR.stack] };
    }
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
  // The keyframe's records by address (copies: a block's segment index is set again below).
  const segs = new Map(), blocks = new Map();
  for (let i = 0; i < key.segs.length; i += SEG.len) segs.set(key.segs[i + SEG.address], Array.from(key.segs.subarray(i, i + SEG.len)));
  for (let i = 0; i < key.blocks.length; i += BLK.len) blocks.set(key.blocks[i + BLK.address], Array.from(key.blocks.subarray(i, i + BLK.len)));
  const O = c.ops, n = O.length / OPR.len;
  let lo = 0, hi = n;
  while (lo < hi) { const h = (lo + hi) >> 1; if (O[h * OPR.len + OPR.event] < key.state) lo = h + 1; else hi = h; }
  for (let r = lo; r < n && O[r * OPR.len + OPR.event] < s; r++) {
    const o = r * OPR.len, kind = O[o + OPR.kind], addr = O[o + OPR.address], size = O[o + OPR.size];
    if (kind === 0) blocks.delete(addr);
    else if (kind === 1) blocks.set(addr, record(BLK, { address: addr, size, requested: O[o + OPR.a], state: O[o + OPR.b], stack: O[o + OPR.stack] }));
    else if (kind === 2) { segs.delete(addr); for (const a of Array.from(blocks.keys())) if (a >= addr && a < addr + size) blocks.delete(a); }
    else segs.set(addr, record(SEG, { address: addr, size, stream: O[o + OPR.a], flags: O[o + OPR.b] }));
  }
  const sl = Array.from(segs.values()).sort((a, b) => a[SEG.address] - b[SEG.address]);
  const bl = Array.from(blocks.values()).sort((a, b) => a[BLK.address] - b[BLK.address]);
  const SA = new Float64Array(sl.length * SEG.len), BA = new Float64Array(bl.length * BLK.len);
  sl.forEach((x, i) => SA.set(x, SEG.len * i));
  let si = 0;
  bl.forEach((b, i) => {
    while (si + 1 < sl.length && sl[si + 1][SEG.address] <= b[BLK.address]) si++;
    b[BLK.segment] = si;
    BA.set(b, BLK.len * i);
  });
  const m = { state: s, kinds: [], segs: SA, blocks: BA };
  m.fig = momentFigures(m);
  return m;
}

function momentFigures(m) {
  let reserved = 0, allocated = 0, pending = 0, free = 0, largest = 0, slack = 0;
  for (let i = 0; i < m.segs.length; i += SEG.len) reserved += m.segs[i + SEG.size];
  for (let i = 0; i < m.blocks.length; i += BLK.len) {
    const size = m.blocks[i + BLK.size], st = m.blocks[i + BLK.state];
    if (st === 0) { free += size; largest = Math.max(largest, size); }
    else if (st === 1) { allocated += size; slack += Math.max(0, size - m.blocks[i + BLK.requested]); }
    else pending += size;
  }
  return { reserved, allocated, pending, free, largest, slack, fsf: free > 0 ? 1 - largest / free : 0, blocks: m.blocks.length / BLK.len };
}
