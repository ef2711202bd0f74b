//! `PYTORCH_CUDA_ALLOC_CONF`: the options that steer allocation decisions,
//! PyTorch's grammar and its validation (spec §9).
//!
//! The grammar is the 2.9+ one: a tokenizer splits on `,` `:` `[` `]` and drops
//! whitespace (§9.2); keys and booleans are case-sensitive. Error texts follow
//! PyTorch's wording so a user recognises them.

use crate::constants::{DIVISION_INTERVALS, LARGE_BUFFER, MIB};
use std::fmt;

/// How equal-size free blocks are ordered in the free set (§2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub enum TieBreak {
    /// (stream, size, address): every release up to PR #183591.
    #[default]
    Address,
    /// (stream, size, registration counter, address): PR #183591 and later.
    RegistrationOrder,
}

/// Which `round_size` rule applies (§1.2 vs §1.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub enum RoundingRule {
    /// 2.1+: per-interval divisions table.
    #[default]
    Table,
    /// ≤2.0: one global divisions value (entry 0 of the table) plus `roundup_bypass_threshold_mb`.
    Legacy,
}

/// `backend:` value (§9.3). Only `Native` is modelled; the other is recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub enum Backend {
    #[default]
    Native,
    CudaMallocAsync,
}

/// Which device's caching allocator wrote the recording. The snapshot API is the same on
/// every PyTorch backend that has one, but the rules differ in places; a config string
/// cannot say which, so the replay sets it from the file (`fragscope_replay::settings`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub enum Accelerator {
    /// NVIDIA CUDA: the rules of spec §1–§9.
    #[default]
    Cuda,
    /// AMD ROCm (HIP): the same `CUDACachingAllocator.cpp`, hipified. Its expandable
    /// segments sit on HIP's virtual-memory API, whose granularity is not modelled:
    /// replayed as CUDA, expect differences there.
    Rocm,
    /// Intel XPU (`c10/xpu/XPUCachingAllocator.cpp`): `round_size` is 512-byte rounding
    /// with no `roundup_power2_divisions`; segment sizes as CUDA's.
    Xpu,
    /// Huawei Ascend NPU (`torch_npu`'s `NPUCachingAllocator.cpp`): `round_size` adds 32
    /// bytes before the 512-byte rounding (512 B becomes a 1,024-byte block), no
    /// divisions; segment sizes, pools, split and oversize rules as CUDA's.
    Npu,
}

impl Accelerator {
    /// The name PyTorch's messages give the device (`CUDA`, `HIP`, `XPU`, `NPU`).
    pub fn name(self) -> &'static str {
        match self {
            Accelerator::Cuda => "CUDA",
            Accelerator::Rocm => "HIP",
            Accelerator::Xpu => "XPU",
            Accelerator::Npu => "NPU",
        }
    }
}

/// Value of `expandable_segments_reserve` (§6.1, §9.3).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ReserveSpec {
    /// Fraction of device memory.
    Fraction(f64),
    /// Absolute size in GiB (`40G`).
    GiB(f64),
}

/// Every `PYTORCH_CUDA_ALLOC_CONF` option, plus the two version switches
/// (`tie_break`, `rounding_rule`) that no config string can express.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocatorConfig {
    /// `max_split_size_mb` in bytes; `None` = unlimited (SIZE_MAX).
    pub max_split_size: Option<u64>,
    /// `max_non_split_rounding_mb` in bytes; defaults to `large_segment_size`.
    pub max_non_split_rounding: u64,
    /// Per-interval divisions (§1.3); 0 or 1 = plain 512-byte rounding.
    pub roundup_power2_divisions: [u64; DIVISION_INTERVALS],
    /// `roundup_bypass_threshold_mb` in bytes (≤2.0 only).
    pub roundup_bypass_threshold: Option<u64>,
    /// `garbage_collection_threshold`; 0 = off.
    pub garbage_collection_threshold: f64,
    pub expandable_segments: bool,
    /// `large_segment_size_mb` in bytes (20 MiB default).
    pub large_segment_size: u64,
    /// `per_process_memory_fraction` (1.0 = none in force).
    pub per_process_memory_fraction: f64,
    pub release_lock_on_cudamalloc: bool,
    pub backend: Backend,
    pub pinned_use_cuda_host_register: bool,
    pub pinned_num_register_threads: u64,
    pub pinned_use_background_threads: bool,
    pub pinned_reserve_segment_size_mb: u64,
    pub pinned_max_round_threshold_mb: Option<u64>,
    pub pinned_max_cached_size_mb: Option<u64>,
    pub pinned_free_catch_all: bool,
    pub graph_capture_record_stream_reuse: bool,
    /// Preemptive rejection (§3.6 step 2).
    pub throw_on_cudamalloc_oom: bool,
    /// Shrinks new expandable reservations (§6.1), capped at 9/8 of device memory.
    pub expandable_segments_reserve: Option<ReserveSpec>,
    /// Per stream-class reserves; parsed and kept, not used (stream classes are not modelled).
    pub expandable_segments_reserve_by_class: Vec<(String, ReserveSpec)>,
    pub tie_break: TieBreak,
    pub rounding_rule: RoundingRule,
    /// Whose allocator's rules apply (no key: set from the recording).
    pub accelerator: Accelerator,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: None,
            max_non_split_rounding: LARGE_BUFFER,
            roundup_power2_divisions: [0; DIVISION_INTERVALS],
            roundup_bypass_threshold: None,
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            large_segment_size: LARGE_BUFFER,
            per_process_memory_fraction: 1.0,
            release_lock_on_cudamalloc: false,
            backend: Backend::Native,
            pinned_use_cuda_host_register: false,
            pinned_num_register_threads: 1,
            pinned_use_background_threads: false,
            pinned_reserve_segment_size_mb: 0,
            pinned_max_round_threshold_mb: None,
            pinned_max_cached_size_mb: None,
            pinned_free_catch_all: false,
            graph_capture_record_stream_reuse: false,
            throw_on_cudamalloc_oom: false,
            expandable_segments_reserve: None,
            expandable_segments_reserve_by_class: Vec::new(),
            tie_break: TieBreak::Address,
            rounding_rule: RoundingRule::Table,
            accelerator: Accelerator::Cuda,
        }
    }
}

