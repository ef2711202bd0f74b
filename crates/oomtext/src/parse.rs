//! Reading the text of an OOM error into an [`OomMessage`]: size tokens, the folded text the
//! scanner searches, the message anchors and one reader per message form.

use crate::model::{
    clearly_gt, printed_precision, MessageForm, OomMessage, ParseError, ProcessUse, GIB, KIB, MIB, ONE_EIB,
};
use fragscope_alloc::format_size;

// ---------------------------------------------------------------------------------------------
// Sizes
// ---------------------------------------------------------------------------------------------

/// Parse one size token such as `"12.50 MiB"`, `"512 bytes"` or `"1.20 GiB"` (the whole
/// string must be the token, surrounding blanks allowed).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (v, end) = size_at(s, 0)?;
    if s[end..].trim().is_empty() {
        Some(v)
    } else {
        None
    }
}

fn unit_bytes(unit: &str) -> Option<u64> {
    // PyTorch only prints bytes/KiB/MiB/GiB. The decimal-looking spellings are accepted
    // because people retype messages; PyTorch's own tables use them for binary units too.
    Some(match unit.to_ascii_lowercase().as_str() {
        "bytes" | "byte" | "b" => 1,
        "kib" | "kb" | "k" => KIB,
        "mib" | "mb" | "m" => MIB,
        "gib" | "gb" | "g" => GIB,
        "tib" | "tb" => 1024 * GIB,
        "pib" | "pb" => 1024 * 1024 * GIB,
        _ => return None,
    })
}

/// Parse a size token starting at byte `pos` of `s` (leading blanks skipped). Returns the
/// bytes and the end offset. Exact integer arithmetic: `mantissa × unit / 10^decimals`,
/// rounded half up, saturating at `u64::MAX` (the cudaMallocAsync form prints SIZE_MAX as
/// `17179869184.00 GiB`, which is 2^64).
fn size_at(s: &str, pos: usize) -> Option<(u64, usize)> {
    let b = s.as_bytes();
    let mut i = pos;
    while i < b.len() && b[i] == b' ' {
        i += 1;
    }
    // PyTorch never prints a sign; an edited or corrupted text may. The magnitude is read so
    // the rest of the message is not lost, and `inconsistencies` names the negative figure.
    if i + 1 < b.len() && b[i] == b'-' && b[i + 1].is_ascii_digit() {
        i += 1;
    }
    let num_start = i;
    let mut mantissa: u128 = 0;
    let mut decimals: u32 = 0;
    let mut seen_dot = false;
    let mut digits = 0u32;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_digit() {
            // 20 digits keep mantissa × unit (≤ 2^50) inside u128; longer is not a size
            if digits == 20 {
                return None;
            }
            mantissa = mantissa * 10 + u128::from(c - b'0');
            if seen_dot {
                decimals += 1;
            }
            digits += 1;
        } else if c == b'.' && !seen_dot && i + 1 < b.len() && b[i + 1].is_ascii_digit() {
            seen_dot = true;
        } else {
            break;
        }
        i += 1;
    }
    if digits == 0 || i == num_start {
        return None;
    }
    // at most one blank between number and unit ("12.50 MiB", "12.50MiB")
    let mut j = i;
    if j < b.len() && b[j] == b' ' {
        j += 1;
    }
    let unit_start = j;
    while j < b.len() && b[j].is_ascii_alphabetic() {
        j += 1;
    }
    let unit = unit_bytes(&s[unit_start..j])?;
    let den = 10u128.pow(decimals);
    let v = (mantissa * u128::from(unit) + den / 2) / den;
    Some((u64::try_from(v).unwrap_or(u64::MAX), j))
}

/// Parse the size token that *ends* at byte `end` of `s` (trailing blanks skipped), e.g.
/// the `1.05 GiB` in `"... 1.05 GiB allowed;"` given the offset of `allowed`.
fn size_before(s: &str, end: usize) -> Option<u64> {
    let b = s.as_bytes();
    let mut i = end.min(b.len());
    while i > 0 && b[i - 1] == b' ' {
        i -= 1;
    }
    let unit_end = i;
    while i > 0 && b[i - 1].is_ascii_alphabetic() {
        i -= 1;
    }
    if i == unit_end {
        return None;
    }
    if i > 0 && b[i - 1] == b' ' {
        i -= 1;
    }
    while i > 0 && (b[i - 1].is_ascii_digit() || b[i - 1] == b'.') {
        i -= 1;
    }
    let (v, e) = size_at(s, i)?;
    (e == unit_end).then_some(v)
}

// ---------------------------------------------------------------------------------------------
// Text scanning helpers
// ---------------------------------------------------------------------------------------------

/// The input with line breaks and blank runs folded to single spaces, and a map back to the
/// original byte offsets. Folding is what makes the scanner tolerant: messages arrive
/// wrapped by terminals and issue trackers, with PyTorch's double blanks collapsed, or as
/// `# `-commented lines in a script.
struct Flat {
    text: String,
    /// `map[i]` = byte offset in the original of `text`'s byte `i`.
    map: Vec<usize>,
}

fn flatten(src: &str) -> Flat {
    let mut text = String::with_capacity(src.len());
    let mut map = Vec::with_capacity(src.len());
    let mut offset = 0usize;
    for (n, line) in src.split('\n').enumerate() {
        let line_start = offset;
        offset += line.len() + 1;
        let body = line.trim_end_matches('\r');
        // Drop what wraps a pasted line: indentation, a log prefix (`[rank1]: `), quote and
        // comment markers (`> `, `# `, `// `) and list bullets (`- `, `* `, `+ `), in any
        // nesting (`> - `).
        let skipped = line_prefix_len(body);
        let body = &body[skipped..];
        if n > 0 && !text.ends_with(' ') && !text.is_empty() {
            text.push(' ');
            map.push(line_start.saturating_sub(1));
        }
        let base = line_start + skipped;
        for (k, ch) in body.char_indices() {
            if ch == '`' {
                // Markdown code spans (`...`): never part of PyTorch's text.
                continue;
            }
            if ch.is_whitespace() {
                if !text.ends_with(' ') {
                    text.push(' ');
                    map.push(base + k);
                }
            } else {
                let at = text.len();
                text.push(ch);
                for _ in at..text.len() {
                    map.push(base + k);
                }
            }
        }
    }
    Flat { text, map }
}

