// ranks.js: view 6, several files side by side, and two files compared (diff).
// The files compared by the analysis (DATA.ranks, fragscope_diagnose::compare_ranks): each
// file's figures are those of its device with the largest reserved peak; the median,
// the outliers and the call sites that explain them are Rust's, drawn as they are.
function ranksView() {
  const R = DATA.ranks;
  const sec = el('section', { id: 'ranks' });
  sec.append(el('h2', {}, `6. ${DATA.files.length} files side by side`));
  const outliers = new Map(R.outliers.map((o) => [o.rank, o]));
  const median = R.median_peak_reserved;
  const maxRes = Math.max(1, ...R.ranks.map((r) => r.peak_reserved));
  const t = el('table', {}, el('tr', {}, el('th', {}, 'file'), el('th', { class: 'n' }, 'peak reserved'), el('th', {}, ''), el('th', { class: 'n' }, 'peak allocated'), el('th', {}, 'largest site at the allocated peak'), el('th', {}, '')));
  for (const r of R.ranks) {
    const o = outliers.get(r.rank);
    t.append(el('tr', { 'data-file': String(r.rank), 'data-peak-reserved': String(r.peak_reserved), 'data-outlier': o ? '1' : '0', 'data-median': String(median) }, el('td', {}, el('a', { href: '#', onclick: (e) => { e.preventDefault(); choose(r.rank); } }, r.file)),
      el('td', { class: 'n' }, bytes(r.peak_reserved)), el('td', {}, el('span', { class: 'bar', style: `width:${(160 * r.peak_reserved) / maxRes}px;background:${o ? '#ef4444' : '#3b82f6'}` })),
      el('td', { class: 'n' }, bytes(r.peak_allocated)), el('td', {}, topSite(DATA.files[r.rank], r.device)), el('td', { class: 'sev-high' }, o ? `outlier: ${o.ratio.toFixed(2)}× the median${whyOutlier(o, R)}` : '')));
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
// The call site that explains most of an outlier's excess: where it holds the most
// more than the median rank (DATA.ranks.median_rank) at their allocated peaks.
function whyOutlier(o, R) {
  const s = o.sites[0];
  if (!s) return '';
  const base = R.ranks[R.median_rank].file.replace(/^.*\//, '');
  return `; ${s.site} holds ${bytes(s.excess)} more than on the median file (${base})`;
}
// The largest call site at the allocated peak of a file's device (the one its figures
// are of).
function topSite(f, device) {
  const d = (f.analysis.devices || []).find((x) => x.device === device);
  const s = d && d.peaks.allocated_peak.sites[0];
  return s ? `${s.site} (${bytes(s.bytes)})` : '—';
}
