//! Who holds the memory: live bytes by call site at the allocated and reserved peaks,
//! by `record_function` scope (`external_annotations`), and the call sites whose few
//! small blocks keep whole segments reserved ("pinned segments").
//!
//! # Call sites
//!
//! A block's site is the innermost *user* frame of its allocation stack, written
//! `file:line:function` with the file's base name (the full path is in `file`). Frames
//! that are not user code are skipped: PyTorch itself (paths with a `torch/` directory,
//! e.g. `site-packages/torch/...`, and inductor's generated `torchinductor_*` code), the
//! Python standard library (`lib/python3.x/` outside `site-packages`, on Windows
//! `<prefix>\Lib\` outside `site-packages`, `runpy`),
//! `<frozen ...>` and other `<...>` pseudo-files, `??`, and C/C++ frames (a line of 0
//! without a `.py` file, or a `.c`/`.cc`/`.cpp`/`.h`/`.cu`/`.S` file). Third-party Python
//! packages (transformers, peft, ...) count as user code: for their users that is where
//! the tensor was made. When every frame is library code, the innermost Python frame is
//! used, and a stack of C++ frames only is `<no python frames> OP (Node)`: the
//! innermost `at::_ops::OP` frame and autograd node (`<no python frames>` alone when
//! neither is found); a block without frames
//! is `<no stack>`, unless it was live before the trace began (then
//! `<allocated before recording>`: the trace has no allocation stack for it).
//!
//! The folded `stack` runs outer → inner with `;`, user frames as `file:line:function`,
//! each run of library frames collapsed to `…`, and at most [`FOLD_FRAMES`] user frames.
//!
//! # Pinned segments
//!
//! Same rule as `summary`'s `pinned_segments` (so the counts agree): a non-expandable
//! segment with at least one active block whose active bytes are ≤ 10% of the segment,
//! or ≤ 2 active blocks holding ≤ 25% of it. `empty_cache()` releases only segments
//! without active blocks, so their free part stays reserved. Each pinned segment is
//! charged to the site of its largest active block. Computed on the final state (the
//! only moment whose segment layout is recorded without an allocator model).

use std::collections::BTreeMap;

use fragscope_snapshot::{FrameTable, FxHashMap, Snapshot, StackId, StrId, NO_TIME};
use serde::Serialize;

use crate::blocks::is_pinned;
use crate::contexts::{context_key_id, context_key_named, ContextField};
use crate::scopes::Scopes;
use crate::timeline::{self, DeviceTimeline, LiveBlock, Peak};

/// User frames kept in a folded stack (innermost ones).
pub(crate) const FOLD_FRAMES: usize = 8;
/// Site of blocks without frames.
pub(crate) const NO_STACK: &str = "<no stack>";
/// Site of blocks whose stack has no Python frame at all.
pub(crate) const NO_PYTHON: &str = "<no python frames>";
/// Site of blocks live before the trace began whose allocation stack is unknown.
pub(crate) const BEFORE_RECORDING: &str = "<allocated before recording>";

/// A call site.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Site {
    /// `file:line:function` of the innermost user frame (base name of the file), or
    /// [`NO_STACK`] / [`BEFORE_RECORDING`].
    pub site: String,
    /// Full file name as recorded (empty for the placeholders).
    pub file: String,
    pub line: i64,
    pub function: String,
    /// Folded stack, outer → inner (see module doc).
    pub stack: String,
}

/// Is this frame library code rather than the user's (module doc)?
pub fn is_library_frame(file: &str, line: i64) -> bool {
    let f = file.replace('\\', "/");
    let lower = f.to_ascii_lowercase();
    let py = lower.ends_with(".py");
    f.is_empty()
        || f == "??"
        || f.starts_with('<')
        || (line == 0 && !py)
        || [".c", ".cc", ".cpp", ".cxx", ".h", ".hpp", ".cu", ".cuh", ".s", ".asm"].iter().any(|x| lower.ends_with(x))
        || lower.starts_with("torch/")
        || lower.contains("/torch/")
        || lower.contains("torchinductor_")
        || lower.contains("runpy")
        || ((lower.contains("/lib/python")
            || lower.contains("/lib/pypy")
            // Windows installs keep the standard library in `<prefix>\Lib\`.
            || (file.contains('\\') && lower.contains("/lib/")))
            && !lower.contains("site-packages")
            && !lower.contains("dist-packages"))
}