/// `[rank1]:`, `[default0]:`, `[RANK 3]:` at the start of `s`: the prefix launchers such as
/// torchrun put on each line of a process's output. Returns the name and the length.
fn log_prefix(s: &str) -> Option<(&str, usize)> {
    let rest = s.strip_prefix('[')?;
    let close = rest.find(']')?;
    let name = &rest[..close];
    let ok = (1..=24).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ' ' || c == '-')
        && name.chars().any(|c| c.is_ascii_digit());
    let after = rest[close + 1..].strip_prefix(':')?;
    ok.then(|| (name, 1 + close + 1 + 1 + (after.len() - after.trim_start().len())))
}

/// Length of the wrapping in front of a pasted line (see [`flatten`]).
fn line_prefix_len(line: &str) -> usize {
    let mut i = 0;
    loop {
        let t = &line[i..];
        let trimmed = t.trim_start();
        i += t.len() - trimmed.len();
        if let Some((_, n)) = log_prefix(trimmed) {
            i += n;
            continue;
        }
        match ["//", "#", ">", "- ", "* ", "+ "].iter().find(|m| trimmed.starts_with(**m)) {
            Some(m) => i += m.len(),
            None => return i,
        }
    }
}

/// Byte offset where the run of trailing characters satisfying `keep` starts (a char
/// boundary, whatever the characters before it are).
fn start_of_trailing(s: &str, keep: impl Fn(char) -> bool) -> usize {
    s.char_indices().rev().find(|&(_, c)| !keep(c)).map_or(0, |(k, c)| k + c.len_utf8())
}

/// ASCII case-insensitive `find` from `from`, bounded by `limit`.
fn find_ci(hay: &str, needle: &str, from: usize, limit: usize) -> Option<usize> {
    let h = hay.as_bytes();
    let n = needle.as_bytes();
    let limit = limit.min(h.len());
    if n.is_empty() || from >= limit || limit - from < n.len() {
        return None;
    }
    // Candidates from the needle's rarest byte (both cases, found by `memchr2`), each
    // checked in full: a compare at every position cost ~100 ns a byte, minutes on a
    // long training log.
    let (j, b) = rarest_byte(n);
    let (lo, up) = (b.to_ascii_lowercase(), b.to_ascii_uppercase());
    let last = limit - n.len();
    let mut at = from + j;
    while at <= last + j {
        let k = at + memchr::memchr2(lo, up, &h[at..=last + j])?;
        let i = k - j;
        if h[i..i + n.len()].eq_ignore_ascii_case(n) {
            return Some(i);
        }
        at = k + 1;
    }
    None
}

/// The byte of `needle` least frequent in English text (letters by frequency; any other
/// byte counts as rare), and where it lies: [`find_ci`] looks for it first.
fn rarest_byte(needle: &[u8]) -> (usize, u8) {
    const COMMON: &[u8] = b" etaoinsrhldcumfpgwybvkxjqz";
    let rank = |b: u8| COMMON.iter().position(|&c| c == b.to_ascii_lowercase()).unwrap_or(COMMON.len());
    let mut best = (0, needle[0]);
    for (j, &b) in needle.iter().enumerate() {
        if rank(b) > rank(best.1) {
            best = (j, b);
        }
    }
    best
}

fn skip_blanks(s: &str, mut i: usize) -> usize {
    let b = s.as_bytes();
    while i < b.len() && b[i] == b' ' {
        i += 1;
    }
    i
}

fn uint_at(s: &str, pos: usize) -> Option<(u32, usize)> {
    let b = s.as_bytes();
    let i = skip_blanks(s, pos);
    let mut j = i;
    while j < b.len() && b[j].is_ascii_digit() {
        j += 1;
    }
    if j == i {
        return None;
    }
    s[i..j].parse().ok().map(|v| (v, j))
}

/// `needle` right at `pos` (after blanks), case-insensitive; returns the end offset.
fn expect_ci(s: &str, pos: usize, needle: &str) -> Option<usize> {
    let i = skip_blanks(s, pos);
    let b = s.as_bytes();
    let n = needle.as_bytes();
    (i + n.len() <= b.len() && b[i..i + n.len()].eq_ignore_ascii_case(n)).then_some(i + n.len())
}

// ---------------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------------

/// One message start found in the flattened text.
#[derive(Clone, Copy)]
enum Anchor {
    /// `CUDA out of memory.` / `HIP out of memory.` / `NPU out of memory.` (torch_npu);
    /// `start` is at the accelerator word, `after` just past the full stop.
    Native { start: usize, after: usize, accel: &'static str },
    /// `Allocation on device N would exceed allowed memory`.
    Async { start: usize },
    /// The figures without the `CUDA out of memory.` sentence before them: `Tried to
    /// allocate S`, or, when that is missing too, `GPU N has a total capacity` or `Of the
    /// allocated memory`; `after` is past the phrase.
    Headerless { start: usize, after: usize },
}

impl Anchor {
    fn start(self) -> usize {
        match self {
            Anchor::Native { start, .. } | Anchor::Async { start } | Anchor::Headerless { start, .. } => start,
        }
    }

