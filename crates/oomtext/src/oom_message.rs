//! Parse and explain the *text* of a PyTorch CUDA out-of-memory error (`fragscope oom`).
//!
//! A user who hit an OOM usually has nothing but the error text: no snapshot was recorded.
//! The text still carries the allocator's own accounting at the moment of failure, and that
//! is often enough to tell fragmentation from real exhaustion, and always enough to tell the
//! user how to record a snapshot next time (then `fragscope analyze` can measure it).
//!
//! # Message forms (spec `pytorch-allocator.md` §13)
//!
//! | [`MessageForm`] | how it is recognised | PyTorch |
//! |---|---|---|
//! | `Legacy` | `Tried to allocate S (GPU d; T total capacity; A already allocated; F free; [L allowed;] R reserved in total by PyTorch)`; very old builds print `X cached` (= reserved but unallocated) instead of `reserved in total` | ≤ 2.0 |
//! | `V2_1` | `GPU d has a total capacty of` (the typo) | 2.1 |
//! | `V2_2` | `GPU d has a total capacity of …`, no 2.5-only parts | 2.2 – 2.4, and later builds when neither a memory fraction nor private-pool memory is printed |
//! | `V2_5` | as `V2_2` plus `L allowed;` and/or `with P allocated in private pools` | ~2.5 onward |
//! | `Recent` | the `docs.pytorch.org` link, `expandable_segments is enabled`, or the expandable-segment reserve sentence | recent main |
//! | `PreemptiveRejection` | `Allocation was preemptively rejected because it would exceed per_process_memory_fraction limit. Requested size: n` | 2.12+ |
//! | `CudaMallocAsync` | `Allocation on device d would exceed allowed memory. (out of memory)` and the `Currently allocated : …` lines | `backend:cudaMallocAsync` |
//! | `TooLarge1EB` | `Tried to allocate more than 1EB memory.` | request ≥ 2^60 bytes |
//! | `Partial` | `CUDA out of memory.` was found but the rest is missing (a truncated paste, an issue title) | — |
//!
//! ROCm builds print the same text with `HIP` for `CUDA` (`HIP out of memory`, `(e.g., HIP
//! Graphs)`); they are accepted, [`OomMessage::accelerator`] says which word was used, and the
//! advice then names ROCm's own variables and tools (`PYTORCH_HIP_ALLOC_CONF`, `rocm-smi`).
//! Intel XPU and Apple MPS messages come from other allocators (other rounding, other
//! settings): they are refused with [`ParseError::Unsupported`], not read as CUDA.
//!
//! A message whose figures cannot all be true (free or allocated above the total, a negative
//! size, …) is parsed as printed, and [`OomMessage::inconsistent`] names the figures; the
//! explanation then gives no verdict.
//!
//! # Figures and their precision
//!
//! PyTorch prints sizes with `format_size` (§13.1): `x ≤ 1024` → `"<x> bytes"` (exact), else
//! two decimals of KiB / MiB / GiB. A parsed size is the printed value × unit, rounded to the
//! nearest byte; the true value lies within ± half a unit in the last printed digit, i.e.
//! ±5.12 bytes for KiB figures, ±5 KiB for MiB figures and ±5 MiB for GiB figures
//! ([`printed_precision`]). Every comparison in [`explain`] allows for that slack, so a rule
//! never fires on rounding noise.
//!
//! What the figures mean is version dependent and the parser normalises them:
//! * `tried_to_allocate` is the *segment* size the allocator asked CUDA for (§1.5, on the
//!   request rounded to 512 bytes: up to 1 MiB → a 2 MiB segment; over 1 MiB and under 10 MiB
//!   → a 20 MiB one (the default `large_segment_size`); 10 MiB and over → rounded up to a
//!   multiple of 2 MiB, so 20 MiB is also what a request of 18–20 MiB asks for), not the
//!   tensor size; [`requests_for_segment`] inverts it with the rounding code itself. The
//!   preemptive-rejection and cudaMallocAsync forms print the request.
//! * From 2.5, "allocated by PyTorch" includes `P`, the *free* cached blocks held by private
//!   pools (CUDA graphs, `MemPool`), and "reserved but unallocated" excludes them. Both are
//!   kept as printed; [`OomMessage::live_allocated`] subtracts `P`.
//! * `reserved_total` is printed only by the legacy form; for 2.x forms it is derived as
//!   allocated + unallocated (= `R` exactly, because PyTorch printed `A+P` and `R−A−P`), and
//!   for the legacy form `reserved_unallocated` is derived as `R − A`.

pub use fragscope_alloc::format_size;
use serde::Serialize;
use std::fmt;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;
/// 2^60 bytes: PyTorch refuses requests at or above this before touching the allocator.
const ONE_EIB: u64 = 1 << 60;

// ---------------------------------------------------------------------------------------------
// Public data model
// ---------------------------------------------------------------------------------------------

/// Which layout of the OOM text was found (see the module table). Serialised as a short
/// stable string (`"legacy"`, `"v2.1"`, …) for `--json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum MessageForm {
    #[serde(rename = "legacy")]
    Legacy,
    #[serde(rename = "v2.1")]
    V2_1,
    #[serde(rename = "v2.2")]
    V2_2,
    #[serde(rename = "v2.5")]
    V2_5,
    #[serde(rename = "recent")]
    Recent,
    #[serde(rename = "preemptive_rejection")]
    PreemptiveRejection,
    #[serde(rename = "cuda_malloc_async")]
    CudaMallocAsync,
    #[serde(rename = "too_large_1eb")]
    TooLarge1EB,
    /// The OOM sentence was found but not the figures that should follow it.
    #[serde(rename = "partial")]
    Partial,
}

impl MessageForm {
    /// The PyTorch versions that print this layout, for humans.
    pub fn versions(self) -> &'static str {
        match self {
            MessageForm::Legacy => "PyTorch 2.0 or older",
            MessageForm::V2_1 => "PyTorch 2.1",
            MessageForm::V2_2 => "PyTorch 2.2 or newer",
            MessageForm::V2_5 => "PyTorch 2.5 or newer",
            MessageForm::Recent => "a recent PyTorch (docs.pytorch.org-era message)",
            MessageForm::PreemptiveRejection => "PyTorch 2.12 or newer",
            MessageForm::CudaMallocAsync => "the cudaMallocAsync allocator backend",
            MessageForm::TooLarge1EB => "any PyTorch 2.x",
            MessageForm::Partial => "unknown (the message is incomplete)",
        }
    }

    /// True for the forms written by the native caching allocator's `malloc`, whose
    /// "Tried to allocate" is a rounded segment size and whose figures describe its cache.
    pub fn is_caching_allocator_report(self) -> bool {
        matches!(
            self,
            MessageForm::Legacy | MessageForm::V2_1 | MessageForm::V2_2 | MessageForm::V2_5 | MessageForm::Recent
        )
    }

    /// Whether `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` exists for this version
    /// (2.1+). Unknown versions are treated as new: that is where users are today.
    fn has_expandable_segments(self) -> bool {
        !matches!(self, MessageForm::Legacy)
    }
}

impl fmt::Display for MessageForm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            MessageForm::Legacy => "legacy (≤ 2.0)",
            MessageForm::V2_1 => "2.1",
            MessageForm::V2_2 => "2.2+",
            MessageForm::V2_5 => "2.5+",
            MessageForm::Recent => "recent",
            MessageForm::PreemptiveRejection => "preemptive rejection",
            MessageForm::CudaMallocAsync => "cudaMallocAsync",
            MessageForm::TooLarge1EB => "more than 1EB",
            MessageForm::Partial => "partial",
        };
        f.write_str(s)
    }
}

/// One line of the NVML process list (2.1+): `Process <pid> has X memory in use` (`pid`
/// set) or `Including non-PyTorch memory, this process has X memory in use` (`pid` None).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessUse {
    pub pid: Option<u32>,
    pub bytes: u64,
}

