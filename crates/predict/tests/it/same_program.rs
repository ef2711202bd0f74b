//! The same-program check (issue 37 item 6): pairs of real recordings of different
//! programs (../shared/traces/grids/GRIDS.md, crates/testdata/h200) are refused with the
//! difference named and its evidence; degenerate inputs (one recording under two sizes,
//! sizes given in the wrong order) are refused; recordings of one program still fit.

use fragscope_predict::behaviour::{differences, Behaviour};
use fragscope_predict::{PredictError, Program, Recording};
use fragscope_snapshot::Snapshot;

fn grid(name: &str) -> Option<Snapshot> {
    let Some(p) = fragscope_testdata::grid_file(name) else {
        fragscope_testdata::skip(&format!("grid file {name} (needs the corpus)"));
        return None;
    };
    Some(fragscope_snapshot::read_path(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
}

fn h200(name: &str) -> Snapshot {
    let p = fragscope_testdata::h200_dir().join(name);
    fragscope_snapshot::read_path(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The refusal of `a` at size `sa` and `b` at `sb` (panics when they fit), its message and
/// the differences it names.
fn refusal(a: &Snapshot, sa: u64, b: &Snapshot, sb: u64) -> (PredictError, String) {
    let recs = [Recording { snap: a, size: sa }, Recording { snap: b, size: sb }];
    match Program::fit(&recs, Some(0)) {
        Ok(_) => panic!("sizes {sa} and {sb}: fitted as one program"),
        Err(e) => {
            let m = e.to_string();
            eprintln!("REFUSED {sa} {sb}: {m}");
            (e, m)
        }
    }
}

fn named(e: &PredictError) -> Vec<String> {
    match e {
        PredictError::NotSameProgram { differences, .. } => differences.clone(),
        other => panic!("not a NotSameProgram refusal: {other}"),
    }
}

#[test]
fn train_vs_forward_names_backward_and_optimizer() {
    // niu: three no_grad forward passes against three training steps of the same model.
    let (Some(fwd), Some(train)) = (grid("niu-fwd-ctx100-fp32.pickle"), grid("niu-train3-ctx200-fp32.pickle")) else {
        return;
    };
    let (e, m) = refusal(&fwd, 100, &train, 200);
    let d = named(&e);
    assert!(d[0].contains("size 200 has a backward pass and an optimizer step"), "{m}");
    assert!(d[0].contains("the one at size 100 has no backward pass and no optimizer step"), "{m}");
    // Its forward keeps autograd's saved tensors, the no_grad one frees them: said too.
    assert!(d.iter().any(|x| x.contains("grad enabled") && x.contains("torch.no_grad()")), "{m}");
    assert!(!m.contains("autocast"), "no autocast in either: {m}");
    // kk: one forward against one training step, the 2.7B model in both.
    let (Some(f), Some(s)) = (grid("kk-2.7b-fwd-ctx128-fp32.pickle"), grid("kk-2.7b-step-ctx256-fp32.pickle")) else {
        return;
    };
    let (e, m) = refusal(&f, 128, &s, 256);
    let d = named(&e);
    assert!(d[0].contains("a training step and an inference run are different programs"), "{m}");
    assert!(!m.contains("autocast") && !m.contains("different models"), "{m}");
}

#[test]
fn autocast_vs_fp32_names_precision() {
    let (Some(fp32), Some(mixed)) = (grid("kk-2.7b-fwd-ctx128-fp32.pickle"), grid("kk-2.7b-fwd-ctx256-mixed.pickle"))
    else {
        return;
    };
    let (e, m) = refusal(&fp32, 128, &mixed, 256);
    let d = named(&e);
    assert_eq!(d.len(), 1, "{m}");
    assert!(d[0].contains("the recording at size 256 runs under torch.autocast"), "{m}");
    // The niu pair, and the H200 GPT step (Python stacks only: `autocast_mode.py`).
    if let (Some(a), Some(b)) = (grid("niu-fwd-ctx100-fp32.pickle"), grid("niu-fwd-ctx200-mixed.pickle")) {
        let (e, m) = refusal(&a, 100, &b, 200);
        assert!(named(&e)[0].contains("size 200 runs under torch.autocast"), "{m}");
    }
    let (e, m) = refusal(&h200("gpt-s512-b8.pickle.gz"), 8, &h200("gpt-s512-b16-amp.pickle.gz"), 16);
    let d = named(&e);
    assert_eq!(d.len(), 1, "{m}");
    assert!(d[0].contains("size 16 runs under torch.autocast"), "{m}");
}

#[test]
fn autocast_without_its_frames_seen_in_the_casts() {
    // A recording whose stacks do not show autocast (frames cut, another build): the
    // casts themselves, forward requests of half a parameter's bytes, tell it.
    let (mut fp32, mut amp) =
        (Behaviour::of(&h200("gpt-s512-b8.pickle.gz"), 0), Behaviour::of(&h200("gpt-s512-b16-amp.pickle.gz"), 0));
    let (hf, ha) = (fp32.half_cast_share.unwrap(), amp.half_cast_share.unwrap());
    assert!(ha >= 0.8 && hf <= 0.5, "half casts: fp32 {hf}, amp {ha}");
    fp32.autocast_entries = 0;
    amp.autocast_entries = 0;
    let d = differences(&fp32, 8, &amp, 16);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].what, "precision");
    assert!(d[0].text.contains("those at size 8"), "{}", d[0].text);
}

#[test]
fn different_models_named() {
    let (Some(niu), Some(kk)) = (grid("niu-fwd-ctx100-fp32.pickle"), grid("kk-2.7b-fwd-ctx256-fp32.pickle")) else {
        return;
    };
    let (e, m) = refusal(&niu, 100, &kk, 256);
    let d = named(&e);
    assert_eq!(d.len(), 1, "{m}");
    assert!(d[0].contains("two different models"), "{m}");
    // The parameters' bytes are in the evidence: 86.6 MiB (niu) and about 13 GB (kk).
    assert!(d[0].contains("86.6 MiB at size 100"), "{m}");
}

#[test]
fn grad_mode_compared_on_aligned_forwards() {
    // A no_grad forward (niu fwd frees its activations as it goes) and a grad-enabled
    // one (kk fwd keeps autograd's saved tensors): the behaviour says which is which,
    // from the lifetimes of the forward's allocations.
    let (Some(niu), Some(kk)) = (grid("niu-fwd-ctx100-fp32.pickle"), grid("kk-2.7b-fwd-ctx128-fp32.pickle")) else {
        return;
    };
    let (n, k) = (Behaviour::of(&niu, 0), Behaviour::of(&kk, 0));
    let (kn, kk_) = (n.forward_kept.unwrap(), k.forward_kept.unwrap());
    assert!(kn < 0.05 && kk_ > 0.3, "kept: niu {kn}, kk {kk_}");
    // Compared as one model (the model check aside), grad mode is the difference named.
    let mut same_model = n.clone();
    same_model.persistent = k.persistent.clone();
    let d = differences(&same_model, 100, &k, 128);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].what, "grad_mode");
    assert!(d[0].text.contains("those at size 100"), "{}", d[0].text);
}