    /// Where to look for the *next* message: past this anchor's phrase (searching from
    /// `start + 1` would find the same "out of memory." again).
    fn search_past(self) -> usize {
        match self {
            Anchor::Native { after, .. } => after,
            Anchor::Async { start } => start + "Allocation on device".len(),
            Anchor::Headerless { after, .. } => after,
        }
    }
}

/// How far back a header or an earlier figure makes a figure part of the same message
/// (a whole 2.x message is about 500 characters; its figures sit within 300 of each other).
const SAME_MESSAGE: usize = 300;

/// The first figure phrase at or after `from` that no `out of memory.` header (and, for the
/// later phrases, no `Tried to allocate`) precedes closely: the start of a message pasted
/// without its first sentence.
fn next_headerless(flat: &str, from: usize) -> Option<Anchor> {
    let near_before = |i: usize, needle: &str| {
        let mut lo = i.saturating_sub(SAME_MESSAGE);
        while !flat.is_char_boundary(lo) {
            lo -= 1;
        }
        find_ci(flat, needle, lo, i).is_some()
    };
    let mut best: Option<Anchor> = None;
    for (phrase, needs_size) in
        [("Tried to allocate", true), ("has a total capac", false), ("Of the allocated memory", true)]
    {
        let mut at = from;
        while let Some(i) = find_ci(flat, phrase, at, flat.len()) {
            at = i + 1;
            let after = i + phrase.len();
            // "GPU N has a total capacity": start at "GPU".
            let start = if phrase == "has a total capac" {
                let before = flat[..i].trim_end_matches(' ');
                let num = start_of_trailing(before, |c| c.is_ascii_digit());
                let word = flat[..num].trim_end_matches(' ');
                if num == before.len() || !word.to_ascii_uppercase().ends_with("GPU") {
                    continue;
                }
                word.len() - 3
            } else {
                i
            };
            if needs_size && size_at(flat, after).is_none() {
                continue;
            }
            // Any "… out of memory" sentence just before owns these figures: CUDA's and HIP's
            // are anchors of their own, XPU's ("XPU out of memory.") and MPS's ("MPS backend
            // out of memory (") are another allocator's and must not be read as CUDA's.
            if near_before(start, "out of memory")
                || (phrase != "Tried to allocate" && near_before(start, "Tried to allocate"))
                || (phrase == "Of the allocated memory" && near_before(start, "has a total capac"))
            {
                continue;
            }
            if best.is_none_or(|b| start < b.start()) {
                best = Some(Anchor::Headerless { start, after });
            }
            break;
        }
    }
    best
}

fn next_anchor(flat: &str, from: usize) -> Option<Anchor> {
    let native = {
        let mut at = from;
        loop {
            let Some(i) = find_ci(flat, "out of memory.", at, flat.len()) else {
                break None;
            };
            at = i + 1;
            let before = flat[..i].trim_end_matches(' ');
            let word_start = start_of_trailing(before, |c| c.is_ascii_alphanumeric());
            let word = &before[word_start..];
            // The accelerator word, or a word glued to it in upper case ("whyCUDA" in an
            // issue title); "XPU"/"MPS" messages are another allocator's and are not anchors.
            // torch_npu's NPUCachingAllocator is a fork of CUDA's and prints its ≤ 2.0 text.
            let accel = ["CUDA", "HIP", "NPU"]
                .into_iter()
                .find(|a| word.eq_ignore_ascii_case(a) || (word.len() > a.len() && word.ends_with(a)));
            if let Some(a) = accel {
                break Some(Anchor::Native {
                    start: before.len() - a.len(),
                    after: i + "out of memory.".len(),
                    accel: a,
                });
            }
        }
    };
    let async_ = {
        let mut at = from;
        loop {
            let Some(i) = find_ci(flat, "Allocation on device", at, flat.len()) else {
                break None;
            };
            at = i + 1;
            // require the rest of the sentence, so prose mentioning the phrase is skipped
            if find_ci(flat, "would exceed allowed memory", i, (i + 80).min(flat.len())).is_some() {
                break Some(Anchor::Async { start: i });
            }
        }
    };
    [native, async_, next_headerless(flat, from)].into_iter().flatten().min_by_key(|a| a.start())
}

/// Parse the first PyTorch OOM message found in `text` (a bare message, a Python traceback,
/// a log; wrapped or not). See the module docs for the recognised forms.
pub fn parse(text: &str) -> Result<OomMessage, ParseError> {
    let all = parse_all(text);
    if let Some(first) = all.into_iter().next() {
        return Ok(first);
    }
    // Another backend's OOM: say so rather than "no message".
    for (needle, backend) in [("XPU out of memory", "XPU"), ("MPS backend out of memory", "MPS")] {
        if let Some(i) = find_ci(text, needle, 0, text.len()) {
            let line_start = text[..i].rfind('\n').map_or(0, |k| k + 1);
            let line_end = text[i..].find('\n').map_or(text.len(), |k| i + k);
            let mut line = text[line_start..line_end].trim().to_string();
            if line.chars().count() > 120 {
                line = line.chars().take(117).collect::<String>() + "...";
            }
            return Err(ParseError::Unsupported { backend: backend.into(), line });
        }
    }
    // Give the more useful error when the only OOM in sight is the runtime's own.
    if let Some(i) = find_ci(text, "CUDA error: out of memory", 0, text.len()) {
        let line_start = text[..i].rfind('\n').map_or(0, |k| k + 1);
        let line_end = text[i..].find('\n').map_or(text.len(), |k| i + k);
        return Err(ParseError::CudaRuntimeError { line: text[line_start..line_end].trim().to_string() });
    }
    Err(ParseError::NoMessage)
}

/// Every OOM message in `text`, in order (logs often repeat the OOM once per retry or rank).
/// When lines carry launcher prefixes of several processes (`[rank0]:`, `[rank1]:`), each
/// process's lines are read on their own, so interleaved messages do not mix; those
/// messages come grouped by process, in order of each process's first line.
pub fn parse_all(text: &str) -> Vec<OomMessage> {
    let near = near_anchors(text);
    let text: &str = &near;
    let mut groups: Vec<(Option<String>, String)> = Vec::new();
    // Group by prefix through a map: a text with thousands of distinct prefixes (or bytes
    // that look like them) must not cost a scan of the groups per line.
    let mut group_of: std::collections::HashMap<Option<String>, usize> = std::collections::HashMap::new();
    for line in text.split('\n') {
        let t = line.trim_start();
        let key = log_prefix(t).map(|(name, _)| name.to_string());
        match group_of.get(&key) {
            Some(&g) => {
                let body = &mut groups[g].1;
                body.push_str(line);
                body.push('\n');
            }
            None => {
                group_of.insert(key.clone(), groups.len());
                groups.push((key, format!("{line}\n")));
            }
        }
    }
    if groups.iter().filter(|(k, _)| k.is_some()).count() < 2 {
        return parse_all_in(text);
    }
    let mut out = Vec::new();
    for (key, body) in groups {
        for mut m in parse_all_in(&body) {
            m.log_prefix = key.clone();
            out.push(m);
        }
    }
    out
}

/// Texts up to this size are read whole; a longer one (a training job's whole log) only
/// around the phrases a message holds ([`near_anchors`]).
const WHOLE_TEXT: usize = 8 << 20;
/// Lines kept before and after each phrase of a long text: a message is a few lines, and
/// up to hundreds when the lines of many ranks interleave.
const LINES_BEFORE: usize = 60;
const LINES_AFTER: usize = 400;
/// Bytes kept at most on each side of a phrase, whatever the lines' lengths.
const BYTES_NEAR: usize = 256 << 10;

/// `text` itself when it is short; else its lines near a phrase that starts or belongs to
/// an OOM message (in order, the rest dropped). Why: the parser's per-byte work and its
/// copies of the text cost seconds and ~15× the text's size in memory per 100 MB, while
/// a log of GBs holds its messages in a few KB. Every message, and every line between
/// its start and its last figure, lies within the kept lines.
fn near_anchors(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= WHOLE_TEXT {
        return std::borrow::Cow::Borrowed(text);
    }
    const PHRASES: [&str; 5] =
        ["out of memory", "Allocation on device", "Tried to allocate", "has a total capac", "Of the allocated memory"];
    let b = text.as_bytes();
    // Byte ranges kept, from each phrase's line, extended by whole lines.
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for phrase in PHRASES {
        let mut at = 0;
        while let Some(i) = find_ci(text, phrase, at, text.len()) {
            at = i + phrase.len();
            // Back over the phrase's line and LINES_BEFORE more, to just after a newline.
            let floor = i.saturating_sub(BYTES_NEAR);
            let mut lo = i;
            for _ in 0..=LINES_BEFORE {
                match memchr::memrchr(b'\n', &b[floor..lo]) {
                    Some(k) => lo = floor + k,
                    None => {
                        lo = floor;
                        break;
                    }
                }
            }
            if b.get(lo) == Some(&b'\n') {
                lo += 1;
            }
            let mut hi = i;
            let cap = (i + BYTES_NEAR).min(b.len());
            for _ in 0..=LINES_AFTER {
                match memchr::memchr(b'\n', &b[hi..cap]) {
                    Some(k) => hi += k + 1,
                    None => {
                        hi = cap;
                        break;
                    }
                }
            }
            ranges.push((lo, hi));
        }
    }
    ranges.sort_unstable();
    let mut out = String::new();
    let mut end = 0;
    for (mut lo, mut hi) in ranges {
        lo = lo.max(end);
        if hi <= lo {
            continue;
        }
        // Char boundaries: the ranges were cut at newlines or at a byte cap.
        while !text.is_char_boundary(lo) {
            lo += 1;
        }
        while !text.is_char_boundary(hi) {
            hi -= 1;
        }
        if lo < hi {
            if lo > end && !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&text[lo..hi]);
        }
        end = end.max(hi);
    }
    std::borrow::Cow::Owned(out)
}

