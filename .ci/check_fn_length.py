#!/usr/bin/env python3
"""List the Rust functions whose bodies are longer than a limit of lines; exit 1 if any.

A function of hundreds of lines is hard to read, review and test; this check keeps new
ones from appearing, and with an allow list (the known long ones) it can be turned on
before they are all shortened: the list can only shrink, since an entry whose function is
no longer over the limit (or is gone) is reported as stale and fails the check too.

Counted: every `fn` item with a body (free functions, methods, trait default methods,
nested fns, each its own entry) in crates/*/src/**/*.rs, from the `fn` line to the closing
brace inclusive. Left out: test code (files named tests.rs, modules declared
`#[cfg(test)] mod x;`, the item after `#[cfg(test)]`, fns marked `#[test]`), bodiless
`fn x();`, closures, and `macro_rules!` bodies. Comments and literals are blanked first,
so braces in strings, raw strings, chars ('{') and doc comments do not count.

Usage: check_fn_length.py [--limit N] [--allow FILE] [--report] [PATH ...]
  PATH: a .rs file, a crate, its src/, a folder of crates, or any folder of .rs files;
        default: crates/*/src here.
  --limit N: the most lines a function may span (default 150).
  --allow FILE: lines `path::fn_name` (path as printed, from the repository root; # for
        comments) that may be over the limit; each must still be, or it is stale.
  --report: also print how many functions exceed 80, 100, 150 and 200 lines, and the 20
        longest.
Python 3.9+, stdlib only, so it runs before any toolchain is installed.
"""
import argparse
import bisect
import re
import sys
from pathlib import Path

from rust_source import blank_span, close_of, drop_cfg_test, strip

ROOT = Path(__file__).resolve().parent.parent
TEST_ATTR = re.compile(r'#\s*\[\s*(?:\w+\s*::\s*)*test\s*\]')  # #[test], #[tokio::test]
MACRO = re.compile(r'\bmacro_rules\s*!\s*\w+\s*[{(\[]')
FN = re.compile(r'\bfn\s+(?:r#)?(\w+)')


def drop_test_code(text):
    """Blank `macro_rules!` bodies (their `fn`s are templates) and each item after
    `#[cfg(test)]`; also return the modules declared `#[cfg(test)] mod x;`."""
    while m := MACRO.search(text):  # blanked, it is not found again
        text = blank_span(text, m.start(), close_of(text, m.end() - 1) + 1)
    return drop_cfg_test(text)


def rust_files(paths):
    """{file: stripped text, test code blanked} for the non-test .rs files under paths."""
    files = []
    for p in map(Path, paths or [ROOT / 'crates']):
        if p.is_file():
            files.append(p)
        elif (p / 'src').is_dir() or list(p.glob('*/src')):
            srcs = [p / 'src'] if (p / 'src').is_dir() else sorted(p.glob('*/src'))
            files += [f for s in srcs for f in sorted(s.rglob('*.rs'))]
        else:
            files += sorted(p.rglob('*.rs'))
    texts, excluded = {}, {f for f in files if f.name == 'tests.rs'}
    for f in files:
        text = strip(f.read_text(encoding='utf-8', errors='replace'))
        if re.search(r'#!\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]', text):
            excluded.add(f)  # #![cfg(test)]: the whole file is test code
        texts[f], mods = drop_test_code(text)
        # `mod x;` in a/b.rs lives in a/b/x.rs or a/b/x/; in lib.rs/mod.rs, beside it.
        here = f.parent if f.name in ('lib.rs', 'main.rs', 'mod.rs') else f.with_suffix('')
        excluded.update(g for x in mods for g in files
                        if g == here / (x + '.rs') or (here / x) in g.parents)
    return {f: t for f, t in texts.items() if f not in excluded}


def functions(text):
    """(line, name, lines spanned) of each fn with a body in text, tests left out."""
    newlines = [i for i, ch in enumerate(text) if ch == '\n']
    line_of = lambda pos: bisect.bisect_left(newlines, pos) + 1  # noqa: E731
    for m in FN.finditer(text):
        # The signature ends at the body's `{` or at `;` (none), outside (), [] and <>:
        # `-> [u8; 4]`, `where F: Fn() -> Vec<T>` (a `>` after `-` is an arrow).
        depth, j = 0, m.end()
        while j < len(text) and not (depth == 0 and text[j] in '{;'):
            ch = text[j]
            depth += (ch in '([<') - (ch in ')]' or (ch == '>' and text[j - 1] != '-'))
            j += 1
        if j == len(text) or text[j] == ';':
            continue
        # Attributes sit between the end of the item before (`;`, `{`, `}`) and the fn.
        before = max(text.rfind(c, 0, m.start()) for c in ';{}')
        if TEST_ATTR.search(text, before + 1, m.start()):
            continue
        first = line_of(m.start())
        yield first, m.group(1), line_of(close_of(text, j)) - first + 1


def shown(f):
    f = f.resolve()
    return str(f.relative_to(ROOT)) if f.is_relative_to(ROOT) else str(f)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('paths', nargs='*')
    ap.add_argument('--limit', type=int, default=150)
    ap.add_argument('--allow', type=Path)
    ap.add_argument('--report', action='store_true')
    args = ap.parse_args(argv)
    texts = rust_files(args.paths)
    fns = sorted((shown(f), line, name, n) for f, t in texts.items()
                 for line, name, n in functions(t))
    allow = set()
    if args.allow:
        allow = {ln.split('#')[0].strip() for ln in args.allow.read_text().splitlines()} - {''}
    over = [x for x in fns if x[3] > args.limit]
    bad = [x for x in over if f'{x[0]}::{x[2]}' not in allow]
    allowed = [x for x in over if f'{x[0]}::{x[2]}' in allow]
    stale = sorted(allow - {f'{x[0]}::{x[2]}' for x in over})

    if args.report:
        for t in (80, 100, 150, 200):
            print(f'functions over {t:3} lines: {sum(x[3] > t for x in fns)}')
        print('the 20 longest:')
        for path, line, name, n in sorted(fns, key=lambda x: -x[3])[:20]:
            print(f'  {n:5}  {path}:{line} fn {name}')
    for path, line, name, n in bad:
        print(f'{path}:{line} fn {name}: {n} lines (limit {args.limit})')
    if allowed:
        print(f'allowed by {args.allow} ({len(allowed)}):')
        for path, line, name, n in allowed:
            print(f'  {path}:{line} fn {name}: {n} lines (limit {args.limit})')
    for entry in stale:
        print(f'stale allow entry: {entry} (not over {args.limit} lines any more, '
              'or gone): remove it')
    print(f'{len(fns)} functions in {len(texts)} files; {len(over)} over {args.limit} lines'
          f' ({len(allowed)} allowed), {len(stale)} stale allow entries')
    return 1 if bad or stale else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
