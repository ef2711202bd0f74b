// fragmentation.js: view 3, fragmentation over time.
function fragView(file, dev, c) {
  const sec = el('section', { id: 'fragmentation' });
  sec.append(el('h2', {}, '3. Fragmentation over time'));
  const a = analysisDev(file);
  const cv = canvas('fr', 180);
  sec.append(cv, el('div', { class: 'legend note' }, el('i', { style: 'background:#7c3aed' }), 'peak fragmentation so far: 1 − peak allocated / peak reserved up to each moment (cached memory tensors used before is not fragmentation; docs/glossary.md)',
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
  // The peaks so far, from the first bucket whatever the zoom: memory freed but kept cached
  // (after an OOM, between steps) leaves the curve where the peaks put it.
  let pa = 0, pr = 0;
  for (let i = 0; i < i0; i++) { pa = Math.max(pa, lv.alloc[i]); pr = Math.max(pr, lv.res[i]); }
  for (let i = i0; i <= i1; i++) {
    pa = Math.max(pa, lv.alloc[i]); pr = Math.max(pr, lv.res[i]);
    const f = pr > 0 ? Math.max(0, 1 - pa / pr) : 0;
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
  // Round byte values (byteTicks), kept inside the plot at its top and bottom.
  for (const v of byteTicks(bmax * 1.05, 2)) { const label = bytes(v), y = YB(v); g.fillText(label, w - g.measureText(label).width - 3, Math.max(TL_TOP + 9, Math.min(TL_TOP + ph - 2, y + 3))); }
  g.fillText('left: fragmentation · right: bytes', TL_LEFT + 4, TL_TOP - 4);
  cv.dataset.x0 = S.x0; cv.dataset.x1 = S.x1;
}
