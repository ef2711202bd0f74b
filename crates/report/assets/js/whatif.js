// whatif.js: view 4, the replays under other settings (their results are the
// analysis').
function whatIfView(file, dev) {
  const sec = el('section', { id: 'whatif' });
  sec.append(el('h2', {}, '4. What if: the replay under other settings'));
  const a = analysisDev(file);
  const r = a && a.recommendations;
  if (!r || !r.baseline) {
    // The command that replays them, named in full (`report` takes --what-if too).
    // A windowed page is titled `file [window A..B]`: the command takes the window back.
    const win = /^(.*) \[window (.+)\]$/s.exec(file.name);
    const how = `fragscope report --what-if ${file.example ? '' : win ? `${quoteArg(win[1])} --window ${win[2]}` : quoteArg(file.name)}`.trim();
    sec.append(el('p', { class: 'note', id: 'whatif-none' }, ((r && r.note) || 'No replay was run for this device (replays run on devices with an OOM)').replace(/\.$/, '') +
      `. \`${how}\` replays the candidate settings on every device and draws them here (\`fragscope analyze --what-if\` gives the same replays as text).`));
    return sec;
  }
  // Every replay the analysis ran, in its order (the chart's curves): the recorded
  // settings, then each setting tried; a recommended one says so, with its rank.
  const rec = new Map((r.recommended || []).map((x) => [x.setting, x]));
  const rows = [Object.assign({ baseline: true }, r.baseline, { setting: 'recorded settings' })].concat((r.tried || []).map((t) => Object.assign({}, t, { rec: rec.get(t.setting) || null })));
  const peak = Math.max(...rows.map((x) => x.peak_reserved_bytes || 0), 1);
  const t = el('table', { id: 'whatif-table' }, el('tr', {}, el('th', {}, 'setting'), el('th', { class: 'n' }, 'peak reserved'), el('th', {}, ''), el('th', { class: 'n' }, 'cudaMalloc'), el('th', {}, 'OOM'), el('th', {}, 'recommended')));
  for (const x of rows) {
    const oom = x.ooms ? `OOM at event ${x.first_oom_index}` : 'no OOM';
    const verdict = x.baseline ? '' : x.rec ? `#${x.rec.rank}` + (x.rec.avoids_oom ? ', gets past the OOM' : '') : 'no';
    t.append(el('tr', { 'data-setting': x.baseline ? 'recorded' : x.setting, 'data-recommended': x.rec ? '1' : '0' }, el('td', {}, x.setting), el('td', { class: 'n' }, bytes(x.peak_reserved_bytes)),
      el('td', {}, el('span', { class: 'bar', style: `width:${(200 * (x.peak_reserved_bytes || 0)) / peak}px;background:${x.baseline ? '#ef4444' : x.rec ? '#7c3aed' : '#a5b4fc'}` })),
      el('td', { class: 'n' }, x.cuda_mallocs ?? '—'), el('td', {}, oom), el('td', {}, verdict)));
  }
  if (dev.whatif && dev.whatif.length) sec.append(whatIfChart(dev, r.capacity_bytes));
  sec.append(t, el('p', { class: 'note' }, `Capacity ${r.capacity_bytes == null ? 'not recorded' : bytes(r.capacity_bytes)}. ` + (r.recommended || []).map((x) => `${x.setting}: ${x.reason}.`).join(' ')));
  return sec;
}
// A file name as a shell argument (quoted when it holds anything but plain characters).
const quoteArg = (s) => (/^[\w@%+=:,./-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`);
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
    const yt = byteTicks(ymax / 1.05, 4);
    for (const v of yt) g.fillText(bytes(v), 2, Y(v) + 3);
    cv.dataset.yTicks = JSON.stringify(yt);
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
