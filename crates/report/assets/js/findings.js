// findings.js: view 5, the analysis' findings, leak suspects and the live memory at
// the peaks as flame graphs.
function findingsView(file, dev) {
  const sec = el('section', { id: 'findings' });
  sec.append(el('h2', {}, '5. Findings'));
  // How the file was recorded (actions skip_actions left out, history never on, one pool
  // only), then pinned host memory: CPU RAM, said apart from every device figure.
  for (const l of (file.summary.notes && file.summary.notes.recording) || []) sec.append(el('p', { class: 'note recording' }, 'Recording: ' + l));
  const h = file.summary.host;
  if (h) sec.append(el('p', { id: 'host-memory' }, el('b', {}, 'Pinned host memory '), `(host_segments; CPU RAM, not in any device figure): ${bytes(h.reserved_bytes)} pinned, ${bytes(h.allocated_bytes)} in use, ${bytes(h.cached_free_bytes)} cached free.`));
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
    if (p.event_index == null && !p.live_blocks) {
      // A peak known only as a total (a torch.profiler trace's reserved bytes): which
      // blocks were live then is not in the file.
      sec.append(el('h3', {}, `Live at the ${key}`), el('p', { class: 'note', 'data-peak': key }, 'not recorded: the file gives this peak as a total, not at a trace entry, so what was live then is not known.'));
      continue;
    }
    sec.append(el('h3', {}, `Live at the ${key} (${bytes(p.live_bytes)} in ${p.live_blocks} blocks${p.event_index != null ? ', event ' + p.event_index : ''})`));
    sec.append(flame(p));
    // Live bytes by the strings PyTorch attaches to each allocation, as analyze lists them.
    for (const [k, what] of [['by_compile_context', 'compile_context'], ['by_user_metadata', 'user_metadata']]) {
      if (!(p[k] || []).length) continue;
      const t = el('table', { class: 'by-context', 'data-by': what, 'data-peak': key }, el('tr', {}, el('th', {}, what), el('th', { class: 'n' }, 'live bytes'), el('th', { class: 'n' }, 'blocks')));
      for (const r of p[k]) t.append(el('tr', {}, el('td', {}, r.name), el('td', { class: 'n' }, bytes(r.bytes)), el('td', { class: 'n' }, String(r.blocks))));
      sec.append(el('h4', {}, `By ${what} at the ${key}`), t);
    }
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
// For the tests: the names of the flame graphs' boxes, and the labels drawn.
const flameRoots = [], flameLabels = [];
api.flameLabels = () => flameLabels.flat();
// Per graph: its roots (the frames under "all") and every frame drawn below a root.
api.flameRoots = () => flameRoots.map((r) => {
  const deeper = new Set(); const walk = (n) => { for (const k of n.kids.values()) { deeper.add(k.name); walk(k); } };
  for (const k of r.kids.values()) walk(k);
  return { roots: [...r.kids.keys()], deeper: [...deeper] };
});
api.flameNames = () => { const out = []; const walk = (n) => { out.push(n.name); for (const k of n.kids.values()) walk(k); }; flameRoots.forEach(walk); return out; };
// The frames of each folded stack of a peak, outer → inner, rooted at the outermost
// frame. `analyze` keeps the innermost 8 user frames of a stack (the site and its
// callers) and folds library frames into "…" (no level of their own): a deep stack
// then starts part-way down (`main` where another stack of the same peak shows
// `<module> → main`). Such a stack gets the frames above its first frame from the
// heaviest stack of the peak that holds that frame deeper down, again until no stack
// holds its first frame deeper: a frame the graph draws under a caller is then never a
// root of its own too.
function rootedStacks(sites) {
  const paths = sites.map((s) => (s.stack || s.site).split(';').filter((x) => x !== '…'));
  const above = new Map(); // frame → frames above it in the heaviest stack holding it deeper
  const weight = new Map();
  sites.forEach((s, i) => paths[i].forEach((fr, k) => {
    if (k > 0 && (weight.get(fr) ?? -1) < s.bytes) { weight.set(fr, s.bytes); above.set(fr, paths[i].slice(0, k)); }
  }));
  return paths.map((p) => {
    const out = p.slice();
    for (let guard = 0; guard < 64 && out.length && above.has(out[0]); guard++) {
      const up = above.get(out[0]);
      if (up.some((fr) => out.includes(fr))) break; // never a loop
      out.unshift(...up);
    }
    return out;
  });
}
// The label of flame box n in `room` pixels: "frame bytes" whole when it fits, else the
// frame shortened with "…" before the whole size, else the frame alone shortened, else
// nothing: a size is never cut ("step 8" must not stand for 86.58 MiB).
function flameLabel(g, n, room) {
  const name = n.name.replace(/^.*\//, ''), size = ' ' + bytes(n.bytes);
  if (room < 16) return null;
  const fits = (t) => g.measureText(t).width <= room;
  if (fits(name + size)) return name + size;
  const cut = (tail) => {
    let lo = 0, hi = name.length - 1;
    while (lo < hi) { const m = (lo + hi + 1) >> 1; if (fits(name.slice(0, m) + '…' + tail)) lo = m; else hi = m - 1; }
    return lo >= 3 ? name.slice(0, lo) + '…' + tail : null;
  };
  return cut(size) || cut('') || null;
}
// Icicle of live bytes by folded stack, outer frames on top.
function flame(p) {
  const root = { name: 'all', bytes: 0, kids: new Map() };
  const paths = rootedStacks(p.sites);
  p.sites.forEach((s, i) => {
    root.bytes += s.bytes;
    let n = root;
    for (const fr of paths[i]) {
      if (!n.kids.has(fr)) n.kids.set(fr, { name: fr, bytes: 0, kids: new Map() });
      n = n.kids.get(fr); n.bytes += s.bytes;
    }
  });
  if (p.other_sites_bytes) root.kids.set('(other sites)', { name: `(${p.other_sites} other sites)`, bytes: p.other_sites_bytes, kids: new Map() }), (root.bytes += p.other_sites_bytes);
  flameRoots.push(root);
  const div = el('div', { class: 'flame' });
  const cv = canvas('fl', 10);
  div.append(cv);
  let depth = 0;
  (function d(n, k) { depth = Math.max(depth, k); for (const c of n.kids.values()) d(c, k + 1); })(root, 0);
  depth = Math.min(depth, 40);
  cv.style.height = (depth + 1) * 16 + 'px';
  const boxes = [], labels = [];
  flameLabels.push(labels);
  views['flame' + Math.random()] = () => {
    const { g, w } = ctxOf(cv);
    g.font = '10px sans-serif';
    boxes.length = 0; labels.length = 0;
    (function d(n, x, k, span) {
      if (k > depth) return;
      g.fillStyle = k === 0 ? '#94a3b8' : `hsl(${(n.name.length * 37 + k * 13) % 50 + 10},80%,${60 + (k % 3) * 5}%)`;
      g.fillRect(x, k * 16, Math.max(span - 1, 0.5), 15);
      boxes.push({ x, y: k * 16, w: span, n });
      const label = flameLabel(g, n, span - 4);
      if (label) { g.fillStyle = '#111'; g.fillText(label, x + 2, k * 16 + 11); labels.push({ text: label, w: g.measureText(label).width, span, bytes: bytes(n.bytes), name: n.name }); }
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
