//! Explaining a parsed OOM message: the verdict ([`Likely`]), the findings that restate its
//! figures, and the next steps, ending with how to record a snapshot at the next OOM.

use crate::model::{clearly_gt, printed_precision, roughly_ge, slack, MessageForm, OomMessage, GIB, KIB, MIB};
use fragscope_alloc::format_size;
use serde::Serialize;
use std::fmt;

/// What most likely caused the OOM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Likely {
    /// The caching allocator held enough free bytes, in pieces that did not fit.
    Fragmentation,
    /// Live tensors plus the request need more than the GPU has.
    Exhaustion,
    /// Memory outside this process's allocator (other processes, non-PyTorch use) is what
    /// was missing.
    OtherProcesses,
    /// A per-process memory fraction capped the process below the GPU's capacity.
    MemoryFractionCap,
    /// The figures fit two readings (fragmentation, exhaustion) and the text cannot decide
    /// between them: the margin is small, or the cache's free bytes cover the request only
    /// just. A snapshot decides.
    Borderline,
    /// The figures do not point at one cause.
    Unclear,
}

impl fmt::Display for Likely {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Likely::Fragmentation => "fragmentation",
            Likely::Exhaustion => "exhaustion",
            Likely::OtherProcesses => "other processes",
            Likely::MemoryFractionCap => "memory fraction cap",
            Likely::Borderline => "borderline",
            Likely::Unclear => "unclear",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OomExplanation {
    pub verdict: Likely,
    pub headline: String,
    pub findings: Vec<String>,
    pub next_steps: Vec<String>,
}

impl fmt::Display for OomExplanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.headline)?;
        if !self.findings.is_empty() {
            writeln!(f)?;
            for x in &self.findings {
                writeln!(f, "  * {}", x.replace('\n', "\n    "))?;
            }
        }
        if !self.next_steps.is_empty() {
            writeln!(f, "\nNext steps:")?;
            for (i, x) in self.next_steps.iter().enumerate() {
                writeln!(f, "  {}. {}", i + 1, x.replace('\n', "\n     "))?;
            }
        }
        Ok(())
    }
}

/// Explain a parsed message. The rules, in the order they are tried (first match wins):
///
/// * **Fixed forms.** `TooLarge1EB`: a request ≥ 2^60 bytes can never fit; it is a size
///   computation gone wrong → `Exhaustion` with shape advice. `PreemptiveRejection`: the
///   allocator refused to exceed `per_process_memory_fraction` → `MemoryFractionCap`.
///   `Partial`: no figures → `Unclear`.
/// * **Request larger than the GPU** (`S > total`) → `Exhaustion`.
/// * **Fraction cap binding**: `allowed < total` and `reserved + S > allowed` (the allocator
///   will not ask CUDA for more than `allowed`) → `MemoryFractionCap`, unless the request
///   is a large-pool one (a segment over 2 MiB) and the reserved-but-unallocated bytes cover
///   it: the cache is searched before the cap is ever consulted, so those free bytes, were
///   they contiguous, would have served it → `Fragmentation`, with the cap as a finding
///   (seen on an H200, PyTorch 2.11: tests/gpu). A small request's segment (2 MiB) comes
///   from the small pool, which the unallocated figure does not separate, so it stays
///   `MemoryFractionCap`.
/// * **Fragmentation**: reserved-but-unallocated ≥ S. "Reserved by PyTorch but
///   unallocated" is memory PyTorch got from CUDA and keeps cached as free blocks instead of
///   returning it. Before raising the OOM PyTorch has already returned every *fully* free
///   segment and retried, so what is still cached sits in segments that also hold live
///   tensors: the allocator had enough free bytes but no block, or contiguous run, that fit.
/// * **Exhaustion**: live allocated + S > total: even an empty cache and an otherwise idle GPU
///   could not hold it.
/// * **Free covers the request** (`free ≥ S` and no cap): CUDA said there was room, yet the
///   allocation failed; a race with another process or a platform quirk (WSL, MIG, ROCm,
///   unified memory) → `Unclear`.
/// * **Fragmentation (weaker)**: S ≤ unallocated + private-pool free + free: the bytes
///   stranded in the cache, were they contiguous with CUDA's free memory, would have been
///   enough.
/// * Otherwise the request fits the GPU but not this process's share of it. If memory
///   outside this allocator (other processes, or `total − free − reserved` when no process
///   list was printed) is a large share — ≥ 1 GiB and ≥ 10% of the GPU, i.e. more than a
///   CUDA context — → `OtherProcesses`; else → `Exhaustion` (the GPU is effectively full).
///
/// cudaMallocAsync messages print no cache figures (the driver's pool owns the cache), so
/// they use the cap, exhaustion and outside-memory rules only.
///
/// Every explanation ends with the exact calls that record a snapshot at the next OOM, and
/// `fragscope analyze oom.pickle`, which measures what the text can only suggest.
pub fn explain(msg: &OomMessage) -> OomExplanation {
    let mut x = Explainer::new(msg);
    x.run();
    if msg.is_npu() {
        x.findings.push(
            "torch_npu prints PyTorch 2.0's message layout in every version, so the 'legacy' form \
             says nothing about the torch_npu version; its allocator is CUDA's with one rounding \
             difference (32 bytes are added to a request before the 512-byte rounding)."
                .into(),
        );
    }
    x.next_steps.extend(recording_steps(msg));
    OomExplanation { verdict: x.verdict, headline: x.headline, findings: x.findings, next_steps: x.next_steps }
}

struct Explainer<'a> {
    m: &'a OomMessage,
    verdict: Likely,
    headline: String,
    findings: Vec<String>,
    next_steps: Vec<String>,
}

fn fs(b: u64) -> String {
    format_size(b)
}

