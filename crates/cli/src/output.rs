//! Text output helpers shared by every command: byte figures in PyTorch's styles and a
//! small table printer.

/// PyTorch's `format_size` (OOM messages): `≤ 1024` → `"<n> bytes"`, then two decimals
/// with KiB / MiB / GiB (`"1.50 GiB"`; exactly 1 MiB prints `"1024.00 KiB"`).
pub use fragscope_alloc::format_size as bytes;
pub use fragscope_alloc::{grouped, percent};

/// A byte cell of `torch.cuda.memory_summary()`: integer (width 6), a space and a unit
/// chosen from `pref` (the `all` row's value): move to the next unit while `pref` ≥
/// 768 × 1024 of the current unit, dividing with floor (`"  1536 MiB"`).
pub fn summary_bytes(value: u64, pref: u64) -> String {
    let units = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let (mut v, mut p, mut unit) = (value, pref as f64, units[0]);
    for u in &units[1..] {
        if p < 768.0 * 1024.0 {
            break;
        }
        unit = u;
        v /= 1024;
        p /= 1024.0;
    }
    format!("{v:6} {unit}")
}

/// A count cell of `torch.cuda.memory_summary()`: width 7, then `""`, `"K"` or `"M"`
/// (threshold 750 × 1000 of `pref`), then a space.
pub fn summary_count(value: u64, pref: u64) -> String {
    let units = [" ", "K", "M"];
    let (mut v, mut p, mut unit) = (value, pref as f64, units[0]);
    for u in &units[1..] {
        if p < 750.0 * 1000.0 {
            break;
        }
        unit = u;
        v /= 1000;
        p /= 1000.0;
    }
    format!("{v:7} {unit} ")
}

