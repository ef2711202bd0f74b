//! The allocator's size constants (spec §1.1; the `constexpr`s at the top of PyTorch's
//! `CUDACachingAllocator.cpp`). A module of their own because both the configuration
//! (whose defaults and bounds are made of them) and the rounding rules read them;
//! [`crate::rounding`] re-exports them, where PyTorch's readers look for them.

/// One mebibyte.
pub const MIB: u64 = 1 << 20;
/// Every block is a multiple of this; smaller requests become this (§1.1 kMinBlockSize).
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Largest rounded size served by the small pool (§1.1 kSmallSize).
pub const SMALL_SIZE: u64 = MIB;
/// Small-pool segment size and small expandable page (§1.1 kSmallBuffer).
pub const SMALL_BUFFER: u64 = 2 * MIB;
/// Rounded sizes at or above this get a segment of their own (§1.1 kMinLargeAlloc).
pub const MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// Granularity of dedicated large segments (§1.1 kRoundLarge).
pub const ROUND_LARGE: u64 = 2 * MIB;
/// Default `large_segment_size` (§1.1 kLargeBuffer).
pub const LARGE_BUFFER: u64 = 20 * MIB;
/// Number of intervals of the divisions table (§1.3).
pub const DIVISION_INTERVALS: usize = 16;