/// A derived figure with its uncertainty: as [`format_size`] when the uncertainty is within
/// what that display implies (twice half its last digit, which covers any sum of two printed
/// figures), else as the range it may lie in (`174–195 MiB`), never with digits the inputs
/// did not have: `1.25 GiB − 1.24 GiB` is "0–21 MiB", not "10.24 MiB".
pub fn format_size_pm(v: u64, pm: u64) -> String {
    if pm <= 2 * printed_precision(v) {
        return format_size(v);
    }
    let lo = v.saturating_sub(pm);
    let hi = v.saturating_add(pm);
    let (unit, name) = if hi <= KIB {
        (1, "bytes")
    } else if hi <= MIB {
        (KIB, "KiB")
    } else if hi <= GIB {
        (MIB, "MiB")
    } else {
        (GIB, "GiB")
    };
    // decimals: as many as the uncertainty leaves meaningful
    let d: i32 = if pm >= unit || unit == 1 {
        0
    } else if pm.saturating_mul(10) >= unit {
        1
    } else {
        2
    };
    let scale = 10f64.powi(d);
    let lo_v = (lo as f64 / unit as f64 * scale).floor() / scale;
    let hi_v = (hi as f64 / unit as f64 * scale).ceil() / scale;
    format!("{lo_v:.prec$}–{hi_v:.prec$} {name}", prec = d as usize)
}

/// The rounded request sizes (PyTorch's `round_size`, default 512-byte rounding) whose
/// segment — the OOM text's "Tried to allocate" — is `segment`, as inclusive ranges, under
/// the default configuration (`large_segment_size` 20 MiB). Built from the allocator's own
/// constants (`fragscope_alloc::rounding`) and tested against its `allocation_size`.
pub fn requests_for_segment(segment: u64) -> Vec<(u64, u64)> {
    use fragscope_alloc::rounding::{
        LARGE_BUFFER, MIN_BLOCK_SIZE, MIN_LARGE_ALLOC, ROUND_LARGE, SMALL_BUFFER, SMALL_SIZE,
    };
    let mut v = Vec::new();
    if segment == SMALL_BUFFER {
        v.push((MIN_BLOCK_SIZE, SMALL_SIZE));
    }
    if segment == LARGE_BUFFER {
        v.push((SMALL_SIZE + MIN_BLOCK_SIZE, MIN_LARGE_ALLOC - MIN_BLOCK_SIZE));
    }
    if segment >= MIN_LARGE_ALLOC && segment.is_multiple_of(ROUND_LARGE) {
        v.push(((segment - ROUND_LARGE + MIN_BLOCK_SIZE).max(MIN_LARGE_ALLOC), segment));
    }
    v
}

/// `requests_for_segment` in words, for a finding: "more than 1 MiB and less than 10 MiB, or
/// more than 18 MiB and at most 20 MiB".
fn requests_in_words(segment: u64) -> Option<String> {
    let r = requests_for_segment(segment);
    if r.is_empty() {
        return None;
    }
    // "1 MiB", not PyTorch's "1024.00 KiB", for the round boundaries of the rule
    let fs = |v: u64| if v.is_multiple_of(MIB) { format!("{} MiB", v / MIB) } else { format_size(v) };
    let one = |&(lo, hi): &(u64, u64)| {
        // lo is one 512-byte step above a boundary, or the boundary itself (MIN_LARGE_ALLOC)
        if lo == 512 {
            format!("at most {}", fs(hi))
        } else if lo % (1 << 20) == 0 {
            format!("from {} to {}", fs(lo), fs(hi))
        } else {
            let below = lo - 512;
            if hi % (1 << 20) == 0 {
                format!("more than {} and at most {}", fs(below), fs(hi))
            } else {
                format!("more than {} and less than {}", fs(below), fs(hi + 512))
            }
        }
    };
    Some(r.iter().map(one).collect::<Vec<_>>().join(", or "))
}

/// What this platform calls its allocator variable, its process viewer and its driver calls.
struct Names {
    /// `PYTORCH_CUDA_ALLOC_CONF`, `PYTORCH_HIP_ALLOC_CONF` on ROCm, `PYTORCH_NPU_ALLOC_CONF`
    /// on Ascend.
    conf: &'static str,
    /// `nvidia-smi` / `rocm-smi` / `npu-smi info`.
    smi: &'static str,
    /// `CUDA_VISIBLE_DEVICES` / `HIP_VISIBLE_DEVICES` / `ASCEND_RT_VISIBLE_DEVICES`.
    visible: &'static str,
    /// `CUDA` / `HIP` / `NPU`: who hands memory to PyTorch.
    driver: &'static str,
}

fn names(m: &OomMessage) -> Names {
    if m.is_npu() {
        Names {
            conf: "PYTORCH_NPU_ALLOC_CONF",
            smi: "npu-smi info",
            visible: "ASCEND_RT_VISIBLE_DEVICES",
            driver: "NPU",
        }
    } else if m.is_rocm() {
        Names { conf: "PYTORCH_HIP_ALLOC_CONF", smi: "rocm-smi", visible: "HIP_VISIBLE_DEVICES", driver: "HIP" }
    } else {
        Names { conf: "PYTORCH_CUDA_ALLOC_CONF", smi: "nvidia-smi", visible: "CUDA_VISIBLE_DEVICES", driver: "CUDA" }
    }
}

/// The smallest amount the device gives out for this request: a 2 MiB page for the small
/// pool's segments, the 20 MiB large-pool rounding otherwise. A margin below it is no room.
fn granularity(request: u64) -> u64 {
    if request <= 2 * MIB {
        2 * MIB
    } else {
        20 * MIB
    }
}

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "?%".into();
    }
    format!("{:.0}%", part as f64 * 100.0 / whole as f64)
}

/// The cache's figures the fragmentation rules of [`explain`] weigh, with the memory
/// outside the allocator.
struct CacheFigures {
    /// Reserved but unallocated.
    u: u64,
    /// Free in private pools.
    p: u64,
    /// Memory the request could have used had it not been stranded in the cache.
    stranded: u64,
    /// "A large share": a tenth of what PyTorch reserved, or a GiB. Below that, even a
    /// perfectly packed cache would leave almost no headroom; the GPU is simply full.
    stranded_matters: bool,
    /// Memory on the GPU outside this allocator ([`OomMessage::outside_allocator`]).
    outside: Option<u64>,
    /// A CUDA context alone is a few hundred MiB, so outside memory counts as "large" from
    /// 1 GiB and 10% of the GPU.
    outside_large: bool,
}

impl CacheFigures {
    /// The figures of `m`, on a GPU of `t` bytes.
    fn of(m: &OomMessage, t: u64) -> Self {
        let u = m.reserved_unallocated.unwrap_or(0);
        let p = m.private_pools.unwrap_or(0);
        let r = m.reserved_total.unwrap_or(0);
        let stranded = u.saturating_add(p);
        let stranded_matters = stranded.saturating_mul(10) >= r || stranded >= GIB;
        let outside = m.outside_allocator();
        let outside_large = outside.is_some_and(|o| o >= GIB && o.saturating_mul(10) >= t);
        CacheFigures { u, p, stranded, stranded_matters, outside, outside_large }
    }
}

