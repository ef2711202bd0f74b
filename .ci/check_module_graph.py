#!/usr/bin/env python3
"""Check that no crate's top-level modules depend on each other in a cycle.

A crate's top-level modules (`src/x.rs`, or the folder `src/x/` with all it holds) are the
units a crate is split along; a cycle among them (a uses crate::b, b uses crate::a) means
none of them can be moved to another crate, or understood, alone. Edges come from paths
`crate::b...` (also inside `use crate::{b, c::{d, e}}` groups) and `super::...::b` that
climb to the crate root (`super::x` from inside a/ stays in a: no edge). Comments,
strings and test code (the item after `#[cfg(test)]`, files named tests.rs, modules
declared `#[cfg(test)] mod x;`) are left out; lib.rs/main.rs are the root, not a node.

Every strongly connected component of more than one module is reported, as the shortest
cycle through each of its edges, with where each edge is written; exit 1 if any.

Usage: check_module_graph.py [--dot] [DIR ...]
  DIR: a crate (with src/), its src/, or a folder of crates; default: crates/*/src here.
  --dot: print the graph (Graphviz; cycle edges red) instead, and exit 0.
Python 3.9+, stdlib only, so it runs before any toolchain is installed.
"""
import re
import sys
from collections import defaultdict, deque
from pathlib import Path

from rust_source import close_of, drop_cfg_test, strip

ROOT = Path(__file__).resolve().parent.parent
INLINE_MOD = re.compile(r'\bmod\s+(\w+)\s*\{')
TOKEN = re.compile(r'\$?\w+|::|[{},*;]|\S')


def scan_crate(src):
    """{module: {target: [(file, line, written path)]}} for the crate whose src/ is src."""
    files, texts, excluded = sorted(src.rglob('*.rs')), {}, {f for f in src.rglob('tests.rs')}
    for f in files:
        text = strip(f.read_text(encoding='utf-8', errors='replace'))
        if re.search(r'#!\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]', text):
            excluded.add(f)  # #![cfg(test)]: the whole file is test code
        # Macro bodies stay: a `crate::b` (or `$crate::b`) there is a use of b wherever
        # the macro is expanded.
        texts[f], mods = drop_cfg_test(text)
        # `mod x;` in a/b.rs lives in a/b/x.rs or a/b/x/; in lib.rs/mod.rs, beside it.
        here = f.parent if f.name in ('lib.rs', 'main.rs', 'mod.rs') else f.with_suffix('')
        excluded.update(g for x in mods for g in files
                        if g == here / (x + '.rs') or (here / x) in g.parents)
    # Modules: the files left, less the root (lib.rs, main.rs; bin/ holds other roots).
    rel = {f: f.relative_to(src).parts for f in files if f not in excluded
           and f.relative_to(src).parts[0] not in ('lib.rs', 'main.rs', 'bin')}
    modules = {p[0].removesuffix('.rs') for p in rel.values()}
    graph = defaultdict(lambda: defaultdict(list))
    for f, parts in rel.items():
        # The module path of the file: a.rs, a/mod.rs -> [a]; a/b.rs, a/b/mod.rs -> [a, b].
        modpath = [p.removesuffix('.rs') for p in parts if p != 'mod.rs']
        text = texts[f]
        inline = [(m.start(), close_of(text, m.end() - 1)) for m in INLINE_MOD.finditer(text)]
        toks = [(t.group(), t.start()) for t in TOKEN.finditer(text)]
        for k, (tok, pos) in enumerate(toks):
            if tok not in ('crate', '$crate', 'super') or (k and toks[k - 1][0] == '::') or (
                    k > 1 and toks[k - 2][0] == '(' and toks[k - 1][0] == 'in'):
                continue  # mid-path, or `pub(in crate::x)` (a visibility, no use)
            depth = len(modpath) + sum(a < pos < b for a, b in inline)
            for path in use_tree(toks, k)[0]:
                names = [s for s, _ in path]
                target = resolve(names, depth)
                if target in modules and target != modpath[0]:
                    t = names.index(target, 1)  # report the line of the target's name
                    line = text.count('\n', 0, toks[path[t][1]][1]) + 1
                    written = '::'.join(names[:t + 1])
                    graph[modpath[0]][target].append(('/'.join(parts), line, written))
    return modules, graph


