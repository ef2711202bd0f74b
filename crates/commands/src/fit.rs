//! `fit`: from "it does not fit" to the cheapest change that makes the recorded run fit on
//! a device of a given size, every option **replayed** through the allocator model.
//!
//! The search, per replayable device and per card asked for ([`Card`]):
//!
//! 1. The recording replayed under its own settings on the card: if it fits, nothing to
//!    change.
//! 2. Free changes: each allocator setting `replay` tries ([`ALTERNATIVES`]:
//!    `expandable_segments`, `max_split_size_mb`, `roundup_power2_divisions`,
//!    `garbage_collection_threshold`), `zero_grad(set_to_none=True)`, each setting with it,
//!    and `torch.cuda.empty_cache()` at every step boundary (alone and with each setting).
//!    The program's live tensors are a lower bound no allocator setting goes under (every
//!    allocator holds at least the bytes requested): when they exceed the card, the
//!    settings and `empty_cache()` are not replayed (`pruned` says so). When a free change
//!    fits, the costlier ones are not searched.
//! 3. Changes that cost compute: activation checkpointing of the fewest layers (layers
//!    ordered by the activations they save) and of the least recomputation (ordered by
//!    saved bytes per microsecond of their forward pass, timed by the trace's timestamps),
//!    each alone and on top of each free change ("bases"). A base on which checkpointing
//!    every layer does not fit is pruned; otherwise the number of layers is bisected.
//! 4. Changes that cost communication: ZeRO-1 and ZeRO-2 over the fewest ranks (2 … 64, by
//!    bisection after the largest fits), on each base; when neither
//!    checkpointing nor ZeRO fits alone, ZeRO-2 with every layer checkpointed.
//! 5. With recordings at several sizes (`sizes`): the largest size that fits, from
//!    [`fragscope_predict::Program::max_fit`].
//!
//! With `sizes` and `at`, the run fitted is the **predicted** run at size `at` (a size
//! nobody recorded, [`fragscope_predict::Program::predict`]): the search is then the
//! allocator settings (each predicted again under the setting) and the largest size that
//! fits; the role-level changes and `empty_cache()` need a recording's steps and roles,
//! which a predicted trace does not have (`pruned` says so). Every option is a prediction
//! replayed through the allocator model, `model: true`.
//! 6. When nothing fits: the smallest capacity that would (bisected by replay between the
//!    live bytes and the unlimited replay's peak), as recorded and with the most aggressive
//!    change tried, and which GPUs that is ([`fragscope_replay::known_gpus`]).
//!
//! Every option listed was replayed on the card and fits there (no OOM, peak reserved
//! within the capacity); options are ranked by what they cost the user ([`CostClass`],
//! then the recomputation, ranks or size given up), and an option another beats on every
//! count is left out. Role-level changes are **a model of the change**, not a recording
//! (`fragscope_diagnose::simulate_change_sets`' label and what it leaves out go with
//! each).
//!
//! Principal types: [`Request`] → [`evaluate`] → [`Fit`] (per file [`FileFit`], per device
//! [`DeviceFit`], per card [`CardFit`] with its [`FitOption`]s) → [`json`]
//! (`fragscope.fit/1`).

use fragscope_alloc::{format_size as fs, AllocatorConfig};
use fragscope_diagnose::{
    simulate_change_sets, simulate_empty_cache, CheckpointLayers, EmptyCacheAt, RoleChange, RoleWhatIf,
};
use fragscope_predict::{Program, Recording};
use fragscope_replay::{self as replay, recorded_config, replayable_devices, WhatIf, ALTERNATIVES};
use fragscope_snapshot::Snapshot;
use fragscope_trace::{device_roles_with, layer_spans, BlockLives, Phase, LIVE_AT_END};
use serde::Serialize;
use std::sync::OnceLock;

use crate::{msg, Error, Param};

/// The JSON document's schema.
pub const SCHEMA: &str = "fragscope.fit/1";

/// The most ranks ZeRO sharding is tried over.
pub const MAX_RANKS: u32 = 64;

/// Largest size `predict`'s search tries (as `predict --max-fit`).
const MAX_SIZE: u64 = 1 << 20;

/// What to fit: the parsed arguments without the files ([`Request::check`]).
#[derive(Clone, Debug, Default)]
pub struct Request {
    /// Device sizes, as a user writes them, comma-separated: bytes with a unit (`40GB`) or
    /// GPU names (`A100-40GB,L40S,H100-80GB`).
    pub capacity: String,
    /// Only this device.
    pub device: Option<i64>,
    /// With several recordings of one program: their sizes (batch size, sequence length),
    /// in file order. The largest is the run to fit; `predict` adds the largest size that
    /// fits. Empty: each file is a run of its own.
    pub sizes: Vec<u64>,
    /// With `sizes`: fit the run predicted at this size instead of the largest recording.
    pub at: Option<u64>,
}

/// One device size to fit on: the name as given and its bytes.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Card {
    pub name: String,
    /// What PyTorch's allocator may hold there: bytes as given, a GPU name's total less
    /// the CUDA context ([`crate::capacity::parse_capacity`], the same reading as `predict`).
    pub bytes: u64,
    /// For a GPU name: what was taken off and why.
    pub note: Option<String>,
}

impl Request {
    /// Parses the capacities and checks the request for `files` recordings, before any
    /// file is read: the one-line errors (exit code 2).
    pub fn check(&self, files: usize) -> Result<Vec<Card>, Error> {
        if files == 0 {
            return Err(Error::argument(msg!["fit needs a snapshot file"]));
        }
        let text = self.capacity.trim();
        if text.is_empty() {
            return Err(Error::argument(msg![
                Param::Capacity,
                " is required: the device size to fit on (40GB, or GPU names: A100-40GB,L40S)"
            ]));
        }
        let mut cards = Vec::new();
        for part in text.split(',') {
            // A GPU name means what it means to `predict`: its total less the CUDA context.
            let (bytes, note) = crate::capacity::parse_capacity(Some(part.trim()))?;
            let bytes = bytes.unwrap_or_default();
            if bytes == 0 {
                return Err(Error::argument(msg![Param::Capacity, format!(" '{}': a device of 0 bytes", part.trim())]));
            }
            cards.push(Card { name: part.trim().to_string(), bytes, note });
        }
        if !self.sizes.is_empty() {
            if files < 2 || self.sizes.len() != files {
                return Err(Error::argument(msg![
                    Param::Sizes,
                    format!(
                        " gives {} size(s) for {files} file(s): one size per recording of one program, in file \
                         order, two or more",
                        self.sizes.len()
                    )
                ]));
            }
            fragscope_predict::check_size_list(&self.sizes).map_err(|e| Error::argument(msg![e.to_string()]))?;
        }
        match self.at {
            Some(_) if self.sizes.is_empty() => {
                return Err(Error::argument(msg![
                    Param::At,
                    " needs ",
                    Param::Sizes,
                    ": the run at another size is predicted from recordings of one program at known sizes"
                ]))
            }
            Some(0) => return Err(Error::argument(msg![Param::At, " 0: sizes are at least 1"])),
            _ => {}
        }
        Ok(cards)
    }
}

/// What an option costs the user, cheapest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CostClass {
    /// Nothing to change: the recorded run fits.
    None,
    /// An environment variable or one argument in the code.
    Free,
    /// `empty_cache()` calls: more `cudaMalloc`/`cudaFree` and synchronisations.
    DriverCalls,
    /// Recomputation (activation checkpointing).
    Compute,
    /// More GPUs and the bytes they exchange (ZeRO).
    Communication,
    /// Less work per step (a smaller batch or sequence).
    Size,
}

