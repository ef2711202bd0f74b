// roles.js: the timeline stacked by role (bytes by role come from the analysis).
const ROLE_COLOUR = { parameters: '#4f46e5', gradients: '#f59e0b', optimizer_state: '#a855f7', activations: '#14b8a6', temporaries: '#f472b6', inputs: '#84cc16', other: '#78716c' };
const ROLE_LABEL = { parameters: 'parameters', gradients: 'gradients', optimizer_state: 'optimizer state', activations: 'activations', temporaries: 'temporaries', inputs: 'inputs', other: 'other' };
const roleColour = (r) => ROLE_COLOUR[r] || '#9ca3af';
// The analysis' figures of a role (confidence and evidence), null without them.
function roleFigures(file, name) {
  const a = analysisDev(file);
  return a && a.roles && a.roles.by_role ? a.roles.by_role[name] || null : null;
}
// Each drawn role's bytes at the allocated peak and its most at any moment, read from
// the drawn buckets (the finest level): the bucket holding the allocated peak (the
// first with the most allocated) gives "at peak", the buckets' maxima give "max".
function roleTotals(c) {
  const L = c.levels[0], R = c.R;
  let p = 0;
  for (let i = 1; i < L.n; i++) if (L.alloc[i] > L.alloc[p]) p = i;
  return c.roles.map((name, j) => {
    let max = 0;
    for (let i = 0; i < L.n; i++) max = Math.max(max, L.rmax[i * R + j]);
    return { role: name, at_peak: L.n ? L.rat[p * R + j] : 0, max, peak_state: L.amax[p] };
  });
}
api.roleTotals = () => (S.c && S.c.R ? roleTotals(S.c) : []);
function roleLegend(file, dev, c) {
  const box = el('div', { id: 'role-legend', class: 'note' });
  if (!c.R) return box;
  const a = analysisDev(file);
  const steps = a && a.roles ? a.roles.steps : '';
  const t = el('table', { id: 'role-table' }, el('tr', {}, el('th', {}, 'role'), el('th', { class: 'n' }, 'at the allocated peak'), el('th', { class: 'n' }, 'most at any moment'), el('th', { class: 'n' }, 'confidence')));
  for (const r of roleTotals(c)) {
    const f = roleFigures(file, r.role);
    t.append(el('tr', { 'data-role': r.role, 'data-at-peak': String(r.at_peak), 'data-max': String(r.max) },
      el('td', {}, el('i', { style: `display:inline-block;width:10px;height:10px;margin-right:4px;background:${roleColour(r.role)}` }), ROLE_LABEL[r.role] || r.role),
      el('td', { class: 'n' }, bytes(r.at_peak)), el('td', { class: 'n' }, bytes(r.max)), el('td', { class: 'n' }, f ? f.confidence.toFixed(2) : '—')));
  }
  box.append(t, el('div', {}, 'Tensor bytes (requests) by role, as summary and analyze count them' + (steps ? ` (${steps})` : '') +
    '; the light band above them is the rest of allocated (blocks\u2019 rounding). Roles are inferred from phases, lifetimes and sizes: click a band for the evidence.'));
  const ms = a && a.roles ? a.roles.model_state : null;
  if (ms) box.append(el('div', { id: 'role-model-state' }, 'Model state, from the sizes of the blocks kept through the trace: ' + modelStateText(ms)));
  // Roles whose totals the trace cannot tell: never shown as 0.
  const byRole = a && a.roles && a.roles.by_role ? a.roles.by_role : {};
  for (const [name, b] of Object.entries(byRole)) {
    if (b.cannot_tell) box.append(el('div', { class: 'role-cannot-tell', 'data-role': name }, `${ROLE_LABEL[name] || name}: cannot tell \u2014 ${b.cannot_tell}`));
  }
  return box;
}
// "32 layers of 10 tensors (3 × 100.0 MiB, …), 4 outside them; 1 copy of 12.7 GiB" (roles.model_state).
function modelStateText(ms) {
  const list = (v) => v.slice(0, 4).map(([b, n]) => `${n} \u00d7 ${bytes(b)}`).join(', ') + (v.length > 4 ? ', \u2026' : '');
  const n = ms.per_layer.reduce((s, x) => s + x[1], 0), out = ms.outside_layers.reduce((s, x) => s + x[1], 0);
  let t = `${ms.layers} layers of ${n} tensors (${list(ms.per_layer)}), ${out} tensor(s) outside them (${list(ms.outside_layers)}); ${ms.copies} ${ms.copies === 1 ? 'copy' : 'copies'} of ${bytes(ms.copy_bytes)}`;
  if (ms.copies > 1) t += `: the parameters and ${ms.copies - 1} of gradients or optimizer state, which the sizes do not tell apart`;
  if (ms.half_size_casts) t += `; autocast\u2019s half-size casts of ${ms.half_size_casts} per-layer size(s) seen`;
  return t + '.';
}
