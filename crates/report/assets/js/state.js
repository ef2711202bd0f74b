// state.js: view 2, the allocator state at a trace state: segments as rows of blocks,
// the slider and the event list.
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
  const nseg = segs.length / SEG.len;
  let maxSeg = 0, total = 0;
  for (let i = 0; i < nseg; i++) { maxSeg = Math.max(maxSeg, segs[SEG.len * i + SEG.size]); total += segs[SEG.len * i + SEG.size]; }
  // Segments laid left to right in address order, wrapping at a row width of at least
  // the largest segment, so a few hundred segments fit in ~60 rows. A segment larger
  // than 1/24 of everything (an expandable segment is often the whole reservation)
  // does not set the width: it wraps over rows of its own, as a long text does.
  // Whole bytes, so that offsets split into rows exactly (sizes are below 2^53).
  const rowBytes = Math.ceil(Math.max(total / 60, Math.min(maxSeg, total / 24))) || 1;
  const place = [];
  let row = 0, used = 0;
  for (let i = 0; i < nseg; i++) {
    const sz = segs[SEG.len * i + SEG.size];
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
    for (const [r, off, len] of pieces(i, 0, segs[SEG.len * i + SEG.size])) g.fillRect(2 + off * sx, 3 + r * (rowH + gap), Math.max(1, len * sx), rowH);
  }
  for (let i = 0; i < blocks.length; i += BLK.len) {
    const si = blocks[i + BLK.segment], o = blocks[i + BLK.address] - segs[SEG.len * si + SEG.address];
    const st = blocks[i + BLK.state], stack = blocks[i + BLK.stack];
    // State 3: several small blocks merged (a coarse keyframe), shaded by the share
    // of their bytes allocated.
    const fill = st === 0 ? '#e5e7eb' : st === 2 ? '#f59e0b' : st === 3 ? `rgba(71,85,105,${(0.15 + 0.75 * blocks[i + BLK.requested] / Math.max(1, blocks[i + BLK.size])).toFixed(2)})`
      : S.colour === 'allocation' ? color(Math.round(blocks[i + BLK.address] / 512) % 9973) : siteColour(file, stack);
    g.globalAlpha = S.highlight && (st === 1 || st === 2) && !S.highlight.has(stack) ? 0.2 : 1;
    // Rounding slack (block − request) at the block's end: the last bytes.
    const slackFrom = st === 1 && blocks[i + BLK.requested] < blocks[i + BLK.size] ? o + blocks[i + BLK.requested] : Infinity;
    let p = o; // offset in the segment of the piece's first byte
    for (const [r, off, len] of pieces(si, o, blocks[i + BLK.size])) {
      const x = 2 + off * sx, bw = len * sx, y = 3 + r * (rowH + gap);
      g.fillStyle = fill;
      g.fillRect(x, y, Math.max(bw - (bw > 3 ? 1 : 0), 0.6), rowH);
      const a = Math.max(slackFrom, p), b = p + len;
      if (b > a && bw > 2) { g.fillStyle = 'rgba(30,41,59,0.55)'; g.fillRect(x + (a - p) * sx, y + rowH / 2, (b - a) * sx, rowH / 2); }
      rects.push({ x, y, w: bw, h: rowH, st, stack, i, seg: si, addr: blocks[i + BLK.address] });
      p += len;
    }
    g.globalAlpha = 1;
  }
  // Segment outlines, over the blocks (each segment's pieces).
  g.strokeStyle = '#94a3b8'; g.lineWidth = 1;
  for (let i = 0; i < nseg; i++) for (const [r, off, len] of pieces(i, 0, segs[SEG.len * i + SEG.size])) g.strokeRect(2 + off * sx + 0.5, 3 + r * (rowH + gap) + 0.5, Math.max(1, len * sx - 1), rowH - 1);
  cv.dataset.rows = String(rows);
  const f = m.fig;
  const kinds = m.kinds.filter((k) => k !== 'step').join(', ');
  const ev = m.state > 0 ? eventAt(c, m.state - 1) : null;
  const after = m.state === 0 ? 'before the first event' : `after event ${m.state - 1}${ev ? ': ' + describeEvent(ev) : ''}`;
  label.textContent = `trace state ${m.state} of ${c.states - 1} (${after})${kinds ? ' — ' + kinds.replace(/_/g, ' ') : ''}` +
    (m.snapped ? ` — snapped from ${m.asked} to the nearest keyframe, event state ${m.state}` : '') +
    (m.coarse ? ` — ${m.fig.blocks} blocks drawn as ${blocks.length / BLK.len} (small neighbouring blocks merged, grey by their allocated share; figures exact)` : '');
  cv.dataset.state = String(m.state); cv.dataset.asked = String(m.asked); cv.dataset.snapped = m.snapped ? '1' : '0'; cv.dataset.blocks = String(m.fig.blocks);
  cv.dataset.records = String(blocks.length / BLK.len); cv.dataset.coarse = m.coarse ? '1' : '0';
  figs.textContent = '';
  figs.append(fig('moment_reserved_bytes', f.reserved, 'reserved', bytes(f.reserved)), fig('moment_allocated_bytes', f.allocated, 'allocated', bytes(f.allocated)),
    fig('moment_pending_bytes', f.pending, 'pending free', bytes(f.pending)), fig('moment_free_bytes', f.free, 'free in cache', bytes(f.free)),
    fig('moment_largest_free_bytes', f.largest, 'largest free block', bytes(f.largest)), fig('moment_fsf', f.fsf, 'free-space fragmentation', pct(f.fsf)),
    fig('moment_slack_bytes', f.slack, 'rounding slack', bytes(f.slack)), fig('moment_segments', nseg, 'segments', String(nseg)));
  return rects;
}
function blockInfo(file, c, b) {
  const m = stateOf(c, S.state), B = m.blocks, i = b.i;
  if (B[i + BLK.state] === 3) {
    detail.textContent = '';
    detail.append(el('div', { 'data-merged': String(B[i + BLK.stack]) }, `${B[i + BLK.stack]} neighbouring blocks ${hex(B[i + BLK.address])}–${hex(B[i + BLK.address] + B[i + BLK.size])}, ${bytes(B[i + BLK.size])}: ${bytes(B[i + BLK.requested])} allocated, ${bytes(B[i + BLK.size] - B[i + BLK.requested])} free or pending`),
      el('p', { class: 'note' }, 'This state has too many blocks for the page\u2019s size budget: small neighbouring blocks are drawn merged. Blocks drawn alone are exact.'));
    return;
  }
  const st = ['free', 'allocated', 'pending free'][B[i + BLK.state]];
  const head = el('div', {}, el('div', {}, `${st} block ${hex(B[i + BLK.address])}, ${bytes(B[i + BLK.size])}` + (B[i + BLK.state] === 1 ? ` (request ${bytes(B[i + BLK.requested])}, slack ${bytes(B[i + BLK.size] - B[i + BLK.requested])})` : '')),
    el('div', { class: 'note' }, `segment ${hex(m.segs[SEG.len * b.seg + SEG.address])}, ${bytes(m.segs[SEG.len * b.seg + SEG.size])}, stream ${streamName(file, m.segs[SEG.len * b.seg + SEG.stream])}${m.segs[SEG.len * b.seg + SEG.flags] & 1 ? ', small pool' : ', large pool'}${m.segs[SEG.len * b.seg + SEG.flags] & 2 ? ', expandable' : ''}${m.segs[SEG.len * b.seg + SEG.flags] & 4 ? ', ' + poolNameAt(m.segs[SEG.len * b.seg + SEG.address]) : ''}`));
  if (B[i + BLK.state] === 0) { detail.textContent = ''; detail.append(head); return; }
  // Linked by call site: the timeline dims the other sites' bands.
  S.highlight = siteStacks(file, B[i + BLK.stack]);
  redrawAll();
  showStack(file, B[i + BLK.stack], 'Allocated at ' + siteName(file, B[i + BLK.stack]), head);
  detail.append(el('button', { onclick: () => { S.highlight = null; redrawAll(); } }, 'clear highlight'));
}
function freeBlockInfo(file, dev, c, b) {
  const m = stateOf(c, S.state), B = m.blocks, size = B[b.i + BLK.size];
  const small = m.segs[SEG.len * b.seg + SEG.flags] & 1;
  // PyTorch serves requests ≤ 1 MiB from the small pool, larger ones from the large pool.
  let n = 0, kinds = 0, biggest = 0;
  for (let i = 0; i < c.requests.length; i += REQ.len) {
    const r = c.requests[i + REQ.size];
    if ((small ? r <= 1048576 : r > 1048576) && r <= size) { n += c.requests[i + REQ.count]; kinds++; biggest = r; }
  }
  detail.textContent = '';
  detail.append(el('div', {}, `free block ${hex(B[b.i + BLK.address])}, ${bytes(size)} in a ${small ? 'small' : 'large'}-pool segment`),
    el('p', { 'data-free-serves': String(n) }, n ? `It could have served ${n} of the trace's requests (${kinds} distinct sizes, the largest ${bytes(biggest)}): those of its pool and stream no larger than it.` : 'No request recorded in the trace was small enough and of its pool.'));
}