fn parse_all_in(text: &str) -> Vec<OomMessage> {
    let flat = flatten(text);
    let s = flat.text.as_str();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(anchor) = next_anchor(s, from) {
        // Fields of this message are searched only up to the next message, so a truncated
        // message never borrows figures from the one after it.
        let limit = next_anchor(s, anchor.search_past()).map_or(s.len(), |a| a.start());
        let (mut msg, end) = match anchor {
            Anchor::Native { start, after, accel } => parse_native(s, start, after, accel, limit),
            Anchor::Async { start } => parse_async(s, start, limit),
            Anchor::Headerless { start, .. } => {
                let (mut m, mut end) = parse_native(s, start, start, "CUDA", limit);
                if m.tried_to_allocate.is_none() {
                    parse_v2(s, start, start, limit, &mut m, &mut end);
                }
                m.headerless = true;
                (m, end)
            }
        };
        let end = sweep(s, anchor.start(), limit, &mut msg).max(end);
        let end = end.clamp(anchor.start() + 1, s.len());
        msg.raw = original_slice(text, &flat, anchor.start(), end);
        msg.exception = exception_before(s, anchor.start());
        msg.missing = missing_figures(&msg);
        if msg.reserved_unallocated_uncertainty == 0 {
            msg.reserved_unallocated_uncertainty = msg.reserved_unallocated.map_or(0, printed_precision);
        }
        msg.inconsistent = inconsistencies(&msg);
        out.push(msg);
        from = end.max(anchor.search_past());
    }
    out
}