/// Everything the OOM text says, in bytes. Absent figures are `None`; see the module docs
/// for what each figure means and its ± precision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OomMessage {
    pub form: MessageForm,
    pub device: Option<u32>,
    pub tried_to_allocate: Option<u64>,
    pub total_capacity: Option<u64>,
    pub free: Option<u64>,
    pub allocated_by_pytorch: Option<u64>,
    pub reserved_unallocated: Option<u64>,
    pub reserved_total: Option<u64>,
    pub private_pools: Option<u64>,
    pub allowed: Option<u64>,
    pub processes: Vec<ProcessUse>,
    /// The message says `expandable_segments is enabled` (recent builds print this instead of
    /// suggesting to enable it).
    pub expandable_segments_hint: bool,
    /// Recent builds: "This allocation exceeds the expandable-segment reserve of …".
    pub exceeds_expandable_reserve: bool,
    /// The reserve size from that sentence, when it could be read.
    pub expandable_reserve: Option<u64>,
    /// The Python exception name in front of the message (`torch.OutOfMemoryError`,
    /// `torch.cuda.OutOfMemoryError`, `RuntimeError`, …) when the text had one.
    pub exception: Option<String>,
    /// `"CUDA"`, or `"HIP"` for ROCm builds.
    pub accelerator: String,
    /// The message as found in the input (from `CUDA out of memory` / `Allocation on device`
    /// to its last recognised word), line breaks included.
    pub raw: String,
    /// The log-line prefix the message's lines carried (`rank1` for `[rank1]: ...`) when a
    /// log interleaved several processes' output; each process's lines are read apart.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_prefix: Option<String>,
    /// The `CUDA out of memory.` sentence was not in the text: the figures were found on
    /// their own (a paste that started mid-message).
    pub headerless: bool,
    /// Figures this form prints that the text did not contain (a truncated or partial
    /// paste), by name; the verdict uses only the figures present.
    pub missing: Vec<String>,
    /// Figures that cannot all be true as printed (free above the total, a negative size,
    /// …), one sentence each naming the figures; empty for a consistent message.
    pub inconsistent: Vec<String>,
    /// ± bytes of `reserved_unallocated`: half a unit of its last printed digit, or, when it
    /// is derived as reserved − allocated (the legacy form), the sum of both figures'.
    pub reserved_unallocated_uncertainty: u64,
}

impl OomMessage {
    /// Bytes held by live tensors: "allocated by PyTorch" minus the private-pool share that
    /// 2.5+ folds into it (those bytes are free blocks owned by CUDA graphs / MemPools).
    pub fn live_allocated(&self) -> Option<u64> {
        self.allocated_by_pytorch.map(|a| a.saturating_sub(self.private_pools.unwrap_or(0)))
    }

    /// True for a ROCm build's message (`HIP out of memory`).
    pub fn is_rocm(&self) -> bool {
        self.accelerator == "HIP"
    }

    /// ± bytes of [`OomMessage::outside_allocator`]: the printed precision of total, free and
    /// reserved added up (it is a difference of rounded figures).
    pub fn outside_allocator_uncertainty(&self) -> u64 {
        let r = self.reserved_total.unwrap_or(0);
        let r_pm = if self.reserved_unallocated_uncertainty > printed_precision(self.reserved_unallocated.unwrap_or(0))
        {
            // legacy: R printed, U derived from it
            printed_precision(r)
        } else {
            printed_precision(self.allocated_by_pytorch.unwrap_or(0)) + self.reserved_unallocated_uncertainty
        };
        printed_precision(self.total_capacity.unwrap_or(0)) + printed_precision(self.free.unwrap_or(0)) + r_pm
    }

    /// GPU memory not held by this process's caching allocator: `total − free − reserved`.
    /// That is other processes, this process's CUDA context and library workspaces, and any
    /// allocation made outside PyTorch's allocator.
    /// `None` when free + reserved clearly exceed the total (beyond the message's rounding):
    /// the device then lent memory it does not have (see [`OomMessage::over_capacity`]),
    /// and no figure outside the allocator can be read.
    pub fn outside_allocator(&self) -> Option<u64> {
        let (t, f, r) = (self.total_capacity?, self.free?, self.reserved_total?);
        if clearly_gt(f.saturating_add(r), t, &[t, f, r]) {
            return None;
        }
        Some(t.saturating_sub(f).saturating_sub(r))
    }

    /// Bytes PyTorch reserved beyond the device's total capacity, when the message says it
    /// reserved clearly more than the GPU has. A discrete GPU cannot: this is Windows' WDDM
    /// driver backing device memory with system RAM ("shared GPU memory") once the GPU is
    /// full, or a device whose memory is the host's (unified memory).
    /// Without a reserved figure (the cudaMallocAsync form) the allocated one is used.
    pub fn over_capacity(&self) -> Option<u64> {
        let (t, r) = (self.total_capacity?, self.reserved_total.or(self.allocated_by_pytorch)?);
        clearly_gt(r, t, &[t, r]).then(|| r - t)
    }

    /// Bytes of the listed processes that are probably *other* processes.
    ///
    /// Inside a container NVML reports host PIDs, so this process can appear as
    /// `Process <pid>` instead of "this process". When the list has no "this process" line,
    /// the `Process` entry closest above our reserved bytes (within reserved + 2 GiB, room
    /// for a CUDA context and library workspaces) is taken to be us and left out.
    pub fn other_process_bytes(&self) -> Option<u64> {
        if self.processes.is_empty() {
            return None;
        }
        let own = self.probable_own_process();
        Some(
            self.processes
                .iter()
                .enumerate()
                .filter(|(i, p)| p.pid.is_some() && Some(*i) != own)
                .map(|(_, p)| p.bytes)
                .sum(),
        )
    }

    /// Index into `processes` of the entry that is this process (see
    /// [`OomMessage::other_process_bytes`]).
    pub fn probable_own_process(&self) -> Option<usize> {
        if let Some(i) = self.processes.iter().position(|p| p.pid.is_none()) {
            return Some(i);
        }
        let r = self.reserved_total?;
        let slack = 2 * printed_precision(r);
        self.processes
            .iter()
            .enumerate()
            .filter(|(_, p)| p.bytes.saturating_add(slack) >= r && p.bytes <= r.saturating_add(2 * GIB))
            .min_by_key(|(_, p)| p.bytes)
            .map(|(i, _)| i)
    }
}

/// Why the parser found nothing to explain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// No OOM message of any known form in the text.
    NoMessage,
    /// An out-of-memory message of another PyTorch backend (`"XPU"`, `"MPS"`): its allocator
    /// rounds and is configured differently, so the CUDA reading would be wrong.
    Unsupported { backend: String, line: String },
    /// Only the CUDA runtime's own `CUDA error: out of memory` was found: raised by a kernel
    /// launch, cuBLAS/cuDNN workspace, NCCL or context creation, not by the caching
    /// allocator, so it carries no allocator figures.
    CudaRuntimeError { line: String },
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::NoMessage => write!(
                f,
                "no CUDA out-of-memory message found: expected text containing \
                 'CUDA out of memory. Tried to allocate ...' (PyTorch 1.13–2.15) or the \
                 cudaMallocAsync form 'Allocation on device N would exceed allowed memory'"
            ),
            ParseError::Unsupported { backend, line } => write!(
                f,
                "{backend} messages are not supported: found '{line}'. fragscope explains the \
                 out-of-memory messages of PyTorch's CUDA and ROCm (HIP) caching allocators; the \
                 {backend} allocator rounds and is configured differently, so reading its figures \
                 as CUDA's would mislead"
            ),
            ParseError::CudaRuntimeError { line } => write!(
                f,
                "found the CUDA runtime error '{line}' but no caching-allocator message: \
                 expected 'CUDA out of memory. Tried to allocate ...' (PyTorch 1.13–2.15) or \
                 'Allocation on device N would exceed allowed memory'. A bare 'CUDA error: out \
                 of memory' comes from a kernel launch, cuBLAS/cuDNN/NCCL or context creation \
                 and carries no allocator figures"
            ),
        }
    }
}

impl std::error::Error for ParseError {}

// ---------------------------------------------------------------------------------------------
// Sizes
// ---------------------------------------------------------------------------------------------

/// The ± uncertainty of a size that PyTorch printed with `format_size` and that was parsed
/// back: half a unit in the second decimal of the unit `format_size` would pick.
pub fn printed_precision(bytes: u64) -> u64 {
    if bytes <= KIB {
        0
    } else if bytes <= MIB {
        KIB.div_ceil(200)
    } else if bytes <= GIB {
        MIB.div_ceil(200)
    } else {
        GIB.div_ceil(200)
    }
}

/// Parse one size token such as `"12.50 MiB"`, `"512 bytes"` or `"1.20 GiB"` (the whole
/// string must be the token, surrounding blanks allowed).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (v, end) = size_at(s, 0)?;
    if s[end..].trim().is_empty() {
        Some(v)
    } else {
        None
    }
}

fn unit_bytes(unit: &str) -> Option<u64> {
    // PyTorch only prints bytes/KiB/MiB/GiB. The decimal-looking spellings are accepted
    // because people retype messages; PyTorch's own tables use them for binary units too.
    Some(match unit.to_ascii_lowercase().as_str() {
        "bytes" | "byte" | "b" => 1,
        "kib" | "kb" | "k" => KIB,
        "mib" | "mb" | "m" => MIB,
        "gib" | "gb" | "g" => GIB,
        "tib" | "tb" => 1024 * GIB,
        "pib" | "pb" => 1024 * 1024 * GIB,
        _ => return None,
    })
}

