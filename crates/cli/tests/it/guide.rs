//! docs/GUIDE.md and README.md stay true: every output block in them is regenerated from the command in
//! the marker comment above it, and this test fails when the file differs.
//!
//! A block is
//!
//! ````text
//! <!-- guide-run: fragscope summary ../shared/traces/X.pickle | grep -F -A 7 "Fragmentation," -->
//! ```text
//! $ fragscope summary ../shared/traces/X.pickle    # excerpt
//! ...the lines the pipe stages keep...
//! ```
//! ````
//!
//! The command runs from the repository root with this build's `fragscope`; `< FILE`
//! feeds standard input, and the pipe stages `head -n N`, `grep -F "TEXT"` and
//! `grep -F -A N "TEXT"` are applied as those tools would (the marker's line runs as is
//! in a shell); the block shows only the `fragscope` command, marked `# excerpt` when
//! stages cut its output, so readers are not handed grep pipelines.
//!
//! Regenerate (rewrites docs/GUIDE.md and README.md in place):
//!     FRAGSCOPE_WRITE_GUIDE=1 cargo test -p fragscope --test it guide::

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const REGEN: &str = "FRAGSCOPE_WRITE_GUIDE=1 cargo test -p fragscope --test it guide::";
const MARK: &str = "<!-- guide-run: ";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Shell-like words: spaces split, '...' and "..." quote.
fn words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    for c in s.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            (None, c) => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// `grep -F -A n pat`: every matching line and `n` after it, `--` between groups.
fn grep_after(lines: &[String], pat: &str, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut last_printed: Option<usize> = None;
    let mut until = 0usize; // print lines < until
    for (i, l) in lines.iter().enumerate() {
        if l.contains(pat) {
            if let Some(p) = last_printed {
                if i > p + 1 && i >= until {
                    out.push("--".to_string());
                }
            }
            until = i + n + 1;
        }
        if i < until {
            out.push(l.clone());
            last_printed = Some(i);
        }
    }
    out
}

/// Runs one marker command; returns the block body (the `$ command` line, then output).
fn run(cmdline: &str) -> Result<String, String> {
    let mut stages = cmdline.split(" | ");
    let main = words(stages.next().unwrap_or(""));
    let (prog, rest) = main.split_first().ok_or("empty command")?;
    if prog != "fragscope" {
        return Err(format!("guide commands start with `fragscope`: {cmdline}"));
    }
    let mut args: Vec<String> = Vec::new();
    let mut stdin_file = None;
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        if a == "<" {
            stdin_file = Some(it.next().ok_or("`<` without a file")?.clone());
        } else {
            args.push(a.clone());
        }
    }
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fragscope"));
    cmd.args(&args).current_dir(root()).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if stdin_file.is_some() { Stdio::piped() } else { Stdio::null() });
    let mut child = cmd.spawn().map_err(|e| e.to_string())?;
    if let Some(f) = stdin_file {
        let data = std::fs::read(root().join(&f)).map_err(|e| format!("{f}: {e}"))?;
        child.stdin.take().unwrap().write_all(&data).map_err(|e| e.to_string())?;
    }
    let o = child.wait_with_output().map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(format!("`{cmdline}` failed: {}", String::from_utf8_lossy(&o.stderr)));
    }
    let mut lines: Vec<String> = String::from_utf8_lossy(&o.stdout).lines().map(str::to_string).collect();
    for st in stages {
        let w = words(st);
        let w: Vec<&str> = w.iter().map(String::as_str).collect();
        lines = match w.as_slice() {
            ["head", "-n", n] => lines.into_iter().take(n.parse().map_err(|_| format!("bad head: {st}"))?).collect(),
            ["grep", "-F", pat] => lines.into_iter().filter(|l| l.contains(pat)).collect(),
            ["grep", "-F", "-A", n, pat] => grep_after(&lines, pat, n.parse().map_err(|_| format!("bad -A: {st}"))?),
            _ => return Err(format!("unsupported pipe stage `{st}` (head -n N, grep -F TEXT, grep -F -A N TEXT)")),
        };
        if lines.is_empty() {
            return Err(format!("`{st}` kept no line of `{cmdline}`'s output: fix the marker"));
        }
    }
    // The block shows the command a reader runs; the pipe stages that cut the output to the
    // lines the text discusses are in the marker only, and the block says it is an excerpt.
    let shown = cmdline.split(" | ").next().unwrap_or(cmdline);
    let mut body = if cmdline.contains(" | ") { format!("$ {shown}    # excerpt\n") } else { format!("$ {shown}\n") };
    for l in lines {
        body.push_str(l.trim_end());
        body.push('\n');
    }
    Ok(body)
}

