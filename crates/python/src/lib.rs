//! `fragscope._native`: the Rust half of the `fragscope` Python package.
//!
//! The pure-Python package (`python/fragscope/`) wraps what this module exports:
//!
//! * [`run_cli`]: the command line itself ([`fragscope::run_cli`]), for the `fragscope`
//!   console script and `python -m fragscope`: the same code as the Rust binary.
//! * [`Snapshot`]: a snapshot loaded from a path ([`load`]), from bytes ([`loads`]) or from
//!   the live dict of `torch.cuda.memory._snapshot()` ([`from_dict`], see [`dict`]). Its
//!   methods return the `--json` documents of the CLI's commands, built by the same public
//!   functions the CLI prints (`fragscope::cmd::*::json`), so a Python result's `to_json()`
//!   is byte for byte what `fragscope <command> --json` prints.
//! * [`analyze_many`]: `analyze` of many files on every core.
//!
//! Every analysis runs with the GIL released. Errors are the exception classes of
//! `fragscope/_errors.py` (defined in Python so that they live in `fragscope` and pickle):
//! `SnapshotError` / `RefusedPickleError` for input that is not a readable snapshot,
//! `ArgumentError` for a bad argument, `FragscopeError` (their base, a `ValueError`) for
//! the rest. Each carries the CLI's one-line message without the `error: ` prefix, with the
//! Python argument names in place of the CLI's flags ([`python_words`]).

pub mod dict;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fragscope::cmd;
use fragscope::CliError;
use fragscope_diagnose::analyze::{self, AnalyzeOptions};
use fragscope_diagnose::{check, diff};
use fragscope_snapshot::ReadError;
use fragscope_snapshot::Snapshot as Snap;
use fragscope_trace::summary;
use pyo3::prelude::*;

/// The exception classes of `fragscope/_errors.py`, imported from the `fragscope` package
/// (always imported before this module is: it is `fragscope._native`).
mod errors {
    pyo3::import_exception!(fragscope, FragscopeError);
    pyo3::import_exception!(fragscope, SnapshotError);
    pyo3::import_exception!(fragscope, RefusedPickleError);
    pyo3::import_exception!(fragscope, ArgumentError);
}
use errors::{ArgumentError, FragscopeError, RefusedPickleError, SnapshotError};

/// What went wrong, for the exception class: the CLI has one error type (exit code 2 for
/// all of these); Python callers catch them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Not a readable snapshot.
    Snapshot,
    /// A pickle that asks to run code.
    Refused,
    /// A bad argument.
    Argument,
    /// Anything else (a file that cannot be written, ...).
    Other,
}

/// A failure on its way to Python: the CLI's message and its kind.
struct Fail {
    kind: Kind,
    message: String,
}

impl Fail {
    fn new(kind: Kind, e: CliError) -> Self {
        Fail { kind, message: e.message }
    }
    fn argument(message: impl Into<String>) -> Self {
        Fail { kind: Kind::Argument, message: message.into() }
    }
}

impl From<Fail> for PyErr {
    fn from(f: Fail) -> PyErr {
        match f.kind {
            Kind::Snapshot => SnapshotError::new_err(f.message),
            Kind::Refused => RefusedPickleError::new_err(f.message),
            Kind::Argument => ArgumentError::new_err(python_words(&f.message)),
            Kind::Other => FragscopeError::new_err(f.message),
        }
    }
}

/// Any error of a step that only parses arguments is a bad argument.
fn arg(e: CliError) -> Fail {
    Fail::new(Kind::Argument, e)
}

/// Errors of steps past argument parsing (writing a file, rendering JSON).
fn other_fail(e: CliError) -> Fail {
    Fail::new(Kind::Other, e)
}