#[test]
fn same_program_pairs_show_no_difference() {
    // Every pair of one family: what the program does is the same at every size, from
    // cold and warm-cut recordings alike (the frozen evaluation fits them all).
    let pairs: &[(&str, &str)] = &[
        ("niu-fwd-ctx100-fp32.pickle", "niu-fwd-ctx200-fp32.pickle"),
        ("niu-train3-ctx100-fp32.pickle", "niu-train3-ctx200-fp32.pickle"),
        ("kk-2.7b-fwd-ctx128-fp32.pickle", "kk-2.7b-fwd-ctx512-fp32.pickle"),
        ("kk-2.7b-fwd-ctx128-mixed.pickle", "kk-2.7b-fwd-ctx256-mixed.pickle"),
        ("kk-2.7b-step-ctx128-fp32.pickle", "kk-2.7b-step-ctx256-fp32.pickle"),
    ];
    for (a, b) in pairs {
        let (Some(x), Some(y)) = (grid(a), grid(b)) else { continue };
        let d = differences(&Behaviour::of(&x, 0), 1, &Behaviour::of(&y, 0), 2);
        assert!(d.is_empty(), "{a} / {b}: {d:?}");
    }
    for (a, b) in [
        ("gpt-s512-b4.pickle.gz", "gpt-s512-b32.pickle.gz"),
        ("gpt-s256-b8.pickle.gz", "gpt-s1024-b8.pickle.gz"),
        ("gpt-s512-b4-amp.pickle.gz", "gpt-s512-b16-amp.pickle.gz"),
        ("gpt-s512-b8.pickle.gz", "gpt-s512-b16-expandable.pickle.gz"),
    ] {
        let d = differences(&Behaviour::of(&h200(a), 0), 1, &Behaviour::of(&h200(b), 0), 2);
        assert!(d.is_empty(), "{a} / {b}: {d:?}");
    }
}

#[test]
fn same_file_under_two_sizes_refused() {
    let s = h200("gpt-s512-b8.pickle.gz");
    let again = h200("gpt-s512-b8.pickle.gz");
    let (e, m) = refusal(&s, 8, &again, 16);
    assert_eq!(e, PredictError::SameRecording { a: 8, b: 16 }, "{m}");
    assert!(m.contains("the same file given twice"), "{m}");
    // The same snapshot object twice, and among three recordings.
    let other = h200("gpt-s512-b4.pickle.gz");
    let recs = [Recording { snap: &other, size: 4 }, Recording { snap: &s, size: 8 }, Recording { snap: &s, size: 16 }];
    assert_eq!(Program::fit(&recs, Some(0)).err(), Some(PredictError::SameRecording { a: 8, b: 16 }));
}

#[test]
fn sizes_in_the_wrong_order_refused() {
    let (b8, b16) = (h200("gpt-s512-b8.pickle.gz"), h200("gpt-s512-b16.pickle.gz"));
    // `--sizes 16,8` for files recorded at batch 8 and 16.
    let (e, m) = refusal(&b8, 16, &b16, 8);
    let PredictError::SizesShrink { shrinking, varying, ref sizes } = e else { panic!("{m}") };
    assert_eq!(shrinking, varying, "every varying request shrinks: {m}");
    assert!(varying > 100, "{m}");
    assert_eq!(sizes, &vec![16, 8]);
    assert!(m.contains("wrong order"), "{m}");
    // The right order fits, and says nothing about shrinking.
    let recs = [Recording { snap: &b8, size: 8 }, Recording { snap: &b16, size: 16 }];
    let p = Program::fit(&recs, Some(0)).expect("one program");
    assert!(p.notes.iter().all(|n| !n.contains("smaller as the size grows")), "{:?}", p.notes);
}
