//! `fragscope._native`: the Rust half of the `fragscope` Python package.
//!
//! The pure-Python package (`python/fragscope/`) wraps what this module exports:
//!
//! * [`run_cli`]: the command line itself ([`fragscope::run_cli`]), for the `fragscope`
//!   console script and `python -m fragscope`: the same code as the Rust binary.
//! * [`Snapshot`]: a snapshot loaded from a path ([`load`]), from bytes ([`loads`]) or from
//!   the live dict of `torch.cuda.memory._snapshot()` ([`from_dict`], see [`dict`]). Its
//!   methods build the requests of [`fragscope_commands`] from keyword arguments and return
//!   the commands' JSON documents — the ones the CLI prints, so a Python result's
//!   `to_json()` is byte for byte what `fragscope <command> --json` prints.
//! * [`analyze_many`]: `analyze` of many files on every core.
//!
//! Every analysis runs with the GIL released. Errors are the exception classes of
//! `fragscope/_errors.py` (defined in Python so that they live in `fragscope` and pickle):
//! `SnapshotError` / `RefusedPickleError` for input that is not a readable snapshot,
//! `ArgumentError` for a bad argument, `FragscopeError` (their base, a `ValueError`) for
//! the rest, chosen by the command error's [`ErrorKind`]. Each carries the command's
//! one-line message with its parameters in Python's words ([`Words::Python`]).

pub mod dict;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fragscope_commands::{self as commands, Error, ErrorKind, Words};
use fragscope_diagnose::{analyze, check, diff, AnalyzeOptions, DiffOptions};
use fragscope_snapshot::Snapshot as Snap;
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

/// A command's error on its way to Python: the exception class by its kind, the message
/// with parameters in Python's words (`capacity=`, not `--capacity`).
struct Fail(Error);

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail(e)
    }
}

impl From<Fail> for PyErr {
    fn from(Fail(e): Fail) -> PyErr {
        let message = e.render(Words::Python);
        match e.kind {
            ErrorKind::UnreadableSnapshot => SnapshotError::new_err(message),
            ErrorKind::RefusedPickle => RefusedPickleError::new_err(message),
            ErrorKind::InvalidArgument => ArgumentError::new_err(message),
            ErrorKind::Input | ErrorKind::Output => FragscopeError::new_err(message),
        }
    }
}

