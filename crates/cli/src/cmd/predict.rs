//! `fragscope predict A B [C ...] --sizes 128,256 --at 512[,1024]`: memory of the same
//! program at a size nobody recorded (batch size, sequence length, ...), from recordings
//! at other sizes, replayed through the allocator model (`fragscope_analysis::predict`).
//!
//! `--capacity GPU` says whether each size fits and where the first OOM would be;
//! `--max-fit` finds the largest size that fits, under the settings in force and the
//! alternatives `replay` tries.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use fragscope_alloc::AllocatorConfig;
use fragscope_analysis::predict::{check_size_list, site_frame, FitQuality, MaxFit, Prediction, Program, Recording};
use serde::Serialize;

use crate::output::{bytes, percent, Align, Table};
use crate::{input, print_stdout, CliError};

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
    /// Device memory: bytes with a unit (80GiB) or a GPU name (H100-80GB, A100-40GB,
    /// ...), as `replay --capacity`. Without it the replay has no limit.
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
    /// Print JSON (schema `fragscope.predict/1`) instead of text.
    #[arg(long)]
    pub json: bool,
}

pub const SCHEMA: &str = "fragscope.predict/1";

#[derive(Serialize)]
struct JsonOut<'a> {
    schema: &'static str,
    files: Vec<JsonFile>,
    /// Per device: how the recordings aligned and how their sizes fitted.
    fits: Vec<JsonFit<'a>>,
    predictions: Vec<JsonPrediction<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    max_fit: Vec<&'a MaxFit>,
}

#[derive(Serialize)]
struct JsonFile {
    file: String,
    size: u64,
}

#[derive(Serialize)]
struct JsonFit<'a> {
    device: i64,
    template_size: u64,
    #[serde(flatten)]
    quality: &'a FitQuality,
    notes: &'a [String],
}

#[derive(Serialize)]
struct JsonPrediction<'a> {
    #[serde(flatten)]
    prediction: &'a Prediction,
    fits: bool,
    fit_quality: CompactQuality,
}

#[derive(Serialize)]
struct CompactQuality {
    aligned_fraction: f64,
    unexplained: usize,
    extrapolated_share: f64,
}

/// Parses `128,256` into sizes (each ≥ 1).
pub fn parse_sizes(s: &str, what: &str) -> Result<Vec<u64>, CliError> {
    let v: Result<Vec<u64>, _> = s.split(',').map(|x| x.trim().replace('_', "").parse::<u64>()).collect();
    let v = v.map_err(|_| CliError::usage(format!("{what} {s:?}: expected whole numbers separated by commas")))?;
    if v.contains(&0) {
        return Err(CliError::usage(format!(
            "{what} {s:?}: a size of 0; sizes are batch sizes, sequence lengths, ..., all at least 1"
        )));
    }
    Ok(v)
}

fn config_on_top(base: &AllocatorConfig, extra: &str) -> Result<AllocatorConfig, CliError> {
    let b = base.to_conf_string();
    let joined = if b.is_empty() { extra.to_string() } else { format!("{b},{extra}") };
    fragscope_alloc::parse_config(&joined).map_err(|e| CliError::usage(e.to_string()))
}

/// The settings `replay` and `analyze` try beside the recorded ones.
pub const ALTERNATIVES: &[&str] = &[
    "expandable_segments:True",
    "max_split_size_mb:128",
    "max_split_size_mb:512",
    "roundup_power2_divisions:4",
    "garbage_collection_threshold:0.8,per_process_memory_fraction:0.95",
];