/// Every figure phrase of the 2.x layout within `[start, limit)` that the in-order parse
/// did not reach (a line broken by a traceback, a paste that lost a sentence): each figure
/// the text holds is used. Returns the end of the last phrase read.
fn sweep(s: &str, start: usize, limit: usize, m: &mut OomMessage) -> usize {
    if !matches!(
        m.form,
        MessageForm::Partial | MessageForm::V2_1 | MessageForm::V2_2 | MessageForm::V2_5 | MessageForm::Recent
    ) {
        return start;
    }
    let mut end = start;
    let mut found = false;
    let mut at_phrase = |phrase: &str| -> Option<usize> {
        let k = find_ci(s, phrase, start, limit)?;
        end = end.max(k + phrase.len());
        Some(k)
    };
    if m.tried_to_allocate.is_none() {
        if let Some(k) = at_phrase("Tried to allocate") {
            m.tried_to_allocate = size_at(s, k + "Tried to allocate".len()).map(|(v, _)| v);
        }
    }
    if m.total_capacity.is_none() {
        if let Some(k) = at_phrase("has a total capac") {
            if let Some(of) = find_ci(s, " of ", k, limit.min(k + 30)) {
                m.total_capacity = size_at(s, of + 4).map(|(v, _)| v);
                found |= m.total_capacity.is_some();
            }
            if m.device.is_none() {
                let before = s[..k].trim_end_matches(' ');
                let num = start_of_trailing(before, |c| c.is_ascii_digit());
                m.device = before[num..].parse().ok();
            }
            if s.as_bytes()[k + "has a total capac".len()..].get(..2).is_some_and(|t| t.eq_ignore_ascii_case(b"ty")) {
                m.form = MessageForm::V2_1;
            }
        }
    }
    if m.free.is_none() {
        if let Some(k) = at_phrase("is free") {
            if let Some(w) = s[start..k].rfind("of which") {
                m.free = size_at(s, start + w + "of which".len()).map(|(v, _)| v);
                found |= m.free.is_some();
            }
        }
    }
    if m.allocated_by_pytorch.is_none() {
        if let Some(k) = at_phrase("is allocated by PyTorch") {
            m.allocated_by_pytorch = size_before(s, k);
            found |= m.allocated_by_pytorch.is_some();
        }
    }
    if m.reserved_unallocated.is_none() {
        // The phrase may be cut after "PyTorch" in a truncated paste; the figure is before it.
        if let Some(k) = at_phrase("is reserved by PyTorch") {
            m.reserved_unallocated = size_before(s, k);
            found |= m.reserved_unallocated.is_some();
        }
    }
    if m.private_pools.is_none() {
        if let Some(k) = at_phrase("allocated in private pools") {
            m.private_pools = size_before(s, k);
        }
    }
    if m.allowed.is_none() {
        if let Some(k) = at_phrase("allowed;") {
            m.allowed = size_before(s, k);
        }
    }
    if m.processes.is_empty() {
        parse_processes(s, start, limit, m);
    }
    if m.reserved_total.is_none() {
        if let (Some(a), Some(u)) = (m.allocated_by_pytorch, m.reserved_unallocated) {
            m.reserved_total = Some(a.saturating_add(u));
        }
    }
    // Figures of the 2.x layout were found after all: say so (a truncated legacy message
    // stays partial, since its figures sit inside one parenthesis).
    if found && m.form == MessageForm::Partial {
        m.form = if m.allowed.is_some() || m.private_pools.is_some() { MessageForm::V2_5 } else { MessageForm::V2_2 };
    }
    end
}

/// Figures of `m` that cannot all be true, one sentence each (see [`OomMessage::inconsistent`]).
/// Comparisons allow for the printed rounding, so only clear contradictions are named.
fn inconsistencies(m: &OomMessage) -> Vec<String> {
    let mut out = Vec::new();
    if let (Some(f), Some(t)) = (m.free, m.total_capacity) {
        if clearly_gt(f, t, &[f, t]) {
            out.push(format!(
                "the free memory ({}) is more than the total capacity ({}); a device never reports more \
                 free memory than it has",
                format_size(f),
                format_size(t)
            ));
        }
    }
    // Before 2.1 both halves were printed: "already allocated" is part of "reserved in total".
    if m.form == MessageForm::Legacy && !m.raw.to_ascii_lowercase().contains("cached") {
        if let (Some(a), Some(r)) = (m.allocated_by_pytorch, m.reserved_total) {
            if clearly_gt(a, r, &[a, r]) {
                out.push(format!(
                    "'already allocated' ({}) is more than 'reserved in total by PyTorch' ({}), which \
                     includes it",
                    format_size(a),
                    format_size(r)
                ));
            }
        }
    }
    // From 2.5 "allocated by PyTorch" includes the private pools' free bytes.
    if let (Some(p), Some(a)) = (m.private_pools, m.allocated_by_pytorch) {
        if clearly_gt(p, a, &[p, a]) {
            out.push(format!(
                "the private pools' {} is more than the {} 'allocated by PyTorch' that includes it",
                format_size(p),
                format_size(a)
            ));
        }
    }
    // Reserved or allocated above the total is possible (Windows lends system RAM to a full
    // GPU, a unified-memory device counts the host's): `over_capacity` names it as a finding,
    // not as a contradiction. A negative size is impossible everywhere: the parser reads the
    // digits only, so the sign is looked for here.
    let raw = m.raw.as_str();
    let b = raw.as_bytes();
    for (i, _) in raw.match_indices('-') {
        let before_ok = i == 0 || matches!(b[i - 1], b' ' | b'(' | b';' | b':' | b'\n');
        if before_ok && b.get(i + 1).is_some_and(u8::is_ascii_digit) {
            if let Some((v, e)) = size_at(raw, i + 1) {
                out.push(format!(
                    "'{}' is a negative size; PyTorch prints sizes as unsigned numbers, so the text was \
                     edited or corrupted (read as {})",
                    &raw[i..e],
                    format_size(v)
                ));
            }
        }
    }
    out
}