fn base_name(file: &str) -> &str {
    file.rsplit(['/', '\\']).next().unwrap_or(file)
}

fn frame_label(file: &str, line: i64, name: &str) -> String {
    format!("{}:{line}:{name}", base_name(file))
}

/// The operator of a C++-only stack (innermost first): the innermost
/// `at::_ops::<op>::` frame, with the innermost autograd node
/// (`torch::autograd::generated::<Node>`) when there is one, as `op (Node)`; else the
/// innermost frame outside the allocator and tensor-factory machinery.
fn cpp_site(all: &[(&str, i64, &str)]) -> Option<String> {
    let between = |name: &str, prefix: &str| -> Option<String> {
        let p = name.find(prefix)? + prefix.len();
        let rest = &name[p..];
        let end = rest.find([':', '(', '<', ' ']).unwrap_or(rest.len());
        (end > 0).then(|| rest[..end].to_string())
    };
    let op = all.iter().find_map(|(_, _, n)| between(n, "at::_ops::"));
    // `generated::details::` holds helpers shared by many nodes, not a node.
    let node = all.iter().filter_map(|(_, _, n)| between(n, "torch::autograd::generated::")).find(|x| x != "details");
    match (op, node) {
        (Some(o), Some(n)) => Some(format!("{o} ({n})")),
        (Some(o), None) => Some(o),
        (None, Some(n)) => Some(n),
        (None, None) => {
            let machinery = [
                "torch::unwind",
                "torch::CapturedTraceback",
                "torch::cuda::",
                "c10::",
                "at::detail::",
                "at::TensorBase at::detail",
                "at::empty",
                "at::native::empty",
                "unwind",
                "gather",
            ];
            all.iter()
                .map(|(_, _, n)| *n)
                .find(|n| {
                    !n.is_empty() && !machinery.iter().any(|m| n.starts_with(m) || n.contains("CachingAllocator"))
                })
                .map(|n| {
                    let short = n.split('(').next().unwrap_or(n);
                    short.chars().take(80).collect()
                })
        }
    }
}

/// The site of a stack (module doc).
pub fn site_of(frames: &FrameTable, stack: Option<StackId>) -> Site {
    let placeholder = |s: &str| Site {
        site: s.to_string(),
        file: String::new(),
        line: 0,
        function: String::new(),
        stack: s.to_string(),
    };
    let Some(id) = stack else { return placeholder(NO_STACK) };
    let all: Vec<(&str, i64, &str)> = frames.resolved(id).collect();
    if all.is_empty() {
        return placeholder(NO_STACK);
    }
    let user: Vec<bool> = all.iter().map(|(f, l, _)| !is_library_frame(f, *l)).collect();
    let pick = user
        .iter()
        .position(|&u| u)
        .or_else(|| all.iter().position(|(f, _, _)| f.to_ascii_lowercase().ends_with(".py") && !f.starts_with('<')))
        .unwrap_or(0);
    if !user[pick] && !all[pick].0.to_ascii_lowercase().ends_with(".py") {
        // Only C++ frames (e.g. `torch::unwind::unwind`): no Python caller was recorded.
        // Name the operator (and the autograd node running it) so that different C++
        // call paths stay apart.
        return match cpp_site(&all) {
            Some(op) => {
                let label = format!("{NO_PYTHON} {op}");
                Site { site: label.clone(), file: String::new(), line: 0, function: op, stack: label }
            }
            None => placeholder(NO_PYTHON),
        };
    }
    let (file, line, function) = all[pick];
    // Outer → inner, library runs collapsed.
    let mut parts: Vec<String> = Vec::new();
    let mut kept = 0usize;
    for (i, (f, l, n)) in all.iter().enumerate() {
        // `all` is innermost first: walk it inner → outer and reverse at the end.
        if user[i] || i == pick {
            if kept == FOLD_FRAMES {
                if parts.last().map(String::as_str) != Some("…") {
                    parts.push("…".into());
                }
                break;
            }
            parts.push(frame_label(f, *l, n));
            kept += 1;
        } else if parts.last().map(String::as_str) != Some("…") {
            parts.push("…".into());
        }
    }
    parts.reverse();
    Site {
        site: frame_label(file, line, function),
        file: file.to_string(),
        line,
        function: function.to_string(),
        stack: parts.join(";"),
    }
}

