//! What a replay can be asked to assume besides the recording: a device size (in bytes or
//! by GPU name, [`parse_capacity`]), allocator settings on top of the recorded ones
//! ([`config_on_top`]), and the settings tried beside the recorded ones when none is asked
//! for ([`ALTERNATIVES`]), and which device's allocator wrote the recording
//! ([`detect_accelerator`], [`recording_remarks`]). Defined once here for every front end
//! (CLI, Python, report) and every analysis that replays (`diagnose`, `predict`).

use fragscope_alloc::{Accelerator, AllocatorConfig, ConfigError};
use fragscope_snapshot::{PyObj, Snapshot};

/// Parses a byte size: a plain integer (bytes) or a number with a unit. Binary units
/// `KiB`, `MiB`, `GiB`, `TiB` and the one-letter forms `K`, `M`, `G`, `T` (as
/// `PYTORCH_CUDA_ALLOC_CONF` writes `40G`) are powers of 1024; `KB`, `MB`, `GB`, `TB`
/// are powers of 1000 (so `20GB` = 20,000,000,000 bytes, as disk makers and
/// nvidia-smi's "GB" mean it); `B` is bytes. Units are case-insensitive; a space before
/// the unit and a fraction (`1.5GiB`) are allowed; the result is rounded to whole bytes.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim();
    let bad = |problem| SizeError { text: s.to_string(), problem };
    let mult: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(bad(SizeProblem::UnknownUnit(unit.to_string()))),
    };
    if num.is_empty() || num.matches('.').count() > 1 {
        return Err(bad(SizeProblem::NoNumber));
    }
    if unit.is_empty() || unit.eq_ignore_ascii_case("b") {
        if let Ok(n) = num.parse::<u64>() {
            return Ok(n);
        }
    }
    let v: f64 = num.parse().map_err(|_| bad(SizeProblem::BadNumber))?;
    let bytes = (v * mult).round();
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(bad(SizeProblem::TooLarge));
    }
    Ok(bytes as u64)
}

/// A size [`parse_size`] cannot read: the text as given and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SizeError {
    pub text: String,
    pub problem: SizeProblem,
}

/// What is wrong with a size ([`SizeError`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SizeProblem {
    /// A unit other than B, KiB, MiB, GiB, TiB (K, M, G, T), KB, MB, GB, TB.
    UnknownUnit(String),
    /// No number before the unit, or one with two decimal points.
    NoNumber,
    /// Digits and a point that still do not read as a number.
    BadNumber,
    /// At least 2^64 bytes.
    TooLarge,
}

impl std::fmt::Display for SizeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.text;
        match &self.problem {
            SizeProblem::UnknownUnit(unit) => {
                write!(f, "invalid size {s:?}: unknown unit {unit:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")
            }
            SizeProblem::NoNumber => {
                write!(f, "invalid size {s:?}: expected a number with an optional unit, e.g. 20GiB")
            }
            SizeProblem::BadNumber => write!(f, "invalid size {s:?}"),
            SizeProblem::TooLarge => write!(f, "invalid size {s:?}: too large"),
        }
    }
}

impl std::error::Error for SizeError {}

