//! The `compile_context` and `user_metadata` of an allocation, as a grouping key: the
//! strings PyTorch attaches to each trace entry (`compile_context` with
//! `_record_memory_history(compile_context=True)`, 2.8+: the `torch.compile` region the
//! allocation happened in; `user_metadata`, 2.10+: the string the program set with
//! `torch.cuda.memory._set_memory_metadata`). `state --by`, `analyze` and `export` group
//! allocations by them as they do by `record_function` annotation ([`ContextField`],
//! [`context_key`]).

use fragscope_snapshot::{Action, EntryContext, Snapshot, StrId};

/// Which of an entry's strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContextField {
    CompileContext,
    UserMetadata,
}

impl ContextField {
    /// This field of an entry's context.
    pub fn of(self, c: &EntryContext) -> Option<StrId> {
        match self {
            ContextField::CompileContext => c.compile_context,
            ContextField::UserMetadata => c.user_metadata,
        }
    }

    /// The key PyTorch writes.
    pub fn as_str(self) -> &'static str {
        match self {
            ContextField::CompileContext => "compile_context",
            ContextField::UserMetadata => "user_metadata",
        }
    }
}

/// Key of a block allocated before the trace (no `alloc` entry to read).
pub const BEFORE_TRACE: &str = "(allocated before the trace)";

/// The string `field` of the `alloc` entry `alloc_event` of `device`'s trace, as a
/// grouping key: `None` for a block allocated before the trace ([`BEFORE_TRACE`] is its
/// key), else the string, `"(not recorded)"` when the entry has none (before 2.8, or
/// `compile_context=False`), `"(none set)"` for an empty `user_metadata` (its default),
/// and `"N/A (outside torch.compile regions)"` for the `"N/A"` PyTorch writes outside them.
pub fn context_key(snap: &Snapshot, device: i64, alloc_event: Option<usize>, field: ContextField) -> String {
    context_key_named(snap, context_key_id(snap, device, alloc_event, field), field)
}

/// What [`context_key`] names, before it is named: `None` for a block allocated before the
/// trace, else the entry's string id (`Some(None)`: none recorded). For a caller that groups
/// many blocks: one key per distinct id, not a `String` per block.
pub fn context_key_id(
    snap: &Snapshot,
    device: i64,
    alloc_event: Option<usize>,
    field: ContextField,
) -> Option<Option<StrId>> {
    let ev = alloc_event.and_then(|i| snap.trace(device).get(i)).filter(|e| e.action == Action::Alloc)?;
    Some(field.of(&snap.context(ev)))
}

/// The key [`context_key`] gives a block whose [`context_key_id`] is `id`.
pub fn context_key_named(snap: &Snapshot, id: Option<Option<StrId>>, field: ContextField) -> String {
    let Some(id) = id else { return BEFORE_TRACE.to_string() };
    match id.map(|s| snap.frames.str(s)) {
        None => "(not recorded)".to_string(),
        Some("") => "(none set)".to_string(),
        Some("N/A") if field == ContextField::CompileContext => "N/A (outside torch.compile regions)".to_string(),
        Some(s) => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_snapshot::{EntryContext, TraceEvent};

    #[test]
    fn keys_name_what_was_recorded() {
        let mut snap = Snapshot::default();
        let cc = snap.frames.intern_str("torch-compiled region: 0/1");
        let um = snap.frames.intern_str("");
        let na = snap.frames.intern_str("N/A");
        let mut a = TraceEvent::new(Action::Alloc, 0x1000, 512);
        a.context = snap
            .intern_context(EntryContext { compile_context: Some(cc), user_metadata: Some(um), ..Default::default() })
            .unwrap();
        let mut b = TraceEvent::new(Action::Alloc, 0x2000, 512);
        b.context = snap.intern_context(EntryContext { compile_context: Some(na), ..Default::default() }).unwrap();
        let free = TraceEvent::new(Action::FreeRequested, 0x1000, 512);
        snap.device_traces = vec![vec![a, b, free]];
        let k = |i, f| context_key(&snap, 0, i, f);
        assert_eq!(k(Some(0), ContextField::CompileContext), "torch-compiled region: 0/1");
        assert_eq!(k(Some(0), ContextField::UserMetadata), "(none set)");
        assert_eq!(k(Some(1), ContextField::CompileContext), "N/A (outside torch.compile regions)");
        assert_eq!(k(Some(1), ContextField::UserMetadata), "(not recorded)");
        assert_eq!(k(None, ContextField::UserMetadata), BEFORE_TRACE);
        // Not an alloc entry, or past the trace: no allocation to read.
        assert_eq!(k(Some(2), ContextField::CompileContext), BEFORE_TRACE);
        assert_eq!(k(Some(9), ContextField::CompileContext), BEFORE_TRACE);
    }
}
