//! The named layouts of the records the page gets as flat arrays of numbers (base64
//! `Float64Array`s, see `encode::f64s`).
//!
//! Each kind of record is a struct here whose fields, in order, are its values: Rust
//! writes a record with [`Life::values`] and the like, never with a literal array, and the
//! page reads each field's index from `LAYOUT`, the field names of [`ALL`] that
//! `build.rs` writes into the script. A field added, removed or moved here moves in the
//! page too, and a field the page reads that a layout lacks stops the page at load
//! (`layoutOf` in `assets/js/data.js`) instead of reading the wrong values.
//!
//! `build.rs` compiles this file too (`#[path]`), so it uses nothing outside itself.

/// Declares a record: a struct of `f64` fields, its name in `LAYOUT`, its field names in
/// order, and its values in that same order.
macro_rules! record {
    ($(#[$meta:meta])* $name:ident $kind:literal { $($(#[$fmeta:meta])* $field:ident,)+ }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub struct $name {
            $($(#[$fmeta])* pub $field: f64,)+
        }

        impl $name {
            /// The record's name in the page's `LAYOUT`.
            pub const KIND: &'static str = $kind;
            /// Its fields, in the order of its values.
            pub const FIELDS: &'static [&'static str] = &[$(stringify!($field)),+];
            /// Values per record.
            pub const LEN: usize = $name::FIELDS.len();

            /// The values, in the order of [`Self::FIELDS`].
            pub fn values(&self) -> [f64; $name::LEN] {
                [$(self.$field),+]
            }

            /// Appends the values to an array of records.
            pub fn push_to(&self, out: &mut Vec<f64>) {
                out.extend_from_slice(&self.values());
            }

            /// The value of the field named `name`.
            pub fn field(&self, name: &str) -> Option<f64> {
                $(if name == stringify!($field) {
                    return Some(self.$field);
                })+
                None
            }

            /// The record whose values are the first [`Self::LEN`] of `v` (as the page
            /// reads them).
            pub fn from_values(v: &[f64]) -> $name {
                let mut it = v[..$name::LEN].iter().copied();
                $name { $($field: it.next().unwrap_or(f64::NAN),)+ }
            }
        }
    };
}

record! {
    /// A life drawn on the timeline: one of the largest allocations
    /// (`DeviceData::allocations`, `initial_allocations`) or of the largest segments
    /// (`DeviceData::segments`, whose `requested` is their size).
    Life "life" {
        address,
        /// Block (or segment) size.
        size,
        /// The request the block was made for.
        requested,
        /// Trace state where it begins: `alloc` entry + 1, 0 for one live before the trace.
        start,
        /// Trace state where it ends (its free entry + 1), −1 when it is live at the end.
        end,
        /// Page stack index (−1: none).
        stack,
        /// `time_us` of the entries that began and ended it (NaN: none).
        start_time_us,
        end_time_us,
    }
}

record! {
    /// A segment of a keyframe of the state view (`Moment::segments`).
    Segment "segment" {
        address,
        size,
        /// Stream, as `StackTable::stream` writes it.
        stream,
        /// 1 small pool, 2 expandable, 4 private pool.
        flags,
    }
}

record! {
    /// A block of a keyframe of the state view (`Moment::blocks`).
    Block "block" {
        /// Index of its segment in the keyframe's segments.
        segment,
        address,
        size,
        /// The request; for a merged record (state `state::MERGED`), the allocated bytes
        /// of the blocks merged.
        requested,
        /// 0 free, 1 allocated, 2 pending free, 3 merged.
        state,
        /// Page stack index (−1: none); for a merged record, how many blocks it holds.
        stack,
    }
}

record! {
    /// A change of the allocator state made by one trace entry (`StateOps::ops`).
    StateOp "state_op" {
        /// The entry: it turns state `event` into state `event + 1`.
        event,
        /// 0 remove the block at `address`; 1 add a block (`a` = request, `b` = state as
        /// in [`Block::state`]); 2 remove the segment at `address` with all its blocks;
        /// 3 add a segment (`a` = stream, `b` = flags as in [`Segment::flags`]).
        kind,
        address,
        size,
        a,
        b,
        /// Page stack index of an added block (−1: none).
        stack,
    }
}

record! {
    /// A trace entry of the event list (`EventWindow::entries`).
    Event "event" {
        /// Index in `Action::ALL`.
        action,
        /// For `oom`: CUDA's free bytes, as recorded.
        address,
        size,
        /// Stream, as `StackTable::stream` writes it.
        stream,
        /// Page stack index (−1: none).
        stack,
    }
}

record! {
    /// A distinct request size of the trace and how many `alloc`s asked for it
    /// (`DeviceData::requests`).
    RequestCount "request" {
        size,
        count,
    }
}

/// Every record kind: its name and its fields, as the page's `LAYOUT` holds them.
pub const ALL: &[(&str, &[&str])] = &[
    (Life::KIND, Life::FIELDS),
    (Segment::KIND, Segment::FIELDS),
    (Block::KIND, Block::FIELDS),
    (StateOp::KIND, StateOp::FIELDS),
    (Event::KIND, Event::FIELDS),
    (RequestCount::KIND, RequestCount::FIELDS),
];

/// [`ALL`] as a JSON object, `{"life":["address","size",...],...}` (the names are
/// identifiers: nothing to escape).
pub fn json() -> String {
    let kinds: Vec<String> = ALL
        .iter()
        .map(|(kind, fields)| {
            let names: Vec<String> = fields.iter().map(|f| format!("\"{f}\"")).collect();
            format!("\"{kind}\":[{}]", names.join(","))
        })
        .collect();
    format!("{{{}}}", kinds.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_layout_lists_every_record_each_field_once() {
        let page: serde_json::Value = serde_json::from_str(&json()).expect("LAYOUT is JSON");
        let kinds = page.as_object().expect("an object");
        assert_eq!(kinds.len(), ALL.len(), "one entry per record kind");
        for (kind, fields) in ALL {
            let listed: Vec<&str> = kinds[*kind].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
            assert_eq!(listed, *fields, "{kind}");
            let mut unique = fields.to_vec();
            unique.sort_unstable();
            unique.dedup();
            assert_eq!(unique.len(), fields.len(), "{kind}: a field named twice");
        }
    }

    /// A record's values are its fields in the order of `FIELDS`: read from values that
    /// hold their own positions (as the page reads them), the field named `FIELDS[i]` is
    /// `i`, and the record's values are those positions again.
    #[test]
    fn values_follow_the_field_names() {
        fn check<const N: usize>(kind: &str, fields: &[&str], field: impl Fn(&str) -> Option<f64>, values: [f64; N]) {
            assert_eq!(fields.len(), N, "{kind}: as many fields as values");
            for (i, name) in fields.iter().enumerate() {
                assert_eq!(field(name), Some(i as f64), "{kind}.{name}");
            }
            assert_eq!(field("no such field"), None, "{kind}");
            assert_eq!(values.to_vec(), (0..N).map(|i| i as f64).collect::<Vec<_>>(), "{kind}: values");
        }
        let pos: Vec<f64> = (0..16).map(|i| i as f64).collect();
        let l = Life::from_values(&pos);
        check(Life::KIND, Life::FIELDS, |n| l.field(n), l.values());
        let s = Segment::from_values(&pos);
        check(Segment::KIND, Segment::FIELDS, |n| s.field(n), s.values());
        let b = Block::from_values(&pos);
        check(Block::KIND, Block::FIELDS, |n| b.field(n), b.values());
        let o = StateOp::from_values(&pos);
        check(StateOp::KIND, StateOp::FIELDS, |n| o.field(n), o.values());
        let e = Event::from_values(&pos);
        check(Event::KIND, Event::FIELDS, |n| e.field(n), e.values());
        let r = RequestCount::from_values(&pos);
        check(RequestCount::KIND, RequestCount::FIELDS, |n| r.field(n), r.values());
    }
}