impl<'a> Explainer<'a> {
    fn new(m: &'a OomMessage) -> Self {
        Explainer { m, verdict: Likely::Unclear, headline: String::new(), findings: Vec::new(), next_steps: Vec::new() }
    }

    fn set(&mut self, v: Likely, headline: String) {
        self.verdict = v;
        self.headline = headline;
    }

    fn gpu(&self) -> String {
        match self.m.device {
            Some(d) => format!("GPU {d}"),
            None => "the GPU".into(),
        }
    }

    /// The rules of [`explain`], in order; the first that decides sets the verdict.
    fn run(&mut self) {
        let m = self.m;
        self.describe_figures();
        match m.form {
            MessageForm::TooLarge1EB => return self.too_large(),
            MessageForm::PreemptiveRejection => return self.preemptive(),
            _ => {}
        }
        self.note_missing();
        let Some((s, t)) = self.request_and_capacity() else { return };
        if clearly_gt(s, t, &[s, t]) {
            return self.larger_than_gpu(s, t);
        }
        if self.fraction_cap_binds(s, t) {
            return;
        }
        if m.form == MessageForm::CudaMallocAsync {
            return self.async_backend(s, t);
        }
        let c = CacheFigures::of(m, t);
        if self.cache_alone_held_it(s, t, &c)
            || self.live_tensors_exceed_gpu(s, t)
            || self.cuda_said_there_was_room(s, c.u)
            || self.cache_and_free_held_it(s, t, &c)
        {
            return;
        }
        self.effectively_full(s, t, &c);
    }

    /// A finding for a message that lacks figures: the verdict rests on those present.
    fn note_missing(&mut self) {
        let m = self.m;
        if !m.missing.is_empty() {
            self.findings.push(format!(
                "The text is incomplete: it lacks {} ({}). The verdict uses only the figures \
                 present; paste the whole message (from 'CUDA out of memory' to 'See \
                 documentation for Memory Management ...') for a full one.",
                m.missing.iter().map(|x| format!("'{x}'")).collect::<Vec<_>>().join(", "),
                if m.headerless { "and the 'CUDA out of memory.' sentence" } else { "truncated or partly pasted" }
            ));
        }
    }

    /// The request and the GPU's capacity, the figures every later rule compares; `None`,
    /// with the verdict set, when the figures are inconsistent, the request is missing, or
    /// the capacity is (then only the cache figures can speak: [`Self::without_capacity`]).
    fn request_and_capacity(&mut self) -> Option<(u64, u64)> {
        let m = self.m;
        if !m.inconsistent.is_empty() {
            self.set(
                Likely::Unclear,
                format!(
                    "Unclear: the message is inconsistent: {}. No verdict can rest on figures that \
                     cannot all be true; paste the message exactly as PyTorch printed it, or record a \
                     snapshot (steps below).",
                    m.inconsistent.join("; ")
                ),
            );
            return None;
        }
        let Some(s) = m.tried_to_allocate else {
            self.set(
                Likely::Unclear,
                "Unclear: the text lacks the request size ('Tried to allocate'), so no figure can \
                 be compared with it."
                    .into(),
            );
            return None;
        };
        let Some(t) = m.total_capacity else {
            self.without_capacity(s);
            return None;
        };
        Some((s, t))
    }

    /// Verdict `Exhaustion`: the request `s` is larger than the whole GPU (`t`).
    fn larger_than_gpu(&mut self, s: u64, t: u64) {
        let gpu = self.gpu();
        self.set(
            Likely::Exhaustion,
            format!("Exhaustion: a single allocation of {} is larger than all of {gpu} ({} total).", fs(s), fs(t)),
        );
        self.findings.push(
            "No allocator setting can make this fit. Such sizes usually come from a shape \
             that grew unexpectedly: an accidental broadcast ((N,1) op (1,N) gives N×N), \
             attention scores over a long sequence, or a whole dataset moved to the GPU at \
             once."
                .into(),
        );
        self.next_steps.push(
            "Find the tensor in the traceback's last frame and print its shape; process \
             the input in chunks (tiles, smaller batches, shorter sequences) or use a \
             memory-efficient kernel (e.g. torch.nn.functional.scaled_dot_product_attention)."
                .into(),
        );
    }

    /// The per-process fraction cap: `true`, with the verdict set, when reserved plus the
    /// request reach a cap below the GPU's capacity; else a finding when a cap is set.
    fn fraction_cap_binds(&mut self, s: u64, t: u64) -> bool {
        let m = self.m;
        let reserved = m.reserved_total.or(m.allocated_by_pytorch);
        if let (Some(l), Some(r)) = (m.allowed, reserved) {
            // reserved + request reaching the cap *within rounding* is enough: the figures
            // are rounded, the allocator's check (reserved + size > allowed) was not.
            if clearly_gt(t, l, &[t, l]) && roughly_ge(r.saturating_add(s), l, &[r, s, l]) {
                let u = m.reserved_unallocated.unwrap_or(0);
                if s > 2 * MIB && roughly_ge(u, s, &[u, s]) && m.form != MessageForm::CudaMallocAsync {
                    self.fraction_cap_fragmented(s, t, l, r);
                } else {
                    self.fraction_cap(s, t, l, r);
                }
                return true;
            }
        }
        if let Some(l) = m.allowed {
            if clearly_gt(t, l, &[t, l]) {
                self.findings.push(format!(
                    "A memory fraction caps this process at {} of the {} GPU, but the cap was \
                     not what stopped this allocation.",
                    fs(l),
                    fs(t)
                ));
            }
        }
        false
    }

    /// Fragmentation: the cache alone held enough free bytes (`true`, verdict set). When
    /// memory outside the allocator is both large and bigger than what fragmentation
    /// stranded, that is the bigger lever and leads; fragmentation is then a finding.
    fn cache_alone_held_it(&mut self, s: u64, t: u64, c: &CacheFigures) -> bool {
        let u = c.u;
        if !(roughly_ge(u, s, &[u, s]) && c.stranded_matters) {
            return false;
        }
        if c.outside_large && c.outside.unwrap_or(0) > c.stranded {
            self.other_processes(s, t, c.outside.unwrap_or(0));
            self.findings.push(format!(
                "Fragmentation also played a part: {} sat reserved but unallocated, enough \
                 for this request, in blocks that did not fit it.",
                self.unallocated()
            ));
            return true;
        }
        self.set(
            Likely::Fragmentation,
            format!(
                "Fragmentation likely: PyTorch held {} reserved but unallocated, more than the \
                 {} it tried to allocate, but no cached block fit.",
                self.unallocated(),
                fs(s)
            ),
        );
        self.fragmentation_advice();
        true
    }