/// `Result` of a step on its way to Python.
type Res<T> = Result<T, Fail>;

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
            "<fragscope Snapshot {} ({}, devices {:?}, {} segment{}, {} trace event{})>",
            self.name,
            self.format(),
            self.devices(),
            self.segments(),
            if self.segments() == 1 { "" } else { "s" },
            self.trace_events(),
            if self.trace_events() == 1 { "" } else { "s" }
        )
    }

    /// `fragscope summary --json [--window START..END]` of this snapshot.
    #[pyo3(signature = (window = None))]
    fn summary_json(&self, py: Python<'_>, window: Option<String>) -> PyResult<String> {
        let (snap, name, example) = (self.inner.clone(), self.name.clone(), self.example);
        py.allow_threads(move || {
            let (snap, w) = windowed(&name, snap, window.as_deref())?;
            commands::summary::summary_json(&[(name, example, commands::summary::FileSummary::of(&snap))], &[w])
        })
        .map_err(|e| Fail(e).into())
    }

    /// `fragscope analyze --json [--top N] [--what-if] [--window START..END]` of this
    /// snapshot.
    #[pyo3(signature = (top = 10, what_if = false, window = None))]
    fn analyze_json(&self, py: Python<'_>, top: i64, what_if: bool, window: Option<String>) -> PyResult<String> {
        let top = commands::summary::check_top(top).map_err(Fail)?;
        let (snap, name) = (self.inner.clone(), self.name.clone());
        py.allow_threads(move || {
            let (snap, w) = windowed(&name, snap, window.as_deref())?;
            commands::summary::analyze_json(&[(name, analyze(&snap, &analyze_options(top, what_if)))], &[w])
        })
        .map_err(|e| Fail(e).into())
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
        let req = commands::replay::ReplayRequest {
            verify,
            configs,
            capacity,
            device,
            save_snapshot,
            empty_cache_at,
            no_caching,
            shard_optimizer,
            shard_gradients,
            grads_set_to_none,
            checkpoint,
        };
        let (snap, name) = (self.inner.clone(), self.name.clone());
        py.allow_threads(move || {
            let checked = req.check()?;
            let mut saved = None;
            let devices = commands::replay::replay_snapshot(&req, &checked, &snap, &mut saved)?;
            commands::replay::save(&req, saved.as_ref())?;
            commands::replay::json(&[(name, devices)], verify, checked.capacity_note.as_deref())
        })
        .map_err(|e| Fail(e).into())
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
        let req = commands::replay::LabRequest { allocators, capacity, device, min_capacity: false };
        let (snap, name) = (self.inner.clone(), self.name.clone());
        py.allow_threads(move || {
            let capacity = commands::replay::parse_capacity(req.capacity.as_deref())?;
            let specs = req.specs()?;
            let devices = commands::replay::lab_snapshot(&req, capacity, &snap, &specs)?;
            commands::replay::lab_json(&[(name, devices)])
        })
        .map_err(|e| Fail(e).into())
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
        let req = commands::check::CheckRequest { max_reserved, max_allocated, max_peak_fragmentation, no_leaks };
        let snap = self.inner.clone();
        py.allow_threads(move || {
            let limits = req.limits()?;
            let result = check(&snap, &limits);
            let first = commands::check::failed_line(&result, &req, Words::Python);
            Ok((commands::check::json(&result)?, result.ok, first))
        })
        .map_err(|e: Error| Fail(e).into())
    }

    /// `fragscope diff --json [--top N] A B` with this snapshot as A.
    #[pyo3(signature = (other, top = 10))]
    fn diff_json(&self, py: Python<'_>, other: &Snapshot, top: i64) -> PyResult<String> {
        let top = commands::summary::check_top(top).map_err(Fail)?;
        let (a, b) = (self.inner.clone(), other.inner.clone());
        let (na, nb) = (self.name.clone(), other.name.clone());
        py.allow_threads(move || commands::diff::json(&na, &nb, &diff(&a, &b, &DiffOptions { top })))
            .map_err(|e| Fail(e).into())
    }

    /// `fragscope state --json` of this snapshot: the allocator state after trace entry
    /// `at` (or at `time` since the first entry, `12.5s`; default: the end of the trace) on
    /// `device` (default: the first with a trace), the holders grouped `by` `site`,
    /// `annotation` or `role`, `top` of them listed.
    #[pyo3(signature = (at = None, time = None, device = None, by = "site", top = 10))]
    fn state_json(
        &self,
        py: Python<'_>,
        at: Option<usize>,
        time: Option<String>,
        device: Option<i64>,
        by: &str,
        top: i64,
    ) -> PyResult<String> {
        let top = commands::summary::check_top(top).map_err(Fail)?;
        let req = commands::state::StateRequest {
            at,
            time,
            device,
            by: commands::state::HoldersBy::parse(by).map_err(Fail)?,
            top,
        };
        let (snap, name) = (self.inner.clone(), self.name.clone());
        py.allow_threads(move || commands::state::json(&commands::state::state(&name, &snap, &req)?))
            .map_err(|e| Fail(e).into())
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
                let here = fragscope_trace::site_of(&snap.frames, b.stack).site;
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
            commands::outfile::save_snapshot(&snap, &path)
                .map_err(|e| Fail(Error::output(format!("cannot write {}: {e}", path.display()))))
        })
        .map_err(PyErr::from)
    }
}

fn read_file(path: &Path, name: String) -> Res<Snapshot> {
    // Checked as the CLI's reads are: a snapshot with sizes or addresses no real one has is
    // refused before any analysis sums them.
    let snap = fragscope_snapshot::read_path_checked(path, &mut |_, _| {})
        .map(commands::input::prepared)
        .map_err(|e| commands::input::read_error(path, &e))?;
    Ok(Snapshot { inner: Arc::new(snap), name, example: false })
}

/// `snap` cut to `window` (`START..END`, as `--window` takes it), with what the window
/// covered; without a window, `snap` itself.
fn windowed(
    name: &str,
    snap: Arc<Snap>,
    window: Option<&str>,
) -> Result<(Arc<Snap>, Option<fragscope_diagnose::WindowInfo>), Error> {
    match commands::windowed::parse(window)? {
        None => Ok((snap, None)),
        Some(spec) => {
            let (cut, info) = commands::windowed::cut_or_error(name, &snap, &spec)?;
            Ok((Arc::new(cut), Some(info)))
        }
    }
}

/// Writes `data` to `path` as the CLI writes its files ([`commands::outfile`]): a regular
/// file or nothing there (a directory, FIFO, device or symlink is refused), through an
/// exclusive temporary file beside it renamed over it. `Report.save` and
/// `fragscope.torch.dump_snapshot` call it.
#[pyfunction]
fn save_bytes(py: Python<'_>, path: PathBuf, data: &[u8]) -> PyResult<()> {
    py.allow_threads(move || {
        commands::outfile::write_bytes(&path, data)
            .map_err(|e| Fail(Error::output(format!("cannot write {}: {e}", path.display()))))
    })
    .map_err(PyErr::from)
}

/// PyTorch's `format_size` (`1.50 GiB`): the one byte formatter every front end's text uses.
#[pyfunction]
fn format_size(n: u64) -> String {
    fragscope_alloc::format_size(n)
}