/// The CLI's argument messages in Python's words: `--max-reserved` is `max_reserved=` here,
/// `--config` is `configs=`, ...
fn python_words(message: &str) -> String {
    const FLAGS: [(&str, &str); 10] = [
        ("--max-reserved", "max_reserved"),
        ("--max-allocated", "max_allocated"),
        ("--max-peak-fragmentation", "max_peak_fragmentation"),
        ("--empty-cache-at", "empty_cache_at"),
        ("--save-snapshot", "save_snapshot"),
        ("--no-caching", "no_caching"),
        ("--allocator", "allocators"),
        ("--capacity", "capacity"),
        ("--config", "configs"),
        ("--device", "device"),
    ];
    let mut m = message.to_string();
    for (flag, name) in FLAGS {
        m = m.replace(flag, name);
    }
    m
}

/// A snapshot that could not be read: refused (it asks to run code) or not a snapshot.
fn read_fail(path: &Path, e: &ReadError) -> Fail {
    let kind = if matches!(e, ReadError::Refused { .. }) { Kind::Refused } else { Kind::Snapshot };
    Fail::new(kind, fragscope::input::read_error(path, e))
}

/// Threads for one analysis, as the CLI uses (`AnalyzeOptions::default().threads`).
fn analyze_options(top: usize, what_if: bool) -> AnalyzeOptions {
    AnalyzeOptions { top, what_if, ..AnalyzeOptions::default() }
}

/// A loaded memory snapshot. Immutable; analyses may run on it from several threads.
#[pyclass(frozen, module = "fragscope._native")]
pub struct Snapshot {
    inner: Arc<Snap>,
    /// The name results carry as `file` (the path as given, `<bytes>`, `<dict>`).
    name: String,
    /// The built-in example (summary's `example` field says so).
    example: bool,
}