/// Parse a size token starting at byte `pos` of `s` (leading blanks skipped). Returns the
/// bytes and the end offset. Exact integer arithmetic: `mantissa × unit / 10^decimals`,
/// rounded half up, saturating at `u64::MAX` (the cudaMallocAsync form prints SIZE_MAX as
/// `17179869184.00 GiB`, which is 2^64).
fn size_at(s: &str, pos: usize) -> Option<(u64, usize)> {
    let b = s.as_bytes();
    let mut i = pos;
    while i < b.len() && b[i] == b' ' {
        i += 1;
    }
    // PyTorch never prints a sign; an edited or corrupted text may. The magnitude is read so
    // the rest of the message is not lost, and `inconsistencies` names the negative figure.
    if i + 1 < b.len() && b[i] == b'-' && b[i + 1].is_ascii_digit() {
        i += 1;
    }
    let num_start = i;
    let mut mantissa: u128 = 0;
    let mut decimals: u32 = 0;
    let mut seen_dot = false;
    let mut digits = 0u32;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_digit() {
            // 20 digits keep mantissa × unit (≤ 2^50) inside u128; longer is not a size
            if digits == 20 {
                return None;
            }
            mantissa = mantissa * 10 + u128::from(c - b'0');
            if seen_dot {
                decimals += 1;
            }
            digits += 1;
        } else if c == b'.' && !seen_dot && i + 1 < b.len() && b[i + 1].is_ascii_digit() {
            seen_dot = true;
        } else {
            break;
        }
        i += 1;
    }
    if digits == 0 || i == num_start {
        return None;
    }
    // at most one blank between number and unit ("12.50 MiB", "12.50MiB")
    let mut j = i;
    if j < b.len() && b[j] == b' ' {
        j += 1;
    }
    let unit_start = j;
    while j < b.len() && b[j].is_ascii_alphabetic() {
        j += 1;
    }
    let unit = unit_bytes(&s[unit_start..j])?;
    let den = 10u128.pow(decimals);
    let v = (mantissa * u128::from(unit) + den / 2) / den;
    Some((u64::try_from(v).unwrap_or(u64::MAX), j))
}

/// Parse the size token that *ends* at byte `end` of `s` (trailing blanks skipped), e.g.
/// the `1.05 GiB` in `"... 1.05 GiB allowed;"` given the offset of `allowed`.
fn size_before(s: &str, end: usize) -> Option<u64> {
    let b = s.as_bytes();
    let mut i = end.min(b.len());
    while i > 0 && b[i - 1] == b' ' {
        i -= 1;
    }
    let unit_end = i;
    while i > 0 && b[i - 1].is_ascii_alphabetic() {
        i -= 1;
    }
    if i == unit_end {
        return None;
    }
    if i > 0 && b[i - 1] == b' ' {
        i -= 1;
    }
    while i > 0 && (b[i - 1].is_ascii_digit() || b[i - 1] == b'.') {
        i -= 1;
    }
    let (v, e) = size_at(s, i)?;
    (e == unit_end).then_some(v)
}

// ---------------------------------------------------------------------------------------------
// Text scanning helpers
// ---------------------------------------------------------------------------------------------

/// The input with line breaks and blank runs folded to single spaces, and a map back to the
/// original byte offsets. Folding is what makes the scanner tolerant: messages arrive
/// wrapped by terminals and issue trackers, with PyTorch's double blanks collapsed, or as
/// `# `-commented lines in a script.
struct Flat {
    text: String,
    /// `map[i]` = byte offset in the original of `text`'s byte `i`.
    map: Vec<usize>,
}

fn flatten(src: &str) -> Flat {
    let mut text = String::with_capacity(src.len());
    let mut map = Vec::with_capacity(src.len());
    let mut offset = 0usize;
    for (n, line) in src.split('\n').enumerate() {
        let line_start = offset;
        offset += line.len() + 1;
        let body = line.trim_end_matches('\r');
        // Drop what wraps a pasted line: indentation, a log prefix (`[rank1]: `), quote and
        // comment markers (`> `, `# `, `// `) and list bullets (`- `, `* `, `+ `), in any
        // nesting (`> - `).
        let skipped = line_prefix_len(body);
        let body = &body[skipped..];
        if n > 0 && !text.ends_with(' ') && !text.is_empty() {
            text.push(' ');
            map.push(line_start.saturating_sub(1));
        }
        let base = line_start + skipped;
        for (k, ch) in body.char_indices() {
            if ch == '`' {
                // Markdown code spans (`...`): never part of PyTorch's text.
                continue;
            }
            if ch.is_whitespace() {
                if !text.ends_with(' ') {
                    text.push(' ');
                    map.push(base + k);
                }
            } else {
                let at = text.len();
                text.push(ch);
                for _ in at..text.len() {
                    map.push(base + k);
                }
            }
        }
    }
    Flat { text, map }
}

/// `[rank1]:`, `[default0]:`, `[RANK 3]:` at the start of `s`: the prefix launchers such as
/// torchrun put on each line of a process's output. Returns the name and the length.
fn log_prefix(s: &str) -> Option<(&str, usize)> {
    let rest = s.strip_prefix('[')?;
    let close = rest.find(']')?;
    let name = &rest[..close];
    let ok = (1..=24).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ' ' || c == '-')
        && name.chars().any(|c| c.is_ascii_digit());
    let after = rest[close + 1..].strip_prefix(':')?;
    ok.then(|| (name, 1 + close + 1 + 1 + (after.len() - after.trim_start().len())))
}

/// Length of the wrapping in front of a pasted line (see [`flatten`]).
fn line_prefix_len(line: &str) -> usize {
    let mut i = 0;
    loop {
        let t = &line[i..];
        let trimmed = t.trim_start();
        i += t.len() - trimmed.len();
        if let Some((_, n)) = log_prefix(trimmed) {
            i += n;
            continue;
        }
        match ["//", "#", ">", "- ", "* ", "+ "].iter().find(|m| trimmed.starts_with(**m)) {
            Some(m) => i += m.len(),
            None => return i,
        }
    }
}

/// Byte offset where the run of trailing characters satisfying `keep` starts (a char
/// boundary, whatever the characters before it are).
fn start_of_trailing(s: &str, keep: impl Fn(char) -> bool) -> usize {
    s.char_indices().rev().find(|&(_, c)| !keep(c)).map_or(0, |(k, c)| k + c.len_utf8())
}

/// ASCII case-insensitive `find` from `from`, bounded by `limit`.
fn find_ci(hay: &str, needle: &str, from: usize, limit: usize) -> Option<usize> {
    let h = hay.as_bytes();
    let n = needle.as_bytes();
    let limit = limit.min(h.len());
    if n.is_empty() || from >= limit || limit - from < n.len() {
        return None;
    }
    // Candidates from the needle's rarest byte (both cases, found by `memchr2`), each
    // checked in full: a compare at every position cost ~100 ns a byte, minutes on a
    // long training log.
    let (j, b) = rarest_byte(n);
    let (lo, up) = (b.to_ascii_lowercase(), b.to_ascii_uppercase());
    let last = limit - n.len();
    let mut at = from + j;
    while at <= last + j {
        let k = at + memchr::memchr2(lo, up, &h[at..=last + j])?;
        let i = k - j;
        if h[i..i + n.len()].eq_ignore_ascii_case(n) {
            return Some(i);
        }
        at = k + 1;
    }
    None
}

/// The byte of `needle` least frequent in English text (letters by frequency; any other
/// byte counts as rare), and where it lies: [`find_ci`] looks for it first.
fn rarest_byte(needle: &[u8]) -> (usize, u8) {
    const COMMON: &[u8] = b" etaoinsrhldcumfpgwybvkxjqz";
    let rank = |b: u8| COMMON.iter().position(|&c| c == b.to_ascii_lowercase()).unwrap_or(COMMON.len());
    let mut best = (0, needle[0]);
    for (j, &b) in needle.iter().enumerate() {
        if rank(b) > rank(best.1) {
            best = (j, b);
        }
    }
    best
}

fn skip_blanks(s: &str, mut i: usize) -> usize {
    let b = s.as_bytes();
    while i < b.len() && b[i] == b' ' {
        i += 1;
    }
    i
}

fn uint_at(s: &str, pos: usize) -> Option<(u32, usize)> {
    let b = s.as_bytes();
    let i = skip_blanks(s, pos);
    let mut j = i;
    while j < b.len() && b[j].is_ascii_digit() {
        j += 1;
    }
    if j == i {
        return None;
    }
    s[i..j].parse().ok().map(|v| (v, j))
}

/// `needle` right at `pos` (after blanks), case-insensitive; returns the end offset.
fn expect_ci(s: &str, pos: usize, needle: &str) -> Option<usize> {
    let i = skip_blanks(s, pos);
    let b = s.as_bytes();
    let n = needle.as_bytes();
    (i + n.len() <= b.len() && b[i..i + n.len()].eq_ignore_ascii_case(n)).then_some(i + n.len())
}