/// Device memory a PyTorch process sees, per GPU: the "total capacity" its CUDA OOM
/// messages print (`cudaMemGetInfo`'s total), in hundredths of a GiB as printed. This is
/// less than nvidia-smi's MiB figure (the driver keeps a share: an H100 80GB shows 81,559
/// MiB = 79.65 GiB in nvidia-smi but 79.11 GiB to PyTorch), and less than the marketing
/// size. Each figure is quoted from a real OOM message in a public issue:
///
/// | name | printed | issue |
/// |---|---|---|
/// | H100-80GB | 79.11 GiB | <https://github.com/vllm-project/vllm/issues/27508> |
/// | H100-NVL (94 GB) | 93.00 GiB | <https://github.com/ali-vilab/VACE/issues/56> |
/// | A100-80GB | 79.25 GiB | <https://github.com/levihsu/OOTDiffusion/issues/235> |
/// | A100-40GB | 39.50 GiB | <https://github.com/TianheWu/CoSeR/issues/10> |
/// | L40S | 44.53 GiB | <https://github.com/Wan-Video/Wan2.1/issues/205> |
/// | L40 | 44.40 GiB | <https://github.com/QwenLM/Qwen3-VL/issues/2097> |
/// | A30 | 23.53 GiB | <https://github.com/google/RB-Modulation/issues/5> |
/// | A10 | 21.99 GiB | <https://github.com/zai-org/CogVLM/issues/236> |
/// | T4 | 14.75 GiB | <https://github.com/hpcaitech/Open-Sora/issues/697>, <https://github.com/googlecolab/colabtools/issues/3439> |
/// | V100-32GB | 31.74 GiB | <https://github.com/liucongg/ChatGLM-Finetuning/issues/73>, <https://github.com/haotian-liu/LLaVA/issues/812> |
/// | V100-16GB | 15.78 GiB | <https://github.com/kchengiva/Shift-GCN/issues/34> |
/// | RTX-4090 | 23.64 GiB | <https://github.com/3DTopia/Phidias-Diffusion/issues/8> |
/// | RTX-3090 | 23.70 GiB | <https://github.com/GaoLii/DSP/issues/10>, <https://github.com/xiaoxiangAQ/GAS-Net/issues/7> |
///
/// GPUs without such a message found (H200, L4, RTX A6000, RTX 5090) are not listed: give
/// their size in bytes (`--capacity 139.8GiB`) from an OOM message of your own.
pub(crate) const GPUS: &[(&str, u64)] = &[
    ("H100-80GB", 7911),
    ("H100", 7911),
    ("H100-NVL", 9300),
    ("H100-94GB", 9300),
    ("A100-80GB", 7925),
    ("A100", 7925),
    ("A100-40GB", 3950),
    ("L40S", 4453),
    ("L40", 4440),
    ("A30", 2353),
    ("A10", 2199),
    ("T4", 1475),
    ("V100-32GB", 3174),
    ("V100-16GB", 1578),
    ("V100", 1578),
    ("RTX-4090", 2364),
    ("RTX-3090", 2370),
];

/// Bytes of a printed "X.YZ GiB" given in hundredths (rounded to the byte, as the parser
/// of OOM messages reads it).
fn gib_hundredths(h: u64) -> u64 {
    (h * (1 << 30) + 50) / 100
}

/// The GPUs [`parse_capacity`] knows, each once (aliases of one size left out), smallest
/// first: `(name, bytes PyTorch sees)`. `fragscope fit` names the cards a capacity is.
pub fn known_gpus() -> Vec<(&'static str, u64)> {
    let mut v: Vec<(&'static str, u64)> = Vec::new();
    for &(n, h) in GPUS {
        if !v.iter().any(|&(_, b)| b == gib_hundredths(h)) {
            v.push((n, gib_hundredths(h)));
        }
    }
    v.sort_by_key(|&(_, b)| b);
    v
}

/// `80GiB`, `80GB` (decimal), `80G` (= GiB), `1234` (bytes), or a GPU name.
pub fn parse_capacity(s: &str) -> Result<u64, CapacityError> {
    // GPU names compare without case, spaces, '-' or '_': "RTX 4090", "rtx-4090", "H100_80GB".
    let key = |n: &str| n.chars().filter(|c| c.is_ascii_alphanumeric()).collect::<String>().to_ascii_uppercase();
    let want = key(s);
    if let Some(&(_, h)) = GPUS.iter().find(|(n, _)| key(n) == want) {
        return Ok(gib_hundredths(h));
    }
    parse_size(s).map_err(|size| CapacityError { param: Param::Capacity, size })
}

/// A device size [`parse_capacity`] cannot read: neither a size nor a name of [`GPUS`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapacityError {
    /// Always [`Param::Capacity`]: the message says "capacity" in the CLI's words.
    pub param: Param,
    /// Why it is not a size (its `text` is the capacity as given).
    pub size: SizeError,
}

