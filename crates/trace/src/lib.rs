//! One walk of a PyTorch memory trace, and what it tells: the memory over time, who holds
//! it, the training steps and what each block is for.
//!
//! Everything here reads a [`fragscope_snapshot::Snapshot`] and returns plain data
//! (serde-serialisable) for the front ends to render. The principal types, and how they
//! meet:
//!
//! * The bookkeeping walk every other part builds on (`walk.rs`): the trace's entries
//!   applied in order to the live blocks and the four [`Levels`], from the state seeded
//!   before the first entry ([`SeededStart`]); no allocator model. It reports to a
//!   [`WalkSink`] — each block entering or leaving the allocated set ([`AllocatedChange`])
//!   and the levels at every state — so that one walk feeds several consumers (a tuple of
//!   sinks is a sink; [`OnAllocated`] and [`OnLevels`] make one of a closure).
//! * [`DeviceTimeline`] ([`timeline()`]): the curves of one device (allocated, active,
//!   requested and reserved over time, downsampled into [`SeriesPoint`]s), their
//!   [`Peak`]s and fragmentation — the timeline's own sink of the walk; the live blocks at
//!   any entry ([`live_at`] → [`LiveBlock`]). [`timeline_walk`] lends the same walk to a
//!   sink of the caller's (the HTML report's curves).
//! * [`BlockLives`]: every block's `allocated` life ([`TracedLife`], [`SeededLife`]), kept
//!   by a sink of the same walk ([`timeline_with_lives`]; [`timeline_with_lives_then`] and
//!   [`timeline_walk_then`] hand them to an [`OnLives`] before the timeline's last part, so
//!   that the roles can start) or by a walk of their own ([`BlockLives::replay`], from its
//!   first pass alone), shared by the analyses that ask "who was live when": attribution,
//!   roles, leak detection.
//! * [`Scopes`]: the `record_function` scopes open at any moment; [`Site`]: the call site
//!   of a stack ([`site_of`]); [`DeviceAttribution`] ([`attribute`]): the sites and scopes
//!   holding the memory at the peaks, read from the lives; [`context_key`]: an
//!   allocation's `compile_context` or `user_metadata` ([`ContextField`]) as a grouping key.
//! * [`Steps`] ([`steps()`]): training steps and their phases (forward, backward,
//!   optimizer) from the stacks' evidence; [`DeviceRoles`] ([`device_roles`]): what each
//!   block is for — parameters, gradients, optimizer state, activations, temporaries —
//!   from the lives and the steps ([`Roles`], one [`BlockRole`] per life).
//! * [`Summary`] ([`summarize`]): the `memory_summary()` figures plus fragmentation, pinned
//!   host memory apart ([`HostSummary`]), the
//!   trace's counts, steps and roles in one document ([`DeviceSummary`] per device).
//!
//! Modules are private; everything above is re-exported here, a few under a name that says
//! what it is ([`roles_text`], [`SUMMARY_SCHEMA`], [`par_map`]). [`SiteTable`] is public for
//! leak detection (`fragscope-diagnose`), which groups the blocks of millions of lives by
//! call site and interns the sites as it goes.
//!
//! Modules depend downwards only, in this order (checked by `.ci/check_module_graph.py`):
//! `hugepages`, `par`, `blocks`, `contexts`, `scopes` → `walk` → `lives` → `timeline` → `attribution`;
//! `steps` → `roles` → `summary`. The allocator's own rules (rounding, the recorded
//! settings, `memory_stats()`) come from `fragscope-replay`; the verdicts built on these
//! results are `fragscope-diagnose`'s.

mod attribution;
mod blocks;
mod contexts;
mod hugepages;
mod lives;
mod par;
mod roles;
mod scopes;
mod steps;
mod summary;
mod timeline;
mod walk;

pub use attribution::{
    attribute, bytes_by_site, is_library_frame, site_of, AnnotationBytes, AttributionOptions, DeviceAttribution,
    PeakAttribution, PeakKind, PinnedGroup, PinnedSegments, Site, SiteBytes, SiteTable,
};
pub use contexts::{context_key, ContextField, BEFORE_TRACE};
pub use lives::{live_bytes_at, BlockLives};
pub use par::{map as par_map, threads as par_threads};
pub use roles::{
    bytes_at as role_bytes_at, classify as classify_roles, describe_bytes as describe_role_bytes, device_block_roles,
    device_roles, device_roles_from, device_roles_prepared, device_roles_with, roles_prep, text as roles_text,
    BlockRole, DeviceRoles, Reason, Role, RoleBytes, RoleEvidence, Roles, RolesPrep, Structure as ModelStructure,
};
pub use scopes::Scopes;
pub use steps::{
    annotated as annotated_spans, has_step_annotations, layer_spans, step_inside_forward, steps, Phase, PhaseSpan,
    Step, StepSource, Steps,
};
pub use summary::{
    host_summary, summarize, summarize_device, summarize_device_threads, summarize_device_with,
    summarize_from_timelines, summarize_parts, summarize_with, DeviceSummary, Fragmentation, History, HostSummary,
    MemvizStats, Notes as ReaderNotes, PoolFigures, Pools, ProfilerTotals, Settings as RecordedSettings, Summary,
    TraceSummary, SCHEMA as SUMMARY_SCHEMA,
};
pub use timeline::{
    levels_at, live_at, live_sets_at, peak_allocated, timeline, timeline_walk, timeline_walk_then, timeline_with_lives,
    timeline_with_lives_then, timelines, DeviceTimeline, LivesIndex, OnLives, Peak, PeakAllocatedSource, SeriesPoint,
    TimelineOptions, DEFAULT_POINTS,
};
pub use walk::{
    AllocatedChange, Levels, LiveBlock, OnAllocated, OnLevels, ReservedSource, Seeded as SeededStart, SeededLife,
    TracedLife, WalkSink, LIVE_AT_END,
};
