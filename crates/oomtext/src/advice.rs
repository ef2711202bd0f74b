//! What the text of an OOM message alone says about the usual advice
//! (`torch.cuda.empty_cache()`, `PYTORCH_NO_CUDA_MEMORY_CACHING=1`; torch_npu's `torch.npu` and
//! `PYTORCH_NO_NPU_MEMORY_CACHING` for an NPU message), for `fragscope oom`.
//!
//! Before raising, PyTorch's allocator releases every cached segment that holds no
//! tensor and retries (`release_cached_blocks`, spec §3.7 / §5.2; not during a CUDA
//! graph capture). So the message's "reserved by PyTorch but unallocated" is what that
//! release could *not* return: free space inside segments that still hold live
//! tensors. `empty_cache()` would return nothing more at that moment. With caching off,
//! the process would hold only the tensors' own bytes; whether the request would then
//! fit follows from the message's figures. What neither figure can say is whether
//! calling `empty_cache()` earlier (each training step) would have prevented the layout:
//! that needs a snapshot and a replay (`replay::advice`).

use crate::{format_size, format_size_pm, printed_precision, OomMessage};

/// With caching off every tensor is its own driver allocation, rounded by the driver (2 MiB
/// pages for anything but tiny tensors); a margin under this is not room for "it would fit".
const NO_CACHING_GRANULARITY: u64 = 20 << 20;

/// One paragraph for `fragscope oom`, or `None` when the message lacks the figures
/// (reserved-but-unallocated and the request).
pub fn message_advice(m: &OomMessage) -> Option<String> {
    let unalloc = m.reserved_unallocated?;
    let request = m.tried_to_allocate?;
    // The driver calls, the cache-release call and the no-caching variable in the
    // platform's own names (torch_npu: aclrt*, torch.npu, PYTORCH_NO_NPU_MEMORY_CACHING).
    let (a_drv_malloc, drv_free, empty_cache, no_caching) = if m.is_npu() {
        ("an aclrtMalloc", "aclrtFree", "torch.npu.empty_cache()", "PYTORCH_NO_NPU_MEMORY_CACHING=1")
    } else if m.is_rocm() {
        ("a hipMalloc", "hipFree", "torch.cuda.empty_cache()", "PYTORCH_NO_CUDA_MEMORY_CACHING=1")
    } else {
        ("a cudaMalloc", "cudaFree", "torch.cuda.empty_cache()", "PYTORCH_NO_CUDA_MEMORY_CACHING=1")
    };
    let mut s = format!(
        "{empty_cache} would not have avoided this error: PyTorch already released every cached \
         segment holding no tensor and retried before raising it, so the {} reserved but unallocated here sits \
         in segments that also hold live tensors, which empty_cache() cannot return.",
        format_size_pm(unalloc, m.reserved_unallocated_uncertainty)
    );
    // The memory this process could have held without caching: what it reserved plus what
    // the device still had free (the same estimate `analyze` uses for the capacity).
    if let (Some(live), Some(reserved), Some(free)) = (m.live_allocated(), m.reserved_total, m.free) {
        let avail = reserved + free;
        let need = live + request;
        // Both sums are of rounded figures: within their rounding, or within the driver's
        // granularity on the "fits" side, the figures cannot say.
        let pm = [live, request, reserved, free].iter().map(|&v| printed_precision(v)).sum::<u64>()
            + m.reserved_unallocated_uncertainty;
        if need <= avail && avail - need <= NO_CACHING_GRANULARITY + pm || need > avail && need - avail <= pm {
            s.push_str(&format!(
                " Whether {no_caching} would have fit it cannot be told: the tensors would hold {} \
                 and this request {} more, {} against the about {} this process could use (reserved + free), a \
                 margin of {} {}, within the figures' rounding and the driver's allocation granularity.",
                format_size(live),
                format_size(request),
                format_size(need),
                format_size(avail),
                format_size_pm(avail.abs_diff(need), pm),
                if need <= avail { "to spare" } else { "short" },
            ));
        } else if need <= avail {
            s.push_str(&format!(
                " With {no_caching} the tensors would hold {} and this request {} more, {} \
                 of the about {} this process could use (reserved + free): by these figures it would fit this once \
                 (each tensor then being its own driver allocation, whose rounding the text cannot count), at the \
                 cost of {a_drv_malloc} and a device-synchronising {drv_free} for every tensor.",
                format_size(live),
                format_size(request),
                format_size(need),
                format_size(avail)
            ));
        } else {
            s.push_str(&format!(
                " {no_caching} would not help either: the tensors alone hold {} and this \
                 request needs {} more, {} over the about {} this process could use (reserved + free).",
                format_size(live),
                format_size(request),
                format_size(need - avail),
                format_size(avail)
            ));
        }
    }
    s.push_str(
        " Whether calling empty_cache() earlier (every training step) would have prevented the layout cannot be read \
         from a message: record a snapshot and run `fragscope replay snap.pickle --empty-cache-at step \
         --no-caching` (cost and peak of both) or `fragscope analyze snap.pickle`.",
    );
    Some(s)
}