impl std::fmt::Display for CapacityError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = GPUS.iter().map(|(n, _)| *n).collect();
        write!(f, "invalid capacity '{}': {}; or a GPU name: {}", self.size.text, self.size, names.join(", "))
    }
}

impl std::error::Error for CapacityError {}

/// A parameter of a request that the library's messages name, so that a front end can
/// say it in its own words (`--empty-cache-at` on the command line, `empty_cache_at=` in
/// Python). The messages still name them as the CLI does ([`Param::cli_flag`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Param {
    /// The device size a replay assumes ([`parse_capacity`]).
    Capacity,
    /// Where `empty_cache()` is added (`fragscope_diagnose::EmptyCacheAt`).
    EmptyCacheAt,
}

impl Param {
    /// The command-line flag (`--capacity`).
    pub fn cli_flag(self) -> &'static str {
        match self {
            Param::Capacity => "--capacity",
            Param::EmptyCacheAt => "--empty-cache-at",
        }
    }
}

/// The settings `replay`, `analyze` and `predict --max-fit` try beside the recorded ones
/// when none is asked for, each added on top of the recorded settings ([`config_on_top`]).
pub const ALTERNATIVES: &[&str] = &[
    "expandable_segments:True",
    "max_split_size_mb:128",
    "max_split_size_mb:512",
    "roundup_power2_divisions:4",
    "garbage_collection_threshold:0.8,per_process_memory_fraction:0.95",
];

/// `extra` (a `PYTORCH_CUDA_ALLOC_CONF` string) applied on top of `base`: the options it
/// names replace `base`'s, the others stay. An empty `extra` is `base` itself. The
/// accelerator whose rules apply is `base`'s (no string can change it), and so is the
/// free-list tie-break (`tie_break`, a version switch no string expresses). An option the
/// model cannot reproduce is refused by name when `extra` changes it
/// ([`AllocatorConfig::refusal`]: `backend:cudaMallocAsync`,
/// `graph_capture_record_stream_reuse`, `expandable_segments_reserve_by_class`).
pub fn config_on_top(base: &AllocatorConfig, extra: &str) -> Result<AllocatorConfig, ConfigError> {
    let b = base.to_conf_string();
    let joined = match (b.is_empty(), extra.is_empty()) {
        (_, true) => return Ok(base.clone()),
        (true, false) => extra.to_string(),
        (false, false) => format!("{b},{extra}"),
    };
    // Parsed together, so that PyTorch's checks between keys hold (max_split_size_mb is
    // bounded by large_segment_size_mb); then only what `extra` changed is taken, so that
    // a field of `base` the string does not carry exactly (the tie-break, the rounding
    // rule, a recorded field) is never rebuilt from it.
    let on_top = fragscope_alloc::parse_config(&joined)?;
    let as_string = fragscope_alloc::parse_config(&b)?;
    let cfg = changed_fields(base, &as_string, on_top);
    cfg.refusal(base)?;
    Ok(cfg)
}