/// What the replay does with an allocator option (the table of docs/fidelity.md,
/// "Allocator options").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fidelity {
    /// Changes allocation decisions, and the model makes them as PyTorch does.
    Modelled,
    /// Read and validated as PyTorch does, but it changes no device-memory decision a
    /// replay makes (host allocator, locking), or its effect is already in the recorded
    /// trace; a what-if that changes it may be refused ([`AllocatorConfig::refusal`]).
    Read,
    /// Not reproducible: a what-if that sets it is refused by name.
    Refused,
}

/// One allocator option: its key, the first release that has it, what the replay does
/// with it and the test that shows it.
#[derive(Clone, Copy, Debug)]
pub struct OptionInfo {
    pub key: &'static str,
    pub since: &'static str,
    pub fidelity: Fidelity,
    /// The test (path from the crate root) that shows the behaviour claimed.
    pub evidence: &'static str,
}

/// Every key [`parse`] accepts, 2.11's and its neighbours' (spec §9.3). The ROCm
/// spellings (`release_lock_on_hipmalloc`, `pinned_use_hip_host_register`) are aliases.
pub const OPTIONS: &[OptionInfo] = &[
    OptionInfo {
        key: "max_split_size_mb",
        since: "1.10",
        fidelity: Fidelity::Modelled,
        evidence: "alloc tests::examples::max_split_size_oversize_rules",
    },
    OptionInfo {
        key: "max_non_split_rounding_mb",
        since: "2.6",
        fidelity: Fidelity::Modelled,
        evidence: "alloc tests::examples::max_non_split_rounding_widens_the_slack",
    },
    OptionInfo {
        key: "roundup_power2_divisions",
        since: "1.13",
        fidelity: Fidelity::Modelled,
        evidence: "alloc rounding::tests::per_interval_table_is_used",
    },
    OptionInfo {
        key: "roundup_bypass_threshold_mb",
        since: "1.13 (to 2.0)",
        fidelity: Fidelity::Modelled,
        evidence: "alloc rounding::tests::legacy_bypass_rule",
    },
    OptionInfo {
        key: "garbage_collection_threshold",
        since: "1.12",
        fidelity: Fidelity::Modelled,
        evidence: "alloc tests::fallbacks::gc_releases_old_whole_segments_by_mean_age",
    },
    OptionInfo {
        key: "expandable_segments",
        since: "2.1",
        fidelity: Fidelity::Modelled,
        evidence: "alloc tests::expandable::maps_pages_and_grows_in_place",
    },
    OptionInfo {
        key: "large_segment_size_mb",
        since: "2.11",
        fidelity: Fidelity::Modelled,
        evidence: "alloc tests::options::large_segment_size_sets_the_segment_of_mid_sized_requests",
    },
    OptionInfo {
        key: "per_process_memory_fraction",
        since: "2.10",
        fidelity: Fidelity::Modelled,
        evidence: "alloc tests::fallbacks::memory_fraction_fails_before_cuda",
    },
    OptionInfo {
        key: "throw_on_cudamalloc_oom",
        since: "2.12",
        fidelity: Fidelity::Modelled,
        evidence: "alloc tests::fallbacks::throw_on_cudamalloc_oom_rejects_without_fallbacks",
    },
    OptionInfo {
        key: "expandable_segments_reserve",
        since: "2.15",
        fidelity: Fidelity::Modelled,
        evidence: "alloc tests::options::expandable_segments_reserve_shrinks_the_reservation",
    },
    OptionInfo {
        key: "backend",
        since: "2.0",
        fidelity: Fidelity::Refused,
        evidence: "alloc config::tests::refusals_name_the_option",
    },
    OptionInfo {
        key: "graph_capture_record_stream_reuse",
        since: "2.9",
        fidelity: Fidelity::Read,
        evidence: "alloc config::tests::refusals_name_the_option",
    },
    OptionInfo {
        key: "expandable_segments_reserve_by_class",
        since: "2.15",
        fidelity: Fidelity::Refused,
        evidence: "alloc config::tests::refusals_name_the_option",
    },
    OptionInfo {
        key: "release_lock_on_cudamalloc",
        since: "2.2",
        fidelity: Fidelity::Read,
        evidence: "alloc config::tests::inert_keys_are_validated",
    },
    OptionInfo {
        key: "pinned_use_cuda_host_register",
        since: "2.2",
        fidelity: Fidelity::Read,
        evidence: "alloc config::tests::inert_keys_are_validated",
    },
    OptionInfo {
        key: "pinned_num_register_threads",
        since: "2.2",
        fidelity: Fidelity::Read,
        evidence: "alloc config::tests::inert_keys_are_validated",
    },
    OptionInfo {
        key: "pinned_use_background_threads",
        since: "2.6",
        fidelity: Fidelity::Read,
        evidence: "alloc config::tests::inert_keys_are_validated",
    },
    OptionInfo {
        key: "pinned_reserve_segment_size_mb",
        since: "2.10",
        fidelity: Fidelity::Read,
        evidence: "alloc config::tests::inert_keys_are_validated",
    },
    OptionInfo {
        key: "pinned_free_catch_all",
        since: "2.12",
        fidelity: Fidelity::Read,
        evidence: "alloc config::tests::inert_keys_are_validated",
    },
    OptionInfo {
        key: "pinned_max_round_threshold_mb",
        since: "2.13",
        fidelity: Fidelity::Read,
        evidence: "alloc config::tests::inert_keys_are_validated",
    },
    OptionInfo {
        key: "pinned_max_cached_size_mb",
        since: "2.13",
        fidelity: Fidelity::Read,
        evidence: "alloc config::tests::inert_keys_are_validated",
    },
];