#[pymethods]
impl Snapshot {
    /// The name results carry in their `file` field.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The source format: `dict`, `segment_list` or `kineto`.
    #[getter]
    fn format(&self) -> &'static str {
        match self.inner.format {
            fragscope_snapshot::SourceFormat::Dict => "dict",
            fragscope_snapshot::SourceFormat::SegmentList => "segment_list",
            fragscope_snapshot::SourceFormat::Kineto => "kineto",
        }
    }

    /// CUDA devices that have segments or trace events.
    #[getter]
    fn devices(&self) -> Vec<i64> {
        self.inner.devices()
    }

    /// Trace entries recorded, all devices together.
    #[getter]
    fn trace_events(&self) -> usize {
        self.inner.device_traces.iter().map(Vec::len).sum()
    }

    /// Segments in the allocator state at the time of the dump.
    #[getter]
    fn segments(&self) -> usize {
        self.inner.segments.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "<fragscope Snapshot {} ({}, devices {:?}, {} segments, {} trace events)>",
            self.name,
            self.format(),
            self.devices(),
            self.segments(),
            self.trace_events()
        )
    }

    /// `fragscope summary --json` of this snapshot.
    fn summary_json(&self, py: Python<'_>) -> PyResult<String> {
        let (snap, name, example) = (self.inner.clone(), self.name.clone(), self.example);
        py.allow_threads(move || cmd::summary::json(&[(name, example, summary::summarize(&snap))]))
            .map_err(|e| other_fail(e).into())
    }

    /// `fragscope analyze --json [--top N] [--what-if]` of this snapshot.
    #[pyo3(signature = (top = 10, what_if = false))]
    fn analyze_json(&self, py: Python<'_>, top: i64, what_if: bool) -> PyResult<String> {
        if !(1..=1000).contains(&top) {
            return Err(Fail::argument(format!("top={top}: it must be in 1..=1000")).into());
        }
        let top = top as usize;
        let (snap, name) = (self.inner.clone(), self.name.clone());
        py.allow_threads(move || cmd::analyze::json(&[(name, analyze::analyze(&snap, &analyze_options(top, what_if)))]))
            .map_err(|e| other_fail(e).into())
    }

    /// `fragscope replay --json` of this snapshot: `--verify`, `--config` (repeatable),
    /// `--capacity`, `--device`, `--save-snapshot`, `--empty-cache-at` (repeatable),
    /// `--no-caching`, and the role-level what-ifs `--shard-optimizer N`,
    /// `--shard-gradients N`, `--grads-set-to-none`, `--checkpoint LAYERS`.
    #[pyo3(signature = (verify = false, configs = Vec::new(), capacity = None, device = None, save_snapshot = None, empty_cache_at = Vec::new(), no_caching = false, shard_optimizer = None, shard_gradients = None, grads_set_to_none = false, checkpoint = None))]
    #[allow(clippy::too_many_arguments)]
    fn replay_json(
        &self,
        py: Python<'_>,
        verify: bool,
        configs: Vec<String>,
        capacity: Option<String>,
        device: Option<i64>,
        save_snapshot: Option<PathBuf>,
        empty_cache_at: Vec<String>,
        no_caching: bool,
        shard_optimizer: Option<u32>,
        shard_gradients: Option<u32>,
        grads_set_to_none: bool,
        checkpoint: Option<String>,
    ) -> PyResult<String> {
        // Every other flag at its CLI default, so flags added to `replay` later keep
        // their command-line meaning here.
        let args = cmd::replay::Args {
            verify,
            config: configs,
            capacity,
            device,
            save_snapshot,
            empty_cache_at,
            no_caching,
            shard_optimizer,
            shard_gradients,
            grads_set_to_none,
            checkpoint,
            json: true,
            ..Default::default()
        };
        let (snap, name) = (self.inner.clone(), self.name.clone());
        py.allow_threads(move || {
            let capacity = cmd::replay::capacity_of(&args).map_err(arg)?;
            device_replayable(&snap, args.device)?;
            let mut saved = None;
            let devices = cmd::replay::replay_snapshot(&args, capacity, &snap, &mut saved).map_err(arg)?;
            empty_cache_found(&args.empty_cache_at, &devices)?;
            cmd::replay::save(&args, saved.as_ref()).map_err(other_fail)?;
            cmd::replay::json(&[(name, devices)], verify).map_err(other_fail)
        })
        .map_err(PyErr::from)
    }

    /// `fragscope replay --allocator NAME... --json` of this snapshot: the allocator lab
    /// (policies repeatable, `all` for every one), `--capacity`, `--device`.
    #[pyo3(signature = (allocators, capacity = None, device = None))]
    fn lab_json(
        &self,
        py: Python<'_>,
        allocators: Vec<String>,
        capacity: Option<String>,
        device: Option<i64>,
    ) -> PyResult<String> {
        let args = cmd::replay::Args { allocator: allocators, capacity, device, json: true, ..Default::default() };
        let (snap, name) = (self.inner.clone(), self.name.clone());
        py.allow_threads(move || {
            let capacity = cmd::replay::capacity_of(&args).map_err(arg)?;
            let specs = cmd::lab::specs_of(&args).map_err(arg)?;
            device_replayable(&snap, args.device)?;
            let devices = cmd::lab::lab_snapshot(&args, capacity, &snap, &specs);
            cmd::lab::json(&[(name, devices)]).map_err(other_fail)
        })
        .map_err(PyErr::from)
    }

    /// `fragscope report` of this snapshot: the self-contained HTML page, as a string.
    fn report_html(&self, py: Python<'_>) -> String {
        let (snap, name, example) = (self.inner.clone(), self.name.clone(), self.example);
        py.allow_threads(move || {
            let data = fragscope_report::file_data(&name, example, &snap, &fragscope_report::ReportOptions::default());
            fragscope_report::render(&[data])
        })
    }

    /// `fragscope check --json` of this snapshot: the JSON document, whether every limit
    /// held, and the line the CLI prints for the first broken limit (`None` when it passed).
    #[pyo3(signature = (max_reserved = None, max_allocated = None, max_peak_fragmentation = None, no_leaks = false))]
    fn check_json(
        &self,
        py: Python<'_>,
        max_reserved: Option<String>,
        max_allocated: Option<String>,
        max_peak_fragmentation: Option<String>,
        no_leaks: bool,
    ) -> PyResult<(String, bool, Option<String>)> {
        let args = cmd::check::Args {
            file: PathBuf::from(&self.name),
            max_reserved,
            max_allocated,
            max_peak_fragmentation,
            no_leaks,
            json: true,
        };
        let snap = self.inner.clone();
        py.allow_threads(move || {
            let limits = cmd::check::limits(&args).map_err(arg)?;
            let result = check::check(&snap, &limits);
            let first = result.failures.first().map(|f| {
                let more = result.failures.len() - 1;
                let suffix = if more > 0 { format!(" (and {more} more)") } else { String::new() };
                format!("check failed: {}{suffix}", cmd::check::failure_line(f))
            });
            Ok((cmd::check::json(&result).map_err(other_fail)?, result.ok, first))
        })
        .map_err(|e: Fail| e.into())
    }

    /// `fragscope diff --json [--top N] A B` with this snapshot as A.
    #[pyo3(signature = (other, top = 10))]
    fn diff_json(&self, py: Python<'_>, other: &Snapshot, top: i64) -> PyResult<String> {
        if !(1..=1000).contains(&top) {
            return Err(Fail::argument(format!("top={top}: it must be in 1..=1000")).into());
        }
        let top = top as usize;
        let (a, b) = (self.inner.clone(), other.inner.clone());
        let (na, nb) = (self.name.clone(), other.name.clone());
        py.allow_threads(move || cmd::diff::json(&na, &nb, &diff::diff(&a, &b, &diff::DiffOptions { top })))
            .map_err(|e| other_fail(e).into())
    }

    /// The blocks of the allocator state at the dump, as `(device, address, size, state,
    /// site)`: `state` as PyTorch names it (`active_allocated`, ...), `site` the call site
    /// analyses report (`file.py:line:function`). With `site`, only that site's blocks;
    /// with `allocated_only`, only `active_allocated` blocks.
    #[pyo3(signature = (site = None, allocated_only = true))]
    fn blocks(&self, site: Option<String>, allocated_only: bool) -> Vec<(i64, u64, u64, &'static str, String)> {
        let snap = &self.inner;
        let mut out = Vec::new();
        for seg in &snap.segments {
            for b in &seg.blocks {
                if allocated_only && b.state != fragscope_snapshot::BlockState::ActiveAllocated {
                    continue;
                }
                let here = fragscope_trace::attribution::site_of(&snap.frames, b.stack).site;
                if site.as_deref().is_some_and(|s| s != here) {
                    continue;
                }
                out.push((seg.device, b.address, b.size, b.state.as_str(), here));
            }
        }
        out
    }

    /// Writes this snapshot as a pickle that PyTorch's viewers read.
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let snap = self.inner.clone();
        py.allow_threads(move || {
            fragscope_snapshot::pickle::write::write_path(&snap, &path)
                .map_err(|e| other_fail(CliError::usage(format!("cannot write {}: {e}", path.display()))))
        })
        .map_err(PyErr::from)
    }
}

