// util.js: DOM and canvas helpers, and the formatting of figures (bytes(), as Rust's
// fragscope_alloc::format_size; percentages; addresses; colours).
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) if (k != null) e.append(k instanceof Node ? k : String(k));
  return e;
}
// Sizes as every CLI command prints them (PyTorch's `format_size`, Rust's
// `fragscope_alloc::format_size`): "512 bytes", "1.50 KiB" up to 1 MiB, "12.50 MiB" up to
// 1 GiB, then GiB; two decimals rounded as Rust rounds them (an exact tie to the even
// digit: 7.125 GiB is "7.12 GiB" there, where toFixed would say 7.13). Kept here for the
// figures the page computes as the user zooms or clicks; the browser test "byte
// formatter" checks it against Rust's text on every value of
// crates/report/tests/format_size.json.
function bytes(n) {
  if (n == null || isNaN(n)) return '—';
  const sign = n < 0 ? '-' : '', v = Math.abs(n);
  if (v <= 1024) return sign + Math.round(v) + ' bytes';
  const [u, name] = v <= 1048576 ? [1024, 'KiB'] : v <= 1073741824 ? [1048576, 'MiB'] : [1073741824, 'GiB'];
  const q = v / u;
  // q is a tie in the third decimal exactly when 8q is an odd integer (q = odd/200 in
  // binary needs 25 | odd); q·100 is then exact.
  let h;
  if (Number.isInteger(q * 8) && (q * 8) % 2 === 1) { h = Math.floor(q * 100); if (h % 2 === 1) h += 1; return sign + (h / 100).toFixed(2) + ' ' + name; }
  return sign + q.toFixed(2) + ' ' + name;
}
// Tick values for a byte axis from 0 to `max`: multiples of a round step (1, 2, 2.5 or 5
// times a power of ten) of the unit bytes() writes `max` in, about `n` of them, so that
// a tick reads "10.00 GiB" or "512.00 MiB", never "514.00 MiB" or "14.23 GiB".
function byteTicks(max, n) {
  if (!(max > 0)) return [0];
  const u = max <= 1024 ? 1 : max <= 1048576 ? 1024 : max <= 1073741824 ? 1048576 : 1073741824;
  const raw = max / u / (n || 4), mag = Math.pow(10, Math.floor(Math.log10(raw)));
  let step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) || 10 * mag;
  if (u === 1) step = Math.max(1, Math.round(step));
  const out = [];
  for (let k = 0; k * step * u <= max * (1 + 1e-9); k++) out.push(k * step * u);
  return out;
}
// Tick values for a count axis (trace events) from a to b: round multiples.
function countTicks(a, b, n) {
  const raw = Math.max(1, (b - a) / (n || 5)), mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = Math.max(1, [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) || 10 * mag);
  const out = [];
  for (let v = Math.ceil(a / step) * step; v <= b; v += step) out.push(v);
  return out;
}
api.byteTicks = (max, n) => byteTicks(max, n);
const pct = (x) => (x == null || isNaN(x) ? '—' : (100 * x).toFixed(1) + '%');
const hex = (a) => '0x' + Math.round(a).toString(16);
function color(i) {
  if (i < 0) return '#9ca3af';
  // Golden-angle hues, skipping the reds of the reserved curve.
  const h = 20 + ((i * 137.508) % 300);
  return `hsl(${h.toFixed(0)},62%,${52 + (i % 3) * 6}%)`;
}
// The colour of stack si's call site: one colour per call site as `analyze` names it
// (file.sites), whatever the stack above it (the same `attention.py:191` reached in
// different steps is one site, one colour). Sites are numbered in the order of the
// file's stack table, once per file.
function siteColour(file, si) {
  if (si == null || si < 0 || !file.sites || file.sites[si] == null) return color(-1);
  if (!file._siteIx) {
    const byName = new Map();
    file._siteIx = file.sites.map((n) => { if (!byName.has(n)) byName.set(n, byName.size); return byName.get(n); });
  }
  return color(file._siteIx[si]);
}
// Every stack of the file whose call site is stack si's (a highlight of a call site
// covers all of them, as its colour does).
function siteStacks(file, si) {
  if (si == null || si < 0 || !file.sites || file.sites[si] == null) return new Set([si]);
  const name = file.sites[si], out = new Set();
  file.sites.forEach((n, i) => { if (n === name) out.add(i); });
  return out;
}
function fig(key, value, label, shown) {
  return el('div', { class: 'fig', 'data-fig': key, 'data-value': String(value) }, el('b', {}, shown), el('span', {}, label));
}
function canvas(cls, h) {
  const c = el('canvas', { class: cls });
  c.style.height = h + 'px';
  return c;
}
function ctxOf(c) {
  const dpr = window.devicePixelRatio || 1;
  const w = c.clientWidth || 800, h = c.clientHeight;
  if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
    c.width = Math.round(w * dpr);
    c.height = Math.round(h * dpr);
  }
  const g = c.getContext('2d');
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, h);
  return { g, w, h };
}
function timed(name, fn) {
  const t = performance.now();
  fn();
  api.drawMs[name] = performance.now() - t;
}

api.bytes = (n) => bytes(n);