    /// Exhaustion: live tensors + the request exceed the GPU (`true`, verdict set).
    fn live_tensors_exceed_gpu(&mut self, s: u64, t: u64) -> bool {
        let m = self.m;
        let gpu = self.gpu();
        if let Some(a) = m.live_allocated() {
            if clearly_gt(a.saturating_add(s), t, &[a, s, t]) {
                self.set(
                    Likely::Exhaustion,
                    format!(
                        "Exhaustion: live tensors ({}) plus this request ({}) exceed {gpu}'s {}.",
                        fs(a),
                        fs(s),
                        fs(t)
                    ),
                );
                self.exhaustion_advice();
                return true;
            }
        }
        false
    }

    /// CUDA said there was room (free ≥ the request), yet the allocation failed: `Unclear`
    /// (`true`, verdict set), with the usual causes; `u` is the cache's unallocated bytes.
    fn cuda_said_there_was_room(&mut self, s: u64, u: u64) -> bool {
        let m = self.m;
        let Some(f) = m.free else { return false };
        if !roughly_ge(f, s, &[f, s]) {
            return false;
        }
        // The driver hands out whole 2 MiB pages; free bytes within a page of the
        // request are not room for it, and the rounding of the figures adds to that.
        let close = !clearly_gt(f, s.saturating_add(2 * MIB), &[f, s]);
        self.set(
            Likely::Unclear,
            if close {
                format!(
                    "Unclear: {} reported {} free, within the driver's 2 MiB page (and \
                     the figures' rounding) of the {} request: too close to tell whether \
                     it could fit.",
                    names(m).driver,
                    fs(f),
                    fs(s)
                )
            } else {
                format!(
                    "Unclear: {} reported {} free, enough for the {} request, yet the \
                     allocation failed.",
                    names(m).driver,
                    fs(f),
                    fs(s)
                )
            },
        );
        self.findings.push(
            "Possible causes: another process allocated between PyTorch's attempt and \
             the report; free memory reported by a virtualised or shared GPU (WSL, \
             MIG, vGPU, unified memory) that cannot actually be mapped; or on ROCm, \
             the driver's own limits."
                .into(),
        );
        if u > 0 {
            self.findings.push(format!(
                "The cache also held {} unallocated; a snapshot would show whether that \
                 was stranded in partly used segments.",
                self.unallocated()
            ));
        }
        true
    }

    /// Stranded cache bytes plus CUDA's free memory would have been enough (`true`,
    /// verdict set): fragmentation when the stranded bytes matter, else borderline; other
    /// processes lead when what they hold is large and bigger.
    fn cache_and_free_held_it(&mut self, s: u64, t: u64, c: &CacheFigures) -> bool {
        let m = self.m;
        let Some(f) = m.free else { return false };
        let (u, p, stranded) = (c.u, c.p, c.stranded);
        // u may be a difference of rounded figures (legacy R − A): its own uncertainty.
        let pm = slack(&[p, f, s]) + m.reserved_unallocated_uncertainty;
        if !(stranded > 0 && stranded.saturating_add(f).saturating_add(pm) >= s) {
            return false;
        }
        if c.outside_large && c.outside.unwrap_or(0) > stranded {
            self.other_processes(s, t, c.outside.unwrap_or(0));
            return true;
        }
        if !c.stranded_matters {
            self.borderline(s, f, u, p);
            return true;
        }
        let gpu = self.gpu();
        self.set(
            Likely::Fragmentation,
            format!(
                "Fragmentation likely: {} reserved but unallocated{} plus {} free on \
                 {gpu} would hold the {} request, had the cached part not been split \
                 among live tensors.",
                self.unallocated(),
                if p > 0 { format!(" and {} free in private pools", fs(p)) } else { String::new() },
                fs(f),
                fs(s)
            ),
        );
        self.fragmentation_advice();
        true
    }

    /// The request fits the GPU but not this process's share: who holds the rest? Other
    /// processes when what they hold is large, else `Exhaustion` (the GPU is effectively
    /// full).
    fn effectively_full(&mut self, s: u64, t: u64, c: &CacheFigures) {
        if c.outside_large {
            return self.other_processes(s, t, c.outside.unwrap_or(0));
        }
        let gpu = self.gpu();
        self.set(
            Likely::Exhaustion,
            format!(
                "Exhaustion: {gpu} is effectively full; the {} request does not fit in what \
                 live tensors and the CUDA context leave over.",
                fs(s)
            ),
        );
        let u = c.u;
        if roughly_ge(u, s, &[u, s]) && u > 0 {
            self.findings.push(format!(
                "The {} reserved but unallocated would have served this one request, but it is \
                 a small share of what PyTorch holds: the next allocation would fail anyway.",
                self.unallocated()
            ));
        }
        self.exhaustion_advice();
    }

    /// `reserved_unallocated` as the text allows: a range when it is a difference of rounded
    /// figures (legacy R − A).
    fn unallocated(&self) -> String {
        format_size_pm(self.m.reserved_unallocated.unwrap_or(0), self.m.reserved_unallocated_uncertainty)
    }