/// The figures `m`'s form prints that it lacks, by the names the text gives them.
fn missing_figures(m: &OomMessage) -> Vec<String> {
    let figures: &[(&str, bool)] = match m.form {
        MessageForm::Partial | MessageForm::Legacy => &[
            ("Tried to allocate", m.tried_to_allocate.is_some()),
            ("total capacity", m.total_capacity.is_some()),
            ("free", m.free.is_some()),
            ("allocated by PyTorch", m.allocated_by_pytorch.is_some()),
            ("reserved by PyTorch", m.reserved_total.is_some()),
        ],
        MessageForm::V2_1 | MessageForm::V2_2 | MessageForm::V2_5 | MessageForm::Recent => &[
            ("Tried to allocate", m.tried_to_allocate.is_some()),
            ("total capacity", m.total_capacity.is_some()),
            ("free", m.free.is_some()),
            ("allocated by PyTorch", m.allocated_by_pytorch.is_some()),
            ("reserved by PyTorch but unallocated", m.reserved_unallocated.is_some()),
        ],
        _ => &[],
    };
    figures.iter().filter(|(_, present)| !present).map(|(name, _)| name.to_string()).collect()
}

fn original_slice(text: &str, flat: &Flat, start: usize, end: usize) -> String {
    let a = flat.map[start];
    let last = flat.map[end - 1];
    // extend to the end of the UTF-8 character at `last`
    let b = text[last..].char_indices().nth(1).map_or(text.len(), |(k, _)| last + k);
    text[a..b].trim().to_string()
}

