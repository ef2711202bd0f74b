//! A device's size as a user writes it (`40GB`, `39.5GiB`, or a GPU name), read one way by
//! every command (`replay`, `predict`, `fit`, `report --fit`): bytes as given; a GPU name's
//! total less [`CUDA_CONTEXT_ALLOWANCE`], with the note that says so ([`parse_capacity`]).

use crate::{msg, Error};

/// The total as written: a GPU name's whole memory, bytes as given.
fn parse_total(t: &str) -> Result<u64, Error> {
    fragscope_replay::parse_capacity(t).map_err(|e| Error::argument(msg![e.to_string()]))
}

/// Bytes a process loses to the CUDA context and library workspaces before PyTorch's
/// allocator gets any: what a GPU name's total capacity is reduced by. Measured as
/// "this process has X in use" less what PyTorch reserved, in real OOM messages: 0.51 GiB
/// on our H200 (both OOM recordings of `crates/testdata/h200`; 552,402,944 bytes between
/// `total_memory` and the free memory at the start of each `fit.jsonl` process), 0.51 and
/// 0.54 GiB on two RTX 4090s and 0.34 GiB on an L40S in public issues (one more process
/// showed 1.15 GiB, other libraries loaded). 560 MiB covers all but that one; give the
/// real figure (`torch.cuda.mem_get_info()[0]` at the start of the process) in bytes.
pub const CUDA_CONTEXT_ALLOWANCE: u64 = 560 << 20;

/// What PyTorch's allocator may hold on a GPU of `total` bytes: the total less
/// [`CUDA_CONTEXT_ALLOWANCE`]. Every reading of a GPU name (`predict`, `fit`'s cards and the
/// GPUs it names) goes through here.
pub fn usable_bytes(total: u64) -> u64 {
    total.saturating_sub(CUDA_CONTEXT_ALLOWANCE)
}

/// A capacity as every command takes it (`--capacity`, `report --fit`): bytes as given; a
/// GPU name's total less [`CUDA_CONTEXT_ALLOWANCE`], with the note that says so.
pub fn parse_capacity(text: Option<&str>) -> Result<(Option<u64>, Option<String>), Error> {
    let Some(t) = text else { return Ok((None, None)) };
    let total = parse_total(t)?;
    if fragscope_replay::parse_size(t).is_ok() {
        return Ok((Some(total), None));
    }
    let usable = usable_bytes(total);
    let note = format!(
        "{t}: {} total capacity less {} for the CUDA context and library workspaces (measured in real OOM \
         messages: 0.34-0.54 GiB) = {usable} for PyTorch's allocator; give the bytes torch.cuda.mem_get_info()[0] \
         reports at the start of your process as --capacity for the exact figure",
        fragscope_alloc::format_size(total),
        fragscope_alloc::format_size(CUDA_CONTEXT_ALLOWANCE),
        usable = fragscope_alloc::format_size(usable),
    );
    Ok((Some(usable), Some(note)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_name_leaves_room_for_the_cuda_context_and_says_so() {
        let total = parse_total("H100-80GB").unwrap();
        let (cap, note) = parse_capacity(Some("H100-80GB")).unwrap();
        assert_eq!(cap, Some(total - CUDA_CONTEXT_ALLOWANCE));
        let note = note.expect("said");
        assert!(note.contains("CUDA context") && note.contains("mem_get_info"), "{note}");
        // Bytes are what the allocator may use, as given.
        assert_eq!(parse_capacity(Some("80GB")).unwrap(), (Some(80_000_000_000), None));
        assert_eq!(parse_capacity(None).unwrap(), (None, None));
        assert!(parse_capacity(Some("H900")).is_err());
    }
}