/// ZeRO sharding of an option: stage, ranks, and the bytes each rank sends per step.
#[derive(Clone, Debug, Serialize)]
pub struct Zero {
    pub stage: u8,
    pub ranks: u32,
    /// About `2 · gradients · (N−1)/N` per rank and step: the reduce-scatter of the
    /// gradients and the all-gather of the updated parameters (as much as data parallel's
    /// all-reduce). `null` when no gradient was found.
    pub bytes_per_step: Option<u64>,
}

/// One way to make the run fit, replayed on the card.
#[derive(Clone, Debug, Serialize)]
pub struct FitOption {
    /// 1 = cheapest.
    pub rank: usize,
    /// The change, in words.
    pub change: String,
    pub cost_class: CostClass,
    /// What it costs, in words.
    pub cost: String,
    /// `PYTORCH_CUDA_ALLOC_CONF` replayed (canonical; empty: the defaults).
    pub config: String,
    /// Allocator settings added on top of the recorded ones (`null`: none).
    pub setting: Option<String>,
    pub set_to_none: bool,
    pub empty_cache_at_steps: bool,
    /// Layers checkpointed (0-based, forward order); empty: none.
    pub checkpoint_layers: Vec<usize>,
    /// Forward time of those layers per step, from the trace's timestamps (`null`:
    /// unknown or none checkpointed).
    pub recompute_us_per_step: Option<u64>,
    pub zero: Option<Zero>,
    /// The size run instead (with `sizes`).
    pub size: Option<u64>,
    /// Replayed on the card.
    pub peak_reserved: u64,
    pub peak_allocated: u64,
    /// Capacity − peak reserved.
    pub margin: u64,
    /// Whether the figures are a model of the change rather than the recorded requests
    /// replayed (role-level changes, a predicted size).
    pub model: bool,
    /// How the figures were made, in words.
    pub basis: String,
    /// What the model leaves out (role-level changes).
    pub not_modelled: Vec<&'static str>,
}

/// The smallest capacity on which a run fits, found by replay, and the GPUs that have it.
#[derive(Clone, Debug, Serialize)]
pub struct SmallestCapacity {
    /// The run: `as recorded` or the change.
    pub change: String,
    pub bytes: u64,
    /// Known GPUs at least that large, smallest first.
    pub gpus: Vec<&'static str>,
}

/// The search on one card.
#[derive(Clone, Debug, Serialize)]
pub struct CardFit {
    pub capacity: String,
    pub capacity_bytes: u64,
    /// For a GPU name: the CUDA context taken off its total (as `predict` says it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_note: Option<String>,
    pub fits_as_recorded: bool,
    /// Cheapest first; every one replayed on the card and fitting.
    pub options: Vec<FitOption>,
    /// What the lower bounds ruled out without a replay, in words.
    pub pruned: Vec<String>,
    /// Replays the search made on this card.
    pub replays: u32,
    /// When nothing fits.
    pub smallest_capacity: Vec<SmallestCapacity>,
    /// The answer in one line.
    pub verdict: String,
}

/// One device of a file.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceFit {
    pub device: i64,
    /// The steps and layers the role-level changes were placed by, in words.
    pub steps: String,
    pub layers: usize,
    /// Per layer (forward order): the activations checkpointing it alone frees (requested
    /// bytes, each block once, over the trace's steps), as `replay --checkpoint N` says;
    /// empty when no card needed checkpointing (measuring it costs a replay per layer).
    pub layer_saved_bytes: Vec<u64>,
    /// Per layer: its forward time per step from the trace's timestamps (`null`: not timed).
    pub layer_forward_us: Vec<Option<u64>>,
    /// The most bytes the live tensors requested at once: no allocator setting holds less
    /// (`null` for a predicted run: its trace is synthesised inside the replay).
    pub live_bytes_peak: Option<u64>,
    /// The recording replayed on an unlimited device.
    pub peak_reserved_unlimited: u64,
    pub peak_allocated_unlimited: u64,
    /// When the recording began warm: the cache PyTorch held when its first request came
    /// (reserved, no tensor in it), which every replay on a card that holds it keeps as
    /// recorded, so that "as recorded needs" can exceed what the live tensors need (on a
    /// smaller card the replays release it first). `null`: less than 1% of the peak
    /// reserved was cached then (or a predicted run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_before_trace: Option<CachedBeforeTrace>,
    pub cards: Vec<CardFit>,
}

/// The memory reserved but unallocated when the recording's first request came (see
/// [`DeviceFit::cached_before_trace`]).
#[derive(Clone, Debug, Serialize)]
pub struct CachedBeforeTrace {
    /// `memory_reserved()` when the first request came (after the recording's own
    /// `empty_cache()` calls before it).
    pub reserved_bytes: u64,
    /// `memory_allocated()` then.
    pub allocated_bytes: u64,
    /// reserved − allocated: the cache the replays on a card that holds it start from.
    pub cached_bytes: u64,
    /// What it means for the figures, in words.
    pub note: String,
}

impl CachedBeforeTrace {
    /// `None` when the run's first request found less than 1% of its peak reserved
    /// cached (a rounding's worth that no verdict turns on), or none: a recording whose
    /// program released the cache itself before asking for anything (`cs336-2.7b-trainstep`
    /// begins with `empty_cache()` returning 28.8 GiB) starts cold.
    fn of(w: &WhatIf) -> Option<CachedBeforeTrace> {
        let (reserved, allocated) = w.at_first_request;
        let cached = reserved.saturating_sub(allocated);
        if cached == 0 || cached.saturating_mul(100) < w.peak_reserved {
            return None;
        }
        let note = format!(
            "the recording began warm: {} reserved when its first request came, {} of it cached with no tensor in \
             it. On a card that holds it, every replay here starts from that cache and holds it, so the peaks \
             include it (torch.cuda.empty_cache() before the step, or a fresh process, would not hold it; no change \
             fit tries drops it); on a smaller card the replays release it before the trace, as PyTorch does when \
             cudaMalloc fails, and start from the segments that hold live tensors",
            fs(reserved),
            fs(cached)
        );
        Some(CachedBeforeTrace { reserved_bytes: reserved, allocated_bytes: allocated, cached_bytes: cached, note })
    }
}

/// One file (with `sizes`: the largest recording, the run to fit; with `at`, the
/// recording the prediction is made from).
#[derive(Clone, Debug, Serialize)]
pub struct FileFit {
    pub file: String,
    pub size: Option<u64>,
    /// With `at`: the run fitted is the prediction at `size`, not a recording (absent
    /// otherwise).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub predicted: bool,
    pub devices: Vec<DeviceFit>,
}

/// The answer: what `fragscope fit --json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct Fit {
    pub schema: &'static str,
    pub cards: Vec<Card>,
    pub files: Vec<FileFit>,
}

/// The document (`fragscope.fit/1`).
pub fn json(fit: &Fit) -> Result<String, Error> {
    crate::to_json(fit)
}