/// The guide with every marked block regenerated.
fn regenerate(text: &str) -> Result<(String, usize), String> {
    let mut out = String::new();
    let mut lines = text.split_inclusive('\n').peekable();
    let mut blocks = 0;
    while let Some(line) = lines.next() {
        out.push_str(line);
        let t = line.trim();
        let Some(cmd) = t.strip_prefix(MARK).and_then(|r| r.strip_suffix("-->")) else { continue };
        let fence = lines.next().ok_or("marker at the end of the file")?;
        if fence.trim() != "```text" {
            return Err(format!("the line after `{t}` must be ```text"));
        }
        out.push_str(fence);
        // Skip the old body up to the closing fence.
        loop {
            match lines.next() {
                Some(l) if l.trim() == "```" => break,
                Some(_) => {}
                None => return Err(format!("block of `{t}` is not closed")),
            }
        }
        out.push_str(&run(cmd.trim())?);
        out.push_str("```\n");
        blocks += 1;
    }
    Ok((out, blocks))
}

/// Checks (or, with FRAGSCOPE_WRITE_GUIDE set, rewrites) one document's generated blocks.
fn check_document(rel: &str, min_blocks: usize) {
    // The commands read the real snapshots; without them (outside CI) nothing can be checked.
    if !fragscope_testdata::has_corpus() {
        fragscope_testdata::skip(&format!("{rel} check (its commands read corpus files)"));
        return;
    }
    let path = root().join(rel);
    let text = std::fs::read_to_string(&path).unwrap();
    let (fresh, blocks) = regenerate(&text).unwrap_or_else(|e| panic!("{rel}: {e}"));
    assert!(blocks >= min_blocks, "{rel} has only {blocks} generated blocks");
    if std::env::var_os("FRAGSCOPE_WRITE_GUIDE").is_some() {
        if fresh != text {
            std::fs::write(&path, &fresh).unwrap();
            eprintln!("{rel} rewritten ({blocks} blocks)");
        }
        return;
    }
    if fresh != text {
        let (a, b): (Vec<&str>, Vec<&str>) = (text.lines().collect(), fresh.lines().collect());
        let i = a.iter().zip(&b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
        panic!(
            "{rel} is stale: its outputs differ from what fragscope prints now (first at line {}:\n  file: {}\n  now:  {})\nRegenerate it with:\n    {REGEN}",
            i + 1,
            a.get(i).unwrap_or(&"<end>"),
            b.get(i).unwrap_or(&"<end>")
        );
    }
}

#[test]
fn guide_outputs_are_current() {
    check_document("docs/GUIDE.md", 7);
}

/// The README's output excerpts are generated the same way (issue 42 item 8: excerpts that
/// had drifted from today's output).
#[test]
fn readme_outputs_are_current() {
    check_document("README.md", 5);
}

#[test]
fn pipe_stages_behave_like_the_tools() {
    let l: Vec<String> = ["a", "x1", "b", "c", "x2", "d", "e", "f", "x3"].iter().map(|s| s.to_string()).collect();
    assert_eq!(grep_after(&l, "x", 1), ["x1", "b", "--", "x2", "d", "--", "x3"]);
    assert_eq!(grep_after(&l, "x", 2), ["x1", "b", "c", "x2", "d", "e", "--", "x3"]);
    assert_eq!(words(r#"grep -F -A 3 "Peak fragmentation" x"#), ["grep", "-F", "-A", "3", "Peak fragmentation", "x"]);
    assert_eq!(words("replay --config '' f"), ["replay", "--config", "", "f"]);
}