/// Interns sites: stack → site index, site string → index.
#[derive(Default)]
pub struct SiteTable {
    /// Site of each stack seen: at `1 + stack index` (0: no stack), `u32::MAX` when not
    /// yet seen. Indexed, not hashed: it is asked once per block of the trace.
    by_stack: Vec<u32>,
    by_name: FxHashMap<String, usize>,
    pub sites: Vec<Site>,
    before: Option<usize>,
}

impl SiteTable {
    pub fn id(&mut self, frames: &FrameTable, stack: Option<StackId>) -> usize {
        let k = stack.map_or(0, |s| s.index() + 1);
        if let Some(&i) = self.by_stack.get(k).filter(|&&i| i != u32::MAX) {
            return i as usize;
        }
        let s = site_of(frames, stack);
        let i = self.intern(s);
        if self.by_stack.len() <= k {
            self.by_stack.resize(k + 1, u32::MAX);
        }
        self.by_stack[k] = u32::try_from(i).unwrap_or(u32::MAX);
        i
    }
    fn intern(&mut self, s: Site) -> usize {
        match self.by_name.get(&s.site) {
            Some(&i) => i,
            None => {
                let i = self.sites.len();
                self.by_name.insert(s.site.clone(), i);
                self.sites.push(s);
                i
            }
        }
    }
    /// Site of a live block: its stack, or [`BEFORE_RECORDING`] for a block seeded at
    /// t = 0 without one.
    pub fn of_block(&mut self, frames: &FrameTable, stack: Option<StackId>, before_trace: bool) -> usize {
        if before_trace && stack.is_none_or(|s| frames.stack(s).is_empty()) {
            if let Some(i) = self.before {
                return i;
            }
            let i = self.intern(Site {
                site: BEFORE_RECORDING.into(),
                file: String::new(),
                line: 0,
                function: String::new(),
                stack: BEFORE_RECORDING.into(),
            });
            self.before = Some(i);
            return i;
        }
        self.id(frames, stack)
    }
}

/// Live bytes of one site.
#[derive(Clone, Debug, Serialize)]
pub struct SiteBytes {
    #[serde(flatten)]
    pub site: Site,
    pub bytes: u64,
    pub blocks: u64,
    pub requested_bytes: u64,
    /// `bytes` / all live bytes at that moment.
    pub share: f64,
}

/// Live bytes allocated inside one `record_function` scope (any occurrence of the name).
#[derive(Clone, Debug, Serialize)]
pub struct AnnotationBytes {
    pub name: String,
    pub bytes: u64,
    pub blocks: u64,
}

/// Which peak a [`PeakAttribution`] is at (`at` in JSON).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PeakKind {
    AllocatedPeak,
    ReservedPeak,
}

impl PeakKind {
    /// The name JSON gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            PeakKind::AllocatedPeak => "allocated_peak",
            PeakKind::ReservedPeak => "reserved_peak",
        }
    }
}

impl std::fmt::Display for PeakKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who holds the memory at one moment.
#[derive(Clone, Debug, Serialize)]
pub struct PeakAttribution {
    pub at: PeakKind,
    pub event_index: Option<usize>,
    pub time_us: Option<i64>,
    /// Allocated bytes / blocks at that moment.
    pub live_bytes: u64,
    pub live_blocks: u64,
    /// Of which live before the trace began.
    pub before_trace_bytes: u64,
    /// Bytes of the peak no block explains (a profiler trace's baseline, see
    /// `timeline::Seeded::profiler_baseline_bytes`); `live_bytes` excludes them.
    pub unattributed_bytes: u64,
    /// Top sites by bytes.
    pub sites: Vec<SiteBytes>,
    /// Sites beyond the top ones: how many, and their bytes.
    pub other_sites: u64,
    pub other_sites_bytes: u64,
    /// Scopes open at that moment, outer → inner (empty without annotations or times).
    pub open_annotations: Vec<String>,
    /// Top scopes by live bytes allocated inside them (nested scopes both count).
    pub by_annotation: Vec<AnnotationBytes>,
    /// Live bytes by the `compile_context` of their allocation (the `torch.compile`
    /// region; [`crate::context_key`]); absent unless a live block was allocated in one.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub by_compile_context: Vec<AnnotationBytes>,
    /// Live bytes by the `user_metadata` of their allocation; absent unless a live
    /// block's allocation carries a string the program set.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub by_user_metadata: Vec<AnnotationBytes>,
}

