// predict.js: the page of `fragscope predict --report`.
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
      for (const v of byteTicks(ymax / 1.05, 4)) { const y = Y(v); g.beginPath(); g.moveTo(L, y); g.lineTo(L + pw, y); g.stroke(); g.fillText(bytes(v), 2, y + 3); }
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