// ---------------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------------

/// One message start found in the flattened text.
#[derive(Clone, Copy)]
enum Anchor {
    /// `CUDA out of memory.` / `HIP out of memory.`; `start` is at the accelerator word,
    /// `after` just past the full stop.
    Native { start: usize, after: usize, hip: bool },
    /// `Allocation on device N would exceed allowed memory`.
    Async { start: usize },
    /// The figures without the `CUDA out of memory.` sentence before them: `Tried to
    /// allocate S`, or, when that is missing too, `GPU N has a total capacity` or `Of the
    /// allocated memory`; `after` is past the phrase.
    Headerless { start: usize, after: usize },
}

impl Anchor {
    fn start(self) -> usize {
        match self {
            Anchor::Native { start, .. } | Anchor::Async { start } | Anchor::Headerless { start, .. } => start,
        }
    }

    /// Where to look for the *next* message: past this anchor's phrase (searching from
    /// `start + 1` would find the same "out of memory." again).
    fn search_past(self) -> usize {
        match self {
            Anchor::Native { after, .. } => after,
            Anchor::Async { start } => start + "Allocation on device".len(),
            Anchor::Headerless { after, .. } => after,
        }
    }
}

/// How far back a header or an earlier figure makes a figure part of the same message
/// (a whole 2.x message is about 500 characters; its figures sit within 300 of each other).
const SAME_MESSAGE: usize = 300;

/// The first figure phrase at or after `from` that no `out of memory.` header (and, for the
/// later phrases, no `Tried to allocate`) precedes closely: the start of a message pasted
/// without its first sentence.
fn next_headerless(flat: &str, from: usize) -> Option<Anchor> {
    let near_before = |i: usize, needle: &str| {
        let mut lo = i.saturating_sub(SAME_MESSAGE);
        while !flat.is_char_boundary(lo) {
            lo -= 1;
        }
        find_ci(flat, needle, lo, i).is_some()
    };
    let mut best: Option<Anchor> = None;
    for (phrase, needs_size) in
        [("Tried to allocate", true), ("has a total capac", false), ("Of the allocated memory", true)]
    {
        let mut at = from;
        while let Some(i) = find_ci(flat, phrase, at, flat.len()) {
            at = i + 1;
            let after = i + phrase.len();
            // "GPU N has a total capacity": start at "GPU".
            let start = if phrase == "has a total capac" {
                let before = flat[..i].trim_end_matches(' ');
                let num = start_of_trailing(before, |c| c.is_ascii_digit());
                let word = flat[..num].trim_end_matches(' ');
                if num == before.len() || !word.to_ascii_uppercase().ends_with("GPU") {
                    continue;
                }
                word.len() - 3
            } else {
                i
            };
            if needs_size && size_at(flat, after).is_none() {
                continue;
            }
            // Any "… out of memory" sentence just before owns these figures: CUDA's and HIP's
            // are anchors of their own, XPU's ("XPU out of memory.") and MPS's ("MPS backend
            // out of memory (") are another allocator's and must not be read as CUDA's.
            if near_before(start, "out of memory")
                || (phrase != "Tried to allocate" && near_before(start, "Tried to allocate"))
                || (phrase == "Of the allocated memory" && near_before(start, "has a total capac"))
            {
                continue;
            }
            if best.is_none_or(|b| start < b.start()) {
                best = Some(Anchor::Headerless { start, after });
            }
            break;
        }
    }
    best
}

fn next_anchor(flat: &str, from: usize) -> Option<Anchor> {
    let native = {
        let mut at = from;
        loop {
            let Some(i) = find_ci(flat, "out of memory.", at, flat.len()) else {
                break None;
            };
            at = i + 1;
            let before = flat[..i].trim_end_matches(' ');
            let word_start = start_of_trailing(before, |c| c.is_ascii_alphanumeric());
            let word = &before[word_start..];
            // The accelerator word, or a word glued to it in upper case ("whyCUDA" in an
            // issue title); "XPU"/"MPS" messages are another allocator's and are not anchors.
            let accel = ["CUDA", "HIP"]
                .into_iter()
                .find(|a| word.eq_ignore_ascii_case(a) || (word.len() > a.len() && word.ends_with(a)));
            if let Some(a) = accel {
                break Some(Anchor::Native {
                    start: before.len() - a.len(),
                    after: i + "out of memory.".len(),
                    hip: a == "HIP",
                });
            }
        }
    };
    let async_ = {
        let mut at = from;
        loop {
            let Some(i) = find_ci(flat, "Allocation on device", at, flat.len()) else {
                break None;
            };
            at = i + 1;
            // require the rest of the sentence, so prose mentioning the phrase is skipped
            if find_ci(flat, "would exceed allowed memory", i, (i + 80).min(flat.len())).is_some() {
                break Some(Anchor::Async { start: i });
            }
        }
    };
    [native, async_, next_headerless(flat, from)].into_iter().flatten().min_by_key(|a| a.start())
}

/// Parse the first PyTorch OOM message found in `text` (a bare message, a Python traceback,
/// a log; wrapped or not). See the module docs for the recognised forms.
pub fn parse(text: &str) -> Result<OomMessage, ParseError> {
    let all = parse_all(text);
    if let Some(first) = all.into_iter().next() {
        return Ok(first);
    }
    // Another backend's OOM: say so rather than "no message".
    for (needle, backend) in [("XPU out of memory", "XPU"), ("MPS backend out of memory", "MPS")] {
        if let Some(i) = find_ci(text, needle, 0, text.len()) {
            let line_start = text[..i].rfind('\n').map_or(0, |k| k + 1);
            let line_end = text[i..].find('\n').map_or(text.len(), |k| i + k);
            let mut line = text[line_start..line_end].trim().to_string();
            if line.chars().count() > 120 {
                line = line.chars().take(117).collect::<String>() + "...";
            }
            return Err(ParseError::Unsupported { backend: backend.into(), line });
        }
    }
    // Give the more useful error when the only OOM in sight is the runtime's own.
    if let Some(i) = find_ci(text, "CUDA error: out of memory", 0, text.len()) {
        let line_start = text[..i].rfind('\n').map_or(0, |k| k + 1);
        let line_end = text[i..].find('\n').map_or(text.len(), |k| i + k);
        return Err(ParseError::CudaRuntimeError { line: text[line_start..line_end].trim().to_string() });
    }
    Err(ParseError::NoMessage)
}

/// Every OOM message in `text`, in order (logs often repeat the OOM once per retry or rank).
/// When lines carry launcher prefixes of several processes (`[rank0]:`, `[rank1]:`), each
/// process's lines are read on their own, so interleaved messages do not mix; those
/// messages come grouped by process, in order of each process's first line.
pub fn parse_all(text: &str) -> Vec<OomMessage> {
    let near = near_anchors(text);
    let text: &str = &near;
    let mut groups: Vec<(Option<String>, String)> = Vec::new();
    // Group by prefix through a map: a text with thousands of distinct prefixes (or bytes
    // that look like them) must not cost a scan of the groups per line.
    let mut group_of: std::collections::HashMap<Option<String>, usize> = std::collections::HashMap::new();
    for line in text.split('\n') {
        let t = line.trim_start();
        let key = log_prefix(t).map(|(name, _)| name.to_string());
        match group_of.get(&key) {
            Some(&g) => {
                let body = &mut groups[g].1;
                body.push_str(line);
                body.push('\n');
            }
            None => {
                group_of.insert(key.clone(), groups.len());
                groups.push((key, format!("{line}\n")));
            }
        }
    }
    if groups.iter().filter(|(k, _)| k.is_some()).count() < 2 {
        return parse_all_in(text);
    }
    let mut out = Vec::new();
    for (key, body) in groups {
        for mut m in parse_all_in(&body) {
            m.log_prefix = key.clone();
            out.push(m);
        }
    }
    out
}

/// Texts up to this size are read whole; a longer one (a training job's whole log) only
/// around the phrases a message holds ([`near_anchors`]).
const WHOLE_TEXT: usize = 8 << 20;
/// Lines kept before and after each phrase of a long text: a message is a few lines, and
/// up to hundreds when the lines of many ranks interleave.
const LINES_BEFORE: usize = 60;
const LINES_AFTER: usize = 400;
/// Bytes kept at most on each side of a phrase, whatever the lines' lengths.
const BYTES_NEAR: usize = 256 << 10;