fn read_file(path: &Path, name: String) -> Result<Snapshot, Fail> {
    // Checked as the CLI's reads are: a snapshot with sizes or addresses no real one has is
    // refused before any analysis sums them.
    let snap = fragscope_snapshot::read_path_checked(path, &mut |_, _| {}).map_err(|e| read_fail(path, &e))?;
    Ok(Snapshot { inner: Arc::new(snap), name, example: false })
}

/// `device=N` must name a device whose trace can be replayed: an empty result for a typo'd
/// device would read as "nothing to report".
fn device_replayable(snap: &Snap, device: Option<i64>) -> Result<(), Fail> {
    let Some(d) = device else { return Ok(()) };
    let have = fragscope_replay::replayable_devices(snap);
    if have.contains(&d) {
        return Ok(());
    }
    let why = if snap.devices().contains(&d) { "has no trace to replay on" } else { "has no" };
    Err(Fail::argument(format!(
        "device={d}: this snapshot {why} device {d} (devices with a replayable trace: {have:?})"
    )))
}

/// Each `empty_cache_at` point must be found on at least one replayed device: a name that
/// matches nothing is a typo, not a what-if to leave out with a note.
fn empty_cache_found(specs: &[String], devices: &[cmd::replay::DeviceResult]) -> Result<(), Fail> {
    for s in specs {
        let Ok(at) = fragscope_diagnose::advice::EmptyCacheAt::parse(s) else { continue };
        let prefix = format!("{}: not replayed, ", at.describe());
        let reasons: Vec<&str> =
            devices.iter().filter_map(|d| d.notes.iter().find_map(|n| n.strip_prefix(prefix.as_str()))).collect();
        if !devices.is_empty() && reasons.len() == devices.len() {
            return Err(Fail::argument(format!("empty_cache_at='{s}': not found on any device ({})", reasons[0])));
        }
    }
    Ok(())
}

