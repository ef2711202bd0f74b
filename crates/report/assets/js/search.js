// search.js: the header's search (an address or frame text).
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
      if (a >= A[i + LIFE.address] && a < A[i + LIFE.address] + A[i + LIFE.size]) { S.hits.push({ alloc: A[i + LIFE.start], free: A[i + LIFE.end], stack: A[i + LIFE.stack], size: A[i + LIFE.size], addr: A[i + LIFE.address] }); S.hitAllocs.add(i / AL); }
    }
    // Blocks holding it now (the state view's position), then at the keyframes.
    const cur = stateOf(c, S.state);
    let lines = 0;
    for (const m of [cur, ...c.moments.filter((m) => m.state !== cur.state)]) {
      for (let i = 0; i < m.blocks.length && lines < 50; i += BLK.len) {
        if (a >= m.blocks[i + BLK.address] && a < m.blocks[i + BLK.address] + m.blocks[i + BLK.size]) {
          lines++;
          out.append(el('div', { onclick: () => { S.state = m.state; redrawAll(); blockInfo(file, c, { i, seg: m.blocks[i + BLK.segment] }); } },
            `event state ${m.state}${m === cur ? ' (shown now)' : ''}: ${['free', 'allocated', 'pending', 'merged'][m.blocks[i + BLK.state]]} block ${hex(m.blocks[i + BLK.address])} ${bytes(m.blocks[i + BLK.size])}`));
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
    for (let i = 0; i < A.length; i += AL) if (match.has(A[i + LIFE.stack])) S.hits.push({ alloc: A[i + LIFE.start], free: A[i + LIFE.end], stack: A[i + LIFE.stack], size: A[i + LIFE.size], addr: A[i + LIFE.address] });
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