/// Fits each file (or with `sizes`, the largest recording) on each card.
pub fn evaluate(names: &[String], snaps: &[&Snapshot], req: &Request) -> Result<Fit, Error> {
    let cards = req.check(snaps.len())?;
    let mut files = Vec::new();
    if req.sizes.is_empty() {
        for (name, snap) in names.iter().zip(snaps) {
            files.push(fit_file(name, snap, None, None, req, &cards)?);
        }
    } else {
        let recs: Vec<Recording> =
            snaps.iter().zip(&req.sizes).map(|(&snap, &size)| Recording { snap, size }).collect();
        let top = (0..snaps.len()).max_by_key(|&k| req.sizes[k]).unwrap_or(0);
        files.push(match req.at {
            Some(at) => fit_predicted(&names[top], snaps[top], &recs, at, req, &cards)?,
            None => fit_file(&names[top], snaps[top], Some(&recs), Some(req.sizes[top]), req, &cards)?,
        });
    }
    Ok(Fit { schema: SCHEMA, cards, files })
}

fn fit_file(
    name: &str,
    snap: &Snapshot,
    recs: Option<&[Recording]>,
    size: Option<u64>,
    req: &Request,
    cards: &[Card],
) -> Result<FileFit, Error> {
    let mut devices = Vec::new();
    for d in devices_to_fit(name, snap, req)? {
        let program = match recs {
            Some(r) => Some(Program::fit(r, Some(d)).map_err(|e| Error::input(e.to_string()))?),
            None => None,
        };
        let dev = Dev::new(snap, d, program.map(|p| (p, size.unwrap_or_default())))?;
        let unlimited = replay::simulate(snap, d, dev.recorded.clone(), None);
        let cards = cards.iter().map(|c| search(&dev, c)).collect();
        devices.push(DeviceFit {
            device: d,
            steps: dev.steps.clone(),
            layers: dev.n_layers,
            layer_saved_bytes: dev.ranked.get().map_or_else(Vec::new, |r| r.0.iter().map(|l| l.saved).collect()),
            layer_forward_us: dev.forward.clone(),
            live_bytes_peak: Some(dev.live_peak),
            peak_reserved_unlimited: unlimited.peak_reserved,
            peak_allocated_unlimited: unlimited.peak_allocated,
            cached_before_trace: CachedBeforeTrace::of(&unlimited),
            cards,
        });
    }
    Ok(FileFit { file: name.to_string(), size, predicted: false, devices })
}

/// The devices of `snap` to fit, with `req.device` checked against them.
fn devices_to_fit(name: &str, snap: &Snapshot, req: &Request) -> Result<Vec<i64>, Error> {
    let mut devs = replayable_devices(snap);
    if let Some(d) = req.device {
        if !devs.contains(&d) {
            return Err(Error::argument(msg![
                Param::Device,
                format!("={d}: {name} has no replayable trace on device {d} (devices: {devs:?})")
            ]));
        }
        devs.retain(|&x| x == d);
    }
    // A device that ran out of memory first (issue 42: every command leads with the OOM).
    devs.sort_by_key(|&d| !snap.trace(d).iter().any(|e| e.action == fragscope_snapshot::Action::Oom));
    if devs.is_empty() {
        return Err(Error::input(format!(
            "{name}: no device with an allocation trace to replay (record with \
             torch.cuda.memory._record_memory_history())"
        )));
    }
    Ok(devs)
}