    /// Verdict `Borderline`: the request exceeded CUDA's free memory, the cache's free bytes
    /// (with CUDA's) would have covered it, but they are a small share of what PyTorch holds.
    /// Fragmentation and exhaustion both read these figures; only the free blocks' sizes,
    /// which a snapshot has and the text does not, decide between them.
    fn borderline(&mut self, s: u64, f: u64, u: u64, p: u64) {
        let m = self.m;
        let gpu = self.gpu();
        let n = names(m);
        let short = s.saturating_sub(f);
        let cached = u.saturating_add(p);
        let margin = cached.saturating_add(f).saturating_sub(s);
        let pm = slack(&[p, f, s]) + m.reserved_unallocated_uncertainty;
        let g = granularity(s);
        let unalloc = self.unallocated();
        let pools = if p > 0 { format!(" and {} free in private pools", fs(p)) } else { String::new() };
        self.set(
            Likely::Borderline,
            format!(
                "Borderline: the {} request was {} more than the {} {} had free, while {unalloc} sat \
                 reserved but unallocated in PyTorch's cache{pools}. Whether another allocator setting \
                 would have fit it cannot be told from the text.",
                fs(s),
                fs(short),
                fs(f),
                n.driver,
            ),
        );
        let live = match (m.live_allocated(), m.total_capacity) {
            (Some(a), Some(t)) => format!(" live tensors hold {} of {gpu}'s {}", fs(a), fs(t)),
            _ => String::new(),
        };
        let tight = if margin <= g.saturating_add(pm) {
            format!(
                " With {} to spare, under the driver's {} granularity{}, even a perfect layout would \
                 not have been room.",
                format_size_pm(margin, pm),
                fs(g),
                if pm > 0 { " and the figures' rounding" } else { "" }
            )
        } else {
            String::new()
        };
        self.findings.push(format!(
            "Reading 1, fragmentation: the cache's free bytes plus {}'s free memory ({}) cover the \
             request{}; had the cached bytes been one block, or returnable to {}, it would have been \
             served, and a setting that changes the layout (expandable segments) might have done \
             that.{tight}",
            n.driver,
            format_size_pm(cached.saturating_add(f), pm),
            if cached.saturating_add(f) < s { " if the rounding of the figures went its way" } else { "" },
            n.driver
        ));
        self.findings.push(format!(
            "Reading 2, exhaustion: the cached bytes are a small share of what PyTorch holds and{live}; \
             a layout that served this request would leave almost nothing for the next \
             allocation, so the lasting fix is to use less memory."
        ));
        self.findings.push(
            "What decides: a snapshot dumped at this OOM (steps below) lists every free block of \
             every segment. If no free block is as large as the request while their sum is, it is \
             fragmentation; `fragscope analyze oom.pickle` then replays the run with \
             expandable_segments:True on the same device and says whether it would have fit."
                .into(),
        );
        if m.has_expandable_segments() && !m.expandable_segments_hint {
            self.next_steps.push(format!(
                "Worth a try, not a sure fix: set `{}=expandable_segments:True` in the environment \
                 before the process starts (before its first {} allocation); if the OOM stays, \
                 the memory is really in use.",
                n.conf, n.driver
            ));
        }
        self.next_steps.push(
            "If it is exhaustion: use less memory per step (smaller batch with gradient \
             accumulation, activation checkpointing, lower precision, torch.no_grad() for \
             inference)."
                .into(),
        );
    }

    /// Verdict `OtherProcesses`: `outside` bytes of the GPU are not held by this allocator.
    fn other_processes(&mut self, s: u64, t: u64, outside: u64) {
        let m = self.m;
        let gpu = self.gpu();
        let who = match m.other_process_bytes() {
            Some(o) if o > 0 => format!(", {} of it by other processes", fs(o)),
            _ => String::new(),
        };
        // Without the outside memory the request had outside + free + the cache's free bytes;
        // a margin within the driver's granularity and the figures' rounding is no "fit".
        let pm = m.outside_allocator_uncertainty();
        let room = outside
            .saturating_add(m.free.unwrap_or(0))
            .saturating_add(m.reserved_unallocated.unwrap_or(0))
            .saturating_add(m.private_pools.unwrap_or(0));
        let spare = room.saturating_sub(s);
        let fit = if spare > granularity(s).saturating_add(pm) {
            format!("without it the {} request would fit", fs(s))
        } else {
            format!(
                "without it the {} request would have had {} to spare, within the driver's {} \
                 granularity and the figures' rounding: too little to say it would fit",
                fs(s),
                format_size_pm(spare, pm),
                fs(granularity(s))
            )
        };
        self.set(
            Likely::OtherProcesses,
            format!(
                "Other processes: {} of {gpu} ({} of {}) is held outside this process's PyTorch \
                 allocator{who}; {fit}.",
                format_size_pm(outside, pm),
                pct(outside, t),
                fs(t),
            ),
        );
        self.other_processes_advice();
    }

    /// Findings that restate the figures in plain words, for every form that has them: the
    /// request, the device's free memory, the cache, the processes on the GPU and the
    /// expandable segments.
    fn describe_figures(&mut self) {
        let m = self.m;
        self.describe_request();
        if let (Some(t), Some(f)) = (m.total_capacity, m.free) {
            self.findings.push(format!(
                "{} of {} was free according to {} ({} in use).",
                fs(f),
                fs(t),
                m.accelerator,
                pct(t.saturating_sub(f), t)
            ));
        }
        if let (Some(over), Some(t), Some((r, what))) = (
            m.over_capacity(),
            m.total_capacity,
            m.reserved_total.map(|r| (r, "reserved")).or(m.allocated_by_pytorch.map(|a| (a, "allocated"))),
        ) {
            self.findings.push(format!(
                "PyTorch reports {} {what} on a device of {}, {} more than it has: the driver \
                 was backing GPU memory with system RAM (Windows' \"shared GPU memory\", or a \
                 unified-memory device), which slows every kernel touching it long before this \
                 error. The figures still hold as PyTorch counted them; the memory outside the \
                 allocator cannot be worked out from them.",
                fs(r),
                fs(t),
                fs(over)
            ));
        }
        self.describe_cache();
        self.describe_processes();
        self.describe_expandable_segments();
    }

    /// 'Tried to allocate' in words: the segment PyTorch asked for, and the requests that
    /// ask for it (not for builds old enough to print the rounded request there).
    fn describe_request(&mut self) {
        let m = self.m;
        // Builds old enough to say "cached" (before ~1.5) printed the rounded request here,
        // not the segment size (a 1 MiB request shows as 1024.00 KiB, not 2.00 MiB).
        let says_cached = m.raw.to_ascii_lowercase().contains("cached)");
        if let (Some(s), true, false) = (m.tried_to_allocate, m.form.is_caching_allocator_report(), says_cached) {
            let mut line = format!(
                "'Tried to allocate {}' is the segment size PyTorch asked for, not the tensor's \
                 size. With default settings a request, rounded up to 512 bytes, of at most 1 MiB \
                 asks for a 2 MiB segment; over 1 MiB and under 10 MiB, for a 20 MiB one; 10 MiB \
                 or more, for its size rounded up to a multiple of 2 MiB.",
                fs(s)
            );
            match requests_in_words(s) {
                Some(w) if s == 2 * MIB => line.push_str(&format!(
                    " {} means a small request ({w}): it can only use the small pool, so cached \
                     large-pool blocks could not have served it.",
                    fs(s)
                )),
                Some(w) => line.push_str(&format!(" {} means a request of {w}.", fs(s))),
                None => {}
            }
            self.findings.push(line);
        }
    }