/// `torch.OutOfMemoryError` in `... torch.OutOfMemoryError: CUDA out of memory`.
fn exception_before(s: &str, start: usize) -> Option<String> {
    let before = s[..start].trim_end_matches(' ');
    let before = before.strip_suffix(':')?;
    let tok_start = start_of_trailing(before, |c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
    let tok = &before[tok_start..];
    (tok.ends_with("Error") || tok.ends_with("Exception")).then(|| tok.to_string())
}

fn empty_message(form: MessageForm, accel: &str) -> OomMessage {
    OomMessage {
        form,
        device: None,
        tried_to_allocate: None,
        total_capacity: None,
        free: None,
        allocated_by_pytorch: None,
        reserved_unallocated: None,
        reserved_total: None,
        private_pools: None,
        allowed: None,
        processes: Vec::new(),
        expandable_segments_hint: false,
        exceeds_expandable_reserve: false,
        expandable_reserve: None,
        exception: None,
        accelerator: accel.to_string(),
        raw: String::new(),
        log_prefix: None,
        headerless: false,
        missing: Vec::new(),
        inconsistent: Vec::new(),
        reserved_unallocated_uncertainty: 0,
    }
}

/// Everything that starts `CUDA out of memory.`; returns the message and the end offset.
fn parse_native(s: &str, start: usize, after: usize, accel: &str, limit: usize) -> (OomMessage, usize) {
    let mut m = empty_message(MessageForm::Partial, accel);
    let mut end = after;

    if let Some(p) = expect_ci(s, after, "Allocation was preemptively rejected") {
        m.form = MessageForm::PreemptiveRejection;
        end = p;
        if let Some(q) = find_ci(s, "Requested size:", p, limit.min(p + 200)) {
            let q = q + "Requested size:".len();
            end = q;
            // format_size today; accept a bare byte count should a build print one
            if let Some((v, e)) = size_at(s, q) {
                m.tried_to_allocate = Some(v);
                end = e;
            } else if let Some((v, e)) = uint_at(s, q) {
                m.tried_to_allocate = Some(u64::from(v));
                end = e;
            }
        } else if let Some(q) = find_ci(s, "fraction limit", p, limit.min(p + 200)) {
            end = q + "fraction limit".len();
        }
        return (m, end);
    }

    let Some(ta) = expect_ci(s, after, "Tried to allocate") else {
        return (m, end);
    };
    end = ta;

    if let Some(p) = expect_ci(s, ta, "more than 1EB memory") {
        m.form = MessageForm::TooLarge1EB;
        end = if s[p..].starts_with('.') { p + 1 } else { p };
        return (m, end);
    }

    let Some((tried, p)) = size_at(s, ta) else {
        return (m, end);
    };
    m.tried_to_allocate = Some(tried);
    end = p;

    let q = skip_blanks(s, p);
    if s[q..].starts_with('(') {
        parse_legacy(s, q, limit, &mut m, &mut end);
    } else {
        parse_v2(s, p, start, limit, &mut m, &mut end);
    }
    (m, end)
}

/// `(GPU 0; 6.00 GiB total capacity; 3.49 GiB already allocated; 1.04 GiB free;
/// [L allowed; ]3.50 GiB reserved in total by PyTorch)`; very old builds end with
/// `X cached)`, where "cached" meant memory held but not used (the later R − A).
/// torch_npu prints `(NPU 0; …; A already allocated; A' current active; F free; …)`:
/// the device is `NPU d`, and "current active" (allocated plus blocks waiting on
/// streams) is not kept.
fn parse_legacy(s: &str, open: usize, limit: usize, m: &mut OomMessage, end: &mut usize) {
    let Some(close) = s[open..limit.max(open)].find(')').map(|k| open + k) else {
        return;
    };
    m.form = MessageForm::Legacy;
    for part in s[open + 1..close].split(';') {
        let part = part.trim();
        let lower = part.to_ascii_lowercase();
        if let Some(rest) = lower.strip_prefix("gpu").or_else(|| lower.strip_prefix("npu")) {
            m.device = uint_at(rest, 0).map(|(d, _)| d);
            continue;
        }
        let Some((v, _)) = size_at(part, 0) else {
            continue;
        };
        if lower.ends_with("total capacity") {
            m.total_capacity = Some(v);
        } else if lower.ends_with("already allocated") {
            m.allocated_by_pytorch = Some(v);
        } else if lower.ends_with("free") {
            m.free = Some(v);
        } else if lower.ends_with("allowed") {
            m.allowed = Some(v);
        } else if lower.contains("reserved in total") {
            m.reserved_total = Some(v);
        } else if lower.ends_with("cached") {
            m.reserved_unallocated = Some(v);
        }
    }
    // Derive the half the message did not print. R − A is a difference of two figures each
    // rounded to half a unit: its uncertainty is the sum of theirs (±10 MiB for two GiB
    // figures), which `reserved_unallocated_uncertainty` keeps for the display.
    match (m.allocated_by_pytorch, m.reserved_total, m.reserved_unallocated) {
        (Some(a), Some(r), None) => {
            m.reserved_unallocated = Some(r.saturating_sub(a));
            m.reserved_unallocated_uncertainty = printed_precision(r) + printed_precision(a);
        }
        (Some(a), None, Some(u)) => m.reserved_total = Some(a.saturating_add(u)),
        _ => {}
    }
    *end = close + 1;
    // " If reserved memory is >> allocated memory try setting max_split_size_mb to avoid
    // fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
    if let Some(p) = expect_ci(s, *end, "If reserved memory is") {
        *end = find_ci(s, "fragmentation.", p, limit.min(p + 200)).map_or(p, |k| k + "fragmentation.".len());
    }
    *end = documentation_tail(s, *end, limit);
}

/// The 2.1+ sentence layout (forms V2_1, V2_2, V2_5, Recent).
fn parse_v2(s: &str, p: usize, start: usize, limit: usize, m: &mut OomMessage, end: &mut usize) {
    // "GPU 0 has a total capacity of" must follow closely, or this is not the 2.x layout
    let Some(gpu) = find_ci(s, "GPU", p, limit.min(p + 16)) else {
        return;
    };
    let Some((dev, q)) = uint_at(s, gpu + 3) else {
        return;
    };
    let Some(cap) = expect_ci(s, q, "has a total capac") else {
        return;
    };
    m.device = Some(dev);
    m.form = if s.as_bytes()[cap..].get(..2).is_some_and(|t| t.eq_ignore_ascii_case(b"ty")) {
        MessageForm::V2_1 // "capacty": the 2.1 typo
    } else {
        MessageForm::V2_2
    };
    let Some(of) = find_ci(s, " of ", cap, limit.min(cap + 12)) else {
        return;
    };
    let Some((total, q)) = size_at(s, of + 4) else {
        return;
    };
    m.total_capacity = Some(total);
    *end = q;
    let Some(q) = expect_ci(s, q, "of which") else {
        return;
    };
    let Some((free, q)) = size_at(s, q) else {
        return;
    };
    m.free = Some(free);
    let Some(q) = expect_ci(s, q, "is free") else {
        return;
    };
    let free_end = if s[q..].starts_with('.') { q + 1 } else { q };
    *end = free_end;

    let of_alloc = find_ci(s, "Of the allocated memory", free_end, limit);
    // Between "is free." and "Of the allocated memory": the NVML process list (2.1+) and
    // "L allowed; " (2.5+). Searched as a region so a reordering or a missing line is fine.
    let region_end = of_alloc.unwrap_or_else(|| limit.min(free_end + 2000));
    parse_processes(s, free_end, region_end, m);
    if let Some(k) = find_ci(s, "allowed;", free_end, region_end) {
        m.allowed = size_before(s, k);
        *end = (*end).max(k + "allowed;".len());
    }

    let Some(oa) = of_alloc else {
        finish_v2(s, start, limit, m, end);
        return;
    };
    let q = oa + "Of the allocated memory".len();
    if let Some((a, q2)) = size_at(s, q) {
        m.allocated_by_pytorch = Some(a);
        *end = q2;
    }
    let unalloc = find_ci(s, "is reserved by PyTorch but unallocated", q, limit.min(q + 400));
    if let Some(k) = find_ci(s, "allocated in private pools", q, unalloc.unwrap_or(limit)) {
        m.private_pools = size_before(s, k);
    }
    if let Some(k) = unalloc {
        m.reserved_unallocated = size_before(s, k);
        let e = k + "is reserved by PyTorch but unallocated".len();
        *end = if s[e..].starts_with('.') { e + 1 } else { e };
    }
    if let (Some(a), Some(u)) = (m.allocated_by_pytorch, m.reserved_unallocated) {
        m.reserved_total = Some(a.saturating_add(u));
    }
    finish_v2(s, start, limit, m, end);
}

/// Hint sentences after the figures, the documentation pointer, and the form upgrade.
fn finish_v2(s: &str, start: usize, limit: usize, m: &mut OomMessage, end: &mut usize) {
    // The hint sentence sits between the figures and "See documentation ..." (~130
    // characters); the recent "expandable_segments is enabled" paragraph is longer, so the
    // window grows only when that paragraph is there. A short window keeps a truncated
    // message from swallowing unrelated text that follows it.
    let long = find_ci(s, "expandable_segments is enabled", *end, limit.min(*end + 300)).is_some();
    let window = if long { 1500 } else { 300 };
    let hint_end =
        find_ci(s, "See documentation for Memory Management", *end, limit.min(*end + window)).unwrap_or(*end);
    if let Some(k) = find_ci(s, "expandable_segments is enabled", start, hint_end.max(*end)) {
        m.expandable_segments_hint = true;
        *end = (*end).max(k + "expandable_segments is enabled".len());
    }
    if let Some(k) = find_ci(s, "exceeds the expandable-segment reserve", start, hint_end.max(*end)) {
        m.exceeds_expandable_reserve = true;
        let after = k + "exceeds the expandable-segment reserve".len();
        if let Some(q) = expect_ci(s, after, "of") {
            if let Some((v, _)) = size_at(s, q) {
                m.expandable_reserve = Some(v);
            }
        }
        *end = (*end).max(after);
    }
    *end = documentation_tail(s, (*end).max(hint_end), limit).max(*end);
    let msg = &s[start..(*end).min(s.len())];
    if m.form == MessageForm::V2_1 {
        return; // the typo pins the version; no later marker can apply
    }
    if find_ci(msg, "docs.pytorch.org", 0, msg.len()).is_some()
        || m.expandable_segments_hint
        || m.exceeds_expandable_reserve
    {
        m.form = MessageForm::Recent;
    } else if m.allowed.is_some() || m.private_pools.is_some() {
        m.form = MessageForm::V2_5;
    }
}

/// If "See documentation for Memory Management" starts within a few words of `from`,
/// return the offset after it and its tail (` and PYTORCH_CUDA_ALLOC_CONF` or ` (URL)`).
fn documentation_tail(s: &str, from: usize, limit: usize) -> usize {
    let from = from.min(s.len());
    let Some(k) = find_ci(s, "See documentation for Memory Management", from, limit.min(from + 400)) else {
        return from;
    };
    let mut e = k + "See documentation for Memory Management".len();
    if let Some(q) = expect_ci(s, e, "and PYTORCH_CUDA_ALLOC_CONF") {
        e = q;
    } else {
        let q = skip_blanks(s, e);
        if s[q..].starts_with("(http") {
            if let Some(c) = s[q..limit.max(q).min(s.len())].find(')') {
                e = q + c + 1;
            }
        }
    }
    e
}

/// `Including non-PyTorch memory, this process has X memory in use.` and
/// `Process <pid> has X memory in use.` lines, in order, within `[from, to)`.
fn parse_processes(s: &str, from: usize, to: usize, m: &mut OomMessage) {
    let mut at = from;
    while let Some(k) = find_ci(s, "memory in use", at, to) {
        at = k + 1;
        let Some(bytes) = size_before(s, k) else {
            continue;
        };
        // the subject of this sentence: text between the previous '.' and the size
        let sentence_start = s[from..k].rfind(". ").map_or(from, |d| from + d + 2);
        let subject = &s[sentence_start..k];
        let lower = subject.to_ascii_lowercase();
        if lower.contains("this process has") {
            m.processes.push(ProcessUse { pid: None, bytes });
        } else if let Some(pi) = lower.find("process ") {
            let pid = uint_at(subject, pi + "process ".len()).map(|(p, _)| p);
            m.processes.push(ProcessUse { pid, bytes });
        }
    }
}

/// `Allocation on device 0 would exceed allowed memory. (out of memory)` followed by the
/// `Currently allocated : …` lines of the cudaMallocAsync backend.
fn parse_async(s: &str, start: usize, limit: usize) -> (OomMessage, usize) {
    let mut m = empty_message(MessageForm::CudaMallocAsync, "CUDA");
    let mut end = start + "Allocation on device".len();
    if let Some((d, e)) = uint_at(s, end) {
        m.device = Some(d);
        end = e;
    }
    if let Some(k) = find_ci(s, "(out of memory)", end, limit.min(end + 80)) {
        end = k + "(out of memory)".len();
    } else if let Some(k) = find_ci(s, "allowed memory", end, limit.min(end + 80)) {
        end = k + "allowed memory".len();
    }
    let window = limit.min(end + 800);
    let field = |label: &str, from: usize| -> Option<(u64, usize)> {
        let k = find_ci(s, label, from, window)?;
        let mut q = skip_blanks(s, k + label.len());
        if s[q..].starts_with(':') {
            q += 1;
        }
        size_at(s, q)
    };
    let mut pos = end;
    if let Some((v, e)) = field("Currently allocated", pos) {
        m.allocated_by_pytorch = Some(v);
        pos = e;
    }
    if let Some((v, e)) = field("Requested", pos) {
        m.tried_to_allocate = Some(v);
        pos = e;
    }
    if let Some((v, e)) = field("Device limit", pos) {
        m.total_capacity = Some(v);
        pos = e;
    }
    if let Some((v, e)) = field("Free (according to CUDA)", pos) {
        m.free = Some(v);
        pos = e;
    }
    if let Some((v, e)) = field("PyTorch limit (set by user-supplied memory fraction)", pos) {
        // Without a fraction the backend prints SIZE_MAX (17179869184.00 GiB): no limit.
        m.allowed = (v < ONE_EIB).then_some(v);
        pos = e;
    }
    (m, pos.max(end))
}

#[cfg(test)]
mod search_tests {
    use super::find_ci;
    use proptest::prelude::*;

    /// The search by definition: a case-insensitive compare at every position.
    fn naive(h: &str, n: &str, from: usize, limit: usize) -> Option<usize> {
        let (h, n) = (h.as_bytes(), n.as_bytes());
        let limit = limit.min(h.len());
        if n.is_empty() || from >= limit || limit - from < n.len() {
            return None;
        }
        (from..=limit - n.len()).find(|&i| h[i..i + n.len()].eq_ignore_ascii_case(n))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn find_ci_finds_what_a_compare_everywhere_finds(
            hay in "[oOuUtT fFmMeErRyY.]{0,60}",
            needle in prop::sample::select(vec!["out of memory.", "Of", "y", "MEMORY", "t o", ". "]),
            from in 0usize..70,
            limit in 0usize..70,
        ) {
            prop_assert_eq!(find_ci(&hay, needle, from, limit), naive(&hay, needle, from, limit));
        }
    }
}
