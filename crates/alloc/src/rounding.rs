//! Size rounding and segment sizing (spec §1).
//!
//! Every decision downstream (pool choice, best fit, split) works on the
//! *rounded* size, so these functions must match PyTorch bit for bit.

use crate::config::{Accelerator, AllocatorConfig, RoundingRule};

pub use crate::constants::*;

#[inline]
fn round_up(n: u64, m: u64) -> u64 {
    n.div_ceil(m).saturating_mul(m)
}

/// Index into the 16-entry divisions table for a size (§1.3): intervals start at
/// 1 MiB and double; everything below 2 MiB shares index 0, ≥ 32 GiB index 15.
#[inline]
pub fn division_index(n: u64) -> usize {
    if n == 0 {
        return 0;
    }
    let log = 63 - n.leading_zeros() as usize;
    log.saturating_sub(20).min(DIVISION_INTERVALS - 1)
}

/// Power-of-two division rounding (§1.2 step 3): split [F, 2F) into `d` equal
/// steps and round up to the next step.
#[inline]
fn pow2_division_round(n: u64, d: u64) -> u64 {
    if n.is_power_of_two() {
        return n;
    }
    let floor = 1u64 << (63 - n.leading_zeros());
    // d is validated to be a power of two; a shift keeps the arithmetic of the
    // original (floor >> log2 d) for any value that slips through.
    let step = floor >> (63 - d.leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    round_up(n, step)
}

/// `round_size(n)`: the block size a request of `n` bytes occupies (§1.2, §1.4).
#[inline]
pub fn round_size(n: u64, cfg: &AllocatorConfig) -> u64 {
    match cfg.accelerator {
        Accelerator::Cuda | Accelerator::Rocm => {}
        // XPUCachingAllocator::round_size: 512-byte rounding, no divisions table.
        Accelerator::Xpu => return round_up(n.max(1), MIN_BLOCK_SIZE),
        // torch_npu's NPUCachingAllocator::round_size: 32 bytes are added first (the
        // device needs room past the end of a tensor), then 512-byte rounding; no
        // divisions table. A 512-byte request so takes a 1,024-byte block.
        Accelerator::Npu => return round_up(n.saturating_add(32), MIN_BLOCK_SIZE),
    }
    if n < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    match cfg.rounding_rule {
        RoundingRule::Table => {
            let d = cfg.roundup_power2_divisions[division_index(n)];
            if d > 1 && n > MIN_BLOCK_SIZE.saturating_mul(d) {
                pow2_division_round(n, d)
            } else {
                round_up(n, MIN_BLOCK_SIZE)
            }
        }
        RoundingRule::Legacy => {
            // ≤2.0: one global value (entry 0 of the table) and a bypass threshold.
            let d = cfg.roundup_power2_divisions[0];
            if cfg.roundup_bypass_threshold.is_some_and(|t| n > t) {
                round_up(n, MIN_BLOCK_SIZE)
            } else if d > 1 && n > MIN_BLOCK_SIZE.saturating_mul(d) {
                pow2_division_round(n, d)
            } else {
                round_up(n, MIN_BLOCK_SIZE)
            }
        }
    }
}

/// Does a rounded size belong to the small pool? (§1.5: test is `<= 1 MiB`.)
#[inline]
pub fn is_small(rounded: u64) -> bool {
    rounded <= SMALL_SIZE
}

/// Size of the segment requested from CUDA when no cached block fits (§1.5
/// `get_allocation_size`); also the "Tried to allocate" figure of an OOM.
#[inline]
pub fn allocation_size(rounded: u64, cfg: &AllocatorConfig) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        cfg.large_segment_size
    } else {
        round_up(rounded, ROUND_LARGE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_div(d: u64) -> AllocatorConfig {
        AllocatorConfig { roundup_power2_divisions: [d; 16], ..Default::default() }
    }

    #[test]
    fn spec_1_2_worked_values() {
        let c4 = with_div(4);
        assert_eq!(round_size(1200, &c4), 1536, "1200 > 512*4 is false");
        assert_eq!(round_size(3000, &c4), 3072);
        assert_eq!(round_size(5000, &c4), 5120);
        assert_eq!(round_size(9000, &c4), 10240);
        assert_eq!(round_size(100 * MIB, &c4), 117_440_512);
        let c8 = with_div(8);
        assert_eq!(round_size(MIB + 1, &c8), 1_179_648);
        assert!(!is_small(round_size(MIB + 1, &c8)));
        let c0 = AllocatorConfig::default();
        assert_eq!(round_size(1000, &c0), 1024);
        assert_eq!(round_size(1, &c0), 512);
        assert_eq!(round_size(0, &c0), 512);
        assert_eq!(round_size(512, &c0), 512);
        assert_eq!(round_size(513, &c0), 1024);
    }

    #[test]
    fn powers_of_two_and_division_one() {
        let c4 = with_div(4);
        assert_eq!(round_size(4096, &c4), 4096);
        let c1 = with_div(1);
        assert_eq!(round_size(3000, &c1), 3072, "d = 1 means plain rounding");
    }

    #[test]
    fn division_index_intervals() {
        assert_eq!(division_index(1), 0);
        assert_eq!(division_index(2 * MIB - 1), 0);
        assert_eq!(division_index(2 * MIB), 1);
        assert_eq!(division_index(4 * MIB), 2);
        assert_eq!(division_index(256 * MIB), 8);
        assert_eq!(division_index(32 * 1024 * MIB), 15);
        assert_eq!(division_index(u64::MAX), 15);
    }

    #[test]
    fn per_interval_table_is_used() {
        let mut c = AllocatorConfig::default();
        c.roundup_power2_divisions[8] = 4; // [256 MiB, 512 MiB)
        assert_eq!(round_size(300 * MIB, &c), 320 * MIB);
        assert_eq!(round_size(100 * MIB + 1, &c), 100 * MIB + 512);
    }

    #[test]
    fn legacy_bypass_rule() {
        let c = AllocatorConfig {
            roundup_power2_divisions: [4; 16],
            roundup_bypass_threshold: Some(4 * MIB),
            rounding_rule: RoundingRule::Legacy,
            ..Default::default()
        };
        assert_eq!(round_size(3 * MIB + 1, &c), 3 * MIB + MIB / 2);
        assert_eq!(round_size(5 * MIB + 1, &c), 5 * MIB + 512, "above bypass: 512 rounding");
        // Legacy reads only the global value (entry 0).
        let mut c2 = c.clone();
        c2.roundup_power2_divisions = [0; 16];
        c2.roundup_power2_divisions[0] = 4;
        assert_eq!(round_size(3 * MIB + 1, &c2), 3 * MIB + MIB / 2);
    }

    /// The rules of the other accelerators, from their sources: torch_npu's
    /// `NPUCachingAllocator::round_size` (`size + 32`, then 512-byte rounding) and
    /// `c10/xpu/XPUCachingAllocator.cpp`'s (512-byte rounding, no divisions).
    #[test]
    fn npu_and_xpu_rounding() {
        let npu = AllocatorConfig { accelerator: Accelerator::Npu, ..with_div(4) };
        assert_eq!(round_size(0, &npu), 512);
        assert_eq!(round_size(480, &npu), 512);
        assert_eq!(round_size(481, &npu), 1024);
        assert_eq!(round_size(512, &npu), 1024, "512 B becomes a 1,024-byte block");
        assert_eq!(round_size(MIB, &npu), MIB + 512, "1 MiB leaves the small pool");
        assert!(!is_small(round_size(MIB, &npu)));
        assert_eq!(round_size(100 * MIB, &npu), 100 * MIB + 512, "no divisions on NPU");
        let xpu = AllocatorConfig { accelerator: Accelerator::Xpu, ..with_div(4) };
        assert_eq!(round_size(1, &xpu), 512);
        assert_eq!(round_size(512, &xpu), 512);
        assert_eq!(round_size(9000, &xpu), 9216, "no divisions on XPU (CUDA: 10240)");
        assert_eq!(round_size(9000, &with_div(4)), 10240);
        let rocm = AllocatorConfig { accelerator: Accelerator::Rocm, ..with_div(4) };
        assert_eq!(round_size(9000, &rocm), 10240, "ROCm runs CUDA's allocator");
    }

    #[test]
    fn allocation_sizes() {
        let c = AllocatorConfig::default();
        assert_eq!(allocation_size(512, &c), 2 * MIB);
        assert_eq!(allocation_size(MIB, &c), 2 * MIB);
        assert_eq!(allocation_size(MIB + 512, &c), 20 * MIB);
        assert_eq!(allocation_size(10 * MIB - 512, &c), 20 * MIB);
        assert_eq!(allocation_size(10 * MIB, &c), 10 * MIB);
        assert_eq!(allocation_size(29 * MIB / 2, &c), 16 * MIB);
        let c2 = AllocatorConfig { large_segment_size: 32 * MIB, ..Default::default() };
        assert_eq!(allocation_size(5 * MIB, &c2), 32 * MIB);
    }
}