/// `blocks` grouped by `field` of their allocation, most bytes first, the first `top`;
/// empty when no block has a string the program or `torch.compile` set (only
/// placeholders: before the trace, not recorded, none set, outside compiled regions), as
/// annotations are listed only when a file has them.
fn by_context(
    snap: &Snapshot,
    device: i64,
    blocks: &[LiveBlock],
    field: ContextField,
    top: usize,
) -> Vec<AnnotationBytes> {
    let set = |key: &str| !(key.starts_with('(') || key.starts_with("N/A ("));
    // Only strings the trace's entry contexts hold can be keys: without one the program
    // or `torch.compile` set, nothing to list, and no look at the blocks' entries.
    if !snap.contexts.iter().filter_map(|c| field.of(c)).any(|id| set(&context_key_named(snap, Some(Some(id)), field)))
    {
        return Vec::new();
    }
    // By string id first, then by name: a `String` per distinct id, not per block (a
    // peak holds hundreds of thousands of blocks and a few contexts).
    let mut by_id: FxHashMap<Option<Option<StrId>>, (u64, u64)> = FxHashMap::default();
    for b in blocks {
        let e = by_id.entry(context_key_id(snap, device, b.alloc_event, field)).or_default();
        e.0 += b.size;
        e.1 += 1;
    }
    let mut m: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut any_set = false;
    for (id, (bytes, n)) in by_id {
        let key = context_key_named(snap, id, field);
        any_set |= set(&key);
        let e = m.entry(key).or_default();
        e.0 += bytes;
        e.1 += n;
    }
    if !any_set {
        return Vec::new();
    }
    let mut v: Vec<AnnotationBytes> =
        m.into_iter().map(|(name, (bytes, blocks))| AnnotationBytes { name, bytes, blocks }).collect();
    v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    v.truncate(top);
    v
}

/// One group of pinned segments (module doc).
#[derive(Clone, Debug, Serialize)]
pub struct PinnedGroup {
    /// Site of the largest active block of each segment in the group.
    #[serde(flatten)]
    pub site: Site,
    pub segments: u64,
    pub reserved_bytes: u64,
    /// Not-active bytes inside these segments (what pinning wastes).
    pub free_bytes: u64,
    pub live_blocks: u64,
    pub live_bytes: u64,
    pub largest_live_block: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct PinnedSegments {
    /// The rule, in words.
    pub definition: &'static str,
    pub segments: u64,
    pub reserved_bytes: u64,
    pub free_bytes: u64,
    /// Groups by site, most reserved bytes first (top N).
    pub by_site: Vec<PinnedGroup>,
}

pub(crate) const PINNED_DEFINITION: &str = "final state; non-expandable segment with active blocks whose active bytes are <= 10% of the segment, or <= 2 active blocks holding <= 25% of it (same rule as summary's pinned_segments)";

/// Attribution of one device.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceAttribution {
    pub device: i64,
    pub allocated_peak: PeakAttribution,
    pub reserved_peak: PeakAttribution,
    pub pinned_segments: PinnedSegments,
}

/// Options of [`attribute`].
#[derive(Clone, Copy, Debug)]
pub struct AttributionOptions {
    /// Sites / scopes / pinned groups listed (the rest is summed).
    pub top: usize,
}

impl Default for AttributionOptions {
    fn default() -> Self {
        AttributionOptions { top: 10 }
    }
}

/// Live bytes per site of a set of live blocks, every site, most bytes first.
pub fn bytes_by_site(snap: &Snapshot, blocks: &[LiveBlock]) -> Vec<SiteBytes> {
    let mut table = SiteTable::default();
    let mut acc: Vec<(u64, u64, u64)> = Vec::new();
    let total: u64 = blocks.iter().map(|b| b.size).sum();
    for b in blocks {
        let i = table.of_block(&snap.frames, b.stack, b.alloc_event.is_none());
        if acc.len() <= i {
            acc.resize(i + 1, (0, 0, 0));
        }
        acc[i].0 += b.size;
        acc[i].1 += 1;
        acc[i].2 += b.requested;
    }
    let mut v: Vec<SiteBytes> = table
        .sites
        .into_iter()
        .zip(acc)
        .map(|(site, (bytes, blocks, req))| SiteBytes {
            site,
            bytes,
            blocks,
            requested_bytes: req,
            share: if total == 0 { 0.0 } else { bytes as f64 / total as f64 },
        })
        .collect();
    v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.site.site.cmp(&b.site.site)));
    v
}

