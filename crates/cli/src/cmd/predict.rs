//! `fragscope predict A B [C ...] --sizes 128,256 --at 512[,1024]`: memory of the same
//! program at a size nobody recorded (batch size, sequence length, ...), from recordings
//! at other sizes, replayed through the allocator model (`fragscope_predict`).
//!
//! `--capacity GPU` says whether each size fits and where the first OOM would be;
//! `--max-fit` finds the largest size that fits, under the settings in force and the
//! alternatives `replay` tries.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use fragscope_commands::input;
use fragscope_commands::predict::{check_request, evaluate, json, parse_sizes, Outcome, Request};
use fragscope_commands::Param;
use fragscope_predict::{MaxFit, Prediction, Program};
use fragscope_snapshot::Snapshot;

use crate::output::{bytes, percent, Align, Table};
use crate::{print_stdout, CliError};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Recordings (snapshot pickles) of one program at different sizes, two or more.
    pub files: Vec<PathBuf>,
    /// The size parameter of each recording, in file order (batch size, sequence
    /// length, ...): `--sizes 128,256`.
    #[arg(long, value_name = "N,N,...", required = true)]
    pub sizes: String,
    /// Sizes to predict: `--at 512,1024`.
    #[arg(long, value_name = "N,N,...")]
    pub at: Option<String>,
    /// PYTORCH_CUDA_ALLOC_CONF string replayed instead of the recorded settings (applied
    /// on top of them).
    #[arg(long, value_name = "STRING")]
    pub config: Option<String>,
    /// Device memory PyTorch's allocator may use: bytes with a unit (80GiB; best:
    /// `torch.cuda.mem_get_info()[0]` at the start of the process) or a GPU name
    /// (H100-80GB, A100-40GB, ...), whose total is reduced by 560 MiB for the CUDA context
    /// (said in the output). Without it the replay has no limit.
    #[arg(long, value_name = "SIZE|GPU")]
    pub capacity: Option<String>,
    /// The largest size that fits on --capacity (bisection over replays), under the
    /// settings in force and the alternatives `replay` tries.
    #[arg(long)]
    pub max_fit: bool,
    /// Largest size --max-fit tries.
    #[arg(long, value_name = "N", default_value_t = 1 << 20)]
    pub max_size: u64,
    /// Only this device.
    #[arg(long)]
    pub device: Option<i64>,
    /// Print JSON (schema `fragscope.predict/2`) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also write an HTML page (self-contained, like `report`) drawing each recording's
    /// reserved and allocated curves beside the predicted ones.
    #[arg(long, value_name = "FILE.html")]
    pub report: Option<PathBuf>,
}

impl Args {
    /// The library's request, parsed (before reading any file).
    fn request(&self) -> Result<Request, CliError> {
        let at = match &self.at {
            Some(s) => parse_sizes(s, Param::At)?,
            None => Vec::new(),
        };
        let (capacity, capacity_note) = fragscope_commands::predict::parse_capacity(self.capacity.as_deref())?;
        let sizes = if self.files.len() < 2 { Vec::new() } else { parse_sizes(&self.sizes, Param::Sizes)? };
        let req = Request {
            sizes,
            at,
            config: self.config.clone(),
            capacity,
            capacity_note,
            max_fit: self.max_fit,
            max_size: self.max_size,
            device: self.device,
        };
        check_request(self.files.len(), &req)?;
        Ok(req)
    }
}