/// A rejected config string; `Display` gives PyTorch's wording.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    message: String,
}

impl ConfigError {
    fn new(message: impl Into<String>) -> Self {
        ConfigError { message: message.into() }
    }
    /// A valid option whose effect the model cannot reproduce, refused by name
    /// ([`AllocatorConfig::refusal`]).
    pub fn unmodelled(key: &str, why: &str) -> Self {
        ConfigError::new(format!("{key} is not modelled: {why}"))
    }
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

/// PyTorch's tokenizer (§9.2): separators are single tokens, whitespace is
/// dropped everywhere (so "max split" would read as "maxsplit").
fn tokenize(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut buf = String::new();
    for ch in s.chars() {
        match ch {
            ',' | ':' | '[' | ']' => {
                if !buf.is_empty() {
                    out.push(std::mem::take(&mut buf));
                }
                out.push(ch.to_string());
            }
            c if c.is_whitespace() => {}
            c => buf.push(c),
        }
    }
    if !buf.is_empty() {
        out.push(buf);
    }
    out
}

struct Tokens {
    toks: Vec<String>,
}

impl Tokens {
    fn get(&self, i: usize) -> Option<&str> {
        self.toks.get(i).map(|s| s.as_str())
    }
    fn expect(&self, i: usize, c: &str) -> Result<(), ConfigError> {
        if self.get(i) == Some(c) {
            Ok(())
        } else {
            Err(ConfigError::new(format!("Error parsing CachingAllocator::AllocatorConfig settings, expected {c}")))
        }
    }
    fn value(&self, i: usize, key: &str) -> Result<&str, ConfigError> {
        match self.get(i) {
            Some(v) if !matches!(v, "," | ":" | "[" | "]") => Ok(v),
            _ => Err(ConfigError::new(format!("Error, expecting {key} value"))),
        }
    }
    fn uint(&self, i: usize, key: &str) -> Result<u64, ConfigError> {
        let v = self.value(i, key)?;
        v.parse::<u64>()
            .map_err(|_| ConfigError::new(format!("Invalid value '{v}' for {key}: expected a non-negative integer")))
    }
    fn float(&self, i: usize, key: &str) -> Result<f64, ConfigError> {
        let v = self.value(i, key)?;
        v.parse::<f64>().map_err(|_| ConfigError::new(format!("Invalid value '{v}' for {key}: expected a number")))
    }
    fn boolean(&self, i: usize, key: &str) -> Result<bool, ConfigError> {
        match self.get(i) {
            Some("True") => Ok(true),
            Some("False") => Ok(false),
            Some(t) => Err(ConfigError::new(format!(
                "Expected 'True' or 'False' at index {i} in ConfigTokenizer but got '{t}'"
            ))),
            None => Err(ConfigError::new(format!("Error, expecting {key} value"))),
        }
    }
}

fn mib(v: u64) -> u64 {
    v.min(u64::MAX / MIB) * MIB
}

fn parse_reserve_spec(tok: &str) -> Option<ReserveSpec> {
    // Bad values are non-fatal in PyTorch (warning, default kept).
    let (num, gib) = match tok.strip_suffix(['G', 'g']) {
        Some(n) => (n, true),
        None => (tok, false),
    };
    let v: f64 = num.parse().ok()?;
    if !v.is_finite() || v <= 0.0 {
        return None;
    }
    Some(if gib { ReserveSpec::GiB(v) } else { ReserveSpec::Fraction(v) })
}

/// Parse a `PYTORCH_CUDA_ALLOC_CONF` string into a fresh config (defaults for
/// every key not mentioned, as on PyTorch's first parse, §9.1).
///
/// `roundup_bypass_threshold_mb` exists only in ≤2.0, so giving it also selects
/// [`RoundingRule::Legacy`].
pub fn parse(s: &str) -> Result<AllocatorConfig, ConfigError> {
    let toks = Tokens { toks: tokenize(s) };
    let mut cfg = AllocatorConfig::default();
    let n = toks.toks.len();

    // 1. large_segment_size_mb is parsed before every other key (§9.3) because the
    // bounds of max_split_size_mb / max_non_split_rounding_mb depend on it.
    apply_large_segment_size(&toks, &mut cfg)?;
    let large_mb = cfg.large_segment_size / MIB;
    let mut non_split: Option<u64> = None;

    // 2. Every `key:value` in order, separated by commas. Each group of keys returns the
    // index of the last token its value used, or None when the key is not one of its own.
    let mut i = 0;
    while i < n {
        let key = toks.get(i).unwrap_or_default().to_string();
        let last = match parse_size_key(&toks, &key, i, &mut cfg, large_mb, &mut non_split)? {
            Some(last) => last,
            None => match parse_segment_key(&toks, &key, i, &mut cfg)? {
                Some(last) => last,
                None => match parse_pinned_key(&toks, &key, i, &mut cfg)? {
                    Some(last) => last,
                    None => {
                        return Err(ConfigError::new(format!("Unrecognized key '{key}' in CUDA allocator config.")));
                    }
                },
            },
        };
        i = last;
        if i + 1 < n {
            toks.expect(i + 1, ",")?;
            i += 1;
        }
        i += 1;
    }
    cfg.max_non_split_rounding = non_split.unwrap_or(cfg.large_segment_size);
    Ok(cfg)
}

/// The pre-pass of [`parse`]: applies every `large_segment_size_mb:N` before any other
/// key is read (§9.3), since it bounds max_split_size_mb and max_non_split_rounding_mb.
fn apply_large_segment_size(toks: &Tokens, cfg: &mut AllocatorConfig) -> Result<(), ConfigError> {
    for i in 0..toks.toks.len() {
        if toks.get(i) == Some("large_segment_size_mb") && toks.get(i + 1) == Some(":") {
            let v = toks.uint(i + 2, "large_segment_size_mb")?;
            if v <= 10 {
                return Err(ConfigError::new(format!(
                    "CachingAllocator option large_segment_size_mb too small, must be > 10, got {v}"
                )));
            }
            cfg.large_segment_size = mib(v);
        }
    }
    Ok(())
}

/// The keys that steer how a request is rounded, whether a block may be split, and
/// when cached blocks are given back: max_split_size_mb, max_non_split_rounding_mb
/// (into `non_split`, as its default depends on the final large segment size),
/// garbage_collection_threshold, roundup_power2_divisions, roundup_bypass_threshold_mb
/// and per_process_memory_fraction. `i` is the key's index; returns the index of the
/// last token of its value, or `None` when `key` is none of these.
fn parse_size_key(
    toks: &Tokens,
    key: &str,
    mut i: usize,
    cfg: &mut AllocatorConfig,
    large_mb: u64,
    non_split: &mut Option<u64>,
) -> Result<Option<usize>, ConfigError> {
    match key {
        "max_split_size_mb" | "max_non_split_rounding_mb" => {
            toks.expect(i + 1, ":")?;
            i += 2;
            let v = toks.uint(i, key)?;
            if v < large_mb {
                return Err(ConfigError::new(format!(
                    "CachingAllocator option {key} too small, must be >= {large_mb}"
                )));
            }
            if key == "max_split_size_mb" {
                cfg.max_split_size = Some(mib(v));
            } else {
                *non_split = Some(mib(v));
            }
        }
        "garbage_collection_threshold" => {
            toks.expect(i + 1, ":")?;
            i += 2;
            let v = toks.float(i, key)?;
            if !(v > 0.0 && v < 1.0) {
                return Err(ConfigError::new("garbage_collect_threshold is invalid, set it in (0.0, 1.0)"));
            }
            cfg.garbage_collection_threshold = v;
        }
        "roundup_power2_divisions" => {
            toks.expect(i + 1, ":")?;
            i += 2;
            i = parse_divisions(toks, i, &mut cfg.roundup_power2_divisions)?;
        }
        "roundup_bypass_threshold_mb" => {
            toks.expect(i + 1, ":")?;
            i += 2;
            cfg.roundup_bypass_threshold = Some(mib(toks.uint(i, key)?));
            cfg.rounding_rule = RoundingRule::Legacy;
        }
        "per_process_memory_fraction" => {
            toks.expect(i + 1, ":")?;
            i += 2;
            let v = toks.float(i, key)?;
            if !(0.0..=1.0).contains(&v) {
                return Err(ConfigError::new("per_process_memory_fraction is invalid, set it in [0.0, 1.0]"));
            }
            cfg.per_process_memory_fraction = v;
        }
        _ => return Ok(None),
    }
    Ok(Some(i))
}

/// The keys that steer how segments are obtained from the driver and what happens
/// around those calls: expandable_segments, large_segment_size_mb (already applied by
/// [`apply_large_segment_size`]), expandable_segments_reserve(_by_class), backend,
/// release_lock_on_cudamalloc, graph_capture_record_stream_reuse and
/// throw_on_cudamalloc_oom. Same contract as [`parse_size_key`].
fn parse_segment_key(
    toks: &Tokens,
    key: &str,
    mut i: usize,
    cfg: &mut AllocatorConfig,
) -> Result<Option<usize>, ConfigError> {
    match key {
        "expandable_segments" => {
            toks.expect(i + 1, ":")?;
            i += 2;
            cfg.expandable_segments = toks.boolean(i, key)?;
        }
        "large_segment_size_mb" => {
            // Already applied by the pre-pass.
            i += 2;
        }
        "release_lock_on_cudamalloc" | "release_lock_on_hipmalloc" => {
            toks.expect(i + 1, ":")?;
            i += 2;
            cfg.release_lock_on_cudamalloc = toks.boolean(i, key)?;
        }
        "graph_capture_record_stream_reuse" => {
            toks.expect(i + 1, ":")?;
            i += 2;
            cfg.graph_capture_record_stream_reuse = toks.boolean(i, key)?;
        }
        "throw_on_cudamalloc_oom" => {
            toks.expect(i + 1, ":")?;
            i += 2;
            cfg.throw_on_cudamalloc_oom = toks.boolean(i, key)?;
        }
        "backend" => {
            toks.expect(i + 1, ":")?;
            i += 2;
            cfg.backend = match toks.value(i, "backend")? {
                "native" => Backend::Native,
                "cudaMallocAsync" => Backend::CudaMallocAsync,
                _ => return Err(ConfigError::new("Unknown allocator backend, options are native and cudaMallocAsync")),
            };
        }
        "expandable_segments_reserve" => {
            toks.expect(i + 1, ":")?;
            i += 2;
            // Invalid values only warn in PyTorch: keep the default.
            if let Some(spec) = parse_reserve_spec(toks.value(i, key)?) {
                cfg.expandable_segments_reserve = Some(spec);
            }
        }
        "expandable_segments_reserve_by_class" => {
            toks.expect(i + 1, ":")?;
            toks.expect(i + 2, "[")?;
            let (last, list) = parse_reserve_by_class(toks, i + 2, key)?;
            i = last;
            cfg.expandable_segments_reserve_by_class = list;
        }
        _ => return Ok(None),
    }
    Ok(Some(i))
}

/// `expandable_segments_reserve_by_class`'s list `[name:spec, ...]`, from its `[` at
/// `i`. Returns the index of the `]` and the (name, spec) pairs whose spec is valid
/// (invalid ones only warn in PyTorch, and are left out).
fn parse_reserve_by_class(
    toks: &Tokens,
    mut i: usize,
    key: &str,
) -> Result<(usize, Vec<(String, ReserveSpec)>), ConfigError> {
    let mut list = Vec::new();
    while toks.get(i + 1).is_some_and(|t| t != "]") {
        let name = toks.value(i + 1, key)?.to_string();
        toks.expect(i + 2, ":")?;
        let v = toks.value(i + 3, key)?;
        if let Some(spec) = parse_reserve_spec(v) {
            list.push((name, spec));
        }
        i += 3;
        if toks.get(i + 1) == Some(",") {
            i += 1;
        }
    }
    toks.expect(i + 1, "]")?;
    i += 1;
    Ok((i, list))
}

/// The keys of the pinned (page-locked host) memory allocator: pinned_use_cuda_host_register,
/// pinned_num_register_threads, pinned_use_background_threads,
/// pinned_reserve_segment_size_mb, pinned_max_round_threshold_mb, pinned_max_cached_size_mb
/// and pinned_free_catch_all. They do not steer device allocations but are validated as
/// PyTorch does. Same contract as [`parse_size_key`].
fn parse_pinned_key(
    toks: &Tokens,
    key: &str,
    mut i: usize,
    cfg: &mut AllocatorConfig,
) -> Result<Option<usize>, ConfigError> {
    match key {
        "pinned_use_cuda_host_register" | "pinned_use_hip_host_register" => {
            toks.expect(i + 1, ":")?;
            i += 2;
            cfg.pinned_use_cuda_host_register = toks.boolean(i, key)?;
        }
        "pinned_num_register_threads" => {
            toks.expect(i + 1, ":")?;
            i += 2;
            let v = toks.uint(i, key)?;
            if !v.is_power_of_two() {
                return Err(ConfigError::new(format!("Number of register threads has to be power of 2, got {v}")));
            }
            if v > 128 {
                return Err(ConfigError::new(format!(
                    "Number of register threads should be less than or equal to 128, got {v}"
                )));
            }
            cfg.pinned_num_register_threads = v;
        }
        "pinned_use_background_threads" => {
            toks.expect(i + 1, ":")?;
            i += 2;
            cfg.pinned_use_background_threads = toks.boolean(i, key)?;
        }
        "pinned_reserve_segment_size_mb" => {
            toks.expect(i + 1, ":")?;
            i += 2;
            let v = toks.uint(i, key)?;
            if v == 0 {
                return Err(ConfigError::new("Pinned reserve segment size has to be greater than 0"));
            }
            cfg.pinned_reserve_segment_size_mb = v;
        }
        "pinned_max_round_threshold_mb" => {
            toks.expect(i + 1, ":")?;
            i += 2;
            cfg.pinned_max_round_threshold_mb = Some(toks.uint(i, key)?);
        }
        "pinned_max_cached_size_mb" => {
            toks.expect(i + 1, ":")?;
            i += 2;
            cfg.pinned_max_cached_size_mb = Some(toks.uint(i, key)?);
        }
        "pinned_free_catch_all" => {
            toks.expect(i + 1, ":")?;
            i += 2;
            cfg.pinned_free_catch_all = toks.boolean(i, key)?;
        }
        _ => return Ok(None),
    }
    Ok(Some(i))
}

/// `roundup_power2_divisions` value: one power of two, or the list form (§1.3).
/// Returns the index of the last token consumed.
fn parse_divisions(toks: &Tokens, mut i: usize, table: &mut [u64; DIVISION_INTERVALS]) -> Result<usize, ConfigError> {
    const KEY: &str = "roundup_power2_divisions";
    if toks.get(i) != Some("[") {
        let v = toks.uint(i, KEY)?;
        if !v.is_power_of_two() {
            return Err(ConfigError::new("For roundups, the divisons has to be power of 2 "));
        }
        *table = [v; DIVISION_INTERVALS];
        return Ok(i);
    }
    let mut first = true;
    let mut last_index = 0usize;
    loop {
        i += 1;
        match toks.get(i) {
            Some("]") => return Ok(i),
            None => return Err(ConfigError::new("Error parsing roundup_power2_divisions value")),
            _ => {}
        }
        let interval = toks.get(i).unwrap_or_default();
        toks.expect(i + 1, ":")?;
        i += 2;
        let v = toks.uint(i, KEY).map_err(|_| ConfigError::new("Error parsing roundup_power2_divisions value"))?;
        if v != 0 && !v.is_power_of_two() {
            return Err(ConfigError::new("For roundups, the divisons has to be power of 2 or 0 to disable roundup "));
        }
        if interval == ">" {
            // The source fills from the last listed index *inclusive* (it uses
            // begin + last_index), so `>` also overwrites the last listed interval.
            for d in table.iter_mut().skip(last_index) {
                *d = v;
            }
        } else {
            let k: u64 =
                interval.parse().map_err(|_| ConfigError::new("For roundups, the intervals have to be power of 2 "))?;
            if !k.is_power_of_two() {
                return Err(ConfigError::new("For roundups, the intervals have to be power of 2 "));
            }
            let index = (63 - k.leading_zeros() as usize).min(DIVISION_INTERVALS - 1);
            if first {
                for d in table.iter_mut().take(index) {
                    *d = v;
                }
                first = false;
            }
            table[index] = v;
            last_index = index;
        }
        match toks.get(i + 1) {
            Some("]") => return Ok(i + 1),
            Some(",") => i += 1,
            _ => return Err(ConfigError::new("Error parsing CachingAllocator::AllocatorConfig settings, expected ,")),
        }
    }
}

fn fmt_f64(v: f64) -> String {
    let s = format!("{v}");
    if s.contains(['.', 'e', 'E']) || s.contains("inf") || s.contains("NaN") {
        s
    } else {
        format!("{s}.0")
    }
}

fn fmt_reserve(r: &ReserveSpec) -> String {
    match r {
        ReserveSpec::Fraction(f) => fmt_f64(*f),
        ReserveSpec::GiB(g) => format!("{}G", fmt_f64(*g)),
    }
}

impl AllocatorConfig {
    /// Refuses, by name, an option of `self` (a what-if: the recorded settings with
    /// `--config` on top) whose effect the model cannot reproduce when it differs from
    /// `recorded`: the `cudaMallocAsync` backend (the driver's pool, no caching-allocator
    /// decisions to replay), `graph_capture_record_stream_reuse` (acts inside CUDA-graph
    /// capture, on `record_stream` uses the trace does not carry) and
    /// `expandable_segments_reserve_by_class` (stream classes are set by a C++ call the
    /// recording does not show).
    pub fn refusal(&self, recorded: &AllocatorConfig) -> Result<(), ConfigError> {
        if self.backend != Backend::Native {
            return Err(ConfigError::unmodelled(
                "backend:cudaMallocAsync",
                "that backend hands every request to the CUDA driver's pool, which keeps no caching-allocator state to replay",
            ));
        }
        if self.graph_capture_record_stream_reuse != recorded.graph_capture_record_stream_reuse {
            return Err(ConfigError::unmodelled(
                "graph_capture_record_stream_reuse",
                "it acts only during CUDA-graph capture, on record_stream uses the trace does not carry; \
                 a recording made with it already shows its effect in its free_completed entries",
            ));
        }
        if self.expandable_segments_reserve_by_class != recorded.expandable_segments_reserve_by_class {
            return Err(ConfigError::unmodelled(
                "expandable_segments_reserve_by_class",
                "stream classes are assigned by a C++ call the recording does not show; use expandable_segments_reserve",
            ));
        }
        Ok(())
    }

