"""The Rust-source reading the .ci checks share: comments and literals blanked so that
brace matching and path search see only code, bracket matching, and the patterns of
attributes that mark test code. Standard library only."""
import re

# One token that is not plain code: a line comment, the start of a block comment, a raw
# string (r"..", r#".."#: no escapes), a string, a char ('{', '\'', '\u{7b}'), else a
# lifetime or label ('a: no closing quote). Tried in this order at each place.
LEX = re.compile(r'''//[^\n]*|/\*|(?<!\w)[bc]?r(\#*)"(.*?)"\1|"((?:\\.|[^"\\])*)"'''
                 r"""|'(\\(?:u\{\w*\}|.)|[^\\'\n])'|'\w+""", re.S)
ATTR = re.compile(r'\s*#\s*\[')
CFG_TEST = re.compile(r'#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]')
TEST_MOD_DECL = re.compile(r'\s*(?:pub\s*(?:\([^)]*\))?\s*)?mod\s+(\w+)\s*;')


def strip(src):
    """`src` with comments and the insides of string and char literals blanked (newlines
    and offsets kept), so that brace matching and path search see only code."""
    out, pos = list(src), 0
    while m := LEX.search(src, pos):
        (a, pos), lit = m.span(), m.lastindex
        if m.group() == '/*':  # block comments nest in Rust
            depth = 1
            while depth and pos < len(src):
                two = src[pos:pos + 2]
                depth += {'/*': 1, '*/': -1}.get(two, 0)
                pos += 2 if two in ('/*', '*/') else 1
        elif lit is None and m.group()[0] == "'":
            continue  # a lifetime or label ('a, 'static): code, not a char
        elif lit:
            a, pos = m.span(lit)  # a literal: blank its inside, keep its quotes
        for k in range(a, pos):
            if out[k] != '\n':
                out[k] = ' '
        pos = max(pos, m.end())
    return ''.join(out)


def close_of(text, i):
    """Index of the bracket closing the one at text[i] (text already stripped)."""
    o, c, depth = text[i], {'{': '}', '(': ')', '[': ']'}[text[i]], 0
    for j in range(i, len(text)):
        depth += (text[j] == o) - (text[j] == c)
        if depth == 0:
            return j
    return len(text) - 1


def blank_span(text, a, b):
    return text[:a] + re.sub(r'[^\n]', ' ', text[a:b]) + text[b:]


def drop_cfg_test(text):
    """Blank each item after `#[cfg(test)]` (a module, a function, a `use`, a field, an
    arm); also return the names of the modules declared `#[cfg(test)] mod x;` (their
    files are test code)."""
    test_mods = []
    while m := CFG_TEST.search(text):
        j = m.end()
        while a := ATTR.match(text, j):  # skip further attributes
            j = close_of(text, a.end() - 1) + 1
        start, depth, end = j, 0, len(text)
        for j in range(start, len(text)):  # the item ends at `;`, after `{..}`, at `,`
            ch = text[j]  # (a field, an arm), or where the enclosing brackets close
            if depth == 0 and ch in ';{,)]}':
                end = close_of(text, j) + 1 if ch == '{' else j + (ch in ';,')
                break
            depth += (ch in '([{') - (ch in ')]}')
        if d := TEST_MOD_DECL.match(text[start:end]):
            test_mods.append(d.group(1))
        text = blank_span(text, m.start(), end)
    return text, test_mods