/// `text` itself when it is short; else its lines near a phrase that starts or belongs to
/// an OOM message (in order, the rest dropped). Why: the parser's per-byte work and its
/// copies of the text cost seconds and ~15× the text's size in memory per 100 MB, while
/// a log of GBs holds its messages in a few KB. Every message, and every line between
/// its start and its last figure, lies within the kept lines.
fn near_anchors(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= WHOLE_TEXT {
        return std::borrow::Cow::Borrowed(text);
    }
    const PHRASES: [&str; 5] =
        ["out of memory", "Allocation on device", "Tried to allocate", "has a total capac", "Of the allocated memory"];
    let b = text.as_bytes();
    // Byte ranges kept, from each phrase's line, extended by whole lines.
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for phrase in PHRASES {
        let mut at = 0;
        while let Some(i) = find_ci(text, phrase, at, text.len()) {
            at = i + phrase.len();
            // Back over the phrase's line and LINES_BEFORE more, to just after a newline.
            let floor = i.saturating_sub(BYTES_NEAR);
            let mut lo = i;
            for _ in 0..=LINES_BEFORE {
                match memchr::memrchr(b'\n', &b[floor..lo]) {
                    Some(k) => lo = floor + k,
                    None => {
                        lo = floor;
                        break;
                    }
                }
            }
            if b.get(lo) == Some(&b'\n') {
                lo += 1;
            }
            let mut hi = i;
            let cap = (i + BYTES_NEAR).min(b.len());
            for _ in 0..=LINES_AFTER {
                match memchr::memchr(b'\n', &b[hi..cap]) {
                    Some(k) => hi += k + 1,
                    None => {
                        hi = cap;
                        break;
                    }
                }
            }
            ranges.push((lo, hi));
        }
    }
    ranges.sort_unstable();
    let mut out = String::new();
    let mut end = 0;
    for (mut lo, mut hi) in ranges {
        lo = lo.max(end);
        if hi <= lo {
            continue;
        }
        // Char boundaries: the ranges were cut at newlines or at a byte cap.
        while !text.is_char_boundary(lo) {
            lo += 1;
        }
        while !text.is_char_boundary(hi) {
            hi -= 1;
        }
        if lo < hi {
            if lo > end && !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&text[lo..hi]);
        }
        end = end.max(hi);
    }
    std::borrow::Cow::Owned(out)
}

fn parse_all_in(text: &str) -> Vec<OomMessage> {
    let flat = flatten(text);
    let s = flat.text.as_str();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(anchor) = next_anchor(s, from) {
        // Fields of this message are searched only up to the next message, so a truncated
        // message never borrows figures from the one after it.
        let limit = next_anchor(s, anchor.search_past()).map_or(s.len(), |a| a.start());
        let (mut msg, end) = match anchor {
            Anchor::Native { start, after, hip } => parse_native(s, start, after, hip, limit),
            Anchor::Async { start } => parse_async(s, start, limit),
            Anchor::Headerless { start, .. } => {
                let (mut m, mut end) = parse_native(s, start, start, false, limit);
                if m.tried_to_allocate.is_none() {
                    parse_v2(s, start, start, limit, &mut m, &mut end);
                }
                m.headerless = true;
                (m, end)
            }
        };
        let end = sweep(s, anchor.start(), limit, &mut msg).max(end);
        let end = end.clamp(anchor.start() + 1, s.len());
        msg.raw = original_slice(text, &flat, anchor.start(), end);
        msg.exception = exception_before(s, anchor.start());
        msg.missing = missing_figures(&msg);
        if msg.reserved_unallocated_uncertainty == 0 {
            msg.reserved_unallocated_uncertainty = msg.reserved_unallocated.map_or(0, printed_precision);
        }
        msg.inconsistent = inconsistencies(&msg);
        out.push(msg);
        from = end.max(anchor.search_past());
    }
    out
}

/// Every figure phrase of the 2.x layout within `[start, limit)` that the in-order parse
/// did not reach (a line broken by a traceback, a paste that lost a sentence): each figure
/// the text holds is used. Returns the end of the last phrase read.
fn sweep(s: &str, start: usize, limit: usize, m: &mut OomMessage) -> usize {
    if !matches!(
        m.form,
        MessageForm::Partial | MessageForm::V2_1 | MessageForm::V2_2 | MessageForm::V2_5 | MessageForm::Recent
    ) {
        return start;
    }
    let mut end = start;
    let mut found = false;
    let mut at_phrase = |phrase: &str| -> Option<usize> {
        let k = find_ci(s, phrase, start, limit)?;
        end = end.max(k + phrase.len());
        Some(k)
    };
    if m.tried_to_allocate.is_none() {
        if let Some(k) = at_phrase("Tried to allocate") {
            m.tried_to_allocate = size_at(s, k + "Tried to allocate".len()).map(|(v, _)| v);
        }
    }
    if m.total_capacity.is_none() {
        if let Some(k) = at_phrase("has a total capac") {
            if let Some(of) = find_ci(s, " of ", k, limit.min(k + 30)) {
                m.total_capacity = size_at(s, of + 4).map(|(v, _)| v);
                found |= m.total_capacity.is_some();
            }
            if m.device.is_none() {
                let before = s[..k].trim_end_matches(' ');
                let num = start_of_trailing(before, |c| c.is_ascii_digit());
                m.device = before[num..].parse().ok();
            }
            if s.as_bytes()[k + "has a total capac".len()..].get(..2).is_some_and(|t| t.eq_ignore_ascii_case(b"ty")) {
                m.form = MessageForm::V2_1;
            }
        }
    }
    if m.free.is_none() {
        if let Some(k) = at_phrase("is free") {
            if let Some(w) = s[start..k].rfind("of which") {
                m.free = size_at(s, start + w + "of which".len()).map(|(v, _)| v);
                found |= m.free.is_some();
            }
        }
    }
    if m.allocated_by_pytorch.is_none() {
        if let Some(k) = at_phrase("is allocated by PyTorch") {
            m.allocated_by_pytorch = size_before(s, k);
            found |= m.allocated_by_pytorch.is_some();
        }
    }
    if m.reserved_unallocated.is_none() {
        // The phrase may be cut after "PyTorch" in a truncated paste; the figure is before it.
        if let Some(k) = at_phrase("is reserved by PyTorch") {
            m.reserved_unallocated = size_before(s, k);
            found |= m.reserved_unallocated.is_some();
        }
    }
    if m.private_pools.is_none() {
        if let Some(k) = at_phrase("allocated in private pools") {
            m.private_pools = size_before(s, k);
        }
    }
    if m.allowed.is_none() {
        if let Some(k) = at_phrase("allowed;") {
            m.allowed = size_before(s, k);
        }
    }
    if m.processes.is_empty() {
        parse_processes(s, start, limit, m);
    }
    if m.reserved_total.is_none() {
        if let (Some(a), Some(u)) = (m.allocated_by_pytorch, m.reserved_unallocated) {
            m.reserved_total = Some(a.saturating_add(u));
        }
    }
    // Figures of the 2.x layout were found after all: say so (a truncated legacy message
    // stays partial, since its figures sit inside one parenthesis).
    if found && m.form == MessageForm::Partial {
        m.form = if m.allowed.is_some() || m.private_pools.is_some() { MessageForm::V2_5 } else { MessageForm::V2_2 };
    }
    end
}

/// Figures of `m` that cannot all be true, one sentence each (see [`OomMessage::inconsistent`]).
/// Comparisons allow for the printed rounding, so only clear contradictions are named.
fn inconsistencies(m: &OomMessage) -> Vec<String> {
    let mut out = Vec::new();
    if let (Some(f), Some(t)) = (m.free, m.total_capacity) {
        if clearly_gt(f, t, &[f, t]) {
            out.push(format!(
                "the free memory ({}) is more than the total capacity ({}); a device never reports more \
                 free memory than it has",
                format_size(f),
                format_size(t)
            ));
        }
    }
    // Before 2.1 both halves were printed: "already allocated" is part of "reserved in total".
    if m.form == MessageForm::Legacy && !m.raw.to_ascii_lowercase().contains("cached") {
        if let (Some(a), Some(r)) = (m.allocated_by_pytorch, m.reserved_total) {
            if clearly_gt(a, r, &[a, r]) {
                out.push(format!(
                    "'already allocated' ({}) is more than 'reserved in total by PyTorch' ({}), which \
                     includes it",
                    format_size(a),
                    format_size(r)
                ));
            }
        }
    }
    // From 2.5 "allocated by PyTorch" includes the private pools' free bytes.
    if let (Some(p), Some(a)) = (m.private_pools, m.allocated_by_pytorch) {
        if clearly_gt(p, a, &[p, a]) {
            out.push(format!(
                "the private pools' {} is more than the {} 'allocated by PyTorch' that includes it",
                format_size(p),
                format_size(a)
            ));
        }
    }
    // Reserved or allocated above the total is possible (Windows lends system RAM to a full
    // GPU, a unified-memory device counts the host's): `over_capacity` names it as a finding,
    // not as a contradiction. A negative size is impossible everywhere: the parser reads the
    // digits only, so the sign is looked for here.
    let raw = m.raw.as_str();
    let b = raw.as_bytes();
    for (i, _) in raw.match_indices('-') {
        let before_ok = i == 0 || matches!(b[i - 1], b' ' | b'(' | b';' | b':' | b'\n');
        if before_ok && b.get(i + 1).is_some_and(u8::is_ascii_digit) {
            if let Some((v, e)) = size_at(raw, i + 1) {
                out.push(format!(
                    "'{}' is a negative size; PyTorch prints sizes as unsigned numbers, so the text was \
                     edited or corrupted (read as {})",
                    &raw[i..e],
                    format_size(v)
                ));
            }
        }
    }
    out
}