    /// Named remarks on what this configuration sets that a reader of a replay should
    /// know: options read but not acted on, a combination with a reported PyTorch
    /// pathology the model reproduces, and another accelerator's rules. Empty for the
    /// defaults and for every plain CUDA configuration without such options.
    pub fn remarks(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.max_split_size.is_some() && self.expandable_segments {
            out.push(
                "max_split_size_mb with expandable_segments: PyTorch applies the oversize rule to blocks inside \
                 expandable segments, so a freed range at or above max_split_size is not reused and reserved memory \
                 can grow without bound (pytorch/pytorch#123548); the replay does the same"
                    .to_string(),
            );
        }
        if self.graph_capture_record_stream_reuse {
            out.push(
                "graph_capture_record_stream_reuse: acts only during CUDA-graph capture; its effect is in the \
                 recorded free_completed entries, which the replay follows"
                    .to_string(),
            );
        }
        if !self.expandable_segments_reserve_by_class.is_empty() {
            out.push(
                "expandable_segments_reserve_by_class: stream classes are not modelled; every stream gets the \
                 default reservation"
                    .to_string(),
            );
        }
        match self.accelerator {
            Accelerator::Cuda => {}
            Accelerator::Rocm if self.expandable_segments => out.push(
                "ROCm (HIP) expandable segments: modelled as CUDA, expect differences (HIP's page granularity is \
                 not modelled)"
                    .to_string(),
            ),
            Accelerator::Rocm => {}
            Accelerator::Xpu => out.push(
                "Intel XPU: replayed with XPUCachingAllocator's 512-byte rounding without roundup_power2_divisions; \
                 its other rules modelled as CUDA, expect differences"
                    .to_string(),
            ),
            Accelerator::Npu => out.push(
                "Ascend NPU: replayed with torch_npu's rounding (32 bytes added before 512-byte rounding, no \
                 roundup_power2_divisions); its other rules modelled as CUDA, expect differences; torch_npu's \
                 workspace allocator is not in the snapshot"
                    .to_string(),
            ),
        }
        out
    }

