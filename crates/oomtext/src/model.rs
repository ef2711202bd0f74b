//! The parsed OOM message: its form, its figures as printed, and what can be derived from them
//! within the figures' printed precision (see the crate doc for what each figure means).

use serde::Serialize;
use std::fmt;

pub(crate) const KIB: u64 = 1024;
pub(crate) const MIB: u64 = 1024 * KIB;
pub(crate) const GIB: u64 = 1024 * MIB;
/// 2^60 bytes: PyTorch refuses requests at or above this before touching the allocator.
pub(crate) const ONE_EIB: u64 = 1 << 60;

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
    pub(crate) fn has_expandable_segments(self) -> bool {
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
    /// `"CUDA"`, `"HIP"` for ROCm builds, or `"NPU"` for Ascend's `torch_npu`.
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
    /// Which software printed this message, for humans: the PyTorch versions of its form
    /// ([`MessageForm::versions`]), except for Ascend's `torch_npu`, which prints PyTorch
    /// 2.0's layout in every version, so that its form tells nothing of its version.
    pub fn versions(&self) -> &'static str {
        if self.is_npu() {
            "torch_npu, whose version the message does not tell"
        } else {
            self.form.versions()
        }
    }

    /// The message form and who prints it, for humans: `2.2+ message form: PyTorch 2.2 or
    /// newer`; for `torch_npu`, which prints PyTorch 2.0's layout in every version, a
    /// sentence that does not read as a PyTorch version.
    pub fn form_text(&self) -> String {
        if self.is_npu() && self.form == MessageForm::Legacy {
            "torch_npu's message, in PyTorch 2.0's layout; the torch_npu version is not told by the message".to_string()
        } else {
            format!("{} message form: {}", self.form, self.versions())
        }
    }

    /// Bytes held by live tensors: "allocated by PyTorch" minus the private-pool share that
    /// 2.5+ folds into it (those bytes are free blocks owned by CUDA graphs / MemPools).
    pub fn live_allocated(&self) -> Option<u64> {
        self.allocated_by_pytorch.map(|a| a.saturating_sub(self.private_pools.unwrap_or(0)))
    }

    /// True for a ROCm build's message (`HIP out of memory`).
    pub fn is_rocm(&self) -> bool {
        self.accelerator == "HIP"
    }

    /// True for an Ascend NPU message (`NPU out of memory`, from `torch_npu`, whose
    /// allocator is a fork of CUDA's printing the ≤ 2.0 layout in every version).
    pub fn is_npu(&self) -> bool {
        self.accelerator == "NPU"
    }

    /// Whether this build has `expandable_segments`: every 2.1+ form, and torch_npu, which
    /// has them although it prints the legacy layout.
    pub(crate) fn has_expandable_segments(&self) -> bool {
        self.form.has_expandable_segments() || self.is_npu()
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

// ---------------------------------------------------------------------------------------------
// Figures and their precision
// ---------------------------------------------------------------------------------------------

/// Slack for comparing sums of printed figures: their rounding errors add up.
pub(crate) fn slack(values: &[u64]) -> u64 {
    values.iter().map(|&v| printed_precision(v)).sum()
}

/// `a > b`, beyond what rounding of the printed figures could explain.
pub(crate) fn clearly_gt(a: u64, b: u64, parts: &[u64]) -> bool {
    a > b.saturating_add(slack(parts))
}

/// `a ≥ b`, allowing for rounding.
pub(crate) fn roughly_ge(a: u64, b: u64, parts: &[u64]) -> bool {
    a.saturating_add(slack(parts)) >= b
}