/// The figures `m`'s form prints that it lacks, by the names the text gives them.
fn missing_figures(m: &OomMessage) -> Vec<String> {
    let figures: &[(&str, bool)] = match m.form {
        MessageForm::Partial | MessageForm::Legacy => &[
            ("Tried to allocate", m.tried_to_allocate.is_some()),
            ("total capacity", m.total_capacity.is_some()),
            ("free", m.free.is_some()),
            ("allocated by PyTorch", m.allocated_by_pytorch.is_some()),
            ("reserved by PyTorch", m.reserved_total.is_some()),
        ],
        MessageForm::V2_1 | MessageForm::V2_2 | MessageForm::V2_5 | MessageForm::Recent => &[
            ("Tried to allocate", m.tried_to_allocate.is_some()),
            ("total capacity", m.total_capacity.is_some()),
            ("free", m.free.is_some()),
            ("allocated by PyTorch", m.allocated_by_pytorch.is_some()),
            ("reserved by PyTorch but unallocated", m.reserved_unallocated.is_some()),
        ],
        _ => &[],
    };
    figures.iter().filter(|(_, present)| !present).map(|(name, _)| name.to_string()).collect()
}

fn original_slice(text: &str, flat: &Flat, start: usize, end: usize) -> String {
    let a = flat.map[start];
    let last = flat.map[end - 1];
    // extend to the end of the UTF-8 character at `last`
    let b = text[last..].char_indices().nth(1).map_or(text.len(), |(k, _)| last + k);
    text[a..b].trim().to_string()
}

