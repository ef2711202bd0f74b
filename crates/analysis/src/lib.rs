//! What happened to the memory: analyses of PyTorch memory snapshots.
//!
//! Everything here works on the [`fragscope_snapshot::Snapshot`] model and returns plain
//! data (serde-serialisable) for the front ends to render: the `memory_summary()`
//! figures plus fragmentation ([`summary`]), timelines and peaks ([`timeline`]), who holds
//! the memory ([`attribution`]), leak suspects ([`leaks`]), block lives shared by them ([`lives`]), the OOM and its fixes
//! ([`oom`], [`recommend`], [`analyze`]), comparisons and CI gates ([`diff`], [`check`]),
//! the OOM error text ([`oom_message`]), leaks planted into real files to test the
//! leak detector ([`plant`]), and replay of traces through the allocator model
//! ([`replay`], [`recorder`]); memory at a size nobody recorded, from recordings at other
//! sizes ([`predict`]); the usual advice (`empty_cache`, no caching) judged from an
//! OOM message ([`advice`]) or replayed ([`replay::advice`]).

pub mod oom_message;
pub mod recorder;

pub mod memstats;
pub mod replay;
pub mod summary;

pub mod attribution;
pub mod check;
pub mod diff;
pub mod leaks;
pub mod lives;
mod mem;
pub mod par;
pub mod plant;
pub mod timeline;
pub mod window;

pub mod advice;
pub mod analyze;
pub mod oom;
pub mod predict;
pub mod recommend;

pub mod roles;
pub mod steps;
