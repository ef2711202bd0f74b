//! `fragscope diff A B [--json] [--top N]`: peak allocated / reserved / fragmentation of
//! two snapshots per device, and the call sites whose live bytes at the allocated peak
//! changed most (`fragscope_diagnose::diff`).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use fragscope_diagnose::{diff, DiffOptions};

use crate::output::{bytes, Align, Table};
use crate::CliError;
use fragscope_commands::input;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The baseline snapshot.
    pub a: PathBuf,
    /// The snapshot compared with it.
    pub b: PathBuf,
    /// Call sites listed.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Print JSON (schema `fragscope.diff/1`) instead of text.
    #[arg(long)]
    pub json: bool,
}

fn signed(d: i64) -> String {
    if d < 0 {
        format!("-{}", bytes(d.unsigned_abs()))
    } else {
        format!("+{}", bytes(d as u64))
    }
}

fn frag(f: Option<f64>) -> String {
    f.map_or("n/a".into(), |x| format!("{:.1}%", x * 100.0))
}

pub fn run(args: &Args) -> Result<ExitCode, CliError> {
    let a = input::load(&args.a, args.json)?;
    let b = input::load(&args.b, args.json)?;
    let d = diff(&a, &b, &DiffOptions { top: args.top });
    let text = if args.json {
        fragscope_commands::diff::json(&args.a.display().to_string(), &args.b.display().to_string(), &d)?
    } else {
        let mut s = String::new();
        let _ = writeln!(s, "A: {}\nB: {}", args.a.display(), args.b.display());
        for dev in &d.devices {
            let mut t =
                Table::new(&[("", Align::Left), ("A", Align::Right), ("B", Align::Right), ("B - A", Align::Right)]);
            t.banner(format!("device {} (A) vs device {} (B)", dev.a.device, dev.b.device));
            t.row([
                "peak allocated".to_string(),
                bytes(dev.a.peak_allocated),
                bytes(dev.b.peak_allocated),
                signed(dev.delta.peak_allocated),
            ]);
            t.row([
                "peak reserved".to_string(),
                bytes(dev.a.peak_reserved),
                bytes(dev.b.peak_reserved),
                signed(dev.delta.peak_reserved),
            ]);
            t.row([
                "peak fragmentation".to_string(),
                frag(dev.a.peak_fragmentation),
                frag(dev.b.peak_fragmentation),
                dev.delta.peak_fragmentation.map_or("n/a".into(), |x| format!("{:+.1} pt", x * 100.0)),
            ]);
            s.push_str(&t.render());
            if !dev.sites.is_empty() {
                let mut t = Table::new(&[
                    ("call site", Align::Left),
                    ("A", Align::Right),
                    ("B", Align::Right),
                    ("B - A", Align::Right),
                ]);
                t.banner("live bytes at the allocated peak, largest changes");
                for x in &dev.sites {
                    t.row([x.site.site.clone(), bytes(x.bytes_a), bytes(x.bytes_b), signed(x.delta)]);
                }
                if dev.other_sites_delta != 0 {
                    t.row(["(other sites)".to_string(), String::new(), String::new(), signed(dev.other_sites_delta)]);
                }
                s.push_str(&t.render());
            }
        }
        for x in &d.only_in_a {
            let _ = writeln!(s, "device {x} is only in A");
        }
        for x in &d.only_in_b {
            let _ = writeln!(s, "device {x} is only in B");
        }
        s
    };
    crate::print_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}
