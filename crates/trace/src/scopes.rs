//! `record_function` scopes (the snapshot's `external_annotations`) of one device, as
//! intervals of time: which scopes were open when a block was allocated. Shared by the
//! walk's consumers that group by annotation (timeline, lives, attribution) and by the
//! step finder, which reads step annotations.

use fragscope_snapshot::{Annotation, FxHashMap, Snapshot, NO_TIME};

/// `record_function` scopes of one device, from `external_annotations`.
///
/// START/END entries are paired per name, last-in first-out. A START without END is
/// open until the end of the trace; an END without START was opened before the buffer
/// began. Scopes are assumed properly nested, as `record_function` makes them.
pub struct Scopes {
    /// (start, end, name, parent index), sorted by start.
    intervals: Vec<(i64, i64, usize, Option<usize>)>,
    pub names: Vec<String>,
}

impl Scopes {
    pub fn new(snap: &Snapshot, device: i64) -> Self {
        let anns: Vec<&Annotation> =
            snap.external_annotations.iter().flatten().filter(|a| a.device == device || a.device < 0).collect();
        Self::from_annotations(&anns)
    }

    fn from_annotations(anns: &[&Annotation]) -> Self {
        let mut names: Vec<String> = Vec::new();
        let mut name_ids: FxHashMap<&str, usize> = FxHashMap::default();
        let mut open: FxHashMap<usize, Vec<i64>> = FxHashMap::default();
        let mut iv: Vec<(i64, i64, usize, Option<usize>)> = Vec::new();
        let mut sorted: Vec<&&Annotation> = anns.iter().collect();
        sorted.sort_by_key(|a| a.time_us); // stable: file order breaks ties
        for a in sorted {
            let id = *name_ids.entry(a.name.as_str()).or_insert_with(|| {
                names.push(a.name.clone());
                names.len() - 1
            });
            match a.stage.as_str() {
                "START" => open.entry(id).or_default().push(a.time_us),
                "END" => {
                    let start = open.get_mut(&id).and_then(Vec::pop).unwrap_or(i64::MIN);
                    iv.push((start, a.time_us, id, None));
                }
                _ => {}
            }
        }
        for (id, starts) in open {
            for s in starts {
                iv.push((s, i64::MAX, id, None));
            }
        }
        // Outer scopes first on equal starts, so the inner one is found last.
        iv.sort_by_key(|&(s, e, id, _)| (s, std::cmp::Reverse(e), id));
        let mut stack: Vec<usize> = Vec::new();
        for k in 0..iv.len() {
            let (s, _, _, _) = iv[k];
            while let Some(&top) = stack.last() {
                if iv[top].1 <= s {
                    stack.pop();
                } else {
                    break;
                }
            }
            iv[k].3 = stack.last().copied();
            stack.push(k);
        }
        Scopes { intervals: iv, names }
    }

    /// Index of the innermost scope open at `t` (start ≤ t < end).
    fn innermost_index(&self, t: i64) -> Option<usize> {
        if t == NO_TIME || self.intervals.is_empty() {
            return None;
        }
        let k = self.intervals.partition_point(|iv| iv.0 <= t);
        let mut cur = k.checked_sub(1);
        // The open scopes at t are the last-started one and its ancestors (nesting).
        while let Some(i) = cur {
            if t < self.intervals[i].1 {
                return Some(i);
            }
            cur = self.intervals[i].3;
        }
        None
    }

    /// Name of the innermost scope open at `t`.
    pub fn innermost_at(&self, t: i64) -> Option<&str> {
        self.innermost_index(t).map(|i| self.names[self.intervals[i].2].as_str())
    }

    /// Names of the scopes open at `t`, outer → inner (name ids).
    pub fn open_at(&self, t: i64) -> Vec<usize> {
        let mut v = Vec::new();
        let mut cur = self.innermost_index(t);
        while let Some(i) = cur {
            v.push(self.intervals[i].2);
            cur = self.intervals[i].3;
        }
        v.reverse();
        v
    }

    /// (start, end, name id, depth) of every scope, by start.
    pub fn occurrences(&self) -> Vec<(i64, i64, usize, usize)> {
        let mut depth = vec![0usize; self.intervals.len()];
        for k in 0..self.intervals.len() {
            depth[k] = self.intervals[k].3.map_or(0, |p| depth[p] + 1);
        }
        self.intervals.iter().zip(depth).map(|(&(s, e, n, _), d)| (s, e, n, d)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(name: &str, stage: &str, t: i64) -> Annotation {
        Annotation { device: 0, time_us: t, name: name.into(), stage: stage.into(), extra: vec![] }
    }

    #[test]
    fn scopes_nest_and_answer_open_at() {
        let a = [
            ann("step", "START", 0),
            ann("fwd", "START", 10),
            ann("fwd", "END", 20),
            ann("bwd", "START", 30),
            ann("bwd", "END", 40),
            ann("step", "END", 100),
            ann("late", "START", 200),
        ];
        let refs: Vec<&Annotation> = a.iter().collect();
        let s = Scopes::from_annotations(&refs);
        let names = |v: Vec<usize>| v.into_iter().map(|i| s.names[i].clone()).collect::<Vec<_>>();
        assert_eq!(names(s.open_at(15)), ["step", "fwd"]);
        assert_eq!(names(s.open_at(25)), ["step"]);
        assert_eq!(s.innermost_at(35), Some("bwd"));
        assert_eq!(s.innermost_at(150), None);
        assert_eq!(s.innermost_at(5000), Some("late"));
        assert_eq!(s.innermost_at(NO_TIME), None);
        let occ = s.occurrences();
        assert_eq!(occ.iter().map(|o| o.3).collect::<Vec<_>>(), [0, 1, 1, 0]);
    }
}
