// ranks.js: view 6, several files side by side, and two files compared (diff).
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