pub fn run(args: &Args) -> Result<ExitCode, CliError> {
    // Usage errors first, before reading anything.
    let req = args.request()?;
    let snaps = args.files.iter().map(|f| input::load(f, args.json)).collect::<Result<Vec<_>, _>>()?;
    let names: Vec<String> = args.files.iter().map(|f| f.display().to_string()).collect();
    let refs: Vec<&Snapshot> = snaps.iter().collect();
    let out = evaluate(&names, &refs, &req)?;
    let json_text = json(&out)?;
    if let Some(path) = &args.report {
        let html = fragscope_report::render_predict(&report_page(&out, &refs, &json_text)?);
        super::report::write_atomically(path, html.as_bytes())?;
        eprintln!("wrote {} ({} bytes)", crate::output::escape_text(&path.display().to_string(), false), html.len());
    }
    let text = if args.json { json_text } else { render_text(&out, args.capacity.as_deref()) };
    print_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// The page of `--report`: each recording's curves (every device predicted) and each
/// prediction's, replayed again with its curve observed (the same replay: its peaks are
/// the `--json` figures), within the page's curve budget
/// ([`fragscope_report::predict::MAX_CURVES`]).
pub fn report_page(
    out: &Outcome,
    snaps: &[&Snapshot],
    json_text: &str,
) -> Result<fragscope_report::predict::PredictPage, CliError> {
    use fragscope_report::predict::{
        buckets_each, recorded_curve, PredictPage, Predicted, PredictedCurve, Recorded, MAX_CURVES,
    };
    let doc: serde_json::Value = serde_json::from_str(json_text).map_err(|e| CliError::usage(e.to_string()))?;
    let wanted = out.programs.len() * snaps.len() + out.predictions.len();
    let buckets = buckets_each(wanted);
    let mut drawn = 0usize;
    let mut take = || {
        drawn += 1;
        drawn <= MAX_CURVES
    };
    let mut recorded = Vec::new();
    for p in &out.programs {
        for ((snap, name), &size) in snaps.iter().zip(&out.names).zip(&out.sizes) {
            let curve = take().then(|| recorded_curve(snap, p.device, buckets));
            recorded.push(Recorded { file: name.clone(), size, device: p.device, curve });
        }
    }
    let mut predicted = Vec::new();
    for (i, (pred, k)) in out.predictions.iter().enumerate() {
        let prog = &out.programs[*k];
        let curve = if take() {
            let cfg = fragscope_alloc::parse_config(&pred.config).map_err(|e| CliError::usage(e.to_string()))?;
            let mut c = PredictedCurve::new(prog.template_entries(), buckets);
            let again = prog.predict_observed(pred.at, &cfg, pred.capacity, |i, l| c.observe(i, l));
            debug_assert_eq!((again.peak_reserved, again.peak_allocated), (pred.peak_reserved, pred.peak_allocated));
            Some(c.finish())
        } else {
            None
        };
        predicted.push(Predicted {
            prediction: doc["predictions"][i].clone(),
            template_size: prog.template_size,
            curve,
        });
    }
    let note = (wanted > MAX_CURVES).then(|| {
        format!("{MAX_CURVES} of the {wanted} curves are drawn (the page's size budget); the others are in the tables")
    });
    Ok(PredictPage { json: doc, recorded, predicted, note })
}

fn conf_label(c: &str) -> String {
    if c.is_empty() {
        "(defaults)".into()
    } else {
        c.to_string()
    }
}

fn render_text(out: &Outcome, capacity: Option<&str>) -> String {
    let (names, sizes) = (&out.names, &out.sizes);
    let mut s = String::new();
    let listed: Vec<String> = names.iter().zip(sizes).map(|(n, z)| format!("{n} (size {z})")).collect();
    let _ = writeln!(s, "predict from {}", listed.join(", "));
    if let Some(n) = &out.capacity_note {
        let _ = writeln!(s, "  capacity: {n}");
    }
    programs_text(&mut s, &out.programs);
    if !out.predictions.is_empty() {
        predictions_text(&mut s, &out.predictions, capacity);
    }
    if !out.max_fit.is_empty() {
        max_fit_text(&mut s, &out.max_fit, capacity);
    }
    s
}

/// Each fitted program (a device): its requests and how many align in every recording,
/// the laws their sizes follow, the largest requests no law explains, and its notes.
fn programs_text(s: &mut String, programs: &[Program]) {
    for p in programs {
        let q = &p.quality;
        let laws: Vec<String> = q.by_law.iter().map(|(l, n)| format!("{l} {n}")).collect();
        let _ = writeln!(
            s,
            "\n  device {}: {} allocations in the largest recording, {} aligned in every recording; sizes: {}",
            p.device,
            q.requests,
            percent(q.aligned_fraction),
            laws.join(", ")
        );
        if q.unexplained_total > 0 {
            let _ = writeln!(
                s,
                "  {} allocation(s) follow no law or were seen at one size only (kept or extrapolated, listed in --json); largest:",
                q.unexplained_total
            );
            for u in q.unexplained.iter().take(5) {
                let rec: Vec<String> = u.recorded.iter().map(|(x, b)| format!("{} at {x}", bytes(*b))).collect();
                let _ = writeln!(
                    s,
                    "    entry {} ({}): {}{}",
                    u.index,
                    u.law.as_str(),
                    rec.join(", "),
                    if u.site.is_empty() { String::new() } else { format!("  {}", u.site) }
                );
            }
        }
        for n in &p.notes {
            let _ = writeln!(s, "  note: {n}");
        }
    }
}

/// The predictions' table (one row per size and device: peaks, whether it fits on
/// `capacity`, the first OOM, the extrapolated share), the settings and the notes.
fn predictions_text(s: &mut String, predictions: &[(Prediction, usize)], capacity: Option<&str>) {
    let cap = capacity.unwrap_or("unlimited");
    let mut t = Table::new(&[
        ("size", Align::Right),
        ("device", Align::Right),
        ("peak reserved", Align::Right),
        ("peak allocated", Align::Right),
        ("range reserved", Align::Right),
        ("range allocated", Align::Right),
        (&format!("fits ({cap})"), Align::Left),
        ("first OOM", Align::Left),
        ("extrapolated", Align::Right),
    ]);
    for (p, _) in predictions {
        let oom = match (&p.start_over_capacity, &p.oom) {
            _ if p.start_refused.is_some() => "state before the trace not held (note)".to_string(),
            (Some(o), _) => format!("before the trace: {} live, {} over", bytes(o.live), bytes(o.over)),
            (None, None) => "none".to_string(),
            (None, Some(o)) => format!(
                "entry {}: {} ({}){}",
                o.index,
                bytes(o.requested),
                o.law.as_str(),
                if o.site.is_empty() { String::new() } else { format!(" at {}", o.site) }
            ),
        };
        let fits = if p.start_refused.is_some() {
            "no".to_string()
        } else if p.capacity.is_none() {
            "n/a".to_string()
        } else {
            let r = p.range.as_ref();
            match (p.fits(), r.is_none_or(|r| r.high_fits), r.is_some_and(|r| r.low_fits)) {
                (true, true, _) => "yes",
                (true, false, _) => "yes (not for certain)",
                (false, _, true) => "no (might)",
                (false, _, false) => "no",
            }
            .to_string()
        };
        let span = |lh: Option<[u64; 2]>| match lh {
            Some([l, h]) if l != h => format!("{} – {}", bytes(l), bytes(h)),
            Some(_) => "exact".to_string(),
            None => "—".to_string(),
        };
        t.row([
            p.at.to_string(),
            p.device.to_string(),
            bytes(p.peak_reserved),
            bytes(p.peak_allocated),
            span(p.range.as_ref().map(|r| r.reserved)),
            span(p.range.as_ref().map(|r| r.allocated)),
            fits,
            oom,
            percent(p.extrapolated_share),
        ]);
    }
    let _ = writeln!(s, "\n{}", t.render());
    if let Some((p, _)) = predictions.first() {
        let _ = writeln!(s, "  settings: {}", conf_label(&p.config));
    }
    let _ = writeln!(
        s,
        "  extrapolated: share of the allocated peak whose size only the recordings determine (no recording \
         checked the law) or that follows no law"
    );
    let _ = writeln!(
        s,
        "  range: the peaks replayed under the plausible alternatives of the laws the recordings leave open \
         (line vs quadratic, step-like sizes, sizes no law explains; more than {} times past the largest \
         recording, growth {:.0}% slower or faster) and a warm template's first step, widened by \
         the model's residual ({:.1}%)",
        fragscope_predict::FAR_BEYOND,
        fragscope_predict::FAR_MARGIN * 100.0,
        fragscope_predict::RESIDUAL * 100.0
    );
    write_notes(s, predictions.iter().map(|(p, _)| p));
}

/// The `--max-fit` table (one row per setting and device: the largest size that fits on
/// `capacity`, its peak, the next size's first OOM, the replays made) and its notes.
fn max_fit_text(s: &mut String, maxfits: &[MaxFit], capacity: Option<&str>) {
    let mut t = Table::new(&[
        ("PYTORCH_CUDA_ALLOC_CONF", Align::Left),
        ("device", Align::Right),
        ("largest size that fits", Align::Right),
        ("for certain", Align::Right),
        ("might fit", Align::Right),
        ("its peak reserved", Align::Right),
        ("next size: first OOM", Align::Left),
        ("replays", Align::Right),
    ]);
    for m in maxfits {
        let largest = match (m.largest, m.bounded) {
            (None, _) => "none".to_string(),
            (Some(x), true) => x.to_string(),
            (Some(x), false) => format!("≥ {x} (all tried fit)"),
        };
        let next = match &m.next {
            Some(p) => match (&p.start_over_capacity, &p.oom) {
                (Some(o), _) => format!("{} before the trace ({} over)", p.at, bytes(o.over)),
                (None, Some(o)) => format!("{} at entry {} ({})", p.at, o.index, bytes(o.requested)),
                (None, None) => format!("{}: fits", p.at),
            },
            None => "—".into(),
        };
        let (certain, might) = match &m.range {
            Some(r) => (
                r.certain.map_or("none".to_string(), |x| x.to_string()),
                match (r.might, r.might_bounded) {
                    (None, _) => "none".to_string(),
                    (Some(x), true) => x.to_string(),
                    (Some(x), false) => format!("≥ {x}"),
                },
            ),
            None => ("—".to_string(), "—".to_string()),
        };
        // A long settings string continues on the next lines of its cell (issue 42 item 7:
        // a 65-character label made this table 189 characters wide).
        let mut label = crate::output::wrap_at_commas(&conf_label(&m.config), 36).into_iter();
        t.row([
            label.next().unwrap_or_default(),
            m.device.to_string(),
            largest,
            certain,
            might,
            m.fits_at.as_ref().map(|p| bytes(p.peak_reserved)).unwrap_or_else(|| "—".into()),
            next,
            m.replays.to_string(),
        ]);
        for more in label {
            t.row(std::iter::once(more).chain(std::iter::repeat_n(String::new(), 7)));
        }
    }
    let cap = capacity.unwrap_or("");
    let _ = writeln!(s, "\n  largest size that fits on {cap} (bisection over replays)\n{}", t.render());
    for m in maxfits.iter().filter(|m| !m.fails_below.is_empty()) {
        let sizes: Vec<String> = m.fails_below.iter().map(u64::to_string).collect();
        let fix = match &m.fails_below_fixed_by {
            Some(c) => format!("; all of them fit with {c}"),
            None => String::new(),
        };
        let _ = writeln!(
            s,
            "  note ({}): below {}, size(s) {} do not fit (allocator luck: the curve is not monotone there){fix}",
            conf_label(&m.config),
            m.largest.unwrap_or(0),
            sizes.join(", ")
        );
    }
    for m in maxfits.iter().filter(|m| !m.fits_above.is_empty()) {
        let sizes: Vec<String> = m.fits_above.iter().map(u64::to_string).collect();
        let _ = writeln!(
            s,
            "  note ({}): above {}, the first OOM, size(s) {} fit again (allocator luck: the curve is not monotone \
             there); {} is the largest size below the first OOM",
            conf_label(&m.config),
            m.next.as_ref().map_or(0, |p| p.at),
            sizes.join(", "),
            m.largest.unwrap_or(0)
        );
    }
    write_notes(s, maxfits.iter().flat_map(|m| m.fits_at.iter()));
}

/// The predictions' notes (a size far past the recordings, requests that vanish) under
/// their table: each kind once, the first size's (the same note of another size differs
/// in its figures only; every one is in --json).
fn write_notes<'a>(s: &mut String, preds: impl Iterator<Item = &'a fragscope_predict::Prediction>) {
    let mut seen = std::collections::BTreeSet::new();
    for n in preds.flat_map(|p| p.notes.iter()) {
        let kind: String = n.chars().filter(|c| !c.is_ascii_digit() && *c != '.').collect();
        if seen.insert(kind) {
            let _ = writeln!(s, "  note: {n}");
        }
    }
}