/// Loads a snapshot file (pickle from `torch.cuda.memory._dump_snapshot`, gzipped or not,
/// or a torch.profiler JSON trace). `name` defaults to the path as given.
#[pyfunction]
#[pyo3(signature = (path, name = None))]
fn load(py: Python<'_>, path: PathBuf, name: Option<String>) -> PyResult<Snapshot> {
    let name = name.unwrap_or_else(|| path.display().to_string());
    py.allow_threads(move || read_file(&path, name)).map_err(PyErr::from)
}

/// Loads a snapshot from the bytes of a file (what `load` would read).
#[pyfunction]
#[pyo3(signature = (data, name = None))]
fn loads(py: Python<'_>, data: &[u8], name: Option<String>) -> PyResult<Snapshot> {
    let name = name.unwrap_or_else(|| "<bytes>".to_string());
    py.allow_threads(|| {
        let snap = fragscope_snapshot::read_from_checked(data).map_err(|e| read_fail(Path::new(&name), &e))?;
        Ok(Snapshot { inner: Arc::new(snap), name: name.clone(), example: false })
    })
    .map_err(|e: Fail| e.into())
}

/// The snapshot of the dict `torch.cuda.memory._snapshot()` returns (or a `pickle.load`
/// of a snapshot file), walked in Rust into the model the pickle reader builds.
#[pyfunction]
#[pyo3(signature = (obj, name = None))]
fn from_dict(obj: &Bound<'_, PyAny>, name: Option<String>) -> PyResult<Snapshot> {
    let name = name.unwrap_or_else(|| "<dict>".to_string());
    let snap = dict::snapshot_from_py(obj)
        // The reader speaks of pickles; here the objects are Python's own.
        .map_err(|e| {
            SnapshotError::new_err(format!(
                "{name} is not a memory snapshot: {}",
                e.to_string().replace("a pickled ", "a Python ")
            ))
        })?;
    Ok(Snapshot { inner: Arc::new(snap), name, example: false })
}

/// The built-in example snapshot (a toy training loop made by fragscope's own code).
#[pyfunction]
fn example() -> Snapshot {
    Snapshot {
        inner: Arc::new(fragscope::example::snapshot()),
        name: fragscope::input::EXAMPLE_NAME.to_string(),
        example: true,
    }
}

/// `fragscope analyze --json` of each file, on up to `threads` cores (0: all of them),
/// one file per core at a time. Returns, per path in order, `(True, json)` or
/// `(False, error line)`: one unreadable rank does not lose the others.
#[pyfunction]
#[pyo3(signature = (paths, top = 10, what_if = false, threads = 0))]
fn analyze_many(py: Python<'_>, paths: Vec<PathBuf>, top: usize, what_if: bool, threads: usize) -> Vec<(bool, String)> {
    py.allow_threads(move || {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let workers = if threads == 0 { cores } else { threads }.clamp(1, paths.len().max(1));
        // Several files at once, one thread each: the per-file analysis' own threads
        // would only compete for the same cores.
        let opts = AnalyzeOptions { threads: 1, ..analyze_options(top, what_if) };
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results: Vec<std::sync::Mutex<Option<(bool, String)>>> =
            paths.iter().map(|_| std::sync::Mutex::new(None)).collect();
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(path) = paths.get(i) else { break };
                    let name = path.display().to_string();
                    let r = read_file(path, name.clone()).and_then(|snap| {
                        cmd::analyze::json(&[(name, analyze::analyze(&snap.inner, &opts))]).map_err(other_fail)
                    });
                    let r = match r {
                        Ok(j) => (true, j),
                        Err(e) => (false, e.message),
                    };
                    *results[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                });
            }
        });
        results
            .into_iter()
            .map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()).unwrap_or((false, "not analysed".into())))
            .collect()
    })
}