/// The ranks document (`fragscope.ranks/1`) of `files`, each with the outcome of its
/// `analyze` (`(True, analyze --json text)` or `(False, the error line)`, as
/// [`analyze_many`] and `fragscope.analyze_file` return them): one definition of the
/// median, the peak rank and the outliers ([`fragscope_diagnose::compare_ranks`]).
#[pyfunction]
fn ranks_json(py: Python<'_>, files: Vec<String>, outcomes: Vec<(bool, String)>) -> PyResult<String> {
    if files.len() != outcomes.len() {
        return Err(Fail(Error::argument(vec![format!(
            "{} files for {} outcomes: one outcome per file",
            files.len(),
            outcomes.len()
        )
        .into()]))
        .into());
    }
    let docs: Vec<(String, Result<String, String>)> =
        files.into_iter().zip(outcomes).map(|(f, (ok, text))| (f, if ok { Ok(text) } else { Err(text) })).collect();
    py.allow_threads(move || commands::ranks::json_of_documents(&docs)).map_err(|e| Fail(e).into())
}

/// `fragscope oom --json TEXT`: every CUDA out-of-memory message in `text` explained.
#[pyfunction]
fn explain_oom_json(py: Python<'_>, text: String) -> PyResult<String> {
    py.allow_threads(move || commands::oom::explain_text(&text).and_then(|e| commands::oom::json(&e)))
        .map_err(|e| Fail(e).into())
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
        let snap = fragscope_snapshot::read_bytes_checked(data)
            .map(commands::input::prepared)
            .map_err(|e| commands::input::read_error(Path::new(&name), &e))?;
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
    // Prepared as a file's snapshot is (what skip_actions left out restored, how it was
    // recorded in its notes), so that a live dict and its file give the same figures.
    let snap = commands::input::prepared(snap);
    Ok(Snapshot { inner: Arc::new(snap), name, example: false })
}

/// The built-in example snapshot (a toy training loop made by fragscope's own code).
#[pyfunction]
fn example() -> Snapshot {
    Snapshot {
        inner: Arc::new(commands::example::snapshot()),
        name: commands::input::EXAMPLE_NAME.to_string(),
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
                        Ok(commands::summary::analyze_json(&[(name, analyze(&snap.inner, &opts))], &[])?)
                    });
                    let r = match r {
                        Ok(j) => (true, j),
                        Err(Fail(e)) => (false, e.render(Words::Python)),
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
        let (capacity, capacity_note) = commands::predict::parse_capacity(capacity.as_deref())?;
        let req = commands::predict::Request {
            sizes,
            at,
            config,
            capacity,
            capacity_note,
            max_fit,
            max_size: 1 << 20,
            device,
        };
        let refs: Vec<&Snap> = snaps.iter().map(|(s, _)| s.as_ref()).collect();
        let names: Vec<String> = snaps.iter().map(|(_, n)| n.clone()).collect();
        let prediction = commands::predict::evaluate(&names, &refs, &req)?;
        commands::predict::json(&prediction)
    })
    .map_err(|e| Fail(e).into())
}

/// `fragscope fit --json FILE... --capacity ...`: the cheapest changes that make each
/// snapshot's run fit on `capacity` (sizes or GPU names, comma-separated); with `sizes`, the
/// snapshots are recordings of one program at those sizes and the largest is fitted.
#[pyfunction]
#[pyo3(signature = (snapshots, capacity, sizes = Vec::new(), device = None, at = None))]
fn fit_json(
    py: Python<'_>,
    snapshots: Vec<PyRef<'_, Snapshot>>,
    capacity: String,
    sizes: Vec<u64>,
    device: Option<i64>,
    at: Option<u64>,
) -> PyResult<String> {
    let snaps: Vec<(Arc<Snap>, String)> = snapshots.iter().map(|s| (s.inner.clone(), s.name.clone())).collect();
    py.allow_threads(move || {
        let req = commands::fit::Request { capacity, device, sizes, at };
        let refs: Vec<&Snap> = snaps.iter().map(|(s, _)| s.as_ref()).collect();
        let names: Vec<String> = snaps.iter().map(|(_, n)| n.clone()).collect();
        commands::fit::json(&commands::fit::evaluate(&names, &refs, &req)?)
    })
    .map_err(|e| Fail(e).into())
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
            let d = fragscope_diagnose::diff(a, b, &fragscope_diagnose::DiffOptions::default());
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
    m.add_function(wrap_pyfunction!(fit_json, m)?)?;
    m.add_function(wrap_pyfunction!(explain_oom_json, m)?)?;
    m.add_function(wrap_pyfunction!(format_size, m)?)?;
    m.add_function(wrap_pyfunction!(save_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(ranks_json, m)?)?;
    Ok(())
}
