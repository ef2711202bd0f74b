//! `torch.cuda.memory_stats()` counters (spec §8.1).

/// One counter: `current`, `peak`, `allocated` (sum of increases), `freed`
/// (sum of decreases), as PyTorch's `Stat` (signed 64-bit like the original).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    pub current: i64,
    pub peak: i64,
    pub allocated: i64,
    pub freed: i64,
}

impl Stat {
    #[inline]
    pub fn increase(&mut self, amount: u64) {
        let a = amount as i64;
        self.current += a;
        self.peak = self.peak.max(self.current);
        self.allocated += a;
    }
    #[inline]
    pub fn decrease(&mut self, amount: u64) {
        let a = amount as i64;
        self.current -= a;
        self.freed += a;
    }
    /// `reset_peak_memory_stats`.
    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }
    /// `reset_accumulated_memory_stats`.
    pub fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// A stat split by pool kind: index 0 `all`, 1 `small_pool`, 2 `large_pool`
/// (PyTorch's AGGREGATE / SMALL_POOL / LARGE_POOL order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatArray(pub [Stat; 3]);

impl StatArray {
    pub fn all(&self) -> &Stat {
        &self.0[0]
    }
    pub fn small_pool(&self) -> &Stat {
        &self.0[1]
    }
    pub fn large_pool(&self) -> &Stat {
        &self.0[2]
    }
    /// Apply to `all` and to the pool kind of the block.
    #[inline]
    pub(crate) fn increase(&mut self, small: bool, amount: u64) {
        self.0[0].increase(amount);
        self.0[if small { 1 } else { 2 }].increase(amount);
    }
    #[inline]
    pub(crate) fn decrease(&mut self, small: bool, amount: u64) {
        self.0[0].decrease(amount);
        self.0[if small { 1 } else { 2 }].decrease(amount);
    }
    fn for_each(&mut self, f: impl Fn(&mut Stat)) {
        self.0.iter_mut().for_each(f)
    }
}

/// All of `memory_stats()` for one device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub allocation: StatArray,
    pub allocated_bytes: StatArray,
    /// cudaMalloc segments only; expandable mappings are not counted (§6.5).
    pub segment: StatArray,
    pub reserved_bytes: StatArray,
    pub active: StatArray,
    pub active_bytes: StatArray,
    /// Free blocks of split non-expandable segments (§4.2 step 4).
    pub inactive_split: StatArray,
    pub inactive_split_bytes: StatArray,
    pub requested_bytes: StatArray,
    pub oversize_allocations: Stat,
    pub oversize_segments: Stat,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    pub num_sync_all_streams: u64,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    pub num_oom_rejections: u64,
    /// `max_split_size` as `memory_stats()` reports it: −1 when unlimited.
    pub max_split_size: i64,
}

impl Stats {
    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.allocated_bytes,
            &mut self.segment,
            &mut self.reserved_bytes,
            &mut self.active,
            &mut self.active_bytes,
            &mut self.inactive_split,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    /// `torch.cuda.reset_peak_memory_stats()`.
    pub fn reset_peak(&mut self) {
        for a in self.arrays_mut() {
            a.for_each(Stat::reset_peak);
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// `torch.cuda.reset_accumulated_memory_stats()`.
    pub fn reset_accumulated(&mut self) {
        for a in self.arrays_mut() {
            a.for_each(Stat::reset_accumulated);
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
        self.num_oom_rejections = 0;
    }

    /// The flat `memory_stats()` dict, sorted by key as PyTorch returns it.
    pub fn to_flat(&self) -> Vec<(String, i64)> {
        let mut out = Vec::new();
        let named: [(&str, &StatArray); 9] = [
            ("active", &self.active),
            ("active_bytes", &self.active_bytes),
            ("allocated_bytes", &self.allocated_bytes),
            ("allocation", &self.allocation),
            ("inactive_split", &self.inactive_split),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("segment", &self.segment),
        ];
        let push = |out: &mut Vec<(String, i64)>, prefix: String, s: &Stat| {
            out.push((format!("{prefix}.allocated"), s.allocated));
            out.push((format!("{prefix}.current"), s.current));
            out.push((format!("{prefix}.freed"), s.freed));
            out.push((format!("{prefix}.peak"), s.peak));
        };
        for (name, arr) in named {
            for (i, pool) in ["all", "small_pool", "large_pool"].iter().enumerate() {
                push(&mut out, format!("{name}.{pool}"), &arr.0[i]);
            }
        }
        push(&mut out, "oversize_allocations".into(), &self.oversize_allocations);
        push(&mut out, "oversize_segments".into(), &self.oversize_segments);
        out.push(("max_split_size".into(), self.max_split_size));
        out.push(("num_alloc_retries".into(), self.num_alloc_retries as i64));
        out.push(("num_device_alloc".into(), self.num_device_alloc as i64));
        out.push(("num_device_free".into(), self.num_device_free as i64));
        out.push(("num_oom_rejections".into(), self.num_oom_rejections as i64));
        out.push(("num_ooms".into(), self.num_ooms as i64));
        out.push(("num_sync_all_streams".into(), self.num_sync_all_streams as i64));
        out.sort();
        out
    }
}