/// `fragscope predict --json A B ... --sizes ... --at ...`: the snapshots are recordings of
/// one program at `sizes`; `capacity` a size or GPU name as `--capacity` takes.
#[pyfunction]
#[pyo3(signature = (snapshots, sizes, at, config = None, capacity = None, max_fit = false, device = None))]
#[allow(clippy::too_many_arguments)]
fn predict_json(
    py: Python<'_>,
    snapshots: Vec<PyRef<'_, Snapshot>>,
    sizes: Vec<u64>,
    at: Vec<u64>,
    config: Option<String>,
    capacity: Option<String>,
    max_fit: bool,
    device: Option<i64>,
) -> PyResult<String> {
    let snaps: Vec<(Arc<Snap>, String)> = snapshots.iter().map(|s| (s.inner.clone(), s.name.clone())).collect();
    py.allow_threads(move || {
        // A capacity that does not parse is the caller's argument; the rest (recordings of
        // different programs, sizes that do not match) is about the input, as in the CLI.
        let capacity = capacity
            .as_deref()
            .map(fragscope_replay::settings::parse_capacity)
            .transpose()
            .map_err(|e| arg(CliError::usage(e)))?;
        let req = cmd::predict::Request { sizes, at, config, capacity, max_fit, max_size: 1 << 20, device };
        let refs: Vec<&Snap> = snaps.iter().map(|(s, _)| s.as_ref()).collect();
        let names: Vec<String> = snaps.iter().map(|(_, n)| n.clone()).collect();
        let prediction = cmd::predict::evaluate(&names, &refs, &req).map_err(other_fail)?;
        cmd::predict::json(&prediction).map_err(other_fail)
    })
    .map_err(PyErr::from)
}

/// Runs the `fragscope` command line on `argv` (program name first) and returns its exit
/// code: 0 ok, 1 a `check` gate failed, 2 bad usage or unreadable input.
#[pyfunction]
fn run_cli(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.allow_threads(move || fragscope::run_cli(argv))
}

/// `fragscope report A B ...` of several snapshots in one page (ranks side by side; two
/// snapshots are also compared, as `diff`), as a string.
#[pyfunction]
fn report_html_many(py: Python<'_>, snapshots: Vec<PyRef<'_, Snapshot>>) -> String {
    let snaps: Vec<(Arc<Snap>, String, bool)> =
        snapshots.iter().map(|s| (s.inner.clone(), s.name.clone(), s.example)).collect();
    py.allow_threads(move || {
        // The page's budgets are shared by its files, as `fragscope report A B ...` shares
        // them (each file's note says what the sharing left out).
        let opts = fragscope_report::ReportOptions::default();
        let each = opts.share(snaps.len());
        let page = Some((&opts, snaps.len()));
        let data: Vec<_> =
            snaps.iter().map(|(s, n, e)| fragscope_report::file_data_shared(n, *e, s, &each, page)).collect();
        if let [(a, _, _), (b, _, _)] = snaps.as_slice() {
            let d = fragscope_diagnose::diff::diff(a, b, &fragscope_diagnose::diff::DiffOptions::default());
            fragscope_report::render_with_diff(&data, Some(&d))
        } else {
            fragscope_report::render(&data)
        }
    })
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<Snapshot>()?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(loads, m)?)?;
    m.add_function(wrap_pyfunction!(from_dict, m)?)?;
    m.add_function(wrap_pyfunction!(example, m)?)?;
    m.add_function(wrap_pyfunction!(analyze_many, m)?)?;
    m.add_function(wrap_pyfunction!(report_html_many, m)?)?;
    m.add_function(wrap_pyfunction!(run_cli, m)?)?;
    m.add_function(wrap_pyfunction!(predict_json, m)?)?;
    Ok(())
}
