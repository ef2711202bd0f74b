//! Verdicts on a PyTorch memory snapshot, each measured by replay where a replay can say.
//!
//! Built on the trace walk (`fragscope-trace`) and the replay (`fragscope-replay`):
//!
//! * [`oom`]: the recorded OOM — fragmentation, exhaustion, stranded memory or a cap — and
//!   the settings a replay shows would have avoided it ([`oom::OomFinding`]);
//! * [`recommend`]: allocator settings replayed and ranked ([`recommend::Recommendation`]);
//! * [`advice`]: the usual advice (`empty_cache()` each step, no caching) replayed;
//! * [`leaks`]: leak suspects on training steps ([`leaks::DeviceLeaks`]);
//! * [`role_whatif`]: the program changed as its author would change it (ZeRO sharding,
//!   `set_to_none`, activation checkpointing), replayed ([`role_whatif::RoleWhatIf`]);
//! * [`analyze`]: all of the above, most important first ([`analyze::Analysis`]);
//! * [`diff`] and [`check`]: two snapshots compared, and a CI gate;
//! * [`compare_ranks`]: several ranks compared: the median, the outliers and the call
//!   sites that explain them ([`RankComparison`]);
//! * [`window`]: a slice of a long trace made into a snapshot of its own.

pub mod advice;
pub mod analyze;
pub mod check;
pub mod diff;
pub mod leaks;
pub mod oom;
pub mod recommend;
pub mod role_whatif;
pub mod window;

mod ranks;
pub use ranks::{
    compare_ranks, Outlier, RankComparison, RankFigures, RankRow, SiteExcess, MIN_RANKS_FOR_OUTLIERS, OUTLIER_FACTOR,
    TOP_SITES,
};