/// `torch.OutOfMemoryError` in `... torch.OutOfMemoryError: CUDA out of memory`.
fn exception_before(s: &str, start: usize) -> Option<String> {
    let before = s[..start].trim_end_matches(' ');
    let before = before.strip_suffix(':')?;
    let tok_start = start_of_trailing(before, |c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
    let tok = &before[tok_start..];
    (tok.ends_with("Error") || tok.ends_with("Exception")).then(|| tok.to_string())
}

fn empty_message(form: MessageForm, hip: bool) -> OomMessage {
    OomMessage {
        form,
        device: None,
        tried_to_allocate: None,
        total_capacity: None,
        free: None,
        allocated_by_pytorch: None,
        reserved_unallocated: None,
        reserved_total: None,
        private_pools: None,
        allowed: None,
        processes: Vec::new(),
        expandable_segments_hint: false,
        exceeds_expandable_reserve: false,
        expandable_reserve: None,
        exception: None,
        accelerator: if hip { "HIP" } else { "CUDA" }.to_string(),
        raw: String::new(),
        log_prefix: None,
        headerless: false,
        missing: Vec::new(),
        inconsistent: Vec::new(),
        reserved_unallocated_uncertainty: 0,
    }
}

/// Everything that starts `CUDA out of memory.`; returns the message and the end offset.
fn parse_native(s: &str, start: usize, after: usize, hip: bool, limit: usize) -> (OomMessage, usize) {
    let mut m = empty_message(MessageForm::Partial, hip);
    let mut end = after;

    if let Some(p) = expect_ci(s, after, "Allocation was preemptively rejected") {
        m.form = MessageForm::PreemptiveRejection;
        end = p;
        if let Some(q) = find_ci(s, "Requested size:", p, limit.min(p + 200)) {
            let q = q + "Requested size:".len();
            end = q;
            // format_size today; accept a bare byte count should a build print one
            if let Some((v, e)) = size_at(s, q) {
                m.tried_to_allocate = Some(v);
                end = e;
            } else if let Some((v, e)) = uint_at(s, q) {
                m.tried_to_allocate = Some(u64::from(v));
                end = e;
            }
        } else if let Some(q) = find_ci(s, "fraction limit", p, limit.min(p + 200)) {
            end = q + "fraction limit".len();
        }
        return (m, end);
    }

    let Some(ta) = expect_ci(s, after, "Tried to allocate") else {
        return (m, end);
    };
    end = ta;

    if let Some(p) = expect_ci(s, ta, "more than 1EB memory") {
        m.form = MessageForm::TooLarge1EB;
        end = if s[p..].starts_with('.') { p + 1 } else { p };
        return (m, end);
    }

    let Some((tried, p)) = size_at(s, ta) else {
        return (m, end);
    };
    m.tried_to_allocate = Some(tried);
    end = p;

    let q = skip_blanks(s, p);
    if s[q..].starts_with('(') {
        parse_legacy(s, q, limit, &mut m, &mut end);
    } else {
        parse_v2(s, p, start, limit, &mut m, &mut end);
    }
    (m, end)
}

/// `(GPU 0; 6.00 GiB total capacity; 3.49 GiB already allocated; 1.04 GiB free;
/// [L allowed; ]3.50 GiB reserved in total by PyTorch)`; very old builds end with
/// `X cached)`, where "cached" meant memory held but not used (the later R − A).
fn parse_legacy(s: &str, open: usize, limit: usize, m: &mut OomMessage, end: &mut usize) {
    let Some(close) = s[open..limit.max(open)].find(')').map(|k| open + k) else {
        return;
    };
    m.form = MessageForm::Legacy;
    for part in s[open + 1..close].split(';') {
        let part = part.trim();
        let lower = part.to_ascii_lowercase();
        if let Some(rest) = lower.strip_prefix("gpu") {
            m.device = uint_at(rest, 0).map(|(d, _)| d);
            continue;
        }
        let Some((v, _)) = size_at(part, 0) else {
            continue;
        };
        if lower.ends_with("total capacity") {
            m.total_capacity = Some(v);
        } else if lower.ends_with("already allocated") {
            m.allocated_by_pytorch = Some(v);
        } else if lower.ends_with("free") {
            m.free = Some(v);
        } else if lower.ends_with("allowed") {
            m.allowed = Some(v);
        } else if lower.contains("reserved in total") {
            m.reserved_total = Some(v);
        } else if lower.ends_with("cached") {
            m.reserved_unallocated = Some(v);
        }
    }
    // Derive the half the message did not print. R − A is a difference of two figures each
    // rounded to half a unit: its uncertainty is the sum of theirs (±10 MiB for two GiB
    // figures), which `reserved_unallocated_uncertainty` keeps for the display.
    match (m.allocated_by_pytorch, m.reserved_total, m.reserved_unallocated) {
        (Some(a), Some(r), None) => {
            m.reserved_unallocated = Some(r.saturating_sub(a));
            m.reserved_unallocated_uncertainty = printed_precision(r) + printed_precision(a);
        }
        (Some(a), None, Some(u)) => m.reserved_total = Some(a.saturating_add(u)),
        _ => {}
    }
    *end = close + 1;
    // " If reserved memory is >> allocated memory try setting max_split_size_mb to avoid
    // fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
    if let Some(p) = expect_ci(s, *end, "If reserved memory is") {
        *end = find_ci(s, "fragmentation.", p, limit.min(p + 200)).map_or(p, |k| k + "fragmentation.".len());
    }
    *end = documentation_tail(s, *end, limit);
}

/// The 2.1+ sentence layout (forms V2_1, V2_2, V2_5, Recent).
fn parse_v2(s: &str, p: usize, start: usize, limit: usize, m: &mut OomMessage, end: &mut usize) {
    // "GPU 0 has a total capacity of" must follow closely, or this is not the 2.x layout
    let Some(gpu) = find_ci(s, "GPU", p, limit.min(p + 16)) else {
        return;
    };
    let Some((dev, q)) = uint_at(s, gpu + 3) else {
        return;
    };
    let Some(cap) = expect_ci(s, q, "has a total capac") else {
        return;
    };
    m.device = Some(dev);
    m.form = if s.as_bytes()[cap..].get(..2).is_some_and(|t| t.eq_ignore_ascii_case(b"ty")) {
        MessageForm::V2_1 // "capacty": the 2.1 typo
    } else {
        MessageForm::V2_2
    };
    let Some(of) = find_ci(s, " of ", cap, limit.min(cap + 12)) else {
        return;
    };
    let Some((total, q)) = size_at(s, of + 4) else {
        return;
    };
    m.total_capacity = Some(total);
    *end = q;
    let Some(q) = expect_ci(s, q, "of which") else {
        return;
    };
    let Some((free, q)) = size_at(s, q) else {
        return;
    };
    m.free = Some(free);
    let Some(q) = expect_ci(s, q, "is free") else {
        return;
    };
    let free_end = if s[q..].starts_with('.') { q + 1 } else { q };
    *end = free_end;

    let of_alloc = find_ci(s, "Of the allocated memory", free_end, limit);
    // Between "is free." and "Of the allocated memory": the NVML process list (2.1+) and
    // "L allowed; " (2.5+). Searched as a region so a reordering or a missing line is fine.
    let region_end = of_alloc.unwrap_or_else(|| limit.min(free_end + 2000));
    parse_processes(s, free_end, region_end, m);
    if let Some(k) = find_ci(s, "allowed;", free_end, region_end) {
        m.allowed = size_before(s, k);
        *end = (*end).max(k + "allowed;".len());
    }

    let Some(oa) = of_alloc else {
        finish_v2(s, start, limit, m, end);
        return;
    };
    let q = oa + "Of the allocated memory".len();
    if let Some((a, q2)) = size_at(s, q) {
        m.allocated_by_pytorch = Some(a);
        *end = q2;
    }
    let unalloc = find_ci(s, "is reserved by PyTorch but unallocated", q, limit.min(q + 400));
    if let Some(k) = find_ci(s, "allocated in private pools", q, unalloc.unwrap_or(limit)) {
        m.private_pools = size_before(s, k);
    }
    if let Some(k) = unalloc {
        m.reserved_unallocated = size_before(s, k);
        let e = k + "is reserved by PyTorch but unallocated".len();
        *end = if s[e..].starts_with('.') { e + 1 } else { e };
    }
    if let (Some(a), Some(u)) = (m.allocated_by_pytorch, m.reserved_unallocated) {
        m.reserved_total = Some(a.saturating_add(u));
    }
    finish_v2(s, start, limit, m, end);
}

/// Hint sentences after the figures, the documentation pointer, and the form upgrade.
fn finish_v2(s: &str, start: usize, limit: usize, m: &mut OomMessage, end: &mut usize) {
    // The hint sentence sits between the figures and "See documentation ..." (~130
    // characters); the recent "expandable_segments is enabled" paragraph is longer, so the
    // window grows only when that paragraph is there. A short window keeps a truncated
    // message from swallowing unrelated text that follows it.
    let long = find_ci(s, "expandable_segments is enabled", *end, limit.min(*end + 300)).is_some();
    let window = if long { 1500 } else { 300 };
    let hint_end =
        find_ci(s, "See documentation for Memory Management", *end, limit.min(*end + window)).unwrap_or(*end);
    if let Some(k) = find_ci(s, "expandable_segments is enabled", start, hint_end.max(*end)) {
        m.expandable_segments_hint = true;
        *end = (*end).max(k + "expandable_segments is enabled".len());
    }
    if let Some(k) = find_ci(s, "exceeds the expandable-segment reserve", start, hint_end.max(*end)) {
        m.exceeds_expandable_reserve = true;
        let after = k + "exceeds the expandable-segment reserve".len();
        if let Some(q) = expect_ci(s, after, "of") {
            if let Some((v, _)) = size_at(s, q) {
                m.expandable_reserve = Some(v);
            }
        }
        *end = (*end).max(after);
    }
    *end = documentation_tail(s, (*end).max(hint_end), limit).max(*end);
    let msg = &s[start..(*end).min(s.len())];
    if m.form == MessageForm::V2_1 {
        return; // the typo pins the version; no later marker can apply
    }
    if find_ci(msg, "docs.pytorch.org", 0, msg.len()).is_some()
        || m.expandable_segments_hint
        || m.exceeds_expandable_reserve
    {
        m.form = MessageForm::Recent;
    } else if m.allowed.is_some() || m.private_pools.is_some() {
        m.form = MessageForm::V2_5;
    }
}

/// If "See documentation for Memory Management" starts within a few words of `from`,
/// return the offset after it and its tail (` and PYTORCH_CUDA_ALLOC_CONF` or ` (URL)`).
fn documentation_tail(s: &str, from: usize, limit: usize) -> usize {
    let from = from.min(s.len());
    let Some(k) = find_ci(s, "See documentation for Memory Management", from, limit.min(from + 400)) else {
        return from;
    };
    let mut e = k + "See documentation for Memory Management".len();
    if let Some(q) = expect_ci(s, e, "and PYTORCH_CUDA_ALLOC_CONF") {
        e = q;
    } else {
        let q = skip_blanks(s, e);
        if s[q..].starts_with("(http") {
            if let Some(c) = s[q..limit.max(q).min(s.len())].find(')') {
                e = q + c + 1;
            }
        }
    }
    e
}

/// `Including non-PyTorch memory, this process has X memory in use.` and
/// `Process <pid> has X memory in use.` lines, in order, within `[from, to)`.
fn parse_processes(s: &str, from: usize, to: usize, m: &mut OomMessage) {
    let mut at = from;
    while let Some(k) = find_ci(s, "memory in use", at, to) {
        at = k + 1;
        let Some(bytes) = size_before(s, k) else {
            continue;
        };
        // the subject of this sentence: text between the previous '.' and the size
        let sentence_start = s[from..k].rfind(". ").map_or(from, |d| from + d + 2);
        let subject = &s[sentence_start..k];
        let lower = subject.to_ascii_lowercase();
        if lower.contains("this process has") {
            m.processes.push(ProcessUse { pid: None, bytes });
        } else if let Some(pi) = lower.find("process ") {
            let pid = uint_at(subject, pi + "process ".len()).map(|(p, _)| p);
            m.processes.push(ProcessUse { pid, bytes });
        }
    }
}

/// `Allocation on device 0 would exceed allowed memory. (out of memory)` followed by the
/// `Currently allocated : …` lines of the cudaMallocAsync backend.
fn parse_async(s: &str, start: usize, limit: usize) -> (OomMessage, usize) {
    let mut m = empty_message(MessageForm::CudaMallocAsync, false);
    let mut end = start + "Allocation on device".len();
    if let Some((d, e)) = uint_at(s, end) {
        m.device = Some(d);
        end = e;
    }
    if let Some(k) = find_ci(s, "(out of memory)", end, limit.min(end + 80)) {
        end = k + "(out of memory)".len();
    } else if let Some(k) = find_ci(s, "allowed memory", end, limit.min(end + 80)) {
        end = k + "allowed memory".len();
    }
    let window = limit.min(end + 800);
    let field = |label: &str, from: usize| -> Option<(u64, usize)> {
        let k = find_ci(s, label, from, window)?;
        let mut q = skip_blanks(s, k + label.len());
        if s[q..].starts_with(':') {
            q += 1;
        }
        size_at(s, q)
    };
    let mut pos = end;
    if let Some((v, e)) = field("Currently allocated", pos) {
        m.allocated_by_pytorch = Some(v);
        pos = e;
    }
    if let Some((v, e)) = field("Requested", pos) {
        m.tried_to_allocate = Some(v);
        pos = e;
    }
    if let Some((v, e)) = field("Device limit", pos) {
        m.total_capacity = Some(v);
        pos = e;
    }
    if let Some((v, e)) = field("Free (according to CUDA)", pos) {
        m.free = Some(v);
        pos = e;
    }
    if let Some((v, e)) = field("PyTorch limit (set by user-supplied memory fraction)", pos) {
        // Without a fraction the backend prints SIZE_MAX (17179869184.00 GiB): no limit.
        m.allowed = (v < ONE_EIB).then_some(v);
        pos = e;
    }
    (m, pos.max(end))
}

// ---------------------------------------------------------------------------------------------
// Explanation
// ---------------------------------------------------------------------------------------------

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

/// Slack for comparing sums of printed figures: their rounding errors add up.
fn slack(values: &[u64]) -> u64 {
    values.iter().map(|&v| printed_precision(v)).sum()
}

/// `a > b`, beyond what rounding of the printed figures could explain.
fn clearly_gt(a: u64, b: u64, parts: &[u64]) -> bool {
    a > b.saturating_add(slack(parts))
}

/// `a ≥ b`, allowing for rounding.
fn roughly_ge(a: u64, b: u64, parts: &[u64]) -> bool {
    a.saturating_add(slack(parts)) >= b
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
    /// `PYTORCH_CUDA_ALLOC_CONF`, `PYTORCH_HIP_ALLOC_CONF` on ROCm.
    conf: &'static str,
    /// `nvidia-smi` / `rocm-smi`.
    smi: &'static str,
    /// `CUDA_VISIBLE_DEVICES` / `HIP_VISIBLE_DEVICES`.
    visible: &'static str,
    /// `CUDA` / `HIP`: who hands memory to PyTorch.
    driver: &'static str,
}

fn names(m: &OomMessage) -> Names {
    if m.is_rocm() {
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

    fn run(&mut self) {
        let m = self.m;
        self.describe_figures();
        match m.form {
            MessageForm::TooLarge1EB => return self.too_large(),
            MessageForm::PreemptiveRejection => return self.preemptive(),
            _ => {}
        }
        if !m.missing.is_empty() {
            self.findings.push(format!(
                "The text is incomplete: it lacks {} ({}). The verdict uses only the figures \
                 present; paste the whole message (from 'CUDA out of memory' to 'See \
                 documentation for Memory Management ...') for a full one.",
                m.missing.iter().map(|x| format!("'{x}'")).collect::<Vec<_>>().join(", "),
                if m.headerless { "and the 'CUDA out of memory.' sentence" } else { "truncated or partly pasted" }
            ));
        }
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
            return;
        }
        let Some(s) = m.tried_to_allocate else {
            self.set(
                Likely::Unclear,
                "Unclear: the text lacks the request size ('Tried to allocate'), so no figure can \
                 be compared with it."
                    .into(),
            );
            return;
        };
        let Some(t) = m.total_capacity else {
            return self.without_capacity(s);
        };
        let gpu = self.gpu();

        // Request larger than the whole GPU.
        if clearly_gt(s, t, &[s, t]) {
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
            return;
        }

        let reserved = m.reserved_total.or(m.allocated_by_pytorch);
        // Per-process fraction cap.
        if let (Some(l), Some(r)) = (m.allowed, reserved) {
            // reserved + request reaching the cap *within rounding* is enough: the figures
            // are rounded, the allocator's check (reserved + size > allowed) was not.
            if clearly_gt(t, l, &[t, l]) && roughly_ge(r.saturating_add(s), l, &[r, s, l]) {
                let u = m.reserved_unallocated.unwrap_or(0);
                if s > 2 * MIB && roughly_ge(u, s, &[u, s]) && m.form != MessageForm::CudaMallocAsync {
                    return self.fraction_cap_fragmented(s, t, l, r);
                }
                return self.fraction_cap(s, t, l, r);
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

        if m.form == MessageForm::CudaMallocAsync {
            return self.async_backend(s, t);
        }

        let u = m.reserved_unallocated.unwrap_or(0);
        let p = m.private_pools.unwrap_or(0);
        let r = m.reserved_total.unwrap_or(0);
        // Memory the request could have used had it not been stranded in the cache.
        let stranded = u.saturating_add(p);
        // "A large share": a tenth of what PyTorch reserved, or a GiB. Below that, even a
        // perfectly packed cache would leave almost no headroom; the GPU is simply full.
        let stranded_matters = stranded.saturating_mul(10) >= r || stranded >= GIB;
        // Memory on the GPU outside this allocator. A CUDA context alone is a few hundred
        // MiB, so it counts as "large" from 1 GiB and 10% of the GPU.
        let outside = m.outside_allocator();
        let outside_large = outside.is_some_and(|o| o >= GIB && o.saturating_mul(10) >= t);

        // Fragmentation: the cache alone held enough free bytes. When memory outside the
        // allocator is both large and bigger than what fragmentation stranded, that is the
        // bigger lever and leads; fragmentation is then a finding.
        if roughly_ge(u, s, &[u, s]) && stranded_matters {
            if outside_large && outside.unwrap_or(0) > stranded {
                self.other_processes(s, t, outside.unwrap_or(0));
                self.findings.push(format!(
                    "Fragmentation also played a part: {} sat reserved but unallocated, enough \
                     for this request, in blocks that did not fit it.",
                    self.unallocated()
                ));
                return;
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
            return self.fragmentation_advice();
        }

        // Exhaustion: live tensors + request exceed the GPU.
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
                return self.exhaustion_advice();
            }
        }

        // CUDA said there was room.
        if let Some(f) = m.free {
            if roughly_ge(f, s, &[f, s]) {
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
                return;
            }
        }

        // Stranded cache bytes plus CUDA's free memory would have been enough.
        if let Some(f) = m.free {
            // u may be a difference of rounded figures (legacy R − A): its own uncertainty.
            let pm = slack(&[p, f, s]) + m.reserved_unallocated_uncertainty;
            if stranded > 0 && stranded.saturating_add(f).saturating_add(pm) >= s {
                if outside_large && outside.unwrap_or(0) > stranded {
                    return self.other_processes(s, t, outside.unwrap_or(0));
                }
                if !stranded_matters {
                    return self.borderline(s, f, u, p);
                }
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
                return self.fragmentation_advice();
            }
        }

        // The request fits the GPU but not this process's share: who holds the rest?
        if outside_large {
            return self.other_processes(s, t, outside.unwrap_or(0));
        }
        self.set(
            Likely::Exhaustion,
            format!(
                "Exhaustion: {gpu} is effectively full; the {} request does not fit in what \
                 live tensors and the CUDA context leave over.",
                fs(s)
            ),
        );
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
        if m.form.has_expandable_segments() && !m.expandable_segments_hint {
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

    /// Findings that restate the figures in plain words, for every form that has them.
    fn describe_figures(&mut self) {
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
        if m.form.is_caching_allocator_report() {
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
        self.findings.push(
            "At the OOM PyTorch had already returned every fully free cached segment to the driver \
             and retried, so the remaining unallocated bytes sit inside segments that still hold \
             live tensors; torch.cuda.empty_cache() cannot release them."
                .into(),
        );
        if m.expandable_segments_hint {
            self.next_steps.push(
                "Expandable segments are already on, so what is left is fragmentation inside a \
                 segment: short- and long-lived tensors interleaved. A snapshot (below) shows \
                 which live allocations pin the gaps; allocating long-lived tensors (weights, \
                 optimizer state, KV caches) first and together usually closes them."
                    .into(),
            );
        } else if m.form.has_expandable_segments() {
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
        self.findings.push(if self.m.is_rocm() {
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
    match m.form {
        MessageForm::Legacy => {
            let mut v = vec![format!(
                "Record a snapshot at the next OOM (PyTorch 1.13 / 2.0 API):\n\
                 import pickle, torch\n\
                 torch.cuda.memory._record_memory_history(True, trace_alloc_max_entries=100000)  # at the start\n\
                 try:\n    main()  # your training / inference code\n\
                 except torch.cuda.OutOfMemoryError:  # RuntimeError before 1.13\n\
                 \x20   with open(\"oom.pickle\", \"wb\") as f:\n\
                 \x20       pickle.dump(torch.cuda.memory._snapshot(), f)\n\
                 \x20   raise"
            )];
            // RuntimeError (no OutOfMemoryError class yet) or the "cached" wording: < 1.13
            let old = m.exception.as_deref() == Some("RuntimeError") || m.raw.to_ascii_lowercase().contains("cached)");
            if old {
                v.push(
                    "This message probably comes from a PyTorch older than 1.13 (it was \
                     raised as RuntimeError or says 'cached'), which cannot record allocation \
                     history; upgrade to record a snapshot."
                        .into(),
                );
            }
            v.push(analyze);
            v
        }
        MessageForm::CudaMallocAsync => vec![
            format!(
                "The cudaMallocAsync backend cannot record allocation history. Reproduce once \
                 with the native allocator (drop `backend:cudaMallocAsync` from \
                 PYTORCH_CUDA_ALLOC_CONF) and record a snapshot:\n{}",
                record_snippet("torch.OutOfMemoryError")
            ),
            analyze,
        ],
        _ => {
            // The top-level alias torch.OutOfMemoryError only exists in newer releases;
            // torch.cuda.OutOfMemoryError works on every 2.x, so 2.1–2.4 messages get that.
            let exc = match m.exception.as_deref() {
                Some(e) if e.ends_with("OutOfMemoryError") && e.starts_with("torch.") => e,
                _ if matches!(m.form, MessageForm::V2_1 | MessageForm::V2_2) => "torch.cuda.OutOfMemoryError",
                _ => "torch.OutOfMemoryError",
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

#[cfg(test)]
mod search_tests {
    use super::find_ci;
    use proptest::prelude::*;

    /// The search by definition: a case-insensitive compare at every position.
    fn naive(h: &str, n: &str, from: usize, limit: usize) -> Option<usize> {
        let (h, n) = (h.as_bytes(), n.as_bytes());
        let limit = limit.min(h.len());
        if n.is_empty() || from >= limit || limit - from < n.len() {
            return None;
        }
        (from..=limit - n.len()).find(|&i| h[i..i + n.len()].eq_ignore_ascii_case(n))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn find_ci_finds_what_a_compare_everywhere_finds(
            hay in "[oOuUtT fFmMeErRyY.]{0,60}",
            needle in prop::sample::select(vec!["out of memory.", "Of", "y", "MEMORY", "t o", ". "]),
            from in 0usize..70,
            limit in 0usize..70,
        ) {
            prop_assert_eq!(find_ci(&hay, needle, from, limit), naive(&hay, needle, from, limit));
        }
    }
}
