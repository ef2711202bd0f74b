//! Tests for `oom_message`: one real message per form where one could be found (fixtures in
//! `tests/data/oom/`, each starting with a `# source:` line naming the issue it was quoted
//! from; `synthetic-*` fixtures are built from the spec's template because no real example
//! was found). Byte figures below are the printed value × unit, rounded to the byte, worked
//! out independently of the parser (exact decimal arithmetic).

use fragscope_oomtext::{
    explain, format_size, parse, parse_all, parse_size, printed_precision, Likely, MessageForm, OomMessage, ParseError,
    ProcessUse,
};
use std::path::PathBuf;

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/oom")
}

/// The fixture's text without its `# source:` line.
fn fixture(name: &str) -> String {
    let text = std::fs::read_to_string(data_dir().join(name)).unwrap_or_else(|e| panic!("fixture {name}: {e}"));
    let (first, rest) = text.split_once('\n').expect("fixture has a source line and a body");
    assert!(first.starts_with("# source: "), "{name}: first line must be '# source: ...'");
    rest.to_string()
}

fn parsed(name: &str) -> OomMessage {
    parse(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn every_fixture_names_its_source() {
    for entry in std::fs::read_dir(data_dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        let first = text.lines().next().unwrap_or("");
        if name.starts_with("synthetic-") {
            assert!(first.starts_with("# source: synthetic"), "{name}: {first}");
        } else {
            assert!(first.starts_with("# source: https://github.com/"), "{name}: {first}");
        }
        // and every fixture parses
        parse(&fixture(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

// ---------------------------------------------------------------------------------------------
// ≤ 2.0
// ---------------------------------------------------------------------------------------------

#[test]
fn legacy_2_0() {
    let m = parsed("legacy-2.0.txt");
    assert_eq!(m.form, MessageForm::Legacy);
    assert_eq!(m.device, Some(0));
    assert_eq!(m.tried_to_allocate, Some(1836098519)); // 1.71 GiB
    assert_eq!(m.total_capacity, Some(6442450944)); // 6.00 GiB
    assert_eq!(m.allocated_by_pytorch, Some(3747358966)); // 3.49 GiB
    assert_eq!(m.free, Some(1116691497)); // 1.04 GiB
    assert_eq!(m.reserved_total, Some(3758096384)); // 3.50 GiB
    assert_eq!(m.reserved_unallocated, Some(3758096384 - 3747358966)); // derived R − A
    assert_eq!(m.allowed, None);
    assert_eq!(m.private_pools, None);
    assert!(m.processes.is_empty());
    assert!(!m.expandable_segments_hint);
    assert_eq!(m.exception.as_deref(), Some("OutOfMemoryError"));
    assert!(m.raw.starts_with("CUDA out of memory. Tried to allocate 1.71 GiB (GPU 0;"));
    assert!(m.raw.ends_with("See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"));

    // 1.46 GiB of a 6 GiB card is in use outside PyTorch: that, not fragmentation, is short.
    let e = explain(&m);
    assert_eq!(e.verdict, Likely::OtherProcesses, "{e}");
    // ≤ 2.0: the 2.0 recording API
    let steps = e.next_steps.join("\n");
    assert!(steps.contains("torch.cuda.memory._record_memory_history(True, trace_alloc_max_entries=100000)"));
    assert!(steps.contains("pickle.dump(torch.cuda.memory._snapshot(), f)"));
    assert!(steps.contains("fragscope analyze oom.pickle"));
}

#[test]
fn legacy_fragmentation_suggests_max_split_size() {
    let m = parsed("legacy-fragmented.txt");
    assert_eq!(m.form, MessageForm::Legacy);
    assert_eq!(m.tried_to_allocate, Some(11639361372)); // 10.84 GiB
    assert_eq!(m.total_capacity, Some(25393994138)); // 23.65 GiB
    assert_eq!(m.allocated_by_pytorch, Some(1138166333)); // 1.06 GiB
    assert_eq!(m.free, Some(11016591114)); // 10.26 GiB
    assert_eq!(m.reserved_total, Some(13453985055)); // 12.53 GiB
    assert_eq!(m.reserved_unallocated, Some(13453985055 - 1138166333));
    assert_eq!(m.exception, None);

    let e = explain(&m);
    assert_eq!(e.verdict, Likely::Fragmentation, "{e}");
    let steps = e.next_steps.join("\n");
    assert!(steps.contains("max_split_size_mb"), "{steps}");
    assert!(
        !steps.contains("Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`"),
        "no expandable segments in ≤ 2.0: {steps}"
    );
    assert!(steps.contains("fragscope analyze oom.pickle"));
    assert!(e.headline.contains("11.47 GiB"), "{}", e.headline); // R − A, PyTorch style
}

#[test]
fn legacy_cached_wording() {
    // Very old builds: "X cached" meant held-but-unused, i.e. the later R − A.
    let m = parsed("legacy-cached.txt");
    assert_eq!(m.form, MessageForm::Legacy);
    assert_eq!(m.tried_to_allocate, Some(MIB)); // 1024.00 KiB
    assert_eq!(m.total_capacity, Some(11993696174)); // 11.17 GiB
    assert_eq!(m.allocated_by_pytorch, Some(11703785882)); // 10.90 GiB
    assert_eq!(m.free, Some(589824)); // 576.00 KiB
    assert_eq!(m.reserved_unallocated, Some(32463913)); // 30.96 MiB
    assert_eq!(m.reserved_total, Some(11703785882 + 32463913));
    assert_eq!(m.exception.as_deref(), Some("RuntimeError"));

    // 31 MiB cached against a 1 MiB request while CUDA had 576 KiB free: had the cache held
    // a 1 MiB small-pool block the request was served; the cache is 0.3% of what PyTorch
    // held, so the next request would fail anyway. Both readings fit: borderline (issue 21
    // item 6), not the "the card is full" this test used to assert.
    let e = explain(&m);
    assert_eq!(e.verdict, Likely::Borderline, "{e}");
    assert!(e.next_steps.iter().any(|s| s.contains("older than 1.13")));
    // Issue 42 item 7: upgrading comes before any recording snippet (a version that cannot
    // record was handed one before being told so), and the snippet is one that runs.
    let upgrade = e.next_steps.iter().position(|s| s.contains("older than 1.13")).unwrap();
    let snippet = e.next_steps.iter().position(|s| s.contains("_record_memory_history")).unwrap();
    assert!(upgrade < snippet, "{:#?}", e.next_steps);
    assert!(e.next_steps[snippet].contains("except torch.cuda.OutOfMemoryError:"), "{}", e.next_steps[snippet]);
}

/// Issue 42 item 8: `except torch.OutOfMemoryError` raises AttributeError before 2.4, so no
/// snapshot is written; every snippet `oom` prints catches `torch.cuda.OutOfMemoryError`
/// (1.13 on) unless the message itself named the top-level alias; torch_npu's catch
/// RuntimeError, which its OOM is.
#[test]
fn recording_snippets_catch_an_exception_every_version_has() {
    for entry in std::fs::read_dir(data_dir()).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        let m = parsed(&name);
        let e = explain(&m);
        for s in e.next_steps.iter().filter(|s| s.contains("except ")) {
            let named_alias = m.exception.as_deref() == Some("torch.OutOfMemoryError");
            assert!(
                s.contains("except torch.cuda.OutOfMemoryError:")
                    || (named_alias && s.contains("except torch.OutOfMemoryError:"))
                    // torch_npu raises RuntimeError for its OOM, in every version
                    || (m.is_npu() && s.contains("except RuntimeError as e:")),
                "{name}: {s}"
            );
        }
    }
}

#[test]
fn legacy_wrapped_in_comment_lines() {
    // Wrapped over four '# '-commented lines in a script.
    let m = parsed("legacy-wrapped-comment.txt");
    assert_eq!(m.form, MessageForm::Legacy);
    assert_eq!(m.tried_to_allocate, Some(37748736)); // 36.00 MiB
    assert_eq!(m.total_capacity, Some(8514772664)); // 7.93 GiB
    assert_eq!(m.allocated_by_pytorch, Some(136681882)); // 130.35 MiB (split over two lines)
    assert_eq!(m.free, Some(49345987)); // 47.06 MiB
    assert_eq!(m.reserved_total, Some(197132288)); // 188.00 MiB
    assert_eq!(m.exception.as_deref(), Some("RuntimeError"));
    assert!(m.raw.contains('\n'), "raw keeps the original line breaks");
    assert!(m.raw.ends_with("PYTORCH_CUDA_ALLOC_CONF"), "{}", m.raw);

    // 7.7 GiB of 7.93 GiB held elsewhere dwarfs the 58 MiB stranded in the cache.
    let e = explain(&m);
    assert_eq!(e.verdict, Likely::OtherProcesses, "{e}");
    assert!(e.findings.iter().any(|f| f.contains("Fragmentation also played a part")));
}

// ---------------------------------------------------------------------------------------------
// 2.1
// ---------------------------------------------------------------------------------------------

#[test]
fn v2_1_capacty_typo_fragmentation() {
    let m = parsed("v2.1-capacty.txt");
    assert_eq!(m.form, MessageForm::V2_1);
    assert_eq!(m.device, Some(0));
    assert_eq!(m.tried_to_allocate, Some(1825361101)); // 1.70 GiB
    assert_eq!(m.total_capacity, Some(6442450944)); // 6.00 GiB
    assert_eq!(m.free, Some(0)); // "0 bytes"
    assert_eq!(m.allocated_by_pytorch, Some(3146063544)); // 2.93 GiB
    assert_eq!(m.reserved_unallocated, Some(2469606195)); // 2.30 GiB
    assert_eq!(m.reserved_total, Some(3146063544 + 2469606195));
    assert_eq!(m.exception.as_deref(), Some("torch.cuda.OutOfMemoryError"));

    let e = explain(&m);
    assert_eq!(e.verdict, Likely::Fragmentation, "{e}");
    let steps = e.next_steps.join("\n");
    assert!(steps.contains("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"), "{steps}");
    assert!(steps.contains("torch.cuda.memory._record_memory_history(max_entries=100000)"));
    assert!(steps.contains("torch.cuda.memory._dump_snapshot(\"oom.pickle\")"));
    assert!(steps.contains("fragscope analyze oom.pickle"));
    assert!(e.findings.iter().any(|f| f.contains("reserved but unallocated")));
}

#[test]
fn v2_1_process_lines() {
    let m = parsed("v2.1-processes.txt");
    assert_eq!(m.form, MessageForm::V2_1);
    assert_eq!(m.tried_to_allocate, Some(137438953472)); // 128.00 GiB
    assert_eq!(m.total_capacity, Some(25393994138)); // 23.65 GiB
    assert_eq!(m.free, Some(8536247501)); // 7.95 GiB
    assert_eq!(
        m.processes,
        vec![
            ProcessUse { pid: Some(1957120), bytes: 7623566950 }, // 7.10 GiB
            ProcessUse { pid: None, bytes: 9212704850 },          // this process, 8.58 GiB
        ]
    );
    assert_eq!(m.allocated_by_pytorch, Some(8729521029)); // 8.13 GiB
    assert_eq!(m.reserved_unallocated, Some(9374269)); // 8.94 MiB
    assert_eq!(m.other_process_bytes(), Some(7623566950));
    assert_eq!(m.exception, None);

    let e = explain(&m);
    assert_eq!(e.verdict, Likely::Exhaustion, "{e}"); // 128 GiB on a 23.65 GiB card
    assert!(e.headline.contains("128.00 GiB") && e.headline.contains("23.65 GiB"));
}

// ---------------------------------------------------------------------------------------------
// 2.2 – 2.4 layout
// ---------------------------------------------------------------------------------------------

#[test]
fn v2_2_fragmentation() {
    let m = parsed("v2.2-fragmentation.txt");
    assert_eq!(m.form, MessageForm::V2_2);
    assert_eq!(m.tried_to_allocate, Some(2136746230)); // 1.99 GiB
    assert_eq!(m.total_capacity, Some(25297357373)); // 23.56 GiB
    assert_eq!(m.free, Some(1320702444)); // 1.23 GiB
    assert_eq!(m.processes, vec![ProcessUse { pid: None, bytes: 23912230420 }]); // 22.27 GiB
    assert_eq!(m.allocated_by_pytorch, Some(15816217068)); // 14.73 GiB
    assert_eq!(m.reserved_unallocated, Some(6861210255)); // 6.39 GiB
    assert_eq!(m.reserved_total, Some(15816217068 + 6861210255));
    assert!(!m.expandable_segments_hint, "the 2.2 text *suggests* expandable segments");
    assert!(m.raw.ends_with("#environment-variables)"), "{}", m.raw);

    let e = explain(&m);
    assert_eq!(e.verdict, Likely::Fragmentation, "{e}");
    assert!(e.headline.contains("6.39 GiB") && e.headline.contains("1.99 GiB"), "{}", e.headline);
    let steps = e.next_steps.join("\n");
    assert!(steps.contains("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"));
    assert!(steps.contains("except torch.OutOfMemoryError:"), "uses the type the message had");
}

#[test]
fn v2_2_exhaustion() {
    let m = parsed("v2.2-exhaustion.txt");
    assert_eq!(m.form, MessageForm::V2_2);
    assert_eq!(m.tried_to_allocate, Some(17179869184)); // 16.00 GiB
    assert_eq!(m.total_capacity, Some(47813723423)); // 44.53 GiB
    assert_eq!(m.free, Some(197069373)); // 187.94 MiB
    assert_eq!(m.processes, vec![ProcessUse { pid: Some(3910771), bytes: 47609712476 }]);
    assert_eq!(m.allocated_by_pytorch, Some(46890305454)); // 43.67 GiB
    assert_eq!(m.reserved_unallocated, Some(351346360)); // 335.07 MiB
                                                         // In a container the own process shows as "Process <host pid>".
    assert_eq!(m.probable_own_process(), Some(0));
    assert_eq!(m.other_process_bytes(), Some(0));

    let e = explain(&m);
    assert_eq!(e.verdict, Likely::Exhaustion, "{e}");
    assert!(e.headline.contains("43.67 GiB"), "{}", e.headline);
    assert!(e.next_steps.iter().any(|s| s.contains("activation checkpointing")));
    assert!(e.findings.iter().any(|f| f.contains("probably this process")));
}

#[test]
fn v2_2_other_processes() {
    let m = parsed("v2.2-other-processes.txt");
    assert_eq!(m.form, MessageForm::V2_2);
    assert_eq!(m.tried_to_allocate, Some(2791728742)); // 2.60 GiB
    assert_eq!(m.total_capacity, Some(15826954486)); // 14.74 GiB
    assert_eq!(m.free, Some(2619930051)); // 2.44 GiB
    assert_eq!(
        m.processes,
        vec![
            ProcessUse { pid: Some(21197), bytes: 383778816 },  // 366.00 MiB
            ProcessUse { pid: Some(21194), bytes: 8665096520 }, // 8.07 GiB
            ProcessUse { pid: Some(21200), bytes: 3650722202 }, // 3.40 GiB
            ProcessUse { pid: Some(21203), bytes: 507510784 },  // 484.00 MiB
        ]
    );
    assert_eq!(m.allocated_by_pytorch, Some(8428873318)); // 7.85 GiB
    assert_eq!(m.reserved_unallocated, Some(91121254)); // 86.90 MiB
                                                        // 21194 (8.07 GiB) matches PyTorch's 7.94 GiB reserved: that one is us.
    assert_eq!(m.probable_own_process(), Some(1));
    assert_eq!(m.other_process_bytes(), Some(383778816 + 3650722202 + 507510784));

    let e = explain(&m);
    assert_eq!(e.verdict, Likely::OtherProcesses, "{e}");
    assert!(e.next_steps.iter().any(|s| s.contains("nvidia-smi")));
}

#[test]
fn v2_2_request_larger_than_gpu_with_process_lines() {
    let m = parsed("v2.2-request-larger-than-gpu.txt");
    assert_eq!(m.tried_to_allocate, Some(121214714511)); // 112.89 GiB
    assert_eq!(m.total_capacity, Some(84975927951)); // 79.14 GiB
    assert_eq!(m.free, Some(62910533468)); // 58.59 GiB
    assert_eq!(
        m.processes,
        vec![
            ProcessUse { pid: Some(4078482), bytes: 12122545193 }, // "Process 4078482 has 11.29 GiB"
            ProcessUse { pid: None, bytes: 9932111872 },           // this process, 9.25 GiB
        ]
    );
    assert_eq!(m.allocated_by_pytorch, Some(8879844884)); // 8.27 GiB
    assert_eq!(m.reserved_unallocated, Some(524686459)); // 500.38 MiB
    let e = explain(&m);
    assert_eq!(e.verdict, Likely::Exhaustion, "{e}");
}

// ---------------------------------------------------------------------------------------------
// 2.5+, recent
// ---------------------------------------------------------------------------------------------

#[test]
fn v2_5_allowed_and_private_pools_hip() {
    let m = parsed("v2.5-hip-allowed-private-pools.txt");
    assert_eq!(m.form, MessageForm::V2_5);
    assert_eq!(m.accelerator, "HIP");
    assert_eq!(m.tried_to_allocate, Some(2 * MIB));
    assert_eq!(m.total_capacity, Some(274856432108)); // 255.98 GiB
    assert_eq!(m.free, Some(262690937242)); // 244.65 GiB
    assert_eq!(m.allowed, Some(1127428915)); // 1.05 GiB
    assert_eq!(m.allocated_by_pytorch, Some(1066412278)); // 1017.01 MiB (includes P)
    assert_eq!(m.private_pools, Some(17825792)); // 17.00 MiB
    assert_eq!(m.reserved_unallocated, Some(57661194)); // 54.99 MiB
    assert_eq!(m.reserved_total, Some(1066412278 + 57661194));
    assert_eq!(m.live_allocated(), Some(1066412278 - 17825792));
    assert!(m.processes.is_empty());

    let e = explain(&m);
    assert_eq!(e.verdict, Likely::MemoryFractionCap, "{e}");
    assert!(e.headline.contains("1.05 GiB"), "{}", e.headline);
    assert!(e.findings.iter().any(|f| f.contains("private pools")));
    assert!(e.findings.iter().any(|f| f.contains("small pool")), "2.00 MiB = small request");
}

#[test]
fn recent_docs_url() {
    let m = parsed("recent-docs-url.txt");
    assert_eq!(m.form, MessageForm::Recent);
    assert_eq!(m.tried_to_allocate, Some(131071664456)); // 122.07 GiB
    assert_eq!(m.total_capacity, Some(274856432108)); // 255.98 GiB
    assert_eq!(m.free, Some(54374285967)); // 50.64 GiB
    assert_eq!(m.allocated_by_pytorch, Some(132864813302)); // 123.74 GiB
    assert_eq!(m.reserved_unallocated, Some(9374269)); // 8.94 MiB
    assert!(!m.expandable_segments_hint);
    assert!(m.raw.ends_with("#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"));

    // ~81.6 GiB in use outside PyTorch's allocator on a shared CI machine.
    let e = explain(&m);
    assert_eq!(e.verdict, Likely::OtherProcesses, "{e}");
    assert!(e.next_steps.join("\n").contains("except torch.OutOfMemoryError:"));
}

#[test]
fn recent_expandable_enabled_synthetic() {
    let m = parsed("synthetic-recent-expandable-enabled.txt");
    assert_eq!(m.form, MessageForm::Recent);
    assert!(m.expandable_segments_hint);
    assert!(m.exceeds_expandable_reserve);
    assert_eq!(m.expandable_reserve, Some(2 * GIB));
    assert_eq!(m.tried_to_allocate, Some(4 * GIB));
    assert_eq!(m.total_capacity, Some(85029615043)); // 79.19 GiB
    assert_eq!(m.free, Some(3350074491)); // 3.12 GiB
    assert_eq!(
        m.processes,
        vec![
            ProcessUse { pid: None, bytes: 78458315080 }, // 73.07 GiB
            ProcessUse { pid: Some(4242), bytes: 3 * GIB },
        ]
    );
    assert_eq!(m.allocated_by_pytorch, Some(73282879488)); // 68.25 GiB
    assert_eq!(m.private_pools, Some(512 * MIB));
    assert_eq!(m.reserved_unallocated, Some(4563402752)); // 4.25 GiB

    let e = explain(&m);
    assert_eq!(e.verdict, Likely::Fragmentation, "{e}");
    let steps = e.next_steps.join("\n");
    // already enabled: do not tell the user to enable it
    assert!(!steps.contains("Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`"), "{steps}");
    assert!(steps.contains("already on"));
    assert!(steps.contains("expandable-segment reserve"));
}

// ---------------------------------------------------------------------------------------------
// Other forms
// ---------------------------------------------------------------------------------------------

#[test]
fn too_large_1eb() {
    let m = parsed("too-large-1eb.txt");
    assert_eq!(m.form, MessageForm::TooLarge1EB);
    assert_eq!(m.tried_to_allocate, None);
    assert_eq!(m.exception.as_deref(), Some("torch.cuda.OutOfMemoryError"));
    assert_eq!(m.raw, "CUDA out of memory. Tried to allocate more than 1EB memory");
    let e = explain(&m);
    assert_eq!(e.verdict, Likely::Exhaustion);
    assert!(e.findings.iter().any(|f| f.contains("negative dimension")));
}

#[test]
fn preemptive_rejection_synthetic() {
    let m = parsed("synthetic-preemptive-rejection.txt");
    assert_eq!(m.form, MessageForm::PreemptiveRejection);
    assert_eq!(m.tried_to_allocate, Some(1610612736)); // 1.50 GiB
    assert_eq!(m.device, None);
    assert!(m.raw.ends_with("Requested size: 1.50 GiB"));
    let e = explain(&m);
    assert_eq!(e.verdict, Likely::MemoryFractionCap);
    assert!(e.next_steps.join("\n").contains("except torch.OutOfMemoryError:"));
}

#[test]
fn cuda_malloc_async_multiline() {
    let m = parsed("cudamallocasync.txt");
    assert_eq!(m.form, MessageForm::CudaMallocAsync);
    assert_eq!(m.device, Some(0));
    assert_eq!(m.allocated_by_pytorch, Some(7398081167)); // 6.89 GiB
    assert_eq!(m.tried_to_allocate, Some(320 * MIB));
    assert_eq!(m.total_capacity, Some(25436943811)); // 23.69 GiB
    assert_eq!(m.free, Some(3082813)); // 2.94 MiB
    assert_eq!(m.allowed, None, "SIZE_MAX (17179869184.00 GiB) means no fraction set");
    assert_eq!(m.reserved_unallocated, None);
    assert_eq!(m.exception.as_deref(), Some("torch.cuda.OutOfMemoryError"));
    assert!(m.raw.ends_with("17179869184.00 GiB"), "{}", m.raw);
    assert_eq!(m.raw.lines().count(), 7);

    let e = explain(&m);
    assert_eq!(e.verdict, Likely::OtherProcesses, "{e}");
    let steps = e.next_steps.join("\n");
    assert!(steps.contains("backend:cudaMallocAsync"), "{steps}");
    assert!(steps.contains("_record_memory_history(max_entries=100000)"));
}

#[test]
fn cuda_malloc_async_collapsed_to_one_line() {
    let m = parsed("cudamallocasync-one-line.txt");
    assert_eq!(m.form, MessageForm::CudaMallocAsync);
    assert_eq!(m.allocated_by_pytorch, Some(13099650253)); // 12.20 GiB
    assert_eq!(m.tried_to_allocate, Some(2018634629)); // 1.88 GiB
    assert_eq!(m.total_capacity, Some(16 * GIB));
    assert_eq!(m.free, Some(0));
    assert_eq!(m.allowed, None);
    assert_eq!(m.exception.as_deref(), Some("OutOfMemoryError"));
}

// ---------------------------------------------------------------------------------------------
// Finding the message in surrounding text
// ---------------------------------------------------------------------------------------------

#[test]
fn full_traceback_with_cpp_stack() {
    // A constructed traceback around a real message (v2.1-capacty.txt), followed by the
    // C++ frames newer builds append and a chained exception.
    let msg = fixture("v2.1-capacty.txt");
    let text = format!(
        "Traceback (most recent call last):\n\
         \x20 File \"train.py\", line 42, in <module>\n\
         \x20   loss = model(batch).sum()\n\
         \x20 File \"/usr/lib/python3.10/site-packages/torch/nn/modules/module.py\", line 1518, in _wrapped_call_impl\n\
         \x20   return self._call_impl(*args, **kwargs)\n\
         {}\
         Exception raised from malloc at ../c10/cuda/CUDACachingAllocator.cpp:1100 (most recent call first):\n\
         frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x57 (0x7f1 in libc10.so)\n\
         frame #1: <unknown function> + 0x2b4d4 (0x7f2 in libc10_cuda.so)\n\
         \n\
         During handling of the above exception, another exception occurred:\n\
         RuntimeError: something else\n",
        msg
    );
    let m = parse(&text).unwrap();
    assert_eq!(m, parse(&msg).unwrap(), "same figures as the bare message");
    assert_eq!(m.exception.as_deref(), Some("torch.cuda.OutOfMemoryError"));
    assert!(!m.raw.contains("Exception raised from"), "{}", m.raw);
    assert!(!m.raw.contains("frame #"));
}

#[test]
fn message_wrapped_by_a_terminal() {
    // The v2.2 fragmentation message hard-wrapped at 80 columns, mid-sentence, with the
    // process line on its own line.
    let text = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.99 GiB. GPU 0 has\n\
                a total capacity of 23.56 GiB of which 1.23 GiB is free.\n\
                Including non-PyTorch memory, this process has 22.27 GiB memory in use. Of the\n\
                allocated memory 14.73 GiB is allocated by PyTorch, and 6.39 GiB is reserved by\n\
                PyTorch but unallocated. If reserved but unallocated memory is large try setting\n\
                PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See\n\
                documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n";
    let m = parse(text).unwrap();
    let mut expected = parsed("v2.2-fragmentation.txt");
    expected.raw = m.raw.clone();
    assert_eq!(m, expected);
    assert!(m.raw.ends_with("#environment-variables)"));
}

#[test]
fn process_lines_other_processes_and_own() {
    // The brief's example shape: several "Process N has X memory in use" sentences, each on
    // its own line, plus this process.
    let text = "CUDA out of memory. Tried to allocate 4.00 GiB. GPU 1 has a total capacity of 23.64 GiB of which 2.06 GiB is free.\n\
                Process 1234 has 3.00 GiB memory in use.\n\
                Process 5678 has 5.50 GiB memory in use.\n\
                Including non-PyTorch memory, this process has 13.06 GiB memory in use.\n\
                Of the allocated memory 11.80 GiB is allocated by PyTorch, and 720.00 MiB is reserved by PyTorch but unallocated.";
    let m = parse(text).unwrap();
    assert_eq!(m.form, MessageForm::V2_2);
    assert_eq!(m.device, Some(1));
    assert_eq!(
        m.processes,
        vec![
            ProcessUse { pid: Some(1234), bytes: 3 * GIB },
            ProcessUse { pid: Some(5678), bytes: 5 * GIB + GIB / 2 },
            ProcessUse { pid: None, bytes: 14023068221 }, // 13.06 GiB
        ]
    );
    assert_eq!(m.other_process_bytes(), Some(8 * GIB + GIB / 2));
    let e = explain(&m);
    assert_eq!(e.verdict, Likely::OtherProcesses, "{e}");
    assert!(e.headline.contains("8.50 GiB of it by other processes"), "{}", e.headline);
}

#[test]
fn no_message_is_an_error_naming_the_expected_forms() {
    let err = parse("Traceback (most recent call last):\nValueError: bad shape\n").unwrap_err();
    assert_eq!(err, ParseError::NoMessage);
    let text = err.to_string();
    assert!(text.starts_with("no CUDA out-of-memory message found"), "{text}");
    assert!(text.contains("'CUDA out of memory. Tried to allocate ...'"));
    assert!(text.contains("Allocation on device N would exceed allowed memory"));

    assert_eq!(parse("").unwrap_err(), ParseError::NoMessage);
    // prose that mentions the phrase without the sentence is not a message
    assert!(parse("we sometimes see Allocation on device errors").is_err());
}

#[test]
fn cuda_runtime_oom_is_recognised_but_refused() {
    let err = parse("RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported")
        .unwrap_err();
    match &err {
        ParseError::CudaRuntimeError { line } => {
            assert_eq!(line, "RuntimeError: CUDA error: out of memory")
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("no allocator figures"));
}

#[test]
fn truncated_message_is_partial() {
    let m = parse("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 218.96 GiB").unwrap();
    assert_eq!(m.form, MessageForm::Partial);
    assert_eq!(m.tried_to_allocate, Some(235106509783)); // 218.96 GiB
    assert_eq!(m.total_capacity, None);
    assert_eq!(explain(&m).verdict, Likely::Unclear);
}

#[test]
fn parse_all_finds_every_message_and_keeps_them_apart() {
    // A truncated message followed by a complete one: the first must not borrow figures.
    let text = format!(
        "WARNING: CUDA out of memory. Tried to allocate 20.00 MiB\n{}\n{}",
        fixture("legacy-2.0.txt"),
        fixture("cudamallocasync.txt")
    );
    let all = parse_all(&text);
    assert_eq!(all.len(), 3);
    assert_eq!(all[0].form, MessageForm::Partial);
    assert_eq!(all[0].tried_to_allocate, Some(20 * MIB));
    assert_eq!(all[0].total_capacity, None);
    assert_eq!(all[1].form, MessageForm::Legacy);
    assert_eq!(all[2].form, MessageForm::CudaMallocAsync);
    assert_eq!(parse(&text).unwrap().form, MessageForm::Partial, "parse returns the first");
}

// ---------------------------------------------------------------------------------------------
// Sizes, output
// ---------------------------------------------------------------------------------------------

#[test]
fn sizes_round_trip_in_pytorch_style() {
    assert_eq!(format_size(0), "0 bytes");
    assert_eq!(format_size(512), "512 bytes");
    assert_eq!(format_size(1024), "1024 bytes");
    assert_eq!(format_size(MIB), "1024.00 KiB"); // §13.1: exactly 1 MiB prints as KiB
    assert_eq!(format_size(12 * MIB + MIB / 2), "12.50 MiB");
    assert_eq!(format_size(GIB + GIB / 2), "1.50 GiB");
    assert_eq!(parse_size("12.50 MiB"), Some(12 * MIB + MIB / 2));
    assert_eq!(parse_size("512 bytes"), Some(512));
    assert_eq!(parse_size("1.20 GiB"), Some(1288490189));
    assert_eq!(parse_size("1.20 parsecs"), None);
    assert_eq!(parse_size("GiB"), None);
    // SIZE_MAX as the cudaMallocAsync backend prints it saturates instead of overflowing
    assert_eq!(parse_size("17179869184.00 GiB"), Some(u64::MAX));
    // ± half a unit of the second decimal
    assert_eq!(printed_precision(512), 0);
    assert_eq!(printed_precision(100 * MIB), 5243);
    assert_eq!(printed_precision(2 * GIB), 5368710);
    for b in [1536u64, 3 * MIB + 12345, 7 * GIB + 987654321] {
        let back = parse_size(&format_size(b)).unwrap();
        assert!(back.abs_diff(b) <= printed_precision(b), "{b} -> {back}");
    }
}

#[test]
fn json_output() {
    let m = parsed("v2.5-hip-allowed-private-pools.txt");
    let v = serde_json::to_value(&m).unwrap();
    assert_eq!(v["form"], "v2.5");
    assert_eq!(v["allowed"], 1127428915u64);
    assert_eq!(v["private_pools"], 17825792u64);
    assert_eq!(v["accelerator"], "HIP");
    let e = serde_json::to_value(explain(&m)).unwrap();
    assert_eq!(e["verdict"], "memory_fraction_cap");
    assert!(e["next_steps"].as_array().unwrap().len() >= 2);
    let p = serde_json::to_value(&parsed("v2.1-processes.txt").processes).unwrap();
    assert_eq!(p[1]["pid"], serde_json::Value::Null);
}

#[test]
fn every_explanation_ends_with_the_recording_recipe() {
    for entry in std::fs::read_dir(data_dir()).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        let e = explain(&parsed(&name));
        assert!(!e.headline.is_empty(), "{name}");
        let steps = e.next_steps.join("\n");
        assert!(steps.contains("_record_memory_history("), "{name}: {steps}");
        assert_eq!(e.next_steps.last().unwrap(), "Then run `fragscope analyze oom.pickle`.", "{name}");
        // rendered text is PyTorch-styled and non-empty
        assert!(e.to_string().contains("Next steps:"));
    }
}

// ---------------------------------------------------------------------------------------------
// Robustness: pasted text is arbitrary; the parser must never panic.
// ---------------------------------------------------------------------------------------------

mod no_panic {
    use super::*;
    use proptest::prelude::*;

    fn all_fixtures() -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(data_dir())
            .unwrap()
            .map(|e| fixture(&e.unwrap().file_name().to_string_lossy()))
            .collect();
        v.sort();
        v
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        #[test]
        fn arbitrary_text(s in "\\PC{0,300}") {
            if let Ok(m) = parse(&s) { let _ = explain(&m); }
        }

        #[test]
        fn truncated_and_mutated_fixtures(
            idx in 0usize..64, cut in 0usize..2000, pos in 0usize..2000, ins in "[ 0-9.;:()\\n]{0,3}|é|GiB|9999999999999999999999 GiB"
        ) {
            let fx = all_fixtures();
            let base = &fx[idx % fx.len()];
            let mut t: String = base.chars().take(cut % (base.chars().count() + 1)).collect();
            let at = t.char_indices().map(|(i, _)| i).nth(pos % (t.chars().count() + 1)).unwrap_or(t.len());
            t.insert_str(at, &ins);
            if let Ok(m) = parse(&t) {
                let e = explain(&m);
                prop_assert!(!e.headline.is_empty());
                let _ = serde_json::to_string(&m).unwrap();
            }
            let _ = parse_all(&t);
        }
    }
}

#[test]
fn absurd_figures_do_not_overflow() {
    let m = parse(
        "CUDA out of memory. Tried to allocate 17179869184.00 GiB. GPU 0 has a total capacity of 17179869184.00 GiB of which 17179869184.00 GiB is free. Of the allocated memory 17179869184.00 GiB is allocated by PyTorch, and 17179869184.00 GiB is reserved by PyTorch but unallocated.",
    )
    .unwrap();
    assert_eq!(m.tried_to_allocate, Some(u64::MAX));
    let _ = explain(&m);
}

// ---------------------------------------------------------------------------------------------
// Messages as users paste them (issue 12): bullets, backticks, no header, wrapped, truncated,
// quoted, interleaved, several in one log
// ---------------------------------------------------------------------------------------------

#[test]
fn markdown_bullets_in_backticks_use_every_figure() {
    let m = parsed("synthetic-pasted-markdown-bullets.txt");
    assert_eq!(m.tried_to_allocate, Some(764 * MIB));
    assert_eq!(m.total_capacity, Some(50863150203)); // 47.37 GiB
    assert_eq!(m.free, Some(464393339)); // 442.88 MiB
    assert_eq!(m.allocated_by_pytorch, Some(45526653338)); // 42.40 GiB
    assert_eq!(m.reserved_unallocated, Some(3478923510)); // 3.24 GiB
    assert!(m.missing.is_empty(), "{:?}", m.missing);
    // 3.24 GiB reserved but unallocated against a 764 MiB request: fragmentation, not
    // exhaustion (the line that says so was ignored before).
    assert_eq!(explain(&m).verdict, Likely::Fragmentation);
}

#[test]
fn headerless_wrapped_truncated_message_is_read() {
    let m = parsed("pasted-headerless-wrapped-truncated.txt");
    assert!(m.headerless);
    assert_eq!(m.form, MessageForm::V2_2);
    assert_eq!(m.tried_to_allocate, Some(1002 * MIB));
    assert_eq!(m.total_capacity, Some(8 * GIB));
    assert_eq!(m.free, Some(0));
    assert_eq!(m.allocated_by_pytorch, Some(15010910700)); // 13.98 GiB
    assert_eq!(m.reserved_unallocated, Some(135769620)); // 129.48 MiB
                                                         // 13.98 GiB live on an 8 GiB GPU (Windows shared memory): exhaustion.
    assert_eq!(explain(&m).verdict, Likely::Exhaustion);
}

#[test]
fn quoted_reply_with_traceback_after_it() {
    let m = parsed("pasted-quoted-with-traceback.txt");
    assert_eq!(m.exception.as_deref(), Some("torch.OutOfMemoryError"));
    assert_eq!(m.tried_to_allocate, Some(24459838751)); // 22.78 GiB
    assert_eq!(m.total_capacity, Some(33790655201)); // 31.47 GiB
    assert_eq!(m.free, Some(13668733420)); // 12.73 GiB
    assert_eq!(m.allocated_by_pytorch, Some(9749575762)); // 9.08 GiB
    assert_eq!(m.reserved_unallocated, Some(10039486054)); // 9.35 GiB
    assert_eq!(m.processes, vec![ProcessUse { pid: None, bytes: 20111184364 }]); // 18.73 GiB
    assert!(m.missing.is_empty());
}

#[test]
fn interleaved_ranks_are_each_explained_with_their_own_figures() {
    let all = parse_all(&fixture("pasted-two-ranks-interleaved.txt"));
    assert_eq!(all.len(), 2, "{all:#?}");
    let r1 = all.iter().find(|m| m.log_prefix.as_deref() == Some("rank1")).unwrap();
    let r0 = all.iter().find(|m| m.log_prefix.as_deref() == Some("rank0")).unwrap();
    assert_eq!(r1.form, MessageForm::V2_1);
    assert_eq!(r1.tried_to_allocate, Some(496 * MIB));
    assert_eq!(r1.total_capacity, Some(15837691904)); // 14.75 GiB
    assert_eq!(r1.allocated_by_pytorch, Some(15096810045)); // 14.06 GiB
    assert_eq!(r1.reserved_unallocated, Some(346470482)); // 330.42 MiB
    assert_eq!(r1.processes, vec![ProcessUse { pid: Some(20398), bytes: 15590731284 }]); // 14.52 GiB
    assert_eq!(r0.tried_to_allocate, Some(14 * MIB));
    assert_eq!(r0.total_capacity, Some(4 * GIB));
    assert_eq!(r0.allocated_by_pytorch, Some(7483980513)); // 6.97 GiB
    assert_eq!(r0.reserved_unallocated, Some(193703444)); // 184.73 MiB
    for m in [r0, r1] {
        assert!(m.missing.is_empty(), "{:?}", m.missing);
        assert_ne!(explain(m).verdict, Likely::Unclear);
    }
}

#[test]
fn a_figure_cut_mid_sentence_is_still_used() {
    let t = "CUDA out of memory. Tried to allocate 764.00 MiB. GPU 0 has a total capacity of 47.37 GiB of \
             which 442.88 MiB is free. Of the allocated memory 42.40 GiB is allocated by PyTorch, and 3.24 GiB \
             is reserved by PyTorch but unall";
    let m = parse(t).unwrap();
    assert_eq!(m.reserved_unallocated, Some(3478923510));
    assert_eq!(explain(&m).verdict, Likely::Fragmentation);
}

#[test]
fn partial_messages_give_the_verdict_their_figures_allow_and_name_what_is_missing() {
    // No total capacity: the cache figures alone show fragmentation.
    let m = parse("Tried to allocate 764.00 MiB ... 42.40 GiB is allocated by PyTorch, and 3.24 GiB is reserved by PyTorch but unallocated").unwrap();
    assert!(m.headerless);
    assert_eq!(m.missing, vec!["total capacity".to_string(), "free".to_string()]);
    let ex = explain(&m);
    assert_eq!(ex.verdict, Likely::Fragmentation);
    assert!(ex.headline.contains("total capacity is not in the text"), "{}", ex.headline);
    assert!(ex.findings.iter().any(|f| f.contains("'total capacity'") && f.contains("'free'")), "{:?}", ex.findings);
    // Only the cache sentence: no request, no verdict, and the text says what is missing.
    let m = parse("Of the allocated memory 2.93 GiB is allocated by PyTorch, and 2.30 GiB is reserved by PyTorch but unallocated.").unwrap();
    assert!(m.missing.contains(&"Tried to allocate".to_string()));
    let ex = explain(&m);
    assert_eq!(ex.verdict, Likely::Unclear);
    assert!(ex.headline.contains("Tried to allocate"), "{}", ex.headline);
    // Request and capacity but the cache figures cut off: exhaustion cannot be claimed from
    // missing figures when live + request fit the GPU.
    let m = parse("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 23.65 GiB of which 4.00 GiB is free.").unwrap();
    assert!(m.missing.contains(&"allocated by PyTorch".to_string()));
    assert_eq!(explain(&m).verdict, Likely::Unclear, "free covers the request");
}

/// A real message whose figures exceed the device: 19.15 GiB reserved on an 8 GiB GPU
/// (Windows lends system RAM as "shared GPU memory"). The request alone exceeds the GPU, so
/// the verdict stays exhaustion; what must not happen is a figure read as if the device
/// were consistent: nothing is "outside the allocator" (8.00 − 0 − 19.15 is not 0 bytes),
/// and the explanation says the device was over-committed.
#[test]
fn reserved_over_capacity_is_named_not_clamped() {
    let m = parsed("legacy-reserved-over-capacity.txt");
    assert_eq!(m.total_capacity, Some(8 * GIB));
    assert_eq!(m.reserved_total, Some(20562155930)); // 19.15 GiB
    assert_eq!(m.outside_allocator(), None);
    assert_eq!(m.over_capacity(), Some(20562155930 - 8 * GIB));
    let e = explain(&m);
    assert_eq!(e.verdict, Likely::Exhaustion, "{e}");
    assert!(e.findings.iter().any(|f| f.contains("11.15 GiB more than it has") && f.contains("system RAM")), "{e}");
    assert!(!e.findings.iter().any(|f| f.contains("outside this allocator")), "{e}");
    // A consistent message (outside = 8.00 − 1.04 − 3.50 GiB, rounding allowed) keeps its figure.
    let ok = parsed("legacy-2.0.txt");
    assert!(ok.outside_allocator().is_some() && ok.over_capacity().is_none());
}

// ---------------------------------------------------------------------------------------------
// Issue 21: verdicts no stronger than the figures (items 6–10)
// ---------------------------------------------------------------------------------------------

/// Every finding and step of an explanation, as one text.
fn all_text(e: &fragscope_oomtext::OomExplanation) -> String {
    format!("{}\n{}\n{}", e.headline, e.findings.join("\n"), e.next_steps.join("\n"))
}

/// Item 6 (cobra#24): the request is 42 MiB more than CUDA had free while 910 MiB sat free in
/// the cache, a small share of the 23 GiB PyTorch held. Fragmentation and exhaustion both
/// read these figures; the text must say so, not "allocator settings will not make this fit".
#[test]
fn borderline_when_the_cache_holds_the_request_but_is_a_small_share() {
    let m = parsed("v2.2-borderline-cache-holds-request.txt");
    let e = explain(&m);
    assert_eq!(e.verdict, Likely::Borderline, "{e}");
    let t = all_text(&e);
    assert!(t.contains("Reading 1, fragmentation") && t.contains("Reading 2, exhaustion"), "{t}");
    assert!(t.contains("What decides: a snapshot"), "{t}");
    assert!(!t.contains("will not make this fit"), "{t}");
    assert!(!t.contains("the next allocation would fail anyway"), "{t}");
    // the setting is offered as a try, with the memory-reducing alternative
    assert!(t.contains("Worth a try, not a sure fix") && t.contains("use less memory"), "{t}");
}

/// Item 6 (pytorch#16417): 22 MiB asked, 11.06 MiB free, 194.87 MiB cached — the shortfall
/// (10.94 MiB) is under the 20 MiB large-segment granularity.
#[test]
fn borderline_when_the_shortfall_is_under_the_segment_granularity() {
    let m = parsed("v2.2-borderline-small-shortfall.txt");
    let e = explain(&m);
    assert_eq!(e.verdict, Likely::Borderline, "{e}");
    assert!(e.headline.contains("10.94 MiB more than the 11.06 MiB CUDA had free"), "{}", e.headline);
    assert!(!all_text(&e).contains("will not make this fit"), "{e}");
}

/// Item 6: a margin under the driver's granularity is never "it would fit" (ShannonAI#6:
/// 20 MiB asked, 1.25 GiB reserved − 1.24 GiB allocated, both printed to 0.01 GiB).
#[test]
fn no_caching_is_not_said_to_fit_or_fail_within_the_rounding() {
    let m = parsed("legacy-20mib-segment.txt");
    let a = fragscope_oomtext::message_advice(&m).unwrap();
    assert!(a.contains("Whether PYTORCH_NO_CUDA_MEMORY_CACHING=1 would have fit it cannot be told"), "{a}");
    assert!(!a.contains("would not help either") && !a.contains("it would fit this once"), "{a}");
}

/// Item 7 (ShannonAI#6): a 20.00 MiB segment is what a request of 1–10 MiB asks for, and
/// also one of 18–20 MiB (10 MiB and more is rounded up to 2 MiB).
#[test]
fn twenty_mib_segment_names_both_request_ranges() {
    let m = parsed("legacy-20mib-segment.txt");
    assert_eq!(m.tried_to_allocate, Some(20 * MIB));
    let f = explain(&m).findings.join("\n");
    assert!(!f.contains("between 1 and 10 MiB"), "{f}");
    assert!(
        f.contains(
            "20.00 MiB means a request of more than 1 MiB and less than 10 MiB, or more than 18 MiB and at most 20 MiB"
        ),
        "{f}"
    );
}

/// Item 7: the inverse of the segment rule, checked against the allocator's own
/// `allocation_size` for every rounded size (multiples of 512) up to 64 MiB.
#[test]
fn requests_for_segment_matches_the_allocators_rounding() {
    use fragscope_alloc::rounding::allocation_size;
    use fragscope_oomtext::requests_for_segment;
    let cfg = fragscope_alloc::AllocatorConfig::default();
    let mut r = 512u64;
    while r <= 64 * MIB {
        let seg = allocation_size(r, &cfg);
        let ranges = requests_for_segment(seg);
        assert!(ranges.iter().any(|&(lo, hi)| lo <= r && r <= hi), "{r} → {seg}: {ranges:?}");
        for s in [2 * MIB, 20 * MIB, 22 * MIB, 10 * MIB, 12 * MIB, 64 * MIB] {
            let inside = requests_for_segment(s).iter().any(|&(lo, hi)| lo <= r && r <= hi);
            assert_eq!(inside, seg == s, "rounded {r}: segment {seg}, ranges of {s}");
        }
        r += 512;
    }
}

/// Item 8: ROCm messages get ROCm's names (pytorch#138002: fragmentation;
/// amd-strix-halo-image-video-toolboxes#3: memory outside the allocator).
#[test]
fn hip_messages_name_rocm_variables_and_tools() {
    let frag = explain(&parsed("hip-fragmentation.txt"));
    assert_eq!(frag.verdict, Likely::Fragmentation, "{frag}");
    let t = all_text(&frag);
    assert!(t.contains("`PYTORCH_HIP_ALLOC_CONF=expandable_segments:True`"), "{t}");
    assert!(!t.contains("`PYTORCH_CUDA_ALLOC_CONF="), "{t}");
    assert!(!t.contains("to CUDA"), "{t}");
    let other = explain(&parsed("hip-memory-outside-allocator.txt"));
    assert_eq!(other.verdict, Likely::OtherProcesses, "{other}");
    let t = all_text(&other);
    assert!(t.contains("`rocm-smi`") && t.contains("HIP_VISIBLE_DEVICES"), "{t}");
    assert!(!t.contains("nvidia-smi") && !t.contains("CUDA_VISIBLE_DEVICES") && !t.contains("cuBLAS"), "{t}");
    let a = fragscope_oomtext::message_advice(&parsed("hip-fragmentation.txt")).unwrap();
    assert!(a.contains("hipMalloc") && a.contains("hipFree") && !a.contains("cudaMalloc"), "{a}");
}

/// Item 8: XPU messages (torch-xpu-ops#3011, 2.x layout; intel-extension-for-pytorch#629,
/// IPEX's legacy layout) are refused by name, not read as CUDA nor called "no message".
#[test]
fn xpu_messages_are_refused_as_unsupported() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/oom-other-backends");
    for name in ["xpu-2.x.txt", "xpu-ipex-legacy.txt"] {
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        let (first, body) = text.split_once('\n').unwrap();
        assert!(first.starts_with("# source: https://github.com/"), "{name}");
        assert!(parse_all(body).is_empty(), "{name}: read as a CUDA message");
        match parse(body) {
            Err(ParseError::Unsupported { backend, line }) => {
                assert_eq!(backend, "XPU");
                assert!(line.contains("XPU out of memory"), "{line}");
            }
            other => panic!("{name}: {other:?}"),
        }
        let msg = parse(body).unwrap_err().to_string();
        assert!(msg.starts_with("XPU messages are not supported"), "{msg}");
    }
}

/// Item 9: figures that cannot all be true are named and get no verdict. No real message
/// with these defects was found; each case is a real message (named) with one figure changed.
#[test]
fn impossible_figures_are_named_and_get_no_verdict() {
    // v2.2-exhaustion.txt (vllm#7721)'s layout on a 3.71 GiB GPU reporting 12 GiB free.
    let free_above_total = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 3.71 GiB of which 12.00 GiB is free. Of the allocated memory 3.43 GiB is allocated by PyTorch, and 75.44 MiB is reserved by PyTorch but unallocated.";
    // legacy-2.0.txt (Zero-DCE#52) with allocated above reserved in total.
    let allocated_above_reserved = "OutOfMemoryError: CUDA out of memory. Tried to allocate 1.71 GiB (GPU 0; 6.00 GiB total capacity; 4.49 GiB already allocated; 1.04 GiB free; 3.50 GiB reserved in total by PyTorch)";
    // legacy-2.0.txt with a minus sign typed before the request.
    let negative = "OutOfMemoryError: CUDA out of memory. Tried to allocate -1.71 GiB (GPU 0; 6.00 GiB total capacity; 3.49 GiB already allocated; 1.04 GiB free; 3.50 GiB reserved in total by PyTorch)";
    for (text, names) in [
        (free_above_total, &["free memory (12.00 GiB)", "total capacity (3.71 GiB)"][..]),
        (allocated_above_reserved, &["'already allocated' (4.49 GiB)", "(3.50 GiB)"][..]),
        (negative, &["'-1.71 GiB' is a negative size"][..]),
    ] {
        let m = parse(text).unwrap();
        assert_eq!(m.inconsistent.len(), 1, "{:?}", m.inconsistent);
        let e = explain(&m);
        assert_eq!(e.verdict, Likely::Unclear, "{e}");
        assert!(e.headline.starts_with("Unclear: the message is inconsistent"), "{}", e.headline);
        for n in names {
            assert!(e.headline.contains(n), "{n}: {}", e.headline);
        }
    }
    // and a consistent real message has none
    for name in ["legacy-2.0.txt", "v2.2-fragmentation.txt", "v2.5-hip-allowed-private-pools.txt"] {
        assert!(parsed(name).inconsistent.is_empty(), "{name}");
    }
}

/// Item 10 (centerX#51): 6.09 GiB reserved − 5.91 GiB allocated is 184.32 MiB ± 10.24 MiB;
/// the text shows the range, never the false "184.32 MiB". (This issue title also glues
/// "why" to "CUDA out of memory.", which used to hide the message.)
#[test]
fn legacy_difference_is_shown_with_its_uncertainty() {
    let m = parsed("legacy-difference-of-gib-figures.txt");
    assert_eq!(m.form, MessageForm::Legacy);
    assert_eq!(m.reserved_unallocated, Some(6539087708 - 6345814180));
    assert_eq!(m.reserved_unallocated_uncertainty, 2 * GIB.div_ceil(200));
    let e = explain(&m);
    let t = all_text(&e) + &fragscope_oomtext::message_advice(&m).unwrap();
    assert!(t.contains("174–195 MiB"), "{t}");
    assert!(!t.contains("184.32 MiB"), "{t}");
    // and outside the allocator (7.80 − 0.03 − 6.09 GiB) is a difference of rounded figures too
    assert!(!t.contains(&format_size(m.outside_allocator().unwrap())), "{t}");
}

#[test]
fn format_size_pm_shows_only_known_digits() {
    use fragscope_oomtext::format_size_pm;
    // a printed figure: as PyTorch prints it
    assert_eq!(format_size_pm(1342177280, printed_precision(1342177280)), "1.25 GiB");
    // 1.25 GiB − 1.24 GiB
    assert_eq!(format_size_pm(10737418, 2 * GIB.div_ceil(200)), "0–21 MiB");
    assert_eq!(format_size_pm(193273528, 2 * GIB.div_ceil(200)), "174–195 MiB");
}

// ---------------------------------------------------------------------------------------------
// Ascend NPU (torch_npu): CUDA's ≤ 2.0 layout with `NPU d` and a `current active` figure
// ---------------------------------------------------------------------------------------------

#[test]
fn npu_fragmentation_in_its_own_words() {
    let m = parsed("npu-fragmentation.txt");
    assert_eq!(m.accelerator, "NPU");
    assert!(m.is_npu() && !m.is_rocm());
    assert_eq!(m.form, MessageForm::Legacy);
    assert_eq!(m.device, Some(3));
    assert_eq!(m.exception.as_deref(), Some("RuntimeError"));
    assert_eq!(m.tried_to_allocate, Some(5400921375)); // 5.03 GiB
    assert_eq!(m.total_capacity, Some(65455301591)); // 60.96 GiB
    assert_eq!(m.allocated_by_pytorch, Some(53118008033)); // 49.47 GiB; "current active" is not it
    assert_eq!(m.free, Some(1417339208)); // 1.32 GiB
    assert_eq!(m.reserved_total, Some(61793841971)); // 57.55 GiB
    let e = explain(&m);
    assert_eq!(e.verdict, Likely::Fragmentation, "{e}");
    let text = e.to_string();
    assert!(text.contains("PYTORCH_NPU_ALLOC_CONF=expandable_segments:True"), "{text}");
    assert!(!text.contains("PYTORCH_CUDA_ALLOC_CONF") && !text.contains("nvidia-smi"), "{text}");
    assert!(!text.contains("older than 1.13"), "torch_npu prints this layout in every version: {text}");
    assert!(text.contains("torch_npu.npu.memory._record_memory_history"), "{text}");
    assert!(!text.contains("torch.cuda.") && !text.contains("PYTORCH_NO_CUDA"), "{text}");
    assert!(text.contains("torch.npu.empty_cache()"), "{text}");
    let advice = fragscope_oomtext::message_advice(&m).expect("figures present");
    assert!(advice.starts_with("torch.npu.empty_cache() would not have avoided"), "{advice}");
    assert!(advice.contains("PYTORCH_NO_NPU_MEMORY_CACHING=1") && advice.contains("an aclrtMalloc"), "{advice}");
}

/// torch_npu prints PyTorch 2.0's layout whatever its version: the label names torch_npu,
/// not "PyTorch 2.0 or older"; a CUDA message of that layout keeps its version reading.
#[test]
fn npu_messages_are_labelled_torch_npu_without_a_version() {
    for file in ["npu-fragmentation.txt", "npu-exhaustion.txt"] {
        let m = parsed(file);
        assert_eq!(m.versions(), "torch_npu, whose version the message does not tell", "{file}");
        let text = m.form_text();
        assert!(text.starts_with("torch_npu's message") && !text.contains("2.0 or older"), "{file}: {text}");
    }
    let cuda = parse(
        "RuntimeError: CUDA out of memory. Tried to allocate 236.00 MiB (GPU 0; 15.78 GiB total capacity; \
         14.25 GiB already allocated; 183.50 MiB free; 14.34 GiB reserved in total by PyTorch)",
    )
    .unwrap();
    assert_eq!(cuda.form_text(), "legacy (≤ 2.0) message form: PyTorch 2.0 or older");
}

#[test]
fn npu_exhaustion_and_other_processes_words() {
    let m = parsed("npu-exhaustion.txt");
    assert_eq!((m.accelerator.as_str(), m.device), ("NPU", Some(0)));
    assert_eq!(m.tried_to_allocate, Some(37913823805)); // 35.31 GiB
    assert_eq!(m.free, Some(36303211069)); // 33.81 GiB
    let e = explain(&m);
    assert_eq!(e.verdict, Likely::Exhaustion, "{e}");
    let text = e.to_string();
    assert!(!text.contains("CUDA_VISIBLE_DEVICES") && !text.contains("cudaMalloc"), "{text}");
    assert!(!text.contains("torch.cuda.") && !text.contains("PYTORCH_NO_CUDA"), "{text}");
    assert!(e.findings.iter().any(|f| f.starts_with("torch_npu prints PyTorch 2.0's message layout")));
}
