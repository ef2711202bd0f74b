//! What the text of an OOM message alone says about the usual advice
//! (`torch.cuda.empty_cache()`, `PYTORCH_NO_CUDA_MEMORY_CACHING=1`), for `fragscope oom`.
//!
//! Before raising, PyTorch's allocator releases every cached segment that holds no
//! tensor and retries (`release_cached_blocks`, spec §3.7 / §5.2; not during a CUDA
//! graph capture). So the message's "reserved by PyTorch but unallocated" is what that
//! release could *not* return: free space inside segments that still hold live
//! tensors. `empty_cache()` would return nothing more at that moment. With caching off,
//! the process would hold only the tensors' own bytes; whether the request would then
//! fit follows from the message's figures. What neither figure can say is whether
//! calling `empty_cache()` earlier (each iteration) would have prevented the layout:
//! that needs a snapshot and a replay (`replay::advice`).

use crate::oom_message::{format_size, OomMessage};

/// One paragraph for `fragscope oom`, or `None` when the message lacks the figures
/// (reserved-but-unallocated and the request).
pub fn message_advice(m: &OomMessage) -> Option<String> {
    let unalloc = m.reserved_unallocated?;
    let request = m.tried_to_allocate?;
    let mut s = format!(
        "torch.cuda.empty_cache() would not have avoided this error: PyTorch already released every cached \
         segment holding no tensor and retried before raising it, so the {} reserved but unallocated here sits \
         in segments that also hold live tensors, which empty_cache() cannot return.",
        format_size(unalloc)
    );
    // The memory this process could have held without caching: what it reserved plus what
    // the device still had free (the same estimate `analyze` uses for the capacity).
    if let (Some(live), Some(reserved), Some(free)) = (m.live_allocated(), m.reserved_total, m.free) {
        let avail = reserved + free;
        let need = live + request;
        if need <= avail {
            s.push_str(&format!(
                " With PYTORCH_NO_CUDA_MEMORY_CACHING=1 the tensors would hold {} and this request {} more, {} \
                 of the about {} this process could use (reserved + free): it would fit this once, at the cost of \
                 a cudaMalloc and a device-synchronising cudaFree for every tensor.",
                format_size(live),
                format_size(request),
                format_size(need),
                format_size(avail)
            ));
        } else {
            s.push_str(&format!(
                " PYTORCH_NO_CUDA_MEMORY_CACHING=1 would not help either: the tensors alone hold {} and this \
                 request needs {} more, {} over the about {} this process could use (reserved + free).",
                format_size(live),
                format_size(request),
                format_size(need - avail),
                format_size(avail)
            ));
        }
    }
    s.push_str(
        " Whether calling empty_cache() earlier (every iteration) would have prevented the layout cannot be read \
         from a message: record a snapshot and run `fragscope replay snap.pickle --empty-cache-at iteration \
         --no-caching` (cost and peak of both) or `fragscope analyze snap.pickle`.",
    );
    Some(s)
}
