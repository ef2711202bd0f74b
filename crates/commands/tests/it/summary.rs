//! `summary`'s OOM lead: [`FileSummary::of`] asks for it only where the summary's counts of
//! the trace entries by action show an `oom` entry, so it must be the lead
//! [`OomLead::of_file`] finds by its own scan, on files with an OOM and without.

use fragscope_commands::summary::FileSummary;
use fragscope_diagnose::OomLead;

#[test]
fn the_oom_lead_is_the_one_a_scan_finds_on_files_with_and_without_an_oom() {
    let dir = fragscope_testdata::h200_dir();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".pickle.gz"))
        .collect();
    files.sort();
    let (mut with, mut without) = (0, 0);
    for f in &files {
        let snap = fragscope_commands::input::load(f, true).unwrap();
        let lead = |l: &OomLead| (l.device, l.event_index, l.time_us, l.headline.clone());
        let got = FileSummary::of(&snap).oom;
        let want = OomLead::of_file(&snap);
        assert_eq!(got.as_ref().map(lead), want.as_ref().map(lead), "{}", f.display());
        if want.is_some() {
            with += 1;
        } else {
            without += 1;
        }
    }
    // The in-repository recordings: four OOMs (exhaustion, fragmentation, and each under a
    // memory fraction) and the training runs without one.
    assert!(with >= 4 && without >= 10, "{with} files with an OOM, {without} without, in {}", dir.display());
}
