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
//! Ascend NPU messages (`torch_npu`, whose `NPUCachingAllocator` is a fork of CUDA's) print
//! the `Legacy` layout in every version, with `NPU d` for `GPU d` and an extra `current
//! active` figure (not kept): they are accepted with [`OomMessage::accelerator`] `"NPU"`,
//! the advice names `PYTORCH_NPU_ALLOC_CONF`, `npu-smi`, `ASCEND_RT_VISIBLE_DEVICES` and
//! `torch_npu.npu.memory`'s recording API, and offers `expandable_segments` (torch_npu has
//! them whatever the layout says).
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
//! ([`printed_precision`]). Every comparison in [`explain`](fn@explain) allows for that slack, so a rule
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
//!
//! # Where the parts live
//!
//! The crate root is the public face of three private modules, re-exported here: the data model
//! (`model.rs`: [`OomMessage`], [`MessageForm`], [`printed_precision`]), the parser
//! (`parse.rs`: [`parse`](fn@parse), [`parse_all`]) and the explainer (`explain.rs`: [`explain`](fn@explain)).
//!
//! [`message_advice`] judges the usual advice (`empty_cache()`, no caching) from the
//! message's figures alone. Nothing here needs a snapshot: when one exists,
//! `fragscope-diagnose` measures instead.

mod advice;
mod explain;
mod model;
mod parse;

pub use advice::message_advice;
pub use explain::{explain, format_size_pm, requests_for_segment, Likely, OomExplanation};
pub use fragscope_alloc::format_size;
pub use model::{printed_precision, MessageForm, OomMessage, ParseError, ProcessUse};
pub use parse::{parse, parse_all, parse_size};