fn peak_attribution(
    snap: &Snapshot,
    device: i64,
    scopes: &Scopes,
    at: PeakKind,
    peak: &Peak,
    blocks: &[LiveBlock],
    top: usize,
) -> PeakAttribution {
    let mut sites = bytes_by_site(snap, blocks);
    let rest = if sites.len() > top { sites.split_off(top) } else { Vec::new() };
    let mut by_name: BTreeMap<usize, (u64, u64)> = BTreeMap::new();
    for b in blocks {
        let mut names = scopes.open_at(b.alloc_time_us.unwrap_or(NO_TIME));
        names.sort_unstable();
        names.dedup();
        for n in names {
            let e = by_name.entry(n).or_default();
            e.0 += b.size;
            e.1 += 1;
        }
    }
    let mut by_annotation: Vec<AnnotationBytes> = by_name
        .into_iter()
        .map(|(n, (bytes, blocks))| AnnotationBytes { name: scopes.names[n].clone(), bytes, blocks })
        .collect();
    by_annotation.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    by_annotation.truncate(top);
    let live_bytes: u64 = blocks.iter().map(|b| b.size).sum();
    PeakAttribution {
        unattributed_bytes: peak.bytes.saturating_sub(live_bytes),
        at,
        event_index: peak.event_index,
        time_us: peak.time_us,
        live_bytes,
        live_blocks: blocks.len() as u64,
        before_trace_bytes: blocks.iter().filter(|b| b.alloc_event.is_none()).map(|b| b.size).sum(),
        sites,
        other_sites: rest.len() as u64,
        other_sites_bytes: rest.iter().map(|s| s.bytes).sum(),
        open_annotations: scopes
            .open_at(peak.time_us.unwrap_or(NO_TIME))
            .into_iter()
            .map(|n| scopes.names[n].clone())
            .collect(),
        by_annotation,
        by_compile_context: by_context(snap, device, blocks, ContextField::CompileContext, top),
        by_user_metadata: by_context(snap, device, blocks, ContextField::UserMetadata, top),
    }
}

/// Pinned segments of the final state, grouped by site (module doc).
pub(crate) fn pinned_segments(snap: &Snapshot, device: i64, top: usize) -> PinnedSegments {
    let mut table = SiteTable::default();
    let mut groups: Vec<Option<PinnedGroup>> = Vec::new();
    let (mut n, mut reserved, mut free) = (0u64, 0u64, 0u64);
    for seg in snap.device_segments(device) {
        if seg.is_expandable == Some(true) {
            continue;
        }
        let live: Vec<_> = seg.blocks.iter().filter(|b| b.state.is_active()).collect();
        let live_bytes: u64 = live.iter().map(|b| b.size).sum();
        let total = seg.total_size;
        if !is_pinned(seg, live.len(), live_bytes) {
            continue;
        }
        n += 1;
        reserved += total;
        free += total.saturating_sub(live_bytes);
        let largest = live.iter().max_by_key(|b| (b.size, std::cmp::Reverse(b.address))).unwrap();
        let stack = largest.stack.or_else(|| largest.history.as_ref().and_then(|h| h.first()).and_then(|h| h.stack));
        let i = table.id(&snap.frames, stack);
        if groups.len() <= i {
            groups.resize(i + 1, None);
        }
        let g = groups[i].get_or_insert_with(|| PinnedGroup {
            site: table.sites[i].clone(),
            segments: 0,
            reserved_bytes: 0,
            free_bytes: 0,
            live_blocks: 0,
            live_bytes: 0,
            largest_live_block: 0,
        });
        g.segments += 1;
        g.reserved_bytes += total;
        g.free_bytes += total.saturating_sub(live_bytes);
        g.live_blocks += live.len() as u64;
        g.live_bytes += live_bytes;
        g.largest_live_block = g.largest_live_block.max(live.iter().map(|b| b.size).max().unwrap_or(0));
    }
    let mut by_site: Vec<PinnedGroup> = groups.into_iter().flatten().collect();
    by_site.sort_by(|a, b| b.reserved_bytes.cmp(&a.reserved_bytes).then_with(|| a.site.site.cmp(&b.site.site)));
    by_site.truncate(top);
    PinnedSegments { definition: PINNED_DEFINITION, segments: n, reserved_bytes: reserved, free_bytes: free, by_site }
}

