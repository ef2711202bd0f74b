// pools.js: the private-pool band (DeviceData.pools, only for a device with private pools:
// CUDA graphs, MemPools), like memory_viz's private-pool view: each pool's memory apart
// from the default pools, as a table at the end and a reserved line on the timeline; the
// state view and the timeline's segments name the pool of a private-pool segment.
const POOL_COLOURS = ['#ef4444', '#7c3aed', '#d97706', '#0891b2', '#be185d', '#4d7c0f'];
function poolColour(j) { return POOL_COLOURS[j % POOL_COLOURS.length]; }
function poolName(p) { return p.kind === 'default pools' ? 'default pools' : `${p.kind} (${p.pool[0]}, ${p.pool[1]})`; }
// The timeline legend's entries for the private pools' reserved lines (none without).
function poolLegend(dev) {
  const out = [];
  (dev.pools || []).forEach((p, j) => { if (j > 0) out.push(el('i', { style: `background:${poolColour(j)}`, 'data-pool-line': p.pool.join(',') }), `${poolName(p)} reserved`); });
  return out;
}
// The pools of the selected device whose segments (at the end, or made during the trace)
// include one at `addr`: more than one when segments of two pools reused the address.
function poolsAt(addr) {
  const d = DATA.files[S.file].devices[S.dev];
  return ((d && d.pools) || []).filter((p) => {
    if (!p._addrs) p._addrs = new Set(f64(p.segment_addresses));
    return p._addrs.has(addr);
  });
}
// The pool of the selected device's segment at `addr`, one PyTorch marked as a private
// pool's ('private pool' when its pool cannot be told).
function poolNameAt(addr) {
  const p = poolsAt(addr).find((q) => q.kind !== 'default pools');
  return p ? poolName(p) : 'private pool';
}
// The name of the private pool of the segment at `addr` for the timeline's segments, whose
// lives do not carry PyTorch's pool mark: null unless exactly one pool, a private one, holds
// the address (the pools' lists do not say when an address changed pools).
function privatePoolNameAt(addr) {
  const ps = poolsAt(addr);
  return ps.length === 1 && ps[0].kind !== 'default pools' ? poolName(ps[0]) : null;
}
function poolsView(file, dev) {
  if (!dev.pools || !dev.pools.length) return document.createDocumentFragment();
  const sec = el('section', { id: 'pools' });
  sec.append(el('h2', {}, 'Private pools: memory held apart from the default pools'));
  sec.append(el('p', { class: 'note' }, 'A private pool (a CUDA graph\u2019s, or a MemPool\u2019s) keeps its blocks: its free memory serves only its own requests. ' +
    'At the end of the recording, from the segments PyTorch wrote; the timeline draws each private pool\u2019s reserved bytes (dotted).'));
  const t = el('table', { id: 'pools-table' }, el('tr', {}, el('th', {}, 'pool'), el('th', { class: 'n' }, 'segments'), el('th', { class: 'n' }, 'reserved'),
    el('th', { class: 'n' }, 'allocated'), el('th', { class: 'n' }, 'free in cache'), el('th', { class: 'n' }, 'largest free block'), el('th', { class: 'n' }, 'peak reserved')));
  dev.pools.forEach((p, j) => {
    t.append(el('tr', { 'data-pool': p.pool.join(','), 'data-reserved': String(p.reserved_bytes), 'data-allocated': String(p.allocated_bytes),
      'data-free': String(p.cached_free_bytes), 'data-segments': String(p.segments), 'data-peak': String(p.peak_reserved_bytes) },
    el('td', {}, el('i', { class: 'swatch', style: `background:${poolColour(j)}` }), ' ', poolName(p)), el('td', { class: 'n' }, String(p.segments)),
    el('td', { class: 'n' }, bytes(p.reserved_bytes)), el('td', { class: 'n' }, bytes(p.allocated_bytes)), el('td', { class: 'n' }, bytes(p.cached_free_bytes)),
    el('td', { class: 'n' }, bytes(p.largest_free_block_bytes)), el('td', { class: 'n' }, bytes(p.peak_reserved_bytes))));
  });
  sec.append(t);
  return sec;
}
// For the tests: each pool's drawn reserved line at the finest level (its highest value).
api.poolLines = () => {
  const d = DATA.files[S.file].devices[S.dev];
  if (!d || !d.pools) return [];
  const c = decodeDevice(d);
  const most = (a) => { let m = 0; for (const v of a) if (v > m) m = v; return m; };
  return d.pools.map((p, j) => ({ pool: p.pool.join(','), max: most(c.levels[0].pools[j]), coarsest: most(c.levels[c.levels.length - 1].pools[j]) }));
};