    /// The caching allocator's own accounting (forms that print it): live tensors against
    /// reserved but unallocated, private pools, and the memory outside the allocator.
    fn describe_cache(&mut self) {
        let m = self.m;
        if !m.form.is_caching_allocator_report() {
            return;
        }
        if let (Some(r), Some(a)) = (m.reserved_total, m.live_allocated()) {
            let u = m.reserved_unallocated.unwrap_or(0);
            self.findings.push(format!(
                "PyTorch's caching allocator held {} in total: {} in live tensors and {} \
                 reserved but unallocated (freed blocks it keeps cached for reuse instead \
                 of returning them to {}){}.",
                fs(r),
                fs(a),
                format_size_pm(u, m.reserved_unallocated_uncertainty),
                names(m).driver,
                if m.reserved_unallocated_uncertainty > 2 * printed_precision(u) {
                    format!(
                        "; the message printed only the total and the allocated bytes, each \
                         to ± {}, so their difference is known to ± {}",
                        fs(m.reserved_unallocated_uncertainty / 2),
                        fs(m.reserved_unallocated_uncertainty)
                    )
                } else {
                    String::new()
                }
            ));
        }
        if let Some(p) = m.private_pools.filter(|&p| p > 0) {
            self.findings.push(format!(
                "{} of the 'allocated by PyTorch' figure is free memory held by private \
                 pools (CUDA graphs, torch.cuda.MemPool); only those pools can reuse it.",
                fs(p)
            ));
        }
        if let Some(o) = m.outside_allocator() {
            if o > 0 {
                self.findings.push(format!(
                    "{} of the GPU was in use outside this allocator (other processes, \
                     the {} context, library workspaces, non-PyTorch allocations).",
                    format_size_pm(o, m.outside_allocator_uncertainty()),
                    names(m).driver
                ));
            }
        }
    }

    /// The processes on the GPU, as NVML listed them, and which is probably this one.
    fn describe_processes(&mut self) {
        let m = self.m;
        if !m.processes.is_empty() {
            let own = m.probable_own_process();
            let list: Vec<String> = m
                .processes
                .iter()
                .enumerate()
                .map(|(i, p)| match p.pid {
                    None => format!("this process {}", fs(p.bytes)),
                    Some(pid) if Some(i) == own => {
                        format!("process {pid} {} (probably this process)", fs(p.bytes))
                    }
                    Some(pid) => format!("process {pid} {}", fs(p.bytes)),
                })
                .collect();
            self.findings.push(format!("Processes on the GPU (NVML): {}.", list.join(", ")));
            if own.is_some() && m.processes[own.unwrap()].pid.is_some() {
                self.findings.push(
                    "No 'this process' line was printed; inside a container NVML shows host \
                     PIDs, so the entry matching PyTorch's reserved memory is taken to be this \
                     process."
                        .into(),
                );
            }
        }
    }

    /// Expandable segments: already enabled, or the request over their reserve.
    fn describe_expandable_segments(&mut self) {
        let m = self.m;
        if m.expandable_segments_hint {
            self.findings.push("Expandable segments were already enabled for this run.".into());
        }
        if m.exceeds_expandable_reserve {
            self.findings.push(format!(
                "The request exceeds the expandable-segment reserve{} (the virtual address range \
                 one expandable segment may grow to); the message names the \
                 PYTORCH_CUDA_ALLOC_CONF option that raises it.",
                m.expandable_reserve.map(|r| format!(" of {}", fs(r))).unwrap_or_default()
            ));
            self.next_steps.push(
                "Raise the expandable-segment reserve with the PYTORCH_CUDA_ALLOC_CONF option \
                 the message names, or split the allocation: a request larger than the reserve \
                 cannot be placed in an expandable segment however much memory is free."
                    .into(),
            );
        }
    }

    /// The request is known but not the GPU's capacity (a truncated or partial paste):
    /// fragmentation can still be shown by the cache figures alone; exhaustion cannot.
    fn without_capacity(&mut self, s: u64) {
        let m = self.m;
        let u = m.reserved_unallocated.unwrap_or(0);
        let r = m.reserved_total.unwrap_or(0);
        if roughly_ge(u, s, &[u, s]) && (u.saturating_mul(10) >= r || u >= GIB) {
            self.set(
                Likely::Fragmentation,
                format!(
                    "Fragmentation likely: PyTorch held {} reserved but unallocated, more than the \
                     {} it tried to allocate, but no cached block fit (the GPU's total capacity \
                     is not in the text, so memory used outside PyTorch cannot be weighed).",
                    self.unallocated(),
                    fs(s)
                ),
            );
            return self.fragmentation_advice();
        }
        self.set(
            Likely::Unclear,
            format!(
                "Unclear: without the GPU's total capacity the text cannot tell exhaustion from \
                 memory held elsewhere{}.",
                if m.reserved_unallocated.is_some() {
                    format!("; the {} reserved but unallocated is less than the {} request", self.unallocated(), fs(s))
                } else {
                    String::new()
                }
            ),
        );
    }

    fn fragmentation_advice(&mut self) {
        let m = self.m;
        self.findings.push(format!(
            "At the OOM PyTorch had already returned every fully free cached segment to the driver \
             and retried, so the remaining unallocated bytes sit inside segments that still hold \
             live tensors; {}.empty_cache() cannot release them.",
            if m.is_npu() { "torch.npu" } else { "torch.cuda" }
        ));
        if m.expandable_segments_hint {
            self.next_steps.push(
                "Expandable segments are already on, so what is left is fragmentation inside a \
                 segment: short- and long-lived tensors interleaved. A snapshot (below) shows \
                 which live allocations pin the gaps; allocating long-lived tensors (weights, \
                 optimizer state, KV caches) first and together usually closes them."
                    .into(),
            );
        } else if m.has_expandable_segments() {
            let n = names(m);
            let mut step = format!(
                "Set `{}=expandable_segments:True` in the environment before the process starts \
                 (it is read at the first {} allocation): segments then grow in place instead of \
                 being split, which removes most of this waste.",
                n.conf, n.driver
            );
            if m.is_rocm() {
                step.push_str(
                    " ROCm builds also read PYTORCH_CUDA_ALLOC_CONF, which wins when both are set; \
                     a build without expandable segments on this platform warns \
                     'expandable_segments not supported on this platform' and ignores it.",
                );
            }
            self.next_steps.push(step);
        } else {
            self.next_steps.push(format!(
                "PyTorch ≤ 2.0 has no expandable segments: set \
                 `{}=max_split_size_mb:128` so large cached blocks are never split for small \
                 tensors (tune the value; upgrading to PyTorch ≥ 2.1 gives \
                 `expandable_segments:True`, which works better).",
                names(m).conf
            ));
        }
        self.findings.push(
            "fragscope can measure this instead of inferring it: with a snapshot recorded at the \
             next OOM (see the steps), `fragscope analyze` replays the allocator and shows which \
             segments held the stranded bytes and whether another setting would have fit."
                .into(),
        );
    }