impl PinnedGroup {
    /// One sentence: "12 segments totalling 3.10 GiB are held by 41 blocks of ≤ 2.00 MiB
    /// allocated at optimizer.py:112:step".
    pub fn describe(&self, fmt_bytes: impl Fn(u64) -> String) -> String {
        format!(
            "{} segment{} totalling {} {} held by {} block{} of <= {} allocated at {}",
            self.segments,
            if self.segments == 1 { "" } else { "s" },
            fmt_bytes(self.reserved_bytes),
            if self.segments == 1 { "is" } else { "are" },
            self.live_blocks,
            if self.live_blocks == 1 { "" } else { "s" },
            fmt_bytes(self.largest_live_block),
            self.site.site
        )
    }
}

/// Attribution of one device, given its timeline (for the peak positions).
pub fn attribute(snap: &Snapshot, tl: &DeviceTimeline, opts: &AttributionOptions) -> DeviceAttribution {
    let device = tl.device;
    let at = [tl.peak_allocated.event_index, tl.peak_reserved.event_index];
    // The lives of the timeline's own walk when it kept them, else a walk of the trace.
    let sets = match &tl.lives {
        Some(l) => l.live_sets_at(snap, &at),
        None => timeline::live_sets_at(snap, device, &at),
    };
    let scopes = Scopes::new(snap, device);
    DeviceAttribution {
        device,
        allocated_peak: peak_attribution(
            snap,
            device,
            &scopes,
            PeakKind::AllocatedPeak,
            &tl.peak_allocated,
            &sets[0],
            opts.top,
        ),
        reserved_peak: peak_attribution(
            snap,
            device,
            &scopes,
            PeakKind::ReservedPeak,
            &tl.peak_reserved,
            &sets[1],
            opts.top,
        ),
        pinned_segments: pinned_segments(snap, device, opts.top),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_snapshot::Frame;

    fn stack(t: &mut FrameTable, frames: &[(&str, i64, &str)]) -> StackId {
        let ids: Vec<_> = frames
            .iter()
            .map(|&(f, l, n)| {
                let frame = Frame { filename: t.intern_str(f), line: l, name: t.intern_str(n) };
                t.intern_frame(frame)
            })
            .collect();
        t.intern_stack(&ids)
    }

    #[test]
    fn innermost_user_frame_and_folding() {
        let mut t = FrameTable::default();
        let s = stack(
            &mut t,
            &[
                ("??", 0, "c10::cuda::CUDACachingAllocator::malloc"),
                ("/usr/lib/python3.11/site-packages/torch/nn/modules/linear.py", 125, "forward"),
                ("/usr/lib/python3.11/site-packages/torch/nn/modules/module.py", 1750, "_call_impl"),
                ("/home/u/model.py", 88, "forward"),
                ("/usr/lib/python3.11/site-packages/torch/nn/modules/module.py", 1750, "_call_impl"),
                ("/home/u/train.py", 40, "main"),
                ("<frozen runpy>", 88, "_run_code"),
            ],
        );
        let site = site_of(&t, Some(s));
        assert_eq!(site.site, "model.py:88:forward");
        assert_eq!(site.file, "/home/u/model.py");
        assert_eq!(site.stack, "…;train.py:40:main;…;model.py:88:forward;…");
        let w = stack(
            &mut t,
            &[
                ("C:\\env\\Lib\\site-packages\\torch\\functional.py", 3, "f"),
                ("C:\\env\\Lib\\copy.py", 153, "deepcopy"),
                ("C:\\research\\opt.py", 7, "step"),
            ],
        );
        assert_eq!(site_of(&t, Some(w)).site, "opt.py:7:step");
        let lib = stack(&mut t, &[("??", 0, "malloc"), ("/x/torch/nn/functional.py", 5, "linear")]);
        assert_eq!(site_of(&t, Some(lib)).site, "functional.py:5:linear");
        let empty = t.intern_stack(&[]);
        assert_eq!(site_of(&t, Some(empty)).site, NO_STACK);
        assert_eq!(site_of(&t, None).site, NO_STACK);
    }
}
