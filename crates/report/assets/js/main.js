// main.js: the test API's remaining entry points, then the first drawing.
api.select = (file, dev) => { choose(file, dev); };
api.selected = () => ({ file: S.file, dev: S.dev, device: DATA.files[S.file].devices[S.dev] ? DATA.files[S.file].devices[S.dev].device : null,
  highlight: S.highlight ? S.highlight.size : 0, hits: S.hits.length, sel: S.sel, detail: detail.textContent, search: document.getElementById('search').value,
  role: S.highlightRole, segment: S.c && S.c.segs && S.c.segs.pts ? S.c.segs.sel : -1, stack: S.stack });
api.allFiles = () => DATA.files;
api.devices = () => DATA.files.map((f) => f.devices.map((d) => ({ device: d.device, moments: d.moments.length, events: d.events,
  exact: !!(d.state_ops && d.state_ops.exact), first: d.state_ops ? d.state_ops.first : 0, allocations: d.allocations.length ? decodeDevice(d).na : 0 })));
api.points = () => (S.c ? S.c.points : 0);
api.keyframes = () => (S.c ? S.c.moments.map((m) => m.state) : []);
api.file = () => DATA.files[S.file];
// For the tests: the drawn allocations' dimming (the search's highlight).
api.dimmed = () => (S.c && S.c.drawn ? S.c.drawn.map((i) => ({ index: i, stack: S.c.allocs[i * AL + LIFE.stack], dim: dimAlloc(S.c, i) })) : []);
try {
  build();
  api.firstPaintMs = performance.now() - T0;
  api.sinceNavigationMs = performance.now();
  document.body.dataset.ready = '1';
  api.ready = true;
} catch (e) {
  main.textContent = 'The report could not be drawn: ' + e.message;
  throw e;
}