/// `base` with each field that differs between `before` (the parse of `base`'s string)
/// and `after` (that string with a what-if on top) taken from `after`. Every field is
/// named, so that a field added to [`AllocatorConfig`] must be placed here.
fn changed_fields(base: &AllocatorConfig, before: &AllocatorConfig, after: AllocatorConfig) -> AllocatorConfig {
    let mut cfg = base.clone();
    // Fields before `;` are taken where they changed; those after it are always base's.
    // The struct is bound by name (no `..`), so a field added to [`AllocatorConfig`] does
    // not compile until it is listed here.
    macro_rules! take_changed {
        ($($f:ident),* ; $($kept:ident),*) => {
            let AllocatorConfig { $($f,)* $($kept: _,)* } = after;
            $(if $f != before.$f { cfg.$f = $f; })*
        };
    }
    take_changed!(
        max_split_size,
        max_non_split_rounding,
        roundup_power2_divisions,
        roundup_bypass_threshold,
        garbage_collection_threshold,
        expandable_segments,
        large_segment_size,
        per_process_memory_fraction,
        release_lock_on_cudamalloc,
        backend,
        pinned_use_cuda_host_register,
        pinned_num_register_threads,
        pinned_use_background_threads,
        pinned_reserve_segment_size_mb,
        pinned_max_round_threshold_mb,
        pinned_max_cached_size_mb,
        pinned_free_catch_all,
        graph_capture_record_stream_reuse,
        throw_on_cudamalloc_oom,
        expandable_segments_reserve,
        expandable_segments_reserve_by_class,
        // Set by no key but roundup_bypass_threshold_mb (≤ 2.0's rule).
        rounding_rule;
        // Set by no key: always base's.
        tie_break,
        accelerator
    );
    cfg
}

/// A part of a recorded settings string the parser refused: the item as written
/// (`key:value`) and the parser's reason. PyTorch accepted the string when it ran, so such
/// a part is an option of another version or backend; the replay runs without it, the
/// option at its default, and says so ([`recording_remarks`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct UnreadSetting {
    pub item: String,
    pub error: String,
}

/// A recorded `PYTORCH_CUDA_ALLOC_CONF` string read as far as it goes: the whole string
/// when it parses; otherwise each top-level `key:value` item (lists in brackets kept
/// whole) is added in turn and kept when the items kept so far still parse with it, and
/// the others are returned by name. `large_segment_size_mb` goes first, since the bounds
/// of other keys depend on it (spec §9.3).
pub fn read_recorded_conf(conf: &str) -> (AllocatorConfig, Vec<UnreadSetting>) {
    if let Ok(cfg) = fragscope_alloc::parse_config(conf) {
        return (cfg, Vec::new());
    }
    let mut items = top_level_items(conf);
    items.sort_by_key(|i| !i.trim_start().starts_with("large_segment_size_mb"));
    let mut kept: Vec<&str> = Vec::new();
    let mut cfg = AllocatorConfig::default();
    let mut unread = Vec::new();
    for item in items {
        kept.push(item);
        match fragscope_alloc::parse_config(&kept.join(",")) {
            Ok(c) => cfg = c,
            Err(e) => {
                kept.pop();
                unread.push(UnreadSetting { item: item.trim().to_string(), error: e.to_string() });
            }
        }
    }
    (cfg, unread)
}