    fn exhaustion_advice(&mut self) {
        self.findings.push(
            "The memory is really in use by live tensors; allocator settings will not make \
             this fit."
                .into(),
        );
        self.next_steps.push(
            "Use less memory per step: a smaller batch (with gradient accumulation to keep the \
             effective batch), activation checkpointing (torch.utils.checkpoint), lower \
             precision (bf16/fp16 autocast, 8-bit optimizer states), or run inference under \
             torch.no_grad()."
                .into(),
        );
        self.next_steps.push(
            "Check that nothing keeps tensors alive by accident (losses accumulated with their \
             graph, lists of outputs, caches); a snapshot shows the largest live allocations \
             and their call sites."
                .into(),
        );
    }

    fn other_processes_advice(&mut self) {
        let n = names(self.m);
        self.findings.push(if self.m.is_npu() {
            "Memory held by other processes, or by this process outside PyTorch's allocator \
             (HCCL buffers, CANN operator workspaces: torch_npu keeps a separate workspace \
             allocator whose memory the caching allocator does not count), is invisible to the \
             caching allocator."
                .to_string()
        } else if self.m.is_rocm() {
            "Memory held by other processes, or by this process outside PyTorch's allocator \
             (another framework, RCCL buffers, rocBLAS/MIOpen workspaces), is invisible to the \
             caching allocator. On a GPU that shares the host's memory (an APU), the total is \
             what the driver may lend, and the host's own use counts as outside."
                .to_string()
        } else {
            "Memory held by other processes, or by this process outside PyTorch's allocator \
             (another framework, NCCL buffers, cuBLAS/cuDNN workspaces), is invisible to the \
             caching allocator."
                .to_string()
        });
        self.next_steps.push(format!(
            "Run `{}` to see who holds the GPU; stop stale processes (old notebooks, \
             dataloader workers, other jobs) or choose a free GPU with {}. \
             Another framework in the same process may preallocate (e.g. JAX: \
             XLA_PYTHON_CLIENT_PREALLOCATE=false; TensorFlow: memory growth).",
            n.smi, n.visible
        ));
    }

    fn fraction_cap(&mut self, s: u64, t: u64, l: u64, r: u64) {
        self.set(
            Likely::MemoryFractionCap,
            format!(
                "Memory fraction cap: this process may use only {} of {}'s {}, and {} reserved \
                 plus the {} request exceed that.",
                fs(l),
                self.gpu(),
                fs(t),
                fs(r),
                fs(s)
            ),
        );
        self.findings.push(format!(
            "The cap comes from torch.cuda.set_per_process_memory_fraction() or \
                 `per_process_memory_fraction` in {}; the allocator will not ask {} for memory \
                 beyond it even when the GPU has room.",
            names(self.m).conf,
            names(self.m).driver
        ));
        if self.m.reserved_unallocated.is_some_and(|u| u >= s) {
            self.findings.push(format!(
                "The cache also held {} unallocated that could not serve the request, so \
                 fragmentation contributed.",
                self.unallocated()
            ));
        }
        self.next_steps.push(
            "Raise or remove the memory fraction if the GPU is not shared; if it is shared on \
             purpose, reduce this process's memory (smaller batch, checkpointing, lower \
             precision)."
                .into(),
        );
    }

    /// A binding cap, and enough reserved-but-unallocated bytes for the request: the cache
    /// failed first (fragmentation), the cap then kept PyTorch from reserving more.
    fn fraction_cap_fragmented(&mut self, s: u64, t: u64, l: u64, r: u64) {
        self.set(
            Likely::Fragmentation,
            format!(
                "Fragmentation likely, under a memory fraction cap: PyTorch held {} reserved but \
                 unallocated, more than the {} it tried to allocate, but no cached block fit; and this \
                 process may use only {} of {}'s {}, which {} reserved plus the request exceed, so it \
                 could not reserve more.",
                self.unallocated(),
                fs(s),
                fs(l),
                self.gpu(),
                fs(t),
                fs(r)
            ),
        );
        self.findings.push(format!(
            "The cap comes from torch.cuda.set_per_process_memory_fraction() or \
             `per_process_memory_fraction` in {}. PyTorch looks for a free cached block before it \
             checks the cap: had the unallocated bytes been in one piece, this request would have \
             fitted without reserving more.",
            names(self.m).conf
        ));
        self.fragmentation_advice();
        self.next_steps.push(
            "Or raise the memory fraction, if the GPU is not shared on purpose: the cap is what \
             turned the fragmentation into an OOM."
                .into(),
        );
    }

    fn preemptive(&mut self) {
        let req =
            self.m.tried_to_allocate.map(|s| format!(" a request of {}", fs(s))).unwrap_or_else(|| " a request".into());
        self.set(
            Likely::MemoryFractionCap,
            format!(
                "Memory fraction cap: the allocator rejected{req} up front because it would \
                 exceed per_process_memory_fraction."
            ),
        );
        self.findings.push(
            "With `throw_on_cudamalloc_oom` and `per_process_memory_fraction` set, PyTorch \
             checks every new segment against the cap and raises without trying CUDA or \
             freeing its cache. The size shown is the request, not a rounded segment."
                .into(),
        );
        self.next_steps.push(
            "Raise per_process_memory_fraction, or reduce this process's peak memory; a \
             snapshot shows the peak and what made it."
                .into(),
        );
    }

