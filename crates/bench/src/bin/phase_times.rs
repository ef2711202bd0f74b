//! Times the report's phases in process, on a snapshot loaded once. The loading is what
//! `fragscope summary` and `fragscope report` share; the benchmark's ratio between them
//! is decided by what comes after it. For each device: the report's walk (the curves
//! and analyze's timeline, [`fragscope_report::curves::curves_and_timeline`]) and the
//! same walk with less kept (the timeline alone, with the block lives, the lives alone,
//! the bookkeeping alone), which shows what each part of the walk costs. Then the
//! summary, the whole of [`fragscope_report::file_data`] and the drop of the snapshot.
//! Best of REPEAT runs each; single runs of the CLI vary more than these.
//!
//! usage: cargo run --release -p fragscope-bench --bin phase_times FILE \[REPEAT\]
//!        (WHAT=walk: the report's walks only; WHAT=file: file_data only;
//!        WHAT=summary: the summary only)

use std::time::Instant;

use fragscope_trace::{levels_at, timeline, timeline_with_lives, BlockLives, TimelineOptions, DEFAULT_POINTS};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (file, repeat) = match args.as_slice() {
        [_, f] => (f, 3),
        [_, f, r] => (f, r.parse().expect("REPEAT must be a number")),
        _ => {
            eprintln!("usage: phase_times FILE [REPEAT]");
            std::process::exit(2);
        }
    };
    let what = std::env::var("WHAT").unwrap_or_default();
    let t = Instant::now();
    let snap = fragscope_snapshot::read_path(std::path::Path::new(file)).expect("cannot read FILE");
    println!("load                  {:.3} s", t.elapsed().as_secs_f64());
    let opts = fragscope_report::ReportOptions::default();
    let best = |label: &str, f: &mut dyn FnMut()| {
        let s = (0..repeat)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min);
        println!("{label:21} {s:.3} s");
    };
    let topts = TimelineOptions { points: DEFAULT_POINTS };
    for d in snap.devices().into_iter().filter(|_| what != "file" && what != "summary") {
        best(&format!("device {d}: report walk"), &mut || {
            std::hint::black_box(fragscope_report::curves::curves_and_timeline(&snap, d, &opts, topts.points));
        });
        if what == "walk" {
            continue;
        }
        best("  timeline", &mut || {
            std::hint::black_box(timeline(&snap, d, &topts));
        });
        best("  timeline + lives", &mut || {
            std::hint::black_box(timeline_with_lives(&snap, d, &topts));
        });
        best("  lives", &mut || {
            std::hint::black_box(BlockLives::replay(&snap, d));
        });
        let last = snap.trace(d).len().checked_sub(1);
        best("  bookkeeping", &mut || {
            std::hint::black_box(levels_at(&snap, d, last));
        });
    }
    if what == "walk" {
        return;
    }
    if what != "file" {
        best("summary", &mut || {
            std::hint::black_box(fragscope_trace::summarize(&snap));
        });
    }
    if what == "summary" {
        return;
    }
    best("file_data", &mut || {
        std::hint::black_box(fragscope_report::file_data("bench", false, &snap, &opts));
    });
    let t = Instant::now();
    drop(snap);
    println!("drop of the snapshot  {:.3} s", t.elapsed().as_secs_f64());
}