def use_tree(toks, j):
    """The paths written from token j on, as [(segment, token index)] lists, and the index
    after them: `crate::a::{b, c::{d, e as f}, *}` gives crate::a::b, crate::a::c::d, ..."""
    segs, paths = [], []
    while j < len(toks):
        if toks[j][0] == '{':  # a group (after `::`): comma-separated subtrees
            j += 1
            while j < len(toks) and toks[j][0] != '}':
                sub, j = use_tree(toks, j)
                paths += [segs + s for s in sub]
                while j < len(toks) and toks[j][0] not in ',}':
                    j += 1  # `as name`, `*`: no further paths
                j += toks[j][0] == ',' if j < len(toks) else 0
            return paths, j + 1
        if not re.match(r'\$?\w', toks[j][0]):
            break
        segs.append((toks[j][0], j))
        j += 1
        if j >= len(toks) or toks[j][0] != '::':
            break
        j += 1
    return paths + ([segs] if segs else []), j


def resolve(path, depth):
    """The top-level module a path names, or None: crate::b -> b; from a module `depth`
    deep, depth supers reach the root, so super::..::b -> b; fewer stay inside."""
    if path[0] in ('crate', '$crate'):
        return path[1] if len(path) > 1 else None
    ups = next((i for i, s in enumerate(path) if s != 'super'), len(path))
    return path[ups] if ups == depth and ups < len(path) else None


def sccs(nodes, graph):
    """The strongly connected components of more than one node. A crate has few modules,
    so mutual reachability (one search from each node) is simple and fast enough."""
    reach = {}
    for u in nodes:
        seen, todo = set(), [u]
        while todo:
            new = set(graph[todo.pop()]) - seen
            seen |= new
            todo += new
        reach[u] = seen
    comps = []
    for u in sorted(nodes):
        comp = {u} | {v for v in reach[u] if u in reach[v]}
        if len(comp) > 1 and comp not in comps:
            comps.append(comp)
    return comps


def cycles(comp, graph):
    """For each edge u -> v inside comp, the shortest cycle through it (v back to u by
    breadth-first search), without repeats: every edge that closes a cycle is shown."""
    found = []
    for u in sorted(comp):
        for v in sorted(w for w in graph[u] if w in comp):
            prev, todo = {v: None}, deque([v])
            while todo and u not in prev:
                x = todo.popleft()
                for y in sorted(graph[x]):
                    if y in comp and y not in prev:
                        prev[y] = x
                        todo.append(y)
            path, x = [], u
            while x is not None:
                path.append(x)
                x = prev[x]
            cyc = [u] + path[::-1][:-1]  # path is u .. v backwards: u -> v -> .. -> u
            i = cyc.index(min(cyc))  # one rotation, so each cycle is listed once
            cyc = cyc[i:] + cyc[:i]
            if cyc not in found:
                found.append(cyc)
    return found


def crate_dirs(args):
    """The src/ folders named by args (a crate, its src/, or a folder of crates)."""
    out = []
    for a in map(Path, args or [ROOT / 'crates']):
        if a.name == 'src' and a.is_dir():
            out.append(a)
        elif (a / 'src').is_dir():
            out.append(a / 'src')
        else:
            out += sorted(p for p in a.glob('*/src') if p.is_dir())
    return out


def crate_name(src):
    toml = src.parent / 'Cargo.toml'
    m = toml.is_file() and re.search(r'^\[package\][^\[]*?^name\s*=\s*"([^"]+)"',
                                     toml.read_text(), re.M | re.S)
    return m.group(1) if m else src.parent.name


def main(argv):
    dot = '--dot' in argv
    dirs = crate_dirs([a for a in argv if a != '--dot'])
    n_modules, bad, lines = 0, 0, ['digraph modules {', '  rankdir=LR; node [shape=box];']
    for src in dirs:
        name = crate_name(src)
        modules, graph = scan_crate(src)
        n_modules += len(modules)
        comps = sccs(modules, graph)
        lines.append(f'  subgraph "cluster_{name}" {{ label="{name}";')
        lines += [f'    "{name}/{m}" [label="{m}"];' for m in sorted(modules)]
        for u in sorted(graph):
            for v in sorted(graph[u]):
                red = ' [color=red]' if any(u in c and v in c for c in comps) else ''
                lines.append(f'    "{name}/{u}" -> "{name}/{v}"{red};')
        lines.append('  }')
        for comp in comps:
            for cyc in cycles(comp, graph):
                bad += 1
                where = ', '.join('{0}:{1} uses {2}'.format(*graph[a][b][0])
                                  for a, b in zip(cyc, cyc[1:] + cyc[:1]))
                if not dot:
                    print(f"{name}: cycle {' -> '.join(cyc + cyc[:1])} ({where})")
    if dot:
        print('\n'.join(lines + ['}']))
        return 0
    summary = f'{len(dirs)} crates, {n_modules} modules'
    print(f'{summary}, {bad} cycle' + 's' * (bad > 1) if bad else f'{summary}, no cycles')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