    fn too_large(&mut self) {
        self.set(
            Likely::Exhaustion,
            "Exhaustion, by a bug: a single allocation of 1 EiB (2^60 bytes) or more was \
             requested; no GPU can hold it."
                .into(),
        );
        self.findings.push(
            "Such a size is almost always a size computation gone wrong: a negative dimension \
             turned into a huge unsigned number, an overflowing product of dimensions, or a \
             shape built from the wrong variable."
                .into(),
        );
        self.next_steps.push(
            "Print the shapes of the inputs of the operation in the traceback's last frame; \
             the bad dimension is usually obvious."
                .into(),
        );
    }

    fn async_backend(&mut self, s: u64, t: u64) {
        let m = self.m;
        self.findings.push(
            "This process uses the cudaMallocAsync backend (PYTORCH_CUDA_ALLOC_CONF \
             backend:cudaMallocAsync): the CUDA driver's memory pool does the caching, so the \
             message has no reserved/unallocated figures and fragmentation cannot be read from \
             it."
            .into(),
        );
        let gpu = self.gpu();
        if let Some(a) = m.allocated_by_pytorch {
            if clearly_gt(a.saturating_add(s), t, &[a, s, t]) {
                self.set(
                    Likely::Exhaustion,
                    format!(
                        "Exhaustion: {} currently allocated plus the {} request exceed {gpu}'s {}.",
                        fs(a),
                        fs(s),
                        fs(t)
                    ),
                );
                return self.exhaustion_advice();
            }
            if let Some(f) = m.free {
                let outside = t.saturating_sub(f).saturating_sub(a);
                if outside >= GIB && outside.saturating_mul(10) >= t && clearly_gt(s, f, &[s, f]) {
                    self.set(
                        Likely::OtherProcesses,
                        format!(
                            "Other processes: {} of {gpu} is used outside this process's \
                             allocations (other processes, the CUDA context, or memory the \
                             driver pool still caches); the {} request would otherwise fit.",
                            fs(outside),
                            fs(s)
                        ),
                    );
                    return self.other_processes_advice();
                }
            }
        }
        self.set(
            Likely::Unclear,
            format!(
                "Unclear: the {} request should have fit in {gpu}'s {} by these figures; the \
                 driver's pool may be fragmented or holding freed memory.",
                fs(s),
                fs(t)
            ),
        );
    }
}

/// The exact calls that capture a snapshot at the next OOM, for the API of the version that
/// printed the message, then the fragscope command.
fn recording_steps(m: &OomMessage) -> Vec<String> {
    let analyze = "Then run `fragscope analyze oom.pickle`.".to_string();
    if m.is_npu() {
        // torch_npu raises RuntimeError in the ≤ 2.0 layout whatever its version, so the
        // legacy branch's "older than 1.13" reading does not apply; it has its own copy of
        // the recording API (torch_npu.npu.memory, Ascend Extension for PyTorch 6.0.0+).
        return vec![
            "Record a snapshot at the next OOM with torch_npu's recording API (fragscope sees the \
             torch_npu frames in the file and replays it under the NPU allocator's rounding, 32 bytes \
             added before the 512-byte rounding):\n\
             import torch, torch_npu\n\
             torch_npu.npu.memory._record_memory_history(max_entries=100000)  # at the start\n\
             try:\n    main()  # your training / inference code\n\
             except RuntimeError as e:\n\
             \x20   if \"out of memory\" in str(e):\n\
             \x20       torch_npu.npu.memory._dump_snapshot(\"oom.pickle\")\n\
             \x20   raise"
                .to_string(),
            analyze,
        ];
    }
    match m.form {
        MessageForm::Legacy => {
            // RuntimeError (no OutOfMemoryError class yet) or the "cached" wording: < 1.13,
            // which cannot record allocation history at all: upgrading comes first, and the
            // snippet is the one for the version upgraded to (not a 1.13 snippet that this
            // version could not run).
            let old = m.exception.as_deref() == Some("RuntimeError") || m.raw.to_ascii_lowercase().contains("cached)");
            if old {
                return vec![
                    "This message probably comes from a PyTorch older than 1.13 (it was raised as \
                     RuntimeError or says 'cached'), which cannot record allocation history: \
                     upgrade PyTorch first."
                        .into(),
                    format!(
                        "Then record a snapshot at the next OOM:\n{}",
                        record_snippet("torch.cuda.OutOfMemoryError")
                    ),
                    analyze,
                ];
            }
            vec![
                "Record a snapshot at the next OOM (PyTorch 1.13 / 2.0 API):\n\
                 import pickle, torch\n\
                 torch.cuda.memory._record_memory_history(True, trace_alloc_max_entries=100000)  # at the start\n\
                 try:\n    main()  # your training / inference code\n\
                 except torch.cuda.OutOfMemoryError:\n\
                 \x20   with open(\"oom.pickle\", \"wb\") as f:\n\
                 \x20       pickle.dump(torch.cuda.memory._snapshot(), f)\n\
                 \x20   raise"
                    .to_string(),
                analyze,
            ]
        }
        MessageForm::CudaMallocAsync => vec![
            format!(
                "The cudaMallocAsync backend cannot record allocation history. Reproduce once \
                 with the native allocator (drop `backend:cudaMallocAsync` from \
                 PYTORCH_CUDA_ALLOC_CONF) and record a snapshot:\n{}",
                record_snippet("torch.cuda.OutOfMemoryError")
            ),
            analyze,
        ],
        _ => {
            // The top-level alias torch.OutOfMemoryError only exists from 2.4 (on 2.1–2.3 the
            // `except` clause itself raises AttributeError and no snapshot is written);
            // torch.cuda.OutOfMemoryError works from 1.13 on, so it is the default, and the
            // message's own exception name is kept when it printed one.
            let exc = match m.exception.as_deref() {
                Some(e) if e.ends_with("OutOfMemoryError") && e.starts_with("torch.") => e,
                _ => "torch.cuda.OutOfMemoryError",
            };
            vec![format!("Record a snapshot at the next OOM:\n{}", record_snippet(exc)), analyze]
        }
    }
}

fn record_snippet(exc: &str) -> String {
    format!(
        "import torch\n\
         torch.cuda.memory._record_memory_history(max_entries=100000)  # at the start\n\
         try:\n    main()  # your training / inference code\n\
         except {exc}:\n\
         \x20   torch.cuda.memory._dump_snapshot(\"oom.pickle\")\n\
         \x20   raise"
    )
}
