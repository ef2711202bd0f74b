// fit.js: view 4b, `fragscope report --fit CAPACITY`: the changes that make this device's
// run fit on each card asked for, cheapest first, each replayed (the `fit` command's
// document, drawn as it is: the same figures as `fragscope fit --json`).
function fitView(file, dev) {
  const sec = el('section', { id: 'fit' });
  sec.append(el('h2', {}, '4b. Make it fit: the cheapest changes, each replayed'));
  if (file.fit.error) {
    sec.append(el('p', { class: 'note', id: 'fit-none' }, `No fit search: ${file.fit.error}.`));
    return sec;
  }
  const d = (file.fit.devices || []).find((x) => x.device === dev.device);
  if (!d) {
    sec.append(el('p', { class: 'note', id: 'fit-none' }, `No fit search for cuda:${dev.device}: it has no allocation trace to replay.`));
    return sec;
  }
  const predicted = !!file.fit.predicted;
  sec.append(el('p', { class: 'note' }, `Replayed on an unlimited device: peak reserved ${bytes(d.peak_reserved_unlimited)}, peak allocated ${bytes(d.peak_allocated_unlimited)}` +
    (d.live_bytes_peak != null ? `; the live tensors reach ${bytes(d.live_bytes_peak)} (no allocator setting holds less)` : '') + `. ${d.steps}.`));
  for (const c of d.cards) sec.append(fitCard(c, predicted));
  sec.append(el('p', { class: 'note' }, '“replay”: the recorded requests replayed through the allocator model under the change; “model”: the recorded trace transformed by the change (activation checkpointing, ZeRO, set_to_none) and replayed, not a recording' +
    (predicted ? '; “prediction”: the run at a size nobody recorded, synthesised from the recordings and replayed' : '') + '. `fragscope fit --json` gives the same figures.'));
  return sec;
}

// One card: its verdict, the options table (margin drawn against the card), and what the
// search left out or, when nothing fits, the smallest capacity that would.
function fitCard(c, predicted) {
  const box = el('div', { class: 'fit-card', 'data-capacity': c.capacity, 'data-fits': c.fits_as_recorded ? '1' : '0' });
  box.append(el('h3', {}, `${c.capacity} (${bytes(c.capacity_bytes)} for PyTorch's allocator)`), el('p', { class: 'fit-verdict' }, c.verdict));
  if (c.options.length) {
    const t = el('table', { class: 'fit-table' }, el('tr', {}, el('th', { class: 'n' }, '#'), el('th', {}, 'change'), el('th', {}, 'cost'), el('th', { class: 'n' }, 'peak reserved'),
      el('th', { class: 'n' }, 'peak allocated'), el('th', { class: 'n' }, 'margin'), el('th', {}, 'peak reserved of the card'), el('th', {}, 'figures')));
    for (const o of c.options) {
      const kind = !o.model ? 'replay' : /^predicted/.test(o.basis) ? 'prediction' : 'model';
      const share = Math.min(1, o.peak_reserved / Math.max(1, c.capacity_bytes));
      t.append(el('tr', { 'data-rank': String(o.rank), 'data-model': o.model ? '1' : '0', 'data-cost-class': o.cost_class, 'data-peak-reserved': String(o.peak_reserved),
        'data-peak-allocated': String(o.peak_allocated), 'data-margin': String(o.margin), title: o.basis },
        el('td', { class: 'n' }, String(o.rank)), el('td', {}, o.change), el('td', {}, o.cost), el('td', { class: 'n' }, bytes(o.peak_reserved)),
        el('td', { class: 'n' }, bytes(o.peak_allocated)), el('td', { class: 'n' }, bytes(o.margin)),
        el('td', {}, el('span', { class: 'bar', style: `width:${Math.round(160 * share)}px;background:${o.model ? '#a78bfa' : '#22c55e'}` }), el('span', { class: 'bar', style: `width:${160 - Math.round(160 * share)}px;background:#e5e7eb` })),
        el('td', {}, kind)));
    }
    box.append(t);
    const m = c.options.find((o) => o.not_modelled && o.not_modelled.length);
    if (m) box.append(el('p', { class: 'note' }, `Not modelled by the role-level changes: ${m.not_modelled.join('; ')}.`));
  }
  for (const s of c.smallest_capacity || []) {
    box.append(el('p', { class: 'note fit-smallest' }, `Smallest capacity ${s.change}: ${bytes(s.bytes)} (${s.gpus.length ? s.gpus.join(', ') : 'no GPU listed is that large'}).`));
  }
  const notes = [];
  if (c.capacity_note) notes.push(`Capacity: ${c.capacity_note}.`);
  for (const p of c.pruned) notes.push(`Not replayed: ${p}.`);
  notes.push(`${c.replays} replays${predicted ? ' (predictions)' : ''}.`);
  box.append(el('p', { class: 'note' }, notes.join(' ')));
  return box;
}
