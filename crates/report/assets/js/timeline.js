// timeline.js: view 1, memory over time: zoom levels, the stacking of allocations and
// segments as memory_viz draws them, drawing, the minimap, clicks and their details.
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
// of A (LIFE records: size, made at state start, freed at state end or -1); each starts
// on top of those live when it is made and drops by the size of any below it that is
// freed. Returns the events (state, made?, row) in order, and per row the bottom of its
// polygon from each state on ([state, offset, state, offset, ...]).
function stackLives(A, ids) {
  const ev = [];
  for (const i of ids) {
    ev.push([A[i * AL + LIFE.start], 1, i]);
    if (A[i * AL + LIFE.end] >= 0) ev.push([A[i * AL + LIFE.end], 0, i]);
  }
  ev.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  const pts = new Map(), live = [];
  let total = 0;
  for (const [s, add, i] of ev) {
    const size = A[i * AL + LIFE.size];
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
    while (e < ev.length && ev[e][0] <= L0.amax[b]) { run += (ev[e][1] ? 1 : -1) * A[ev[e][2] * AL + LIFE.size]; e++; }
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
  const end = A[i * AL + LIFE.end] >= 0 ? A[i * AL + LIFE.end] : states;
  if (!P || s < P[0] || s >= end) return null;
  let off = P[1];
  for (let k = 2; k < P.length && P[k] <= s; k += 2) off = P[k + 1];
  return off;
}
// For the tests: the segments' stacked height at state s (all drawn ones live there).
api.segmentsAt = (s) => { const c = S.c, G = layoutSegments(c); let t = 0; for (const i of G.drawn) { if (livesOffset(G, i, s, c.states) != null) t += G.A[i * AL + LIFE.size]; } return { bytes: t, drawn: G.n, total: G.total }; };
// Bottom of drawn allocation i at state s (null when not live there).
function allocOffset(c, i, s) {
  const A = c.allocs, P = c.pts.get(i);
  const end = A[i * AL + LIFE.end] >= 0 ? A[i * AL + LIFE.end] : c.states;
  if (!P || s < P[0] || s >= end) return null;
  let off = P[1];
  for (let k = 2; k < P.length && P[k] <= s; k += 2) off = P[k + 1];
  return off;
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
    el('i', { style: 'background:var(--req)' }), 'requested', ...poolLegend(dev), restNote,
    ' · wheel: zoom, drag: pan, click: what is there and its stack · ',
    `${c.states - 1} events, finest level ${c.levels[0].n} buckets (max of each)` + (c.clock && !c.clock.exact ? '; wall clock interpolated inside buckets' : '')));
  // The curves use the trace's sizes at every moment; peak allocated counts the allocator's
  // blocks as torch.cuda.max_memory_allocated() does (docs/glossary.md). Where the blocks'
  // remainders put that figure above the drawn curve, the page says by how much.
  const ta = analysisDev(file), tpk = ta && ta.fragmentation.timeline.peak_allocated;
  let drawnPeak = 0;
  for (const v of c.levels[0].alloc) if (v > drawnPeak) drawnPeak = v;
  if (tpk && drawnPeak < tpk.bytes) {
    sec.append(el('p', { class: 'note', id: 'alloc-basis', 'data-drawn': String(drawnPeak), 'data-peak': String(tpk.bytes) },
      `The allocated curve peaks at ${bytes(drawnPeak)}, ${bytes(tpk.bytes - drawnPeak)} below peak allocated (${bytes(tpk.bytes)}): the curve adds up the trace's sizes, ` +
      'peak allocated counts the blocks the allocator holds, as torch.cuda.max_memory_allocated() does (a block\u2019s unsplit remainder the trace does not show; docs/glossary.md).'));
  }
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
  return S.colour === 'allocation' ? color(Math.abs(Math.round(c.allocs[i * AL + LIFE.address] / 512) * 31 + c.allocs[i * AL + LIFE.start]) % 9973) : siteColour(DATA.files[S.file], c.allocs[i * AL + LIFE.stack]);
}
api.allocColours = () => (S.c && S.c.drawn ? S.c.drawn.map((i) => ({ index: i, stack: S.c.allocs[i * AL + LIFE.stack], colour: allocColour(S.c, i) })) : []);
// Whether an allocation is dimmed by the current highlight (search or click).
function dimAlloc(c, i) {
  if (S.hitAllocs) return !S.hitAllocs.has(i);
  return S.highlight ? !S.highlight.has(c.allocs[i * AL + LIFE.stack]) : false;
}
// For the tests: the phase labels drawn (boxes in canvas pixels).
let phaseLabels = [];
api.phaseLabels = () => phaseLabels;
function drawTimeline(file, dev, c, cv, info) {
  phaseLabels = [];
  const { g, w, h } = ctxOf(cv);
  const G = tlGeom(c, w, h), { lv, i0, i1, ymax, pw, ph } = G;
  const Y = (v) => TL_TOP + ph - (v / ymax) * ph;
  const X = (s) => TL_LEFT + xOf(s, pw);
  const next = (i) => (i + 1 < lv.n ? lv.first[i + 1] : c.states);
  // The pixels of a life from state a to state b (exclusive), widened to the buckets of
  // the level drawn and to whole pixels: the curves are the buckets' maxima, so a life
  // live at a bucket's maximum fills that bucket's whole width, and a peak narrower than
  // its bucket (or than a pixel) is drawn filled up to its curve at every zoom level.
  // At the finest level of a short trace a bucket is one state: the life's own span.
  const bucketOf = (s) => { let lo = 0, hi = lv.n - 1; while (lo < hi) { const m = (lo + hi + 1) >> 1; if (lv.first[m] <= s) lo = m; else hi = m - 1; } return lo; };
  const span = (a, b) => {
    const xa = Math.floor(Math.max(TL_LEFT, X(lv.first[bucketOf(a)])));
    return [xa, Math.min(w, Math.max(xa + 1, Math.ceil(X(next(bucketOf(Math.max(a, b - 1)))))))];
  };
  const k = c.k;
  g.save();
  g.beginPath(); g.rect(TL_LEFT, 0, pw, h); g.clip();
  // Phases: nested scopes shaded, each depth's names on a line of its own (the first
  // PHASE_ROWS depths; deeper ones are shaded only), a name only where it fits: shortened
  // with "…" to its phase's width, and left out where an earlier name of its line still
  // runs (on the wall clock, phases a pause apart in events can meet in time).
  g.font = '10px sans-serif';
  const rowEnd = [];
  const label = (text, x, room, row, kind) => {
    if (x < (rowEnd[row] ?? -Infinity) + 6 || room < 24) return false;
    let t = text;
    if (g.measureText(t).width > room) {
      let lo = 0, hi = t.length - 1;
      while (lo < hi) { const m = (lo + hi + 1) >> 1; if (g.measureText(t.slice(0, m) + '…').width <= room) lo = m; else hi = m - 1; }
      if (lo < 2) return false;
      t = t.slice(0, lo) + '…';
    }
    const y = TL_TOP + 10 + row * 11, tw = g.measureText(t).width;
    g.fillStyle = '#475467';
    g.fillText(t, x, y);
    rowEnd[row] = x + tw;
    phaseLabels.push({ x, y: y - 9, w: tw, h: 11, depth: row, kind, text: t });
    return true;
  };
  for (const p of dev.phases) {
    if (p.end < S.x0 || p.start > S.x1) continue;
    const a = Math.max(TL_LEFT, X(p.start)), b = Math.min(w, X(p.end + 1));
    g.fillStyle = p.depth % 2 ? 'rgba(148,163,184,0.10)' : 'rgba(99,102,241,0.08)';
    g.fillRect(a, TL_TOP, Math.max(1, b - a), ph);
    if (p.depth < PHASE_ROWS) label(p.name, a + 2, b - a - 4, p.depth, 'phase');
  }
  // Wall clock: pauses (consecutive events far apart in time) shaded, so they read as
  // gaps rather than as memory held. Only where the knots are consecutive states. Their
  // words go on the line under the phases' names, where nothing is written yet.
  let gaps = 0;
  if (timeAxis()) {
    const { KS, KT } = c.clock;
    const row = Math.min(rowEnd.length, PHASE_ROWS);
    for (let i = 0; i + 1 < KS.length; i++) {
      if (KS[i + 1] < S.x0 || KS[i] > S.x1 || KS[i + 1] - KS[i] > 1) continue;
      const xa = X(KS[i]), xb = X(KS[i + 1]);
      if (xb - xa < 12) continue;
      gaps++;
      g.fillStyle = 'rgba(100,116,139,0.13)';
      g.fillRect(xa, TL_TOP, xb - xa, ph);
      if (xb - xa > 70) label(`no event for ${((KT[i + 1] - KT[i]) / 1e6).toFixed(3)} s`, Math.max(TL_LEFT, xa) + 3, Math.min(w, xb) - Math.max(TL_LEFT, xa) - 6, row, 'gap');
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
      const a = A[i * AL + LIFE.start], end = A[i * AL + LIFE.end] >= 0 ? A[i * AL + LIFE.end] : c.states;
      if (end < S.x0 || a > S.x1) continue;
      const P = c.pts.get(i), size = A[i * AL + LIFE.size];
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
        const [xa, xb] = span(sa, sb), off = P[q + 1];
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
      const a = A[i * AL + LIFE.start], end = A[i * AL + LIFE.end] >= 0 ? A[i * AL + LIFE.end] : c.states;
      if (end < S.x0 || a > S.x1) continue;
      const P = G.pts.get(i), size = A[i * AL + LIFE.size];
      g.fillStyle = S.colour === 'allocation' ? color(Math.abs(Math.round(A[i * AL + LIFE.address] / 512) * 31 + a) % 9973) : siteColour(file, A[i * AL + LIFE.stack]);
      g.globalAlpha = S.highlight && !S.highlight.has(A[i * AL + LIFE.stack]) ? 0.2 : 1;
      shown++;
      for (let q = 0; q < P.length; q += 2) {
        const sb = q + 2 < P.length ? P[q + 2] : end;
        if (sb < S.x0 || P[q] > S.x1) continue;
        const [xa, xb] = span(P[q], sb), off = P[q + 1];
        g.fillRect(xa, Y(off + size), xb - xa, Math.max(0.5, Y(off) - Y(off + size)));
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
    // Stacked call-site bands, then the rest of allocated (whole pixels, as above).
    for (let i = i0; i <= i1; i++) {
      const xa = Math.floor(Math.max(TL_LEFT, X(lv.first[i]))), xb = Math.ceil(Math.min(w, X(next(i))));
      const bw = Math.max(1, xb - xa);
      let base = 0;
      for (let j = 0; j < S.bands && j < k; j++) {
        const v = lv.sites[i * k + j];
        if (v <= 0) continue;
        const si = dev.curves.site_stacks[j];
        g.globalAlpha = S.highlight && !S.highlight.has(si) ? 0.25 : 1;
        g.fillStyle = siteColour(file, si);
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
  // Private pools: each pool's reserved bytes, apart from the default pools' (pools.js).
  (dev.pools || []).forEach((p, j) => { if (j > 0) line(lv.pools[j], poolColour(j), [2, 2]); });
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
  const yt = byteTicks(ymax / 1.05, 4);
  for (const v of yt) {
    const y = TL_TOP + ph - (v / ymax) * ph;
    g.beginPath(); g.moveTo(TL_LEFT, y); g.lineTo(w, y); g.stroke();
    g.fillText(bytes(v), 2, y + 3);
  }
  const k = timeAxis() ? c.clock : null;
  // x ticks: round event numbers (or round times), each label kept clear of the last.
  const xt = [];
  if (k) {
    // Seconds since the first timed event, evenly spaced in time.
    const a = k.at(S.x0), b = k.at(S.x1);
    for (let t = 0; t <= 5; t++) xt.push([TL_LEFT + (pw * t) / 5, ((a + ((b - a) * t) / 5 - k.t0) / 1e6).toFixed(b - a < 5e3 ? 6 : b - a < 5e6 ? 3 : 1) + ' s']);
  } else if (c.states < 6) {
    xt.push([TL_LEFT, String(Math.floor(S.x0))]);
  } else {
    for (const s of countTicks(S.x0, Math.min(S.x1, c.states - 1), 5)) xt.push([TL_LEFT + xOf(s, pw), String(s)]);
  }
  let last = -Infinity;
  for (const [x, label] of xt) {
    const lw = g.measureText(label).width, lx = Math.max(0, Math.min(x - (x > TL_LEFT ? lw / 2 : 0), w - lw - 2));
    if (lx < last + 8) continue;
    g.fillText(label, lx, h - 4);
    last = lx + lw;
  }
  g.canvas.dataset.yTicks = JSON.stringify(yt);
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
      if (off != null && v >= off && v < off + c.allocs[i * AL + LIFE.size]) { hit = i; break; }
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
      if (off != null && v >= off && v < off + A[i * AL + LIFE.size]) { hit = i; break; }
    }
    G.sel = hit;
    detail.textContent = '';
    detail.append(head);
    if (hit < 0) { S.highlight = null; redrawAll(); detail.append(el('p', { class: 'note' }, 'Click a segment for its address, life and stack.')); return; }
    const o = hit * AL, si = A[o + LIFE.stack];
    S.highlight = siteStacks(file, si);
    redrawAll();
    const made = A[o + LIFE.start] > 0 ? `reserved at event ${A[o + LIFE.start] - 1}` : 'reserved before the trace';
    const gone = A[o + LIFE.end] >= 0 ? `released at event ${A[o + LIFE.end] - 1}` : 'still reserved at the end';
    // A private pool's segment says whose (pools.js), in the state view's words.
    const pool = privatePoolNameAt(A[o + LIFE.address]);
    showStack(file, si, `Segment ${hex(A[o + LIFE.address])}: ${bytes(A[o + LIFE.size])}, ${made}, ${gone}${pool ? ', ' + pool : ''}`, head);
    detail.append(el('div', { id: 'segment-info', class: 'note', 'data-addr': String(A[o + LIFE.address]), 'data-size': String(A[o + LIFE.size]), 'data-pool': pool || '' },
      'The stack that reserved it (cudaMalloc or, for an expandable segment, the mapping).'));
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
    S.highlight = siteStacks(file, si);
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
  S.highlight = siteStacks(file, A[o + LIFE.stack]);
  redrawAll();
  const t0 = c.clock ? c.clock.t0 : NaN;
  const when = (t) => (isNaN(t) ? '' : isNaN(t0) ? ` (time ${t} µs)` : ` (t = ${((t - t0) / 1e6).toFixed(6)} s)`);
  const freed = A[o + LIFE.end] >= 0 ? `freed at event ${A[o + LIFE.end] - 1}${when(A[o + LIFE.end_time_us])}` : 'still allocated at the end of the trace';
  const head = el('div', { id: 'alloc-info', 'data-alloc-addr': String(A[o + LIFE.address]), 'data-alloc-size': String(A[o + LIFE.size]), 'data-alloc-request': String(A[o + LIFE.requested]),
    'data-alloc-state': String(A[o + LIFE.start]), 'data-free-state': String(A[o + LIFE.end]), 'data-alloc-index': String(i) },
  el('div', {}, `Allocation ${hex(A[o + LIFE.address])}: ${bytes(A[o + LIFE.size])} (request ${bytes(A[o + LIFE.requested])}, ${A[o + LIFE.requested]} B)`),
  el('div', {}, `${A[o + LIFE.start] > 0 ? `allocated at event ${A[o + LIFE.start] - 1}${when(A[o + LIFE.start_time_us])}` : 'allocated before the trace began'}; ${freed}`));
  showStack(file, A[o + LIFE.stack], 'Allocated at ' + siteName(file, A[o + LIFE.stack]), extra ? el('div', {}, extra, head) : head);
  detail.append(el('button', { onclick: () => { S.highlight = null; S.sel = -1; redrawAll(); } }, 'clear highlight'));
}
// For the tests: per pixel column of the plot (canvas pixels), the top of the allocated
// curve there (the most allocated of the buckets the column shows) and the bottom of the
// plot: the fill must reach the curve in every column.
api.allocatedColumns = () => {
  const c = S.c, cv = document.querySelector('canvas.tl');
  const w = cv.clientWidth, h = cv.clientHeight, G = tlGeom(c, w, h), { lv, i0, i1 } = G;
  const Y = (v) => TL_TOP + G.ph - (v / G.ymax) * G.ph, X = (s) => TL_LEFT + xOf(s, G.pw);
  const top = new Float64Array(w).fill(-1);
  for (let i = i0; i <= i1; i++) {
    const xa = Math.max(TL_LEFT, X(lv.first[i])), xb = Math.min(w, X(i + 1 < lv.n ? lv.first[i + 1] : c.states));
    for (let x = Math.floor(xa); x < Math.max(Math.floor(xa) + 1, Math.ceil(xb)) && x < w; x++) top[x] = Math.max(top[x], lv.alloc[i]);
  }
  const out = [];
  for (let x = TL_LEFT; x < w; x++) if (top[x] > 0) out.push({ x, y: Y(top[x]), bottom: Y(0), bytes: top[x] });
  return out;
};
// For the tests: the drawn lives (allocations or segments) visible now, each with a point
// inside it (page pixels relative to the canvas) on its widest step.
function livesBoxes(A, pts, drawn) {
  const c = S.c, cv = document.querySelector('canvas.tl');
  if (!c || !cv || !drawn) return [];
  const w = cv.clientWidth, h = cv.clientHeight, G = tlGeom(c, w, h);
  const Y = (v) => TL_TOP + G.ph - (v / G.ymax) * G.ph, X = (s) => TL_LEFT + xOf(s, G.pw);
  const out = [];
  for (const i of drawn) {
    const P = pts.get(i), end = A[i * AL + LIFE.end] >= 0 ? A[i * AL + LIFE.end] : c.states, size = A[i * AL + LIFE.size];
    let best = null;
    for (let q = 0; q < P.length; q += 2) {
      const sa = Math.max(P[q], S.x0), sb = Math.min(q + 2 < P.length ? P[q + 2] : end, S.x1);
      if (sb <= sa) continue;
      const xa = X(sa), xb = X(sb), ya = Y(P[q + 1] + size), yb = Y(P[q + 1]);
      if (!best || (xb - xa) * (yb - ya) > best.area) best = { area: (xb - xa) * (yb - ya), x: (xa + xb) / 2, y: (ya + yb) / 2, w: xb - xa, h: yb - ya };
    }
    if (best) out.push({ index: i, addr: A[i * AL + LIFE.address], size, stack: A[i * AL + LIFE.stack], ...best, x: best.x + cv.clientLeft, y: best.y + cv.clientTop });
  }
  return out;
}
api.allocBoxes = () => (S.c && S.c.drawn ? livesBoxes(S.c.allocs, S.c.pts, S.c.drawn) : []);
// The segments' boxes, as the "stacked by: segment" mode draws them.
api.segmentBoxes = () => {
  if (!S.c || !S.c.segs || !S.c.segs.n) return [];
  const G = layoutSegments(S.c);
  return livesBoxes(G.A, G.pts, G.drawn);
};