pub fn run(args: &Args) -> Result<ExitCode, CliError> {
    // Usage errors first, before reading anything.
    if args.files.len() < 2 {
        return Err(CliError::usage(format!(
            "predict needs two or more recordings of one program at different sizes, got {}: {}",
            args.files.len(),
            fragscope_analysis::predict::recording_recipe()
        )));
    }
    let sizes = parse_sizes(&args.sizes, "--sizes")?;
    if sizes.len() != args.files.len() {
        return Err(CliError::usage(format!(
            "--sizes gives {} size(s) for {} file(s): one size per recording, in file order",
            sizes.len(),
            args.files.len()
        )));
    }
    check_size_list(&sizes).map_err(|e| CliError::usage(e.0))?;
    let at = match &args.at {
        Some(s) => parse_sizes(s, "--at")?,
        None if args.max_fit => Vec::new(),
        None => return Err(CliError::usage("--at is required (the sizes to predict), or --max-fit with --capacity")),
    };
    let capacity = args.capacity.as_deref().map(super::replay::parse_capacity).transpose().map_err(CliError::usage)?;
    if args.max_fit && capacity.is_none() {
        return Err(CliError::usage("--max-fit needs --capacity (a GPU name such as H100-80GB, or bytes)"));
    }
    if let Some(c) = &args.config {
        fragscope_alloc::parse_config(c).map_err(|e| CliError::usage(e.to_string()))?;
    }
    let snaps = args.files.iter().map(|f| input::load(f, args.json)).collect::<Result<Vec<_>, _>>()?;
    let recs: Vec<Recording> = snaps.iter().zip(&sizes).map(|(s, &size)| Recording { snap: s, size }).collect();
    let devices = match args.device {
        Some(d) => vec![d],
        None => {
            let mut common = fragscope_analysis::replay::replayable_devices(&snaps[0]);
            for s in &snaps[1..] {
                let d = fragscope_analysis::replay::replayable_devices(s);
                common.retain(|x| d.contains(x));
            }
            common
        }
    };
    if devices.is_empty() {
        return Err(CliError::usage("the recordings share no device with an allocation trace: nothing to predict"));
    }
    let mut programs = Vec::new();
    for &d in &devices {
        programs.push(Program::fit(&recs, Some(d)).map_err(|e| CliError::usage(e.0))?);
    }
    let mut preds: Vec<(Prediction, &Program)> = Vec::new();
    let mut maxfits: Vec<MaxFit> = Vec::new();
    for prog in &programs {
        let base = prog.recorded_config.clone();
        let cfg = match &args.config {
            Some(c) => config_on_top(&base, c)?,
            None => base.clone(),
        };
        for &x in &at {
            preds.push((prog.predict(x, &cfg, capacity), prog));
        }
        if let (true, Some(cap)) = (args.max_fit, capacity) {
            maxfits.push(prog.max_fit(&cfg, cap, args.max_size));
            if args.config.is_none() {
                for alt in ALTERNATIVES {
                    maxfits.push(prog.max_fit(&config_on_top(&base, alt)?, cap, args.max_size));
                }
            }
        }
    }
    let names: Vec<String> = args.files.iter().map(|f| f.display().to_string()).collect();
    let text = if args.json {
        let out = JsonOut {
            schema: SCHEMA,
            files: names.iter().zip(&sizes).map(|(f, &size)| JsonFile { file: f.clone(), size }).collect(),
            fits: programs
                .iter()
                .map(|p| JsonFit {
                    device: p.device,
                    template_size: p.template_size,
                    quality: &p.quality,
                    notes: &p.notes,
                })
                .collect(),
            predictions: preds
                .iter()
                .map(|(p, prog)| JsonPrediction {
                    prediction: p,
                    fits: p.oom.is_none(),
                    fit_quality: CompactQuality {
                        aligned_fraction: prog.quality.aligned_fraction,
                        unexplained: prog.quality.unexplained_total,
                        extrapolated_share: p.extrapolated_share,
                    },
                })
                .collect(),
            max_fit: maxfits.iter().collect(),
        };
        crate::output::json_text(&out)?
    } else {
        render_text(&names, &sizes, &programs, &preds, &maxfits, args)
    };
    print_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}

fn conf_label(c: &str) -> String {
    if c.is_empty() {
        "(defaults)".into()
    } else {
        c.to_string()
    }
}

fn render_text(
    names: &[String],
    sizes: &[u64],
    programs: &[Program],
    preds: &[(Prediction, &Program)],
    maxfits: &[MaxFit],
    args: &Args,
) -> String {
    let mut s = String::new();
    let listed: Vec<String> = names.iter().zip(sizes).map(|(n, z)| format!("{n} (size {z})")).collect();
    let _ = writeln!(s, "predict from {}", listed.join(", "));
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
                    u.frame.as_deref().map(|f| format!("  {f}")).unwrap_or_default()
                );
            }
        }
        for n in &p.notes {
            let _ = writeln!(s, "  note: {n}");
        }
    }
    if !preds.is_empty() {
        let cap = args.capacity.as_deref().unwrap_or("unlimited");
        let mut t = Table::new(&[
            ("size", Align::Right),
            ("device", Align::Right),
            ("peak reserved", Align::Right),
            ("peak allocated", Align::Right),
            (&format!("fits ({cap})"), Align::Left),
            ("first OOM", Align::Left),
            ("extrapolated", Align::Right),
        ]);
        for (p, _) in preds {
            let oom = match &p.oom {
                None => "none".to_string(),
                Some(o) => format!(
                    "entry {}: {} ({}){}",
                    o.index,
                    bytes(o.requested),
                    o.law.as_str(),
                    site_frame(&o.stack).map(|f| format!(" at {f}")).unwrap_or_default()
                ),
            };
            let fits = if p.capacity.is_none() {
                "n/a".to_string()
            } else if p.oom.is_none() {
                "yes".to_string()
            } else {
                "no".to_string()
            };
            t.row([
                p.at.to_string(),
                p.device.to_string(),
                bytes(p.peak_reserved),
                bytes(p.peak_allocated),
                fits,
                oom,
                percent(p.extrapolated_share),
            ]);
        }
        let _ = writeln!(s, "\n{}", t.render());
        if let Some((p, _)) = preds.first() {
            let _ = writeln!(s, "  settings: {}", conf_label(&p.config));
        }
        let _ = writeln!(
            s,
            "  extrapolated: share of the allocated peak whose size only the recordings determine (no recording \
             checked the law) or that follows no law"
        );
    }
    if !maxfits.is_empty() {
        let mut t = Table::new(&[
            ("PYTORCH_CUDA_ALLOC_CONF", Align::Left),
            ("device", Align::Right),
            ("largest size that fits", Align::Right),
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
                Some(p) => match &p.oom {
                    Some(o) => format!("{} at entry {} ({})", p.at, o.index, bytes(o.requested)),
                    None => format!("{}: fits", p.at),
                },
                None => "—".into(),
            };
            t.row([
                conf_label(&m.config),
                m.device.to_string(),
                largest,
                m.fits_at.as_ref().map(|p| bytes(p.peak_reserved)).unwrap_or_else(|| "—".into()),
                next,
                m.replays.to_string(),
            ]);
        }
        let cap = args.capacity.as_deref().unwrap_or("");
        let _ = writeln!(s, "\n  largest size that fits on {cap} (bisection over replays)\n{}", t.render());
    }
    s
}