/// The run predicted at `at` from the recordings `recs`, fitted on each card (module doc:
/// the allocator settings and the largest size that fits, each a prediction replayed).
fn fit_predicted(
    name: &str,
    snap: &Snapshot,
    recs: &[Recording],
    at: u64,
    req: &Request,
    cards: &[Card],
) -> Result<FileFit, Error> {
    let mut devices = Vec::new();
    for d in devices_to_fit(name, snap, req)? {
        let prog = Program::fit(recs, Some(d)).map_err(|e| Error::input(e.to_string()))?;
        let recorded = recorded_config(snap);
        let mut settings: Vec<(Option<&'static str>, AllocatorConfig)> = vec![(None, recorded.clone())];
        for alt in ALTERNATIVES {
            let c = crate::replay::config_on_top(&recorded, alt)?;
            if c != recorded {
                settings.push((Some(*alt), c));
            }
        }
        let unlimited = prog.predict(at, &recorded, None);
        let sizes: Vec<String> = recs.iter().map(|r| r.size.to_string()).collect();
        let cards = cards.iter().map(|c| search_predicted(&prog, at, &settings, &unlimited, c)).collect();
        devices.push(DeviceFit {
            device: d,
            steps: format!("a run predicted at size {at} from the recordings at sizes {}", sizes.join(", ")),
            layers: 0,
            layer_saved_bytes: Vec::new(),
            layer_forward_us: Vec::new(),
            live_bytes_peak: None,
            peak_reserved_unlimited: unlimited.peak_reserved,
            peak_allocated_unlimited: unlimited.peak_allocated,
            cached_before_trace: None,
            cards,
        });
    }
    Ok(FileFit { file: name.to_string(), size: Some(at), predicted: true, devices })
}

/// An option of a predicted run: `cfg` (one of the settings) or a smaller size, predicted.
fn predicted_option(
    change: String,
    class: CostClass,
    cost: String,
    setting: Option<&str>,
    size: Option<u64>,
    p: &fragscope_predict::Prediction,
    cap: u64,
) -> FitOption {
    FitOption {
        rank: 0,
        change,
        cost_class: class,
        cost,
        config: p.config.clone(),
        setting: setting.map(str::to_string),
        set_to_none: false,
        empty_cache_at_steps: false,
        checkpoint_layers: Vec::new(),
        recompute_us_per_step: None,
        zero: None,
        size,
        peak_reserved: p.peak_reserved,
        peak_allocated: p.peak_allocated,
        margin: cap.saturating_sub(p.peak_reserved),
        model: true,
        basis: format!(
            "predicted at size {} from the recordings at other sizes and replayed through the allocator model \
             (predict)",
            p.at
        ),
        not_modelled: Vec::new(),
    }
}

/// The search on one card for a predicted run: as predicted, each allocator setting, the
/// largest size that fits; when nothing does, the smallest capacity as predicted.
fn search_predicted(
    prog: &Program,
    at: u64,
    settings: &[(Option<&'static str>, AllocatorConfig)],
    unlimited: &fragscope_predict::Prediction,
    card: &Card,
) -> CardFit {
    let cap = card.bytes;
    let mut replays = 0u32;
    let mut options = Vec::new();
    let mut pruned = Vec::new();
    // As predicted first: when it fits there is nothing to change (no other replay).
    let fits_on = |p: &fragscope_predict::Prediction| p.fits() && p.peak_reserved <= cap;
    let first = prog.predict(at, &settings[0].1, Some(cap));
    replays += 1;
    let fits_as_predicted = fits_on(&first);
    if fits_as_predicted {
        let change = format!("as predicted at size {at}");
        options.push(predicted_option(change, CostClass::None, "nothing".into(), None, None, &first, cap));
    } else {
        pruned.push(
            "activation checkpointing, ZeRO, set_to_none and empty_cache(): not searched on a predicted run (they \
             need a recording's steps and roles; fit a recording at this size for them)"
                .to_string(),
        );
        for (alt, cfg) in &settings[1..] {
            replays += 1;
            let p = prog.predict(at, cfg, Some(cap));
            if let (Some(a), true) = (alt, fits_on(&p)) {
                let change = format!("PYTORCH_CUDA_ALLOC_CONF={a}");
                options.push(predicted_option(
                    change,
                    CostClass::Free,
                    "free (environment)".into(),
                    Some(a),
                    None,
                    &p,
                    cap,
                ));
            }
        }
    }
    if options.is_empty() {
        let m = prog.max_fit(&settings[0].1, cap, MAX_SIZE);
        replays += m.replays;
        match (m.largest, &m.fits_at) {
            (Some(x), Some(p)) if x < at && p.peak_reserved <= cap => options.push(predicted_option(
                format!("size {x} instead of {at} (the largest that fits, predict --max-fit)"),
                CostClass::Size,
                format!("{:.0}% of the work per step ({x} of {at})", x as f64 * 100.0 / at as f64),
                None,
                Some(x),
                p,
                cap,
            )),
            _ => pruned.push(no_smaller_size(&m, at)),
        }
    }
    options.sort_by_key(|o| (o.cost_class, u64::MAX - o.margin));
    for (i, o) in options.iter_mut().enumerate() {
        o.rank = i + 1;
    }
    let mut smallest = Vec::new();
    if options.is_empty() {
        smallest.extend(smallest_predicted(prog, at, &settings[0].1, unlimited, &mut replays));
    }
    let verdict = verdict(card, fits_as_predicted, &options, &smallest)
        .replacen("as recorded", "as predicted", 1)
        .replace(", a model of the change", ", a prediction");
    CardFit {
        capacity: card.name.clone(),
        capacity_bytes: cap,
        capacity_note: card.note.clone(),
        fits_as_recorded: fits_as_predicted,
        options,
        pruned,
        replays,
        smallest_capacity: smallest,
        verdict,
    }
}

/// The smallest capacity on which the predicted run fits under `cfg`, bisected by
/// prediction between 0 and its unlimited peak reserved (2 MiB resolution).
fn smallest_predicted(
    prog: &Program,
    at: u64,
    cfg: &AllocatorConfig,
    unlimited: &fragscope_predict::Prediction,
    replays: &mut u32,
) -> Option<SmallestCapacity> {
    let mut check = |c: u64| {
        *replays += 1;
        let p = prog.predict(at, cfg, Some(c));
        p.fits() && p.peak_reserved <= c
    };
    let mut hi = unlimited.peak_reserved.max(1);
    let mut grow = 0;
    while !check(hi) {
        hi += hi / 16 + 1;
        grow += 1;
        if grow > 16 {
            return None;
        }
    }
    let mut lo = 0;
    while hi - lo > 2 << 20 {
        let mid = lo + (hi - lo) / 2;
        if check(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(SmallestCapacity { change: "as predicted".into(), bytes: hi, gpus: gpus_of(hi) })
}

/// Known GPUs on which PyTorch's allocator may hold `b` bytes (their total less the CUDA
/// context, as a card's), smallest first.
fn gpus_of(b: u64) -> Vec<&'static str> {
    replay::known_gpus().into_iter().filter(|&(_, c)| crate::capacity::usable_bytes(c) >= b).map(|(n, _)| n).collect()
}

/// One layer of the model: the activations checkpointing it frees, its forward time.
#[derive(Clone, Copy, Debug)]
struct Layer {
    saved: u64,
    forward_us: Option<u64>,
}

/// Layers measured, and the orders to checkpoint them in.
type Ranked = (Vec<Layer>, Vec<(&'static str, Vec<usize>)>);

/// What the search knows of one device before it replays anything.
struct Dev<'a> {
    snap: &'a Snapshot,
    device: i64,
    recorded: AllocatorConfig,
    /// Each of [`ALTERNATIVES`] that differs from the recorded settings.
    settings: Vec<(&'static str, AllocatorConfig)>,
    live_peak: u64,
    steps: String,
    /// Layers in a pass (0: none found).
    n_layers: usize,
    /// Each layer's forward time per step.
    forward: Vec<Option<u64>>,
    /// The layers and the orders to checkpoint them in (what it minimises, layers best
    /// first), measured when the search first needs them ([`Dev::ranked`]).
    ranked: OnceLock<Ranked>,
    gradient_bytes: Option<u64>,
    /// Why ZeRO cannot apply to this trace (no training step, or neither optimizer state
    /// nor gradients found), said once up front instead of replaying every (stage, base)
    /// pair to find out; `None`: it may apply.
    zero_not_applicable: Option<String>,
    /// The fitted program and the recorded size (with `sizes`).
    program: Option<(Program<'a>, u64)>,
}

impl<'a> Dev<'a> {
    fn new(snap: &'a Snapshot, device: i64, program: Option<(Program<'a>, u64)>) -> Result<Dev<'a>, Error> {
        let recorded = recorded_config(snap);
        let mut settings = Vec::new();
        for alt in ALTERNATIVES {
            let c = crate::replay::config_on_top(&recorded, alt)?;
            if c != recorded {
                settings.push((*alt, c));
            }
        }
        let lives = BlockLives::replay(snap, device);
        let live_peak = live_requested_peak(snap, device, &lives);
        let (roles, steps, _) = device_roles_with(snap, &lives);
        let gradient_bytes = roles.by_role.get("gradients").map(|r| r.max).filter(|&b| b > 0);
        // ZeRO shards blocks of these two roles; with neither, every stage's replay would
        // only find that out.
        let shardable = ["gradients", "optimizer_state"]
            .iter()
            .any(|k| roles.by_role.get(*k).is_some_and(|r| r.blocks > 0 || r.max > 0));
        let zero_not_applicable = match (shardable, steps.steps.is_empty()) {
            (true, _) => None,
            (false, true) => Some(steps.describe()),
            (false, false) => Some("no optimizer state or gradients found to shard".to_string()),
        };
        let n_layers = steps.steps.iter().filter_map(|s| s.layers).max().unwrap_or(0);
        let forward = forward_times(snap, device, &steps.steps, n_layers);
        Ok(Dev {
            snap,
            device,
            recorded,
            settings,
            live_peak,
            steps: steps.describe(),
            n_layers,
            forward,
            ranked: OnceLock::new(),
            gradient_bytes,
            zero_not_applicable,
            program,
        })
    }

    /// The layers (what checkpointing each alone saves, replayed once each on an unlimited
    /// device, and its forward time) and the orders to checkpoint them in, measured once.
    fn ranked(&self) -> &Ranked {
        self.ranked.get_or_init(|| {
            if self.n_layers == 0 {
                return (Vec::new(), Vec::new());
            }
            let sets: Vec<Vec<RoleChange>> =
                (0..self.n_layers).map(|j| vec![RoleChange::Checkpoint(CheckpointLayers::Some(vec![j]))]).collect();
            let runs = simulate_change_sets(self.snap, self.device, &sets, self.recorded.clone(), None, &[]);
            let layers: Vec<Layer> = runs
                .iter()
                .zip(&self.forward)
                .map(|(r, &f)| Layer { saved: r.changes.first().map_or(0, |c| c.bytes), forward_us: f })
                .collect();
            let orders = layer_orders(&layers);
            (layers, orders)
        })
    }
}

/// The most bytes live tensors requested at one moment: blocks live before the trace and
/// those the trace allocates, each from its allocation to the entry that frees it.
fn live_requested_peak(snap: &Snapshot, device: i64, lives: &BlockLives) -> u64 {
    let trace = snap.trace(device);
    let mut delta: Vec<(usize, i128)> = Vec::new();
    let mut live: i128 = 0;
    for s in &lives.seeded {
        live += i128::from(s.request);
        if s.end != LIVE_AT_END {
            delta.push((s.end, -i128::from(s.request)));
        }
    }
    for t in &lives.traced {
        let req = i128::from(trace[t.alloc()].size);
        delta.push((t.alloc(), req));
        if t.end() != LIVE_AT_END {
            delta.push((t.end(), -req));
        }
    }
    // Frees before allocations at one entry (an entry is one or the other).
    delta.sort_unstable_by_key(|&(at, d)| (at, d > 0));
    let mut peak = live;
    for (_, d) in delta {
        live += d;
        peak = peak.max(live);
    }
    u64::try_from(peak.max(0)).unwrap_or(u64::MAX)
}

/// Each layer's forward time per step (microseconds, averaged over the steps whose forward
/// pass shows the layers), from the trace's timestamps; `None` where no step times it.
fn forward_times(snap: &Snapshot, device: i64, steps: &[fragscope_trace::Step], n: usize) -> Vec<Option<u64>> {
    let trace = snap.trace(device);
    let mut sum = vec![(0u64, 0u64); n];
    for st in steps {
        let Some(spans) = layer_spans(snap, device, st, Phase::Forward) else { continue };
        if spans.len() != n {
            continue;
        }
        for (j, &(a, b)) in spans.iter().enumerate() {
            let (Some(x), Some(y)) = (trace.get(a), trace.get(b.min(trace.len()).saturating_sub(1))) else {
                continue;
            };
            let dt = u64::try_from(y.time_us - x.time_us).unwrap_or(0);
            sum[j].0 += dt;
            sum[j].1 += 1;
        }
    }
    sum.into_iter().map(|(t, k)| (k > 0 && t > 0).then(|| t / k)).collect()
}

/// The orders layers are checkpointed in: most saved first (the fewest layers), and most
/// saved per microsecond of forward first (the least recomputation), when timed.
fn layer_orders(layers: &[Layer]) -> Vec<(&'static str, Vec<usize>)> {
    let mut by_bytes: Vec<usize> = (0..layers.len()).collect();
    by_bytes.sort_by_key(|&j| (std::cmp::Reverse(layers[j].saved), layers[j].forward_us.unwrap_or(0), j));
    let mut v = vec![("fewest layers", by_bytes)];
    if layers.iter().all(|l| l.forward_us.is_some()) {
        let mut by_rate: Vec<usize> = (0..layers.len()).collect();
        let rate = |j: usize| layers[j].saved as f64 / layers[j].forward_us.unwrap_or(1).max(1) as f64;
        by_rate.sort_by(|&a, &b| rate(b).total_cmp(&rate(a)).then(a.cmp(&b)));
        if by_rate != v[0].1 {
            v.push(("least recomputation", by_rate));
        }
    }
    v
}

/// One combination of changes the search replays.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Spec {
    /// Index into [`Dev::settings`].
    setting: Option<usize>,
    set_to_none: bool,
    empty_cache: bool,
    /// Layers checkpointed, sorted.
    checkpoint: Vec<usize>,
    /// (stage, ranks).
    zero: Option<(u8, u32)>,
}

impl Spec {
    fn role_changes(&self) -> Vec<RoleChange> {
        let mut v = Vec::new();
        if let Some((stage, n)) = self.zero {
            v.push(RoleChange::ShardOptimizer(n));
            if stage >= 2 {
                v.push(RoleChange::ShardGradients(n));
            }
        }
        if self.set_to_none {
            v.push(RoleChange::GradsSetToNone);
        }
        if !self.checkpoint.is_empty() {
            v.push(RoleChange::Checkpoint(CheckpointLayers::Some(self.checkpoint.clone())));
        }
        v
    }
    /// Free changes in it (a setting, set_to_none).
    fn free_count(&self) -> u64 {
        u64::from(self.setting.is_some()) + u64::from(self.set_to_none)
    }
    fn with_free(&self, base: &Spec) -> Spec {
        Spec { setting: base.setting, set_to_none: base.set_to_none, ..self.clone() }
    }
}

/// A spec replayed: the run, and for role-level changes what the model says of itself
/// (its label and what it leaves out).
#[derive(Clone, Debug)]
struct Ran {
    w: WhatIf,
    model: Option<(&'static str, &'static [&'static str])>,
}

/// A spec replayed, or `None` when a change of it cannot be applied.
type Run = Option<Ran>;

fn fits(w: &Ran, cap: u64) -> bool {
    w.w.ooms == 0 && w.w.peak_reserved <= cap
}

impl Dev<'_> {
    fn config(&self, s: &Spec) -> AllocatorConfig {
        s.setting.map_or_else(|| self.recorded.clone(), |k| self.settings[k].1.clone())
    }

    /// Replays `specs` on `cap` bytes (`None`: unlimited), side by side; role-level
    /// changes under one setting share one replay of the recording.
    fn replay(&self, specs: &[Spec], cap: Option<u64>) -> Vec<Run> {
        self.replay_why(specs, cap).into_iter().map(Result::ok).collect()
    }

    /// [`Dev::replay`], with why a spec could not be replayed: the first change of it the
    /// role model cannot apply to this trace, in its own words (`None`: no reason given).
    fn replay_why(&self, specs: &[Spec], cap: Option<u64>) -> Vec<Result<Ran, Option<String>>> {
        let mut groups: Vec<(Option<usize>, Vec<usize>)> = Vec::new();
        let mut plain = Vec::new();
        for (i, s) in specs.iter().enumerate() {
            if s.role_changes().is_empty() {
                plain.push(i);
            } else {
                match groups.iter_mut().find(|g| g.0 == s.setting) {
                    Some(g) => g.1.push(i),
                    None => groups.push((s.setting, vec![i])),
                }
            }
        }
        let jobs = plain.len() + groups.len();
        let done = fragscope_trace::par_map(jobs, fragscope_trace::par_threads(), |k| {
            if k < plain.len() {
                let s = &specs[plain[k]];
                return vec![(plain[k], self.replay_plain(s, cap).ok_or(None))];
            }
            let (setting, idx) = &groups[k - plain.len()];
            let cfg = setting.map_or_else(|| self.recorded.clone(), |j| self.settings[j].1.clone());
            let sets: Vec<Vec<RoleChange>> = idx.iter().map(|&i| specs[i].role_changes()).collect();
            let runs: Vec<RoleWhatIf> = simulate_change_sets(self.snap, self.device, &sets, cfg, cap, &[]);
            idx.iter()
                .zip(runs)
                .map(|(&i, r)| {
                    let model = Some((r.label, r.not_modelled));
                    let why = r
                        .changes
                        .iter()
                        .find(|c| !c.applied)
                        .map(|c| c.cannot_apply.as_ref().map(|w| format!("{}: {w}", c.change)));
                    match (why, r.changed) {
                        (None, Some(w)) => (i, Ok(Ran { w, model })),
                        (why, _) => (i, Err(why.flatten())),
                    }
                })
                .collect()
        });
        let mut out: Vec<Result<Ran, Option<String>>> = vec![Err(None); specs.len()];
        for (i, r) in done.into_iter().flatten() {
            out[i] = r;
        }
        out
    }

    fn replay_plain(&self, s: &Spec, cap: Option<u64>) -> Run {
        let cfg = self.config(s);
        let w = if s.empty_cache {
            simulate_empty_cache(self.snap, self.device, cfg, cap, &EmptyCacheAt::Steps).ok()?
        } else {
            replay::simulate(self.snap, self.device, cfg, cap)
        };
        Some(Ran { w, model: None })
    }
}

/// The search on one card (module doc).
struct Search<'d, 'a> {
    dev: &'d Dev<'a>,
    cap: u64,
    replays: u32,
    pruned: Vec<String>,
    /// Fitting specs with their runs.
    found: Vec<(Spec, Ran)>,
    /// The largest size that fits (with `sizes`): (size, peak reserved, peak allocated).
    size: Option<(u64, u64, u64)>,
}

impl Search<'_, '_> {
    fn run(&mut self, specs: &[Spec]) -> Vec<Run> {
        self.replays += specs.len() as u32;
        self.dev.replay(specs, Some(self.cap))
    }
    /// Replays `specs`, keeps those that fit; returns whether any did.
    fn try_all(&mut self, specs: &[Spec]) -> bool {
        let runs = self.run(specs);
        let mut any = false;
        for (s, r) in specs.iter().zip(runs) {
            if let Some(w) = r.filter(|w| fits(w, self.cap)) {
                self.found.push((s.clone(), w));
                any = true;
            }
        }
        any
    }
    fn fits_one(&mut self, s: &Spec) -> Option<Ran> {
        self.run(std::slice::from_ref(s)).pop().flatten().filter(|w| fits(w, self.cap))
    }

    /// The free changes (module doc, 2).
    fn free(&mut self) -> bool {
        let dev = self.dev;
        let settings_can = dev.live_peak <= self.cap;
        if !settings_can {
            self.pruned.push(format!(
                "allocator settings and empty_cache(): the live tensors reach {} requested, above {}; no allocator \
                 holds less",
                fs(dev.live_peak),
                fs(self.cap)
            ));
        }
        let mut specs = vec![Spec { set_to_none: true, ..Spec::default() }];
        for k in 0..dev.settings.len() {
            if settings_can {
                specs.push(Spec { setting: Some(k), ..Spec::default() });
            }
            specs.push(Spec { setting: Some(k), set_to_none: true, ..Spec::default() });
        }
        if settings_can {
            specs.push(Spec { empty_cache: true, ..Spec::default() });
            specs.extend((0..dev.settings.len()).map(|k| Spec {
                setting: Some(k),
                empty_cache: true,
                ..Spec::default()
            }));
        }
        self.try_all(&specs)
    }

    /// The bases compute and communication changes go on: none, and each free change
    /// (without `empty_cache()`, which the role-level what-ifs do not combine with).
    fn bases(&self) -> Vec<Spec> {
        let mut v = vec![Spec::default(), Spec { set_to_none: true, ..Spec::default() }];
        for k in 0..self.dev.settings.len() {
            v.push(Spec { setting: Some(k), ..Spec::default() });
            v.push(Spec { setting: Some(k), set_to_none: true, ..Spec::default() });
        }
        v
    }

    /// Activation checkpointing on each base (module doc, 3).
    fn checkpoint(&mut self, bases: &[Spec]) -> bool {
        let n = self.dev.n_layers;
        if n == 0 {
            self.pruned.push(format!("activation checkpointing: no layers found ({})", self.dev.steps));
            return false;
        }
        let all: Vec<Spec> =
            bases.iter().map(|b| Spec { checkpoint: (0..n).collect(), ..Spec::default() }.with_free(b)).collect();
        let runs = self.run(&all);
        let mut any = false;
        let mut cut = 0;
        for (b, r) in bases.iter().zip(runs) {
            let Some(w) = r.filter(|w| fits(w, self.cap)) else {
                cut += 1;
                continue;
            };
            any = true;
            for (_, order) in self.dev.ranked().1.clone() {
                // Smallest prefix of `order` that fits: `n` fits.
                let (mut lo, mut hi, mut best) = (0usize, n, w.clone());
                while hi - lo > 1 {
                    let mid = (lo + hi) / 2;
                    let mut layers = order[..mid].to_vec();
                    layers.sort_unstable();
                    match self.fits_one(&Spec { checkpoint: layers, ..Spec::default() }.with_free(b)) {
                        Some(w) => (hi, best) = (mid, w),
                        None => lo = mid,
                    }
                }
                let mut layers = order[..hi].to_vec();
                layers.sort_unstable();
                self.found.push((Spec { checkpoint: layers, ..Spec::default() }.with_free(b), best));
            }
        }
        if cut > 0 {
            self.pruned.push(format!(
                "activation checkpointing on {cut} of {} bases: checkpointing all {n} layers does not fit, so no \
                 fewer can",
                bases.len()
            ));
        }
        any
    }

    /// ZeRO-1 and ZeRO-2 over the fewest ranks, on each base (module doc, 4).
    fn zero(&mut self, bases: &[Spec], checkpoint_all: bool) -> bool {
        let ranks: Vec<u32> = (2..=MAX_RANKS).collect();
        let ck: Vec<usize> = if checkpoint_all { (0..self.dev.n_layers).collect() } else { Vec::new() };
        let mut any = false;
        // Pairs that do not fit, and pairs the model cannot apply (no optimizer state or
        // gradient found to shard, or a free change of the base that does not apply).
        let (mut cut, mut cannot) = (0, 0);
        // What the role model said of the pairs it could not apply, each once.
        let mut reasons: Vec<String> = Vec::new();
        for stage in [1u8, 2] {
            let top: Vec<Spec> = bases
                .iter()
                .map(|b| {
                    Spec { zero: Some((stage, MAX_RANKS)), checkpoint: ck.clone(), ..Spec::default() }.with_free(b)
                })
                .collect();
            self.replays += top.len() as u32;
            let runs = self.dev.replay_why(&top, Some(self.cap));
            for (b, r) in bases.iter().zip(runs) {
                let r = match r {
                    Ok(r) => r,
                    Err(why) => {
                        cannot += 1;
                        if let Some(why) = why {
                            if !reasons.contains(&why) {
                                reasons.push(why);
                            }
                        }
                        continue;
                    }
                };
                let Some(w) = Some(r).filter(|w| fits(w, self.cap)) else {
                    cut += 1;
                    continue;
                };
                any = true;
                // Fewest ranks that fit: ranks[hi] fits, ranks[lo] does not (−1: none tried).
                let (mut lo, mut hi, mut best) = (-1isize, ranks.len() as isize - 1, w);
                while hi - lo > 1 {
                    let mid = (lo + hi) / 2;
                    let s =
                        Spec { zero: Some((stage, ranks[mid as usize])), checkpoint: ck.clone(), ..Spec::default() };
                    match self.fits_one(&s.with_free(b)) {
                        Some(w) => (hi, best) = (mid, w),
                        None => lo = mid,
                    }
                }
                let hi = hi as usize;
                let s = Spec { zero: Some((stage, ranks[hi])), checkpoint: ck.clone(), ..Spec::default() };
                self.found.push((s.with_free(b), best));
            }
        }
        let with = if checkpoint_all { " with every layer checkpointed" } else { "" };
        if cut > 0 {
            self.pruned.push(format!(
                "ZeRO{with}: {cut} of {} (stage, base) pairs do not fit even over {MAX_RANKS} ranks",
                2 * bases.len()
            ));
        }
        if cannot > 0 {
            let why = if reasons.is_empty() {
                "no optimizer state or gradients found to shard, or a change of the base that does not apply"
                    .to_string()
            } else {
                reasons.join("; ")
            };
            self.pruned.push(format!(
                "ZeRO{with}: {cannot} of {} (stage, base) pairs cannot be applied to this trace ({why})",
                2 * bases.len()
            ));
        }
        any
    }

    /// The smallest capacity on which `s` fits, by bisection over replays between the
    /// live bytes and its unlimited peak (2 MiB resolution).
    fn smallest_capacity(&mut self, s: &Spec) -> Option<u64> {
        self.replays += 1;
        let un = self.dev.replay(std::slice::from_ref(s), None).pop().flatten()?;
        let mut hi = un.w.peak_reserved.max(1);
        let check = |this: &mut Self, c: u64| {
            this.replays += 1;
            this.dev.replay(std::slice::from_ref(s), Some(c)).pop().flatten().is_some_and(|w| fits(&w, c))
        };
        let mut grow = 0;
        while !check(self, hi) {
            hi += hi / 16 + 1;
            grow += 1;
            if grow > 16 {
                return None;
            }
        }
        let mut lo = if s.role_changes().is_empty() { self.dev.live_peak.min(hi) } else { 0 };
        while hi - lo > 2 << 20 {
            let mid = lo + (hi - lo) / 2;
            if check(self, mid) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        Some(hi)
    }
}

/// The search on one card (module doc).
fn search(dev: &Dev, card: &Card) -> CardFit {
    let mut s = Search { dev, cap: card.bytes, replays: 0, pruned: Vec::new(), found: Vec::new(), size: None };
    let as_recorded = s.fits_one(&Spec::default());
    let mut smallest = Vec::new();
    if let Some(w) = as_recorded.clone() {
        s.found.push((Spec::default(), w));
    } else if !s.free() {
        let bases = s.bases();
        let ck = s.checkpoint(&bases);
        if let Some(why) = &dev.zero_not_applicable {
            s.pruned.push(format!("ZeRO: not applicable: {why}"));
        } else {
            let zero = s.zero(&bases, false);
            if !ck && !zero && dev.n_layers > 0 {
                s.zero(&[Spec::default()], true);
            }
        }
        size_option(&mut s);
        if s.found.is_empty() && s.size.is_none() {
            smallest = smallest_capacities(&mut s);
        }
    } else {
        s.pruned.push("changes that cost compute or communication: not searched, a free change fits".into());
    }
    let options = rank_options(dev, card.bytes, &s.found, s.size);
    let verdict = verdict(card, as_recorded.is_some(), &options, &smallest);
    CardFit {
        capacity: card.name.clone(),
        capacity_bytes: card.bytes,
        capacity_note: card.note.clone(),
        fits_as_recorded: as_recorded.is_some(),
        options,
        pruned: s.pruned,
        replays: s.replays,
        smallest_capacity: smallest,
        verdict,
    }
}

/// With recordings at several sizes: the largest size that fits under the recorded
/// settings, from `predict` (module doc, 5).
fn size_option(s: &mut Search) {
    let Some((prog, recorded)) = &s.dev.program else { return };
    let m = prog.max_fit(&s.dev.recorded, s.cap, MAX_SIZE);
    s.replays += m.replays;
    match (m.largest, &m.fits_at) {
        (Some(x), Some(p)) if x < *recorded && p.peak_reserved <= s.cap => {
            s.size = Some((x, p.peak_reserved, p.peak_allocated));
        }
        _ => s.pruned.push(no_smaller_size(&m, *recorded)),
    }
}

/// Why `predict --max-fit` offers no smaller size than `recorded`, in words: a user told
/// "nothing fits" is told why a smaller batch would not help either (the state before the
/// trace, the parameters and optimizer state, over the card at every size).
fn no_smaller_size(m: &fragscope_predict::MaxFit, recorded: u64) -> String {
    let head = format!("a smaller size: none that fits found by predict --max-fit ({} replays)", m.replays);
    let why = match (m.largest, &m.next) {
        (Some(x), _) if x >= recorded => format!(
            "the largest size predicted to fit, {x}, is not below the recorded {recorded}: the prediction there \
             differs from the recording's replay"
        ),
        (_, Some(p)) => match (&p.start_over_capacity, &p.start_refused) {
            (Some(o), _) => format!(
                "even at size {}, the state before the trace (tensors live when the recording began: parameters, \
                 optimizer state) holds {} reserved, {} over the card",
                p.at,
                fs(o.reserved),
                fs(o.over)
            ),
            (None, Some(why)) => format!("the state before the trace could not be held: {why}"),
            (None, None) => format!("size {} already runs out of memory", p.at),
        },
        _ => return head,
    };
    format!("{head}: {why}")
}

/// When nothing fits: the smallest capacity as recorded, and with the most aggressive
/// change tried (module doc, 6).
fn smallest_capacities(s: &mut Search) -> Vec<SmallestCapacity> {
    // A GPU has what its allocator may hold: its total less the CUDA context, as for a card.
    let gpus = gpus_of;
    let mut v = Vec::new();
    if let Some(b) = s.smallest_capacity(&Spec::default()) {
        v.push(SmallestCapacity { change: "as recorded".into(), bytes: b, gpus: gpus(b) });
    }
    // The most aggressive change that applies to this trace: every role-level change,
    // then fewer (a change that cannot be applied makes its set unreplayable).
    let n = s.dev.n_layers;
    let ck: Vec<usize> = (0..n).collect();
    let zero = Some((2, MAX_RANKS));
    let tries = [
        Spec { set_to_none: true, checkpoint: ck.clone(), zero, ..Spec::default() },
        Spec { checkpoint: ck.clone(), zero, ..Spec::default() },
        Spec { zero, ..Spec::default() },
        Spec { checkpoint: ck, ..Spec::default() },
        Spec { set_to_none: true, ..Spec::default() },
    ];
    for most in tries {
        if most.role_changes().is_empty() || (most.zero.is_some() && s.dev.zero_not_applicable.is_some()) {
            continue;
        }
        if let Some(b) = s.smallest_capacity(&most) {
            v.push(SmallestCapacity { change: describe(s.dev, &most), bytes: b, gpus: gpus(b) });
            break;
        }
    }
    v
}

/// The change of `s`, in words.
fn describe(dev: &Dev, s: &Spec) -> String {
    let mut parts = Vec::new();
    if let Some(k) = s.setting {
        parts.push(format!("PYTORCH_CUDA_ALLOC_CONF={}", dev.settings[k].0));
    }
    if s.set_to_none {
        parts.push("zero_grad(set_to_none=True)".into());
    }
    if s.empty_cache {
        parts.push("empty_cache() at every step boundary".into());
    }
    if !s.checkpoint.is_empty() {
        let n = dev.n_layers;
        parts.push(if s.checkpoint.len() == n {
            format!("checkpoint all {n} layers")
        } else {
            format!(
                "checkpoint {} of {n} layers ({})",
                s.checkpoint.len(),
                s.checkpoint.iter().map(|j| j.to_string()).collect::<Vec<_>>().join(",")
            )
        });
    }
    if let Some((stage, n)) = s.zero {
        parts.push(format!("ZeRO-{stage} over {n} ranks"));
    }
    if parts.is_empty() {
        "as recorded".into()
    } else {
        parts.join(" + ")
    }
}

/// Sort key: class, then the amount given up, then the free changes added.
fn cost_key(o: &FitOption, free: u64) -> (CostClass, u64, u64, u64) {
    let amount = match o.cost_class {
        CostClass::Compute => o.recompute_us_per_step.unwrap_or(o.checkpoint_layers.len() as u64),
        CostClass::Communication => {
            o.zero.as_ref().map_or(0, |z| u64::from(z.ranks) * 4 + u64::from(z.stage)) * 1_000_000
                + o.checkpoint_layers.len() as u64
        }
        CostClass::Size => u64::MAX - o.size.unwrap_or(0),
        _ => 0,
    };
    (o.cost_class, amount, free, u64::MAX - o.margin)
}

/// The fitting runs as options, cheapest first, those another beats on every count left
/// out (module doc).
fn rank_options(dev: &Dev, cap: u64, found: &[(Spec, Ran)], size: Option<(u64, u64, u64)>) -> Vec<FitOption> {
    let mut opts: Vec<(FitOption, u64)> = Vec::new();
    let mut seen: Vec<&Spec> = Vec::new();
    for (s, w) in found {
        if seen.contains(&s) {
            continue;
        }
        seen.push(s);
        opts.push((fit_option(dev, cap, s, w), s.free_count() + u64::from(s.empty_cache)));
    }
    opts.extend(size.map(|x| (size_fit_option(dev, cap, x), 0)));
    opts.sort_by_key(|(o, free)| cost_key(o, *free));
    // An option is left out when an earlier one of its class costs no more, adds no more
    // free changes, checkpoints no more layers and shards over no more ranks (the earlier
    // one is then at least as cheap on every count).
    let mut kept: Vec<(FitOption, u64)> = Vec::new();
    for (o, free) in opts {
        let k = cost_key(&o, free);
        let beaten = kept.iter().any(|(p, pf)| {
            let pk = cost_key(p, *pf);
            pk.0 == k.0
                && pk.1 <= k.1
                && pk.2 <= k.2
                && k.0 != CostClass::Free
                && p.checkpoint_layers.len() <= o.checkpoint_layers.len()
                && p.zero.as_ref().map(|z| (z.ranks, z.stage)) <= o.zero.as_ref().map(|z| (z.ranks, z.stage))
        });
        if !beaten {
            kept.push((o, free));
        }
    }
    kept.into_iter()
        .enumerate()
        .map(|(i, (mut o, _))| {
            o.rank = i + 1;
            o
        })
        .collect()
}

fn size_fit_option(dev: &Dev, cap: u64, (x, reserved, allocated): (u64, u64, u64)) -> FitOption {
    let recorded = dev.program.as_ref().map_or(0, |p| p.1);
    FitOption {
        rank: 0,
        change: format!("size {x} instead of {recorded} (the largest that fits, predict --max-fit)"),
        cost_class: CostClass::Size,
        cost: format!("{:.0}% of the work per step ({x} of {recorded})", x as f64 * 100.0 / recorded.max(1) as f64),
        config: dev.recorded.to_conf_string(),
        setting: None,
        set_to_none: false,
        empty_cache_at_steps: false,
        checkpoint_layers: Vec::new(),
        recompute_us_per_step: None,
        zero: None,
        size: Some(x),
        peak_reserved: reserved,
        peak_allocated: allocated,
        margin: cap.saturating_sub(reserved),
        model: true,
        basis: "predicted from the recordings at other sizes and replayed (predict)".into(),
        not_modelled: Vec::new(),
    }
}

fn fit_option(dev: &Dev, cap: u64, s: &Spec, ran: &Ran) -> FitOption {
    let w = &ran.w;
    let roles = ran.model.is_some();
    let class = if s.zero.is_some() {
        CostClass::Communication
    } else if !s.checkpoint.is_empty() {
        CostClass::Compute
    } else if s.empty_cache {
        CostClass::DriverCalls
    } else if s.free_count() > 0 {
        CostClass::Free
    } else {
        CostClass::None
    };
    let recompute: Option<u64> = if s.checkpoint.is_empty() {
        None
    } else {
        s.checkpoint.iter().map(|&j| dev.forward.get(j).copied().flatten()).sum()
    };
    let zero = s.zero.map(|(stage, ranks)| Zero {
        stage,
        ranks,
        bytes_per_step: dev
            .gradient_bytes
            .map(|g| (2 * u128::from(g) * u128::from(ranks - 1) / u128::from(ranks)) as u64),
    });
    let cost = cost_words(s, w, recompute, zero.as_ref());
    FitOption {
        rank: 0,
        change: describe(dev, s),
        cost_class: class,
        cost,
        config: w.config.clone(),
        setting: s.setting.map(|k| dev.settings[k].0.to_string()),
        set_to_none: s.set_to_none,
        empty_cache_at_steps: s.empty_cache,
        checkpoint_layers: s.checkpoint.clone(),
        recompute_us_per_step: recompute,
        zero,
        size: None,
        peak_reserved: w.peak_reserved,
        peak_allocated: w.peak_allocated,
        margin: cap.saturating_sub(w.peak_reserved),
        model: roles,
        basis: ran.model.map_or("the recorded requests replayed through the allocator model", |m| m.0).to_string(),
        not_modelled: ran.model.map_or(&[][..], |m| m.1).to_vec(),
    }
}

fn cost_words(s: &Spec, w: &WhatIf, recompute: Option<u64>, zero: Option<&Zero>) -> String {
    let mut v = Vec::new();
    if let Some(z) = zero {
        v.push(match z.bytes_per_step {
            Some(b) => format!("{} GPUs, ~{} sent per rank per step", z.ranks, fs(b)),
            None => format!("{} GPUs (no gradient found to size the communication)", z.ranks),
        });
    }
    if !s.checkpoint.is_empty() {
        v.push(match recompute {
            Some(us) => format!("recompute {} layer(s): ~{:.1} ms per step", s.checkpoint.len(), us as f64 / 1000.0),
            None => format!("recompute {} layer(s) (not timed)", s.checkpoint.len()),
        });
    }
    if s.empty_cache {
        v.push(format!("{} cudaMalloc, {} syncs", w.cuda_mallocs, w.driver.syncs()));
    }
    if s.setting.is_some() {
        v.push("free (environment)".into());
    }
    if s.set_to_none {
        v.push("free (one argument)".into());
    }
    if v.is_empty() {
        v.push("nothing".into());
    }
    v.join("; ")
}

fn verdict(card: &Card, as_recorded: bool, options: &[FitOption], smallest: &[SmallestCapacity]) -> String {
    let on = format!("{} ({})", card.name, fs(card.bytes));
    if as_recorded {
        let m = options.first().map_or(0, |o| o.margin);
        return format!("fits on {on} as recorded, {} to spare", fs(m));
    }
    match options.first() {
        Some(o) => format!(
            "does not fit on {on} as recorded; cheapest: {} (peak reserved {}, {} to spare){}",
            o.change,
            fs(o.peak_reserved),
            fs(o.margin),
            if o.model { ", a model of the change" } else { "" }
        ),
        None => {
            let need: Vec<String> = smallest
                .iter()
                .map(|s| {
                    format!(
                        "{} needs {} ({})",
                        s.change,
                        fs(s.bytes),
                        if s.gpus.is_empty() {
                            "no GPU listed is that large".into()
                        } else if s.gpus.len() == replay::known_gpus().len() {
                            "every GPU listed has it".into()
                        } else {
                            s.gpus.join(", ")
                        }
                    )
                })
                .collect();
            format!("nothing tried fits on {on}; {}", need.join("; "))
        }
    }
}