/// `s` safe to write to a terminal: control characters (ESC of an OSC title or a
/// clear-screen sequence, BEL, CR, backspace, DEL, the C1 range) and the invisible
/// characters that reorder or hide text (bidi embeddings, overrides and isolates, the
/// marks, line and paragraph separators) written as `\u001b`, `\u202e`, ... Newlines and
/// tabs are kept (`lines: true`) or escaped too (`lines: false`, for a one-line message).
///
/// Every text the command line writes goes through it ([`crate::print_stdout`], error
/// lines): frame names, annotation names and file names come from the file and the user.
/// The form is a JSON escape, so a JSON document through it still parses to the same
/// strings (serde_json leaves the C1 range and the bidi characters raw).
pub fn escape_text(s: &str, lines: bool) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| match c {
        '\n' | '\t' => !lines,
        '\u{061c}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}' => true,
        c => c.is_control(),
    };
    if !s.chars().any(unsafe_char) {
        return s.into();
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if unsafe_char(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out.into()
}

/// A `--json` document as every command prints it: serde_json's pretty form and a newline.
/// The Python package returns exactly this text from its results' `to_json()`.
pub fn json_text<T: serde::Serialize + ?Sized>(value: &T) -> Result<String, crate::CliError> {
    let mut s =
        serde_json::to_string_pretty(value).map_err(|e| crate::CliError::usage(format!("cannot write JSON: {e}")))?;
    s.push('\n');
    Ok(s)
}

/// `n` (digits grouped) and the noun for that count: `1 trace entry`, `2 trace entries`.
pub fn count_of(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", grouped(n), if n == 1 { one } else { many })
}

/// `text` cut between words into lines of at most `max` characters (a word longer than
/// `max` is a line of its own): a sentence as continuation lines of a table cell.
pub fn wrap_words(text: &str, max: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut line = String::new();
    for w in text.split(' ') {
        if !line.is_empty() && line.chars().count() + 1 + w.chars().count() > max {
            out.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(w);
    }
    out.push(line);
    out
}

/// `text` cut after its commas into pieces of at most `max` characters (a piece without a
/// comma may be longer): a long `PYTORCH_CUDA_ALLOC_CONF` string as continuation lines of a
/// table cell instead of one column that makes the table 170 characters wide.
pub fn wrap_at_commas(text: &str, max: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for part in text.split_inclusive(',') {
        match out.last_mut() {
            Some(cur) if cur.chars().count() + part.chars().count() <= max => cur.push_str(part),
            _ => out.push(part.to_string()),
        }
    }
    if out.is_empty() {
        out.push(String::new());
    }
    out
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// A fixed-width table in memory_summary's style: `|`-bordered, `=` at top and bottom,
/// `-` between groups.
#[derive(Debug, Default)]
pub struct Table {
    columns: Vec<(String, Align)>,
    rows: Vec<Row>,
}

#[derive(Debug)]
enum Row {
    Cells(Vec<String>),
    Rule,
    /// A line spanning the whole table.
    Banner(String),
}

impl Table {
    pub fn new(columns: &[(&str, Align)]) -> Self {
        Table { columns: columns.iter().map(|(h, a)| (h.to_string(), *a)).collect(), rows: Vec::new() }
    }
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows.push(Row::Cells(cells.into_iter().map(Into::into).collect()));
    }
    /// A `-` separator line.
    pub fn rule(&mut self) {
        self.rows.push(Row::Rule);
    }
    pub fn banner(&mut self, text: impl Into<String>) {
        self.rows.push(Row::Banner(text.into()));
    }

    fn widths(&self) -> Vec<usize> {
        let mut w: Vec<usize> = self.columns.iter().map(|(h, _)| h.chars().count()).collect();
        for r in &self.rows {
            if let Row::Cells(c) = r {
                for (i, cell) in c.iter().enumerate().take(w.len()) {
                    w[i] = w[i].max(cell.chars().count());
                }
            }
        }
        w
    }

    pub fn render(&self) -> String {
        let mut w = self.widths();
        let mut inner: usize = w.iter().map(|x| x + 2).sum::<usize>() + w.len().saturating_sub(1);
        let banner_w = self
            .rows
            .iter()
            .filter_map(|r| if let Row::Banner(b) = r { Some(b.chars().count() + 2) } else { None })
            .max()
            .unwrap_or(0);
        if banner_w > inner {
            if let Some(first) = w.first_mut() {
                *first += banner_w - inner;
            }
            inner = banner_w;
        }
        let line = |c: char| format!("|{}|\n", c.to_string().repeat(inner));
        let cells = |c: &[String]| {
            let mut s = String::from("|");
            for (i, width) in w.iter().enumerate() {
                let text = c.get(i).map(String::as_str).unwrap_or("");
                let pad = width.saturating_sub(text.chars().count());
                let align = self.columns.get(i).map_or(Align::Left, |x| x.1);
                match align {
                    Align::Left => s.push_str(&format!(" {text}{} |", " ".repeat(pad))),
                    Align::Right => s.push_str(&format!(" {}{text} |", " ".repeat(pad))),
                }
            }
            s.push('\n');
            s
        };
        let mut out = line('=');
        let header: Vec<String> = self.columns.iter().map(|(h, _)| h.clone()).collect();
        let (mut header_done, mut had_banner) = (false, false);
        for r in &self.rows {
            match r {
                Row::Banner(b) => {
                    let pad = inner.saturating_sub(b.chars().count());
                    let left = pad / 2;
                    out.push_str(&format!("|{}{b}{}|\n", " ".repeat(left), " ".repeat(pad - left)));
                    had_banner = true;
                }
                Row::Rule | Row::Cells(_) if !header_done => {
                    // A banner is closed by its own rule; the top border needs no second one.
                    if had_banner {
                        out.push_str(&line('='));
                    }
                    out.push_str(&cells(&header));
                    out.push_str(&line('-'));
                    header_done = true;
                    if let Row::Cells(c) = r {
                        out.push_str(&cells(c));
                    }
                }
                Row::Rule => out.push_str(&line('-')),
                Row::Cells(c) => out.push_str(&cells(c)),
            }
        }
        out.push_str(&line('='));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_settings_wrap_after_commas() {
        let w = wrap_at_commas("garbage_collection_threshold:0.8,per_process_memory_fraction:0.95", 36);
        assert_eq!(w, ["garbage_collection_threshold:0.8,", "per_process_memory_fraction:0.95"]);
        assert_eq!(wrap_at_commas("expandable_segments:True", 36), ["expandable_segments:True"]);
        assert_eq!(wrap_at_commas("a:1,b:2,c:3", 8), ["a:1,b:2,", "c:3"]);
        assert_eq!(wrap_at_commas("", 8), [""]);
        assert_eq!(wrap_words("one two three four", 9), ["one two", "three", "four"]);
        assert_eq!(wrap_words("a verylongword b", 4), ["a", "verylongword", "b"]);
        assert_eq!(wrap_words("", 8), [""]);
    }

    #[test]
    fn pytorch_styles() {
        assert_eq!(bytes(1024), "1024 bytes");
        assert_eq!(bytes(1 << 20), "1024.00 KiB");
        assert_eq!(bytes(3 << 29), "1.50 GiB");
        assert_eq!(summary_bytes(1536 << 20, 1536 << 20), "  1536 MiB");
        assert_eq!(summary_bytes(512, 512), "   512 B  ");
        assert_eq!(summary_bytes(1 << 20, 800 << 20), "     1 MiB");
        assert_eq!(summary_count(12, 12), "     12   ");
        assert_eq!(summary_count(800_000, 800_000), "    800 K ");
        assert_eq!(grouped(1234567), "1,234,567");
        assert_eq!(grouped(12), "12");
        assert_eq!(count_of(1, "trace entry", "trace entries"), "1 trace entry");
        assert_eq!(count_of(1234, "trace entry", "trace entries"), "1,234 trace entries");
        assert_eq!(count_of(0, "trace entry", "trace entries"), "0 trace entries");
    }

    #[test]
    fn table_renders_aligned() {
        let mut t = Table::new(&[("Metric", Align::Left), ("Cur Usage", Align::Right)]);
        t.banner("title");
        t.row(["a", "1"]);
        t.rule();
        t.row(["bbb", "22"]);
        let s = t.render();
        let lens: Vec<usize> = s.lines().map(|l| l.chars().count()).collect();
        assert!(lens.iter().all(|&l| l == lens[0]), "{s}");
        assert!(s.contains("| bbb    |        22 |"), "{s}");
    }
}
