//! One walk of a PyTorch memory trace, and what it tells: the memory over time, who holds
//! it, the training steps and what each block is for.
//!
//! Everything here reads a [`fragscope_snapshot::Snapshot`] and returns plain data
//! (serde-serialisable) for the front ends to render:
//!
//! * [`timeline`]: the walk of one device's trace ([`timeline::DeviceTimeline`]: allocated,
//!   reserved and fragmentation over time, the peaks), and the allocator's live blocks at
//!   any entry ([`timeline::live_at`]);
//! * [`lives`]: every block's life from the walk ([`lives::BlockLives`]), shared by the
//!   analyses that ask "who was live when";
//! * [`attribution`]: call sites ([`attribution::Site`]) and `record_function` scopes
//!   ([`attribution::Scopes`]) holding the memory at the peaks;
//! * [`steps`]: training steps and their phases (forward, backward, optimizer) from the
//!   stacks' evidence ([`steps::Steps`]);
//! * [`roles`]: what each block is for — parameters, gradients, optimizer state,
//!   activations, temporaries ([`roles::DeviceRoles`]);
//! * [`summary`]: the `memory_summary()` figures plus fragmentation, the trace's counts,
//!   steps and roles in one document ([`summary::Summary`]).
//!
//! The state before the trace comes from the replay's backward walk (`fragscope-replay`);
//! the verdicts built on these results are `fragscope-diagnose`'s.

pub mod attribution;
pub(crate) mod hugepages;
pub mod lives;
pub mod par;
pub mod roles;
pub mod steps;
pub mod summary;
pub mod timeline;
