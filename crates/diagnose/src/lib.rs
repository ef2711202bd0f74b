//! Verdicts on a PyTorch memory snapshot, each measured by replay where a replay can say.
//!
//! Built on the trace walk (`fragscope-trace`) and the replay (`fragscope-replay`). The
//! principal types, and how they meet:
//!
//! * [`OomFinding`] ([`oom_finding`]): the recorded OOM — fragmentation, exhaustion,
//!   stranded memory or a cap ([`OomVerdict`]) — the allocator state it saw
//!   ([`allocator_state_at`] → [`StateFigures`]) and the settings a replay shows would
//!   have avoided it ([`OomFix`]);
//! * [`Recommendations`]: allocator settings ([`Candidate`]s of the recording's PyTorch
//!   [`Era`]) replayed as [`Trial`]s and ranked ([`Recommendation`]); with the usual advice,
//!   one ranking by saving and [`Cost`] ([`Ranked`], [`rank_key`]) that findings,
//!   recommendations, the report and MCP all read;
//! * the usual advice replayed ([`simulate_empty_cache`] at [`EmptyCacheAt`],
//!   [`simulate_uncached`]), each a [`fragscope_replay::WhatIf`] beside the settings';
//! * [`DeviceLeaks`] ([`leaks_device`]): leak suspects ([`LeakSuspect`]) on training steps;
//! * [`RoleWhatIf`] ([`simulate_changes`]): the program changed as its author would change
//!   it ([`RoleChange`]: ZeRO sharding, `set_to_none`, activation checkpointing of
//!   [`CheckpointLayers`]), replayed;
//! * [`Analysis`] ([`analyze()`]): all of the above for each device ([`DeviceAnalysis`]),
//!   most important first ([`Finding`]);
//! * [`OomLead`] ([`first_oom`]): where a file's OOM is, which every surface leads with;
//!   [`Imbalance`] ([`imbalance()`]): one device holding far more than its peers;
//! * [`Diff`] ([`diff()`]) and [`CheckResult`] ([`check()`] against [`CheckLimits`]): two
//!   snapshots compared, and a CI gate;
//! * [`RankComparison`] ([`compare_ranks`]): several ranks compared: the median, the
//!   outliers and the call sites that explain them;
//! * [`WindowInfo`] ([`cut_window`] at a [`WindowSpec`]): a slice of a long trace made into
//!   a snapshot of its own.
//!
//! Modules are private; everything above is re-exported here, a few under a name that says
//! what it is (e.g. [`ANALYZE_SCHEMA`] and [`CHECK_SCHEMA`], both `SCHEMA` in their module).

mod advice;
mod analyze;
mod check;
mod diff;
mod imbalance;
mod leaks;
mod oom;
mod ranks;
mod recommend;
mod role_whatif;
mod window;

pub use advice::{
    empty_cache_points, simulate_empty_cache, simulate_uncached, EmptyCacheAt, EmptyCacheAtError, NoEmptyCachePoint,
};
pub use analyze::{
    analyze, analyze_with_timelines, Analysis, AnalyzeOptions, Beside, DeviceAnalysis, Finding, FindingKind,
    FragmentationFindings, OnRoles, Peaks, Severity, TimelineOf, SCHEMA as ANALYZE_SCHEMA,
};
pub use check::{
    check, parse_fraction, CheckResult, DeviceCheck, Failure as CheckFailure, FractionError, Limit as LimitKind,
    Limits as CheckLimits, Value as CheckValue, SCHEMA as CHECK_SCHEMA,
};
pub use diff::{diff, Delta, DeviceDiff, Diff, DiffOptions, Figures as DiffFigures, SiteDelta};
pub use imbalance::{imbalance, Imbalance, FACTOR as IMBALANCE_FACTOR, MIN_EXCESS as IMBALANCE_MIN_EXCESS};
pub use leaks::{
    leaks_device, CurvePoint, DeviceLeaks, GrowthSpan, LeakStepSource, LeakSteps, LeakSuspect,
    MAX_SAMPLES as MAX_LEAK_SAMPLES,
};
pub use oom::{
    allocator_state_at, avoids as avoids_oom, first_oom, oom_finding, state_figures, AdviceOutcome,
    CapacitySource as OomCapacitySource, Fix as OomFix, FreeSpace, OomFinding, OomLead, OomOptions, PoolKind,
    StateAtError, StateFigures, StateSource as OomStateSource, Verdict as OomVerdict,
};
pub use ranks::{
    compare_ranks, Outlier, RankComparison, RankFigures, RankRow, SiteExcess, MIN_RANKS_FOR_OUTLIERS, OUTLIER_FACTOR,
    TOP_SITES,
};
pub use recommend::{
    advice_headline, advice_trials, candidates, from_trials, infer_era, rank_key, refusal as trials_refusal, Candidate,
    Cost, Era, Ranked, Recommendation, Recommendations, Trial,
};
pub use role_whatif::{
    reserved_floor, shard as shard_size, simulate_change_sets, simulate_changes, CannotApply, Change as RoleChange,
    ChangeOutcome, Layers as CheckpointLayers, LayersError as CheckpointLayersError, RoleRow, RoleRows, RoleWhatIf,
};
pub use window::{
    cut as cut_window, Bound as WindowBound, DeviceWindow, EndState as WindowEndState, TraceExtent, WindowBy,
    WindowError, WindowInfo, WindowSpec,
};
