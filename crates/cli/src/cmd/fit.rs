//! `fragscope fit FILE… --capacity 40GB` (or GPU names, `A100-40GB,L40S,H100-80GB`): the
//! changes that make the recorded run fit, each replayed, cheapest first
//! (`fragscope_commands::fit`). With `--sizes`, the files are recordings of one program at
//! those sizes: the largest is fitted, and `predict` adds the largest size that fits; with
//! `--at N` too, the run predicted at size N is fitted instead.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use fragscope_alloc::format_size;
use fragscope_commands::fit::{evaluate, json, CardFit, Fit, FitOption, Request};
use fragscope_commands::input;
use fragscope_commands::predict::parse_sizes;
use fragscope_commands::Param;
use fragscope_snapshot::Snapshot;

use crate::output::{Align, Table};
use crate::{print_stdout, CliError};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Snapshot pickles with an allocation trace (each fitted on its own, or with --sizes
    /// one program recorded at several sizes).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Device sizes to fit on: bytes with a unit (40GB, 39.5GiB) or GPU names, several
    /// separated by commas (A100-40GB,L40S,H100-80GB).
    #[arg(long, value_name = "SIZE|GPU,...", required = true)]
    pub capacity: String,
    /// The size parameter of each recording (batch size, sequence length), in file order:
    /// the largest is fitted, and the largest size that fits is predicted.
    #[arg(long, value_name = "N,N,...")]
    pub sizes: Option<String>,
    /// With --sizes: fit the run predicted at this size (nobody recorded it): allocator
    /// settings and a smaller size, each predicted and replayed.
    #[arg(long, value_name = "N", requires = "sizes")]
    pub at: Option<u64>,
    /// Only this device.
    #[arg(long)]
    pub device: Option<i64>,
    /// Options shown per card in the text (all are in --json).
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub top: usize,
    /// Print JSON (schema `fragscope.fit/1`) instead of text.
    #[arg(long)]
    pub json: bool,
}

impl Args {
    /// The library's request, checked before any file is read.
    fn request(&self) -> Result<Request, CliError> {
        let sizes = match &self.sizes {
            Some(s) => parse_sizes(s, Param::Sizes)?,
            None => Vec::new(),
        };
        let req = Request { capacity: self.capacity.clone(), device: self.device, sizes, at: self.at };
        req.check(self.files.len())?;
        Ok(req)
    }
}

pub fn run(args: &Args) -> Result<ExitCode, CliError> {
    let req = args.request()?;
    let snaps = args.files.iter().map(|f| input::load(f, args.json)).collect::<Result<Vec<_>, _>>()?;
    let names: Vec<String> = args.files.iter().map(|f| f.display().to_string()).collect();
    let refs: Vec<&Snapshot> = snaps.iter().collect();
    let fit = evaluate(&names, &refs, &req)?;
    let text = if args.json { json(&fit)? } else { render_text(&fit, args.top) };
    print_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// The text: per file and device, per card the verdict and the options, cheapest first.
pub fn render_text(fit: &Fit, top: usize) -> String {
    let mut s = String::new();
    // What a GPU name was read as: once, not under every card of every device.
    for c in &fit.cards {
        if let Some(n) = &c.note {
            let _ = writeln!(s, "capacity: {n}");
        }
    }
    if fit.cards.iter().any(|c| c.note.is_some()) {
        s.push('\n');
    }
    for f in &fit.files {
        let size = match f.size {
            Some(x) if f.predicted => format!(" (predicted at size {x})"),
            Some(x) => format!(" (size {x})"),
            None => String::new(),
        };
        let _ = writeln!(s, "{}{size}", f.file);
        for d in &f.devices {
            let live = d.live_bytes_peak.map_or(String::new(), |b| format!("live tensors reach {}; ", format_size(b)));
            let _ = writeln!(
                s,
                "  device {}: peak reserved {} (allocated {}) on an unlimited device; {live}{}",
                d.device,
                format_size(d.peak_reserved_unlimited),
                format_size(d.peak_allocated_unlimited),
                d.steps
            );
            if let Some(w) = &d.cached_before_trace {
                let _ = writeln!(s, "  note: {}", w.note);
            }
            for c in &d.cards {
                render_card(&mut s, c, top);
            }
        }
        s.push('\n');
    }
    s
}

fn render_card(s: &mut String, c: &CardFit, top: usize) {
    let _ = writeln!(s, "\n  {}: {}", c.capacity, c.verdict);
    if !c.fits_as_recorded && !c.options.is_empty() {
        let mut t = Table::new(&[
            ("#", Align::Right),
            ("change", Align::Left),
            ("cost", Align::Left),
            ("peak reserved", Align::Right),
            ("peak allocated", Align::Right),
            ("margin", Align::Right),
            ("model", Align::Left),
        ]);
        for o in c.options.iter().take(top) {
            t.row([
                o.rank.to_string(),
                o.change.clone(),
                o.cost.clone(),
                format_size(o.peak_reserved),
                format_size(o.peak_allocated),
                format_size(o.margin),
                match (o.model, o.basis.starts_with("predicted")) {
                    (false, _) => "replay",
                    (true, true) => "prediction",
                    (true, false) => "model",
                }
                .to_string(),
            ]);
        }
        s.push_str(&t.render());
        if c.options.len() > top {
            let _ = writeln!(s, "  ({} more in --json)", c.options.len() - top);
        }
        // Two kinds of model: a run predicted at another size, a recorded trace transformed.
        let predicted = |o: &&FitOption| o.model && o.basis.starts_with("predicted");
        if c.options.iter().take(top).any(|o| predicted(&o)) {
            let _ = writeln!(s, "  model: predicted from the recordings at other sizes and replayed, not a recording");
        }
        if c.options.iter().take(top).any(|o| o.model && !predicted(&o)) {
            let _ = writeln!(
                s,
                "  model: the recorded trace transformed and replayed, not a recording; not modelled: {}",
                c.options
                    .iter()
                    .find(|o| !o.not_modelled.is_empty())
                    .map_or(String::new(), |o| o.not_modelled.join("; "))
            );
        }
    }
    for p in &c.pruned {
        let _ = writeln!(s, "  pruned: {p}");
    }
    let _ = writeln!(s, "  {} replays", c.replays);
}
