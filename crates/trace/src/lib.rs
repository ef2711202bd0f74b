//! One walk of a PyTorch memory trace, and what it tells: the memory over time, who holds
//! it, the training steps and what each block is for.
//!
//! Everything here reads a [`fragscope_snapshot::Snapshot`] and returns plain data
//! (serde-serialisable) for the front ends to render:
//!
//! * [`walk`]: the bookkeeping walk every other module builds on ([`walk::Replayer`]): the
//!   trace's entries applied in order to the live blocks and the four levels, from the
//!   state seeded before the first entry ([`walk::Seeded`]);
//! * [`blocks`] and [`scopes`]: what a recorded block's figures mean, and the
//!   `record_function` scopes open at any moment ([`scopes::Scopes`]);
//! * [`lives`]: every block's life from the walk ([`lives::BlockLives`]), shared by the
//!   analyses that ask "who was live when";
//! * [`timeline`]: the curves of one device ([`timeline::DeviceTimeline`]: allocated,
//!   reserved and fragmentation over time, the peaks), and the live blocks at any entry
//!   ([`timeline::live_at`]);
//! * [`attribution`]: call sites ([`attribution::Site`]) holding the memory at the peaks;
//! * [`steps`]: training steps and their phases (forward, backward, optimizer) from the
//!   stacks' evidence ([`steps::Steps`]);
//! * [`roles`]: what each block is for — parameters, gradients, optimizer state,
//!   activations, temporaries ([`roles::DeviceRoles`]);
//! * [`summary`]: the `memory_summary()` figures plus fragmentation, the trace's counts,
//!   steps and roles in one document ([`summary::Summary`]).
//!
//! Modules depend downwards only, in this order (checked by `.ci/check_module_graph.py`):
//! `hugepages`, `par`, `blocks`, `scopes` → `walk` → `lives` → `timeline` → `attribution`;
//! `steps` → `roles` → `summary`. The allocator's own rules (rounding, the recorded
//! settings, `memory_stats()`) come from `fragscope-replay`; the verdicts built on these
//! results are `fragscope-diagnose`'s.

pub mod attribution;
pub mod blocks;
pub(crate) mod hugepages;
pub mod lives;
pub mod par;
pub mod roles;
pub mod scopes;
pub mod steps;
pub mod summary;
pub mod timeline;
pub mod walk;