    /// Canonical config string; `parse(cfg.to_conf_string())` gives back every
    /// option the string can express. `tie_break` is a version switch with no
    /// key, and `rounding_rule` is only expressed through the bypass key.
    pub fn to_conf_string(&self) -> String {
        let d = AllocatorConfig::default();
        let mut parts: Vec<String> = Vec::new();
        let b = |v: bool| if v { "True" } else { "False" };
        if self.backend != d.backend {
            parts.push("backend:cudaMallocAsync".into());
        }
        if self.large_segment_size != d.large_segment_size {
            parts.push(format!("large_segment_size_mb:{}", self.large_segment_size / MIB));
        }
        if let Some(m) = self.max_split_size {
            parts.push(format!("max_split_size_mb:{}", m / MIB));
        }
        if self.max_non_split_rounding != self.large_segment_size {
            parts.push(format!("max_non_split_rounding_mb:{}", self.max_non_split_rounding / MIB));
        }
        if self.roundup_power2_divisions != d.roundup_power2_divisions {
            let t = &self.roundup_power2_divisions;
            if t.iter().all(|&x| x == t[0]) && t[0].is_power_of_two() {
                parts.push(format!("roundup_power2_divisions:{}", t[0]));
            } else {
                // The list form with every interval spelled out; the first key
                // fills nothing below it, and no `>` is needed.
                let items: Vec<String> = t.iter().enumerate().map(|(i, v)| format!("{}:{}", 1u64 << i, v)).collect();
                parts.push(format!("roundup_power2_divisions:[{}]", items.join(",")));
            }
        }
        if let Some(t) = self.roundup_bypass_threshold {
            parts.push(format!("roundup_bypass_threshold_mb:{}", t / MIB));
        }
        if self.garbage_collection_threshold != 0.0 {
            parts.push(format!("garbage_collection_threshold:{}", fmt_f64(self.garbage_collection_threshold)));
        }
        if self.expandable_segments {
            parts.push("expandable_segments:True".into());
        }
        if self.per_process_memory_fraction != 1.0 {
            parts.push(format!("per_process_memory_fraction:{}", fmt_f64(self.per_process_memory_fraction)));
        }
        if self.release_lock_on_cudamalloc {
            parts.push(format!("release_lock_on_cudamalloc:{}", b(true)));
        }
        if self.pinned_use_cuda_host_register {
            parts.push("pinned_use_cuda_host_register:True".into());
        }
        if self.pinned_num_register_threads != 1 {
            parts.push(format!("pinned_num_register_threads:{}", self.pinned_num_register_threads));
        }
        if self.pinned_use_background_threads {
            parts.push("pinned_use_background_threads:True".into());
        }
        if self.pinned_reserve_segment_size_mb != 0 {
            parts.push(format!("pinned_reserve_segment_size_mb:{}", self.pinned_reserve_segment_size_mb));
        }
        if let Some(v) = self.pinned_max_round_threshold_mb {
            parts.push(format!("pinned_max_round_threshold_mb:{v}"));
        }
        if let Some(v) = self.pinned_max_cached_size_mb {
            parts.push(format!("pinned_max_cached_size_mb:{v}"));
        }
        if self.pinned_free_catch_all {
            parts.push("pinned_free_catch_all:True".into());
        }
        if self.graph_capture_record_stream_reuse {
            parts.push("graph_capture_record_stream_reuse:True".into());
        }
        if self.throw_on_cudamalloc_oom {
            parts.push("throw_on_cudamalloc_oom:True".into());
        }
        if let Some(r) = &self.expandable_segments_reserve {
            parts.push(format!("expandable_segments_reserve:{}", fmt_reserve(r)));
        }
        if !self.expandable_segments_reserve_by_class.is_empty() {
            let items: Vec<String> = self
                .expandable_segments_reserve_by_class
                .iter()
                .map(|(n, r)| format!("{n}:{}", fmt_reserve(r)))
                .collect();
            parts.push(format!("expandable_segments_reserve_by_class:[{}]", items.join(",")));
        }
        parts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(s: &str) -> String {
        parse(s).unwrap_err().to_string()
    }

    #[test]
    fn empty_and_whitespace() {
        assert_eq!(parse("").unwrap(), AllocatorConfig::default());
        assert_eq!(parse("  ").unwrap(), AllocatorConfig::default());
        let c = parse(" max_split_size_mb : 128 , expandable_segments:True ").unwrap();
        assert_eq!(c.max_split_size, Some(128 * MIB));
        assert!(c.expandable_segments);
    }

    #[test]
    fn unknown_key_and_bool_errors() {
        assert_eq!(err("foo:1"), "Unrecognized key 'foo' in CUDA allocator config.");
        assert_eq!(err("malloc_fraction=0.5"), "Unrecognized key 'malloc_fraction=0.5' in CUDA allocator config.");
        let e = err("expandable_segments:true");
        assert!(e.starts_with("Expected 'True' or 'False'"), "{e}");
        assert!(e.contains("'true'"), "{e}");
        assert!(err("release_lock_on_cudamalloc:1").starts_with("Expected 'True' or 'False'"));
    }

    #[test]
    fn max_split_size_bounds() {
        assert_eq!(err("max_split_size_mb:19"), "CachingAllocator option max_split_size_mb too small, must be >= 20");
        assert_eq!(parse("max_split_size_mb:20").unwrap().max_split_size, Some(20 * MIB));
        assert_eq!(parse("max_split_size_mb:100").unwrap().max_split_size, Some(100 * MIB));
        // Bound follows large_segment_size_mb, whatever its position in the string.
        assert_eq!(
            err("max_split_size_mb:30,large_segment_size_mb:32"),
            "CachingAllocator option max_split_size_mb too small, must be >= 32"
        );
        let c = parse("max_split_size_mb:32,large_segment_size_mb:32").unwrap();
        assert_eq!(c.large_segment_size, 32 * MIB);
        assert_eq!(c.max_non_split_rounding, 32 * MIB, "defaults to the large segment size");
        assert!(err("large_segment_size_mb:10").contains("large_segment_size_mb"));
        assert!(err("max_split_size_mb:abc").contains("max_split_size_mb"));
        assert!(err("max_split_size_mb").contains("expected :"));
        assert_eq!(
            err("max_non_split_rounding_mb:5"),
            "CachingAllocator option max_non_split_rounding_mb too small, must be >= 20"
        );
        assert_eq!(parse("max_non_split_rounding_mb:64").unwrap().max_non_split_rounding, 64 * MIB);
    }

    #[test]
    fn gc_and_fraction() {
        assert_eq!(parse("garbage_collection_threshold:0.6").unwrap().garbage_collection_threshold, 0.6);
        assert_eq!(
            err("garbage_collection_threshold:1.0"),
            "garbage_collect_threshold is invalid, set it in (0.0, 1.0)"
        );
        assert_eq!(err("garbage_collection_threshold:0"), "garbage_collect_threshold is invalid, set it in (0.0, 1.0)");
        assert_eq!(parse("per_process_memory_fraction:0.5").unwrap().per_process_memory_fraction, 0.5);
        assert_eq!(
            err("per_process_memory_fraction:1.5"),
            "per_process_memory_fraction is invalid, set it in [0.0, 1.0]"
        );
    }

    #[test]
    fn roundup_forms() {
        assert_eq!(parse("roundup_power2_divisions:4").unwrap().roundup_power2_divisions, [4; 16]);
        assert_eq!(err("roundup_power2_divisions:3"), "For roundups, the divisons has to be power of 2 ");
        let c = parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap();
        let t = c.roundup_power2_divisions;
        assert_eq!(&t[..8], &[1; 8], "first key fills every lower index");
        assert_eq!(t[8], 1);
        assert_eq!(t[9], 2);
        // `>` fills from the last listed index inclusive (see parse_divisions).
        assert_eq!(&t[10..], &[8; 6]);
        let c = parse("roundup_power2_divisions:[64:8,>:0]").unwrap();
        assert_eq!(&c.roundup_power2_divisions[..6], &[8; 6]);
        assert_eq!(&c.roundup_power2_divisions[6..], &[0; 10]);
        assert_eq!(err("roundup_power2_divisions:[3:4]"), "For roundups, the intervals have to be power of 2 ");
        assert!(
            err("roundup_power2_divisions:[4:3]").starts_with("For roundups, the divisons has to be power of 2 or 0")
        );
        assert!(parse("roundup_power2_divisions:[4:4").is_err());
        let c = parse("roundup_power2_divisions:[1:4,2:8],expandable_segments:True").unwrap();
        assert_eq!(c.roundup_power2_divisions[0], 4);
        assert_eq!(c.roundup_power2_divisions[1], 8);
        assert_eq!(c.roundup_power2_divisions[2], 0);
        assert!(c.expandable_segments);
    }

    #[test]
    fn legacy_bypass_selects_legacy_rule() {
        let c = parse("roundup_power2_divisions:4,roundup_bypass_threshold_mb:64").unwrap();
        assert_eq!(c.rounding_rule, RoundingRule::Legacy);
        assert_eq!(c.roundup_bypass_threshold, Some(64 * MIB));
    }

    #[test]
    fn inert_keys_are_validated() {
        let c = parse(
            "backend:native,pinned_use_cuda_host_register:True,pinned_num_register_threads:8,\
             pinned_use_background_threads:True,pinned_reserve_segment_size_mb:64,pinned_free_catch_all:True,\
             graph_capture_record_stream_reuse:True,throw_on_cudamalloc_oom:True,release_lock_on_cudamalloc:True,\
             expandable_segments_reserve:0.5,expandable_segments_reserve_by_class:[a:40G,b:0.25],\
             pinned_max_round_threshold_mb:4,pinned_max_cached_size_mb:1024",
        )
        .unwrap();
        assert_eq!(c.pinned_num_register_threads, 8);
        assert_eq!(c.expandable_segments_reserve, Some(ReserveSpec::Fraction(0.5)));
        assert_eq!(c.expandable_segments_reserve_by_class.len(), 2);
        assert_eq!(err("pinned_num_register_threads:3"), "Number of register threads has to be power of 2, got 3");
        assert_eq!(
            err("pinned_num_register_threads:256"),
            "Number of register threads should be less than or equal to 128, got 256"
        );
        assert_eq!(err("pinned_reserve_segment_size_mb:0"), "Pinned reserve segment size has to be greater than 0");
        assert_eq!(err("backend:foo"), "Unknown allocator backend, options are native and cudaMallocAsync");
        // Bad reserve values only warn in PyTorch.
        assert_eq!(parse("expandable_segments_reserve:-1").unwrap().expandable_segments_reserve, None);
        assert!(err("max_split_size_mb:40 expandable_segments:True").contains("Invalid value"));
    }

    /// What-ifs that set an option the model cannot reproduce are refused, naming it;
    /// the recording's own value of such an option is not a refusal.
    #[test]
    fn refusals_name_the_option() {
        let rec = AllocatorConfig::default();
        let e = parse("backend:cudaMallocAsync").unwrap().refusal(&rec).unwrap_err().to_string();
        assert!(e.starts_with("backend:cudaMallocAsync is not modelled: "), "{e}");
        let reuse = parse("graph_capture_record_stream_reuse:True").unwrap();
        let e = reuse.refusal(&rec).unwrap_err().to_string();
        assert!(e.starts_with("graph_capture_record_stream_reuse is not modelled: "), "{e}");
        assert_eq!(reuse.refusal(&reuse), Ok(()), "as recorded: its effect is in the trace");
        let by_class = parse("expandable_segments_reserve_by_class:[a:0.5]").unwrap();
        assert!(by_class.refusal(&rec).unwrap_err().to_string().starts_with("expandable_segments_reserve_by_class"));
        assert_eq!(parse("max_split_size_mb:128,expandable_segments:True").unwrap().refusal(&rec), Ok(()));
    }

    #[test]
    fn remarks_name_what_the_replay_does_with_an_option() {
        assert!(AllocatorConfig::default().remarks().is_empty());
        assert!(parse("max_split_size_mb:128").unwrap().remarks().is_empty());
        let r = parse("max_split_size_mb:128,expandable_segments:True").unwrap().remarks();
        assert_eq!(r.len(), 1);
        assert!(r[0].starts_with("max_split_size_mb with expandable_segments") && r[0].contains("#123548"), "{r:?}");
        let npu = AllocatorConfig { accelerator: Accelerator::Npu, ..Default::default() };
        assert!(npu.remarks()[0].contains("expect differences"));
        let rocm = AllocatorConfig { accelerator: Accelerator::Rocm, ..Default::default() };
        assert!(rocm.remarks().is_empty(), "ROCm without expandable segments runs CUDA's rules");
        let rocm_exp = AllocatorConfig { expandable_segments: true, ..rocm };
        assert!(rocm_exp.remarks()[0].contains("modelled as CUDA, expect differences"));
    }

    /// The fidelity table names every key the parser accepts (each parses with a valid
    /// value) and no key twice.
    #[test]
    fn options_table_covers_the_parser() {
        let mut seen = std::collections::HashSet::new();
        for o in OPTIONS {
            assert!(seen.insert(o.key), "{} twice", o.key);
            let e = err(&format!("{}:", o.key));
            assert!(!e.starts_with("Unrecognized key"), "{}: {e}", o.key);
        }
        assert_eq!(OPTIONS.len(), 21);
        for k in ["foo", "expandable_segment", "large_segment_size"] {
            assert!(err(&format!("{k}:1")).starts_with("Unrecognized key"), "{k}");
        }
    }

    #[test]
    fn canonical_string_round_trips() {
        for s in [
            "",
            "max_split_size_mb:100",
            "max_split_size_mb:128,max_non_split_rounding_mb:64,garbage_collection_threshold:0.8,expandable_segments:True",
            "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
            "roundup_power2_divisions:8,roundup_bypass_threshold_mb:128",
            "large_segment_size_mb:64,per_process_memory_fraction:0.5,throw_on_cudamalloc_oom:True",
            "expandable_segments_reserve:40G,expandable_segments_reserve_by_class:[x:0.5],pinned_num_register_threads:4",
        ] {
            let c = parse(s).unwrap();
            let canon = c.to_conf_string();
            let again = parse(&canon).unwrap_or_else(|e| panic!("{canon}: {e}"));
            assert_eq!(again, c, "{s} -> {canon}");
        }
    }
}