/// The parts of a settings string between commas outside brackets.
fn top_level_items(conf: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i64, 0);
    for (i, ch) in conf.char_indices() {
        match ch {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth <= 0 => {
                out.push(&conf[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&conf[start..]);
    out
}

/// The parts of `snap`'s recorded settings string that [`read_recorded_conf`] could not
/// read (empty when there are none, or no string).
pub fn unread_settings(snap: &Snapshot) -> Vec<UnreadSetting> {
    let conf = snap.recorded_settings().and_then(|rs| rs.conf);
    conf.map(|c| read_recorded_conf(&c).1).unwrap_or_default()
}

/// Which device's caching allocator wrote a recording, and what in the file says so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DetectedAccelerator {
    pub accelerator: Accelerator,
    /// The string in the file that decided it (a frame's file, a settings key).
    pub evidence: String,
}

/// The accelerator a recording comes from, from what the file carries: every backend
/// writes the same snapshot dict, so the signs are in its strings. Frames from
/// `torch_npu` (Ascend's PyTorch plugin) → NPU; from `torch/xpu/` or
/// `intel_extension_for_pytorch` → XPU; HIP's allocator or runtime in a C++ frame
/// (`c10/hip/`, `HIPCachingAllocator`, `hipMalloc`) or a `PYTORCH_HIP_ALLOC_CONF` /
/// `*_hipmalloc` settings key → ROCm; a settings key naming NPU or XPU likewise. `None`:
/// nothing but CUDA's signs (or none at all), replayed under CUDA's rules.
pub fn detect_accelerator(snap: &Snapshot) -> Option<DetectedAccelerator> {
    // Most specific first: torch_npu and IPEX recordings also carry torch's own frames.
    const SIGNS: &[(&str, Accelerator)] = &[
        ("torch_npu", Accelerator::Npu),
        ("PYTORCH_NPU_ALLOC_CONF", Accelerator::Npu),
        ("torch/xpu/", Accelerator::Xpu),
        ("intel_extension_for_pytorch", Accelerator::Xpu),
        ("PYTORCH_XPU_ALLOC_CONF", Accelerator::Xpu),
        ("c10/hip/", Accelerator::Rocm),
        ("HIPCachingAllocator", Accelerator::Rocm),
        ("hipMalloc", Accelerator::Rocm),
        ("PYTORCH_HIP_ALLOC_CONF", Accelerator::Rocm),
        // hipify rewrites the settings keys the snapshot writer spells out
        ("release_lock_on_hipmalloc", Accelerator::Rocm),
        ("pinned_use_hip_host_register", Accelerator::Rocm),
    ];
    let t = &snap.frames;
    let mut keys: Vec<&str> = Vec::new();
    if let Some(PyObj::Dict(items)) = &snap.allocator_settings {
        keys.extend(items.iter().filter_map(|(k, _)| k.as_str()));
    }
    let strings = (0..t.num_strings()).map(|i| t.str_at(i)).chain(keys);
    let mut best: Option<(usize, &str)> = None;
    for s in strings {
        if let Some(rank) = SIGNS.iter().position(|(sign, _)| s.contains(sign)) {
            if best.is_none_or(|(r, _)| rank < r) {
                best = Some((rank, s));
            }
        }
    }
    best.map(|(rank, s)| DetectedAccelerator { accelerator: SIGNS[rank].1, evidence: s.to_string() })
}

/// The note a replay carries when parts of the recorded settings string were not read.
fn unread_note(unread: &[UnreadSetting]) -> Option<String> {
    if unread.is_empty() {
        return None;
    }
    let parts: Vec<String> = unread.iter().map(|u| format!("{:?} ({})", u.item, u.error)).collect();
    Some(format!(
        "the recorded PYTORCH_CUDA_ALLOC_CONF has {} part(s) fragscope cannot read, replayed as if absent \
         (those options at their defaults; the settings recorded as their own entries still apply): {}",
        unread.len(),
        parts.join("; ")
    ))
}

/// What a reader of a replay of `snap` under `cfg` should be told about the settings:
/// parts of the recorded settings string not read ([`read_recorded_conf`]), by name;
/// another accelerator's rules and the sign that chose them, the named remarks of
/// [`AllocatorConfig::remarks`], and a settings string that asks for expandable segments
/// the allocator did not use (PyTorch 2.9.1 ignored `expandable_segments` given through
/// `PYTORCH_ALLOC_CONF` on CUDA, pytorch/pytorch#183387; the recorded flag wins).
pub fn recording_remarks(snap: &Snapshot, cfg: &AllocatorConfig) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(d) = detect_accelerator(snap).filter(|d| d.accelerator == cfg.accelerator) {
        out.push(format!("recorded on {} (the file has {:?})", d.accelerator.name(), d.evidence));
    }
    out.extend(cfg.remarks());
    if let Some(rs) = snap.recorded_settings() {
        let (asked, unread) = rs.conf.as_deref().map(read_recorded_conf).unzip();
        if let Some(note) = unread.as_deref().and_then(unread_note) {
            out.push(note);
        }
        if asked.is_some_and(|a| a.expandable_segments) && rs.expandable_segments == Some(false) {
            out.push(
                "the settings string asks for expandable_segments:True but the allocator ran without it \
                 (PyTorch 2.9.1 ignored it when given through PYTORCH_ALLOC_CONF, pytorch/pytorch#183387; \
                 PYTORCH_CUDA_ALLOC_CONF works in every version); replayed as it ran"
                    .to_string(),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{config_on_top, detect_accelerator, parse_capacity, parse_size, recording_remarks, ALTERNATIVES};
    use fragscope_alloc::Accelerator;
    use fragscope_snapshot::{PyObj, Snapshot};

    fn with_strings(strings: &[&str]) -> Snapshot {
        let mut s = Snapshot::default();
        for t in strings {
            s.frames.intern_str(t);
        }
        s
    }

    /// The signs of each accelerator, and the most specific wins (a torch_npu or IPEX
    /// recording also has torch's own frames; an NPU one may run hipify-free C++ frames).
    #[test]
    fn accelerators_are_told_apart_by_the_strings_of_the_file() {
        let cases = [
            (&["/site-packages/torch/cuda/memory.py"][..], None),
            (
                &["/site-packages/torch_npu/npu/memory.py", "/site-packages/torch/nn/modules/module.py"],
                Some(Accelerator::Npu),
            ),
            (&["/site-packages/torch/xpu/memory.py"], Some(Accelerator::Xpu)),
            (&["/site-packages/intel_extension_for_pytorch/frontend.py"], Some(Accelerator::Xpu)),
            (&["c10/hip/HIPCachingAllocator.cpp"], Some(Accelerator::Rocm)),
            (&["c10::hip::HIPCachingAllocator::malloc", "torch_npu/x.py"], Some(Accelerator::Npu)),
            (&["chip_design.py", "relationship.py"], None),
        ];
        for (strings, want) in cases {
            let got = detect_accelerator(&with_strings(strings)).map(|d| d.accelerator);
            assert_eq!(got, want, "{strings:?}");
        }
        // A hipified settings key is a sign too.
        let s = Snapshot {
            allocator_settings: Some(PyObj::Dict(vec![(
                PyObj::Str("release_lock_on_hipmalloc".into()),
                PyObj::Bool(false),
            )])),
            ..Default::default()
        };
        let d = detect_accelerator(&s).unwrap();
        assert_eq!((d.accelerator, d.evidence.as_str()), (Accelerator::Rocm, "release_lock_on_hipmalloc"));
    }

    #[test]
    fn remarks_say_which_accelerator_and_why() {
        let s = with_strings(&["/site-packages/torch_npu/npu/memory.py"]);
        let npu = fragscope_alloc::AllocatorConfig { accelerator: Accelerator::Npu, ..Default::default() };
        let r = recording_remarks(&s, &npu);
        assert_eq!(r[0], "recorded on NPU (the file has \"/site-packages/torch_npu/npu/memory.py\")");
        assert!(r[1].starts_with("Ascend NPU: replayed with torch_npu's rounding"), "{r:?}");
        // Replayed under CUDA's rules on purpose (a what-if): no claim about the recording.
        assert!(recording_remarks(&s, &Default::default()).is_empty());
    }

    #[test]
    fn capacities_by_size_or_gpu_name() {
        assert_eq!(parse_capacity("80GiB"), Ok(80 << 30));
        assert_eq!(parse_capacity("40GB"), Ok(40_000_000_000));
        // GPU names ignore case, spaces, '-' and '_' (the issue writes "RTX 4090").
        assert_eq!(parse_capacity("RTX 4090"), parse_capacity("RTX-4090"));
        // 79.11 GiB, as PyTorch prints it, not nvidia-smi's 81,559 MiB.
        assert_eq!(parse_capacity("h100_80gb"), Ok(84_943_715_697));
        assert!(parse_capacity("H200").is_err(), "uncited GPUs are not guessed");
        let e = parse_capacity("bogus").unwrap_err();
        assert_eq!(e.param, super::Param::Capacity);
        let e = e.to_string();
        assert!(e.contains("H100-80GB") && e.contains("GiB"), "{e}");
        assert!(e.starts_with("invalid capacity 'bogus': invalid size \"bogus\": unknown unit \"bogus\""), "{e}");
    }

    #[test]
    fn sizes_binary_and_decimal() {
        assert_eq!(parse_size("20GiB"), Ok(20 << 30));
        assert_eq!(parse_size("20GB"), Ok(20_000_000_000));
        assert_eq!(parse_size("1.5 gib"), Ok(3 << 29));
        assert!(parse_size("20 parsecs").is_err());
    }

    /// The messages front ends print, word for word.
    #[test]
    fn size_errors_say_what_is_wrong() {
        use super::SizeProblem::*;
        let cases = [
            (
                "20 parsecs",
                UnknownUnit("parsecs".into()),
                "invalid size \"20 parsecs\": unknown unit \"parsecs\" (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)",
            ),
            ("GiB", NoNumber, "invalid size \"GiB\": expected a number with an optional unit, e.g. 20GiB"),
            ("1.2.3", NoNumber, "invalid size \"1.2.3\": expected a number with an optional unit, e.g. 20GiB"),
            (".", BadNumber, "invalid size \".\""),
            ("99999999999TiB", TooLarge, "invalid size \"99999999999TiB\": too large"),
        ];
        for (text, problem, message) in cases {
            let e = parse_size(text).unwrap_err();
            assert_eq!((e.text.as_str(), &e.problem), (text, &problem));
            assert_eq!(e.to_string(), message);
        }
    }

    #[test]
    fn alternatives_go_on_top_of_the_recorded_settings() {
        let base = fragscope_alloc::parse_config("max_split_size_mb:256,roundup_power2_divisions:2").unwrap();
        for alt in ALTERNATIVES {
            let c = config_on_top(&base, alt).unwrap();
            assert_eq!(c.roundup_power2_divisions == base.roundup_power2_divisions, !alt.contains("roundup"), "{alt}");
        }
        let e = config_on_top(&base, "expandable_segments:True").unwrap();
        assert!(e.expandable_segments && e.max_split_size == base.max_split_size);
        assert_eq!(config_on_top(&base, "").unwrap().to_conf_string(), base.to_conf_string());
        assert!(config_on_top(&base, "no_such_option:1").is_err());
    }

    /// The named capacities equal the "total capacity" of the real OOM messages they cite,
    /// read by fragscope's own OOM-text parser.
    #[test]
    fn gpu_names_give_the_total_real_oom_messages_print() {
        use fragscope_oomtext::parse;
        let cases = [
            ("H100-80GB", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB. GPU 0 has a total capacity of 79.11 GiB of which 140.75 MiB is free."),
            ("V100-32GB", "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 384.00 MiB (GPU 0; 31.74 GiB total capacity; 30.41 GiB already allocated; 98.12 MiB free; 30.53 GiB reserved in total by PyTorch)"),
            ("V100-16GB", "RuntimeError: CUDA out of memory. Tried to allocate 236.00 MiB (GPU 0; 15.78 GiB total capacity; 14.25 GiB already allocated; 183.50 MiB free; 14.34 GiB reserved in total by PyTorch)"),
            ("T4", "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 160.00 MiB. GPU 0 has a total capacity of 14.75 GiB of which 73.06 MiB is free."),
            ("A100-40GB", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 80.00 GiB. GPU 0 has a total capacity of 39.50 GiB of which 25.24 GiB is free."),
        ];
        for (name, text) in cases {
            let m = parse(text).unwrap();
            assert_eq!(parse_capacity(name).ok(), m.total_capacity, "{name}");
        }
    }
}
