use std::time::Instant;
use fragscope_analysis::*;
fn main() {
    let p = std::env::args().nth(1).unwrap();
    let t = Instant::now();
    let snap = fragscope_snapshot::read_path(p.as_ref()).unwrap();
    eprintln!("load {:?}", t.elapsed());
    let d = 0;
    let t = Instant::now();
    let tl = timeline::timeline(&snap, d, &Default::default());
    eprintln!("timeline {:?} peaks alloc {:?} res {:?}", t.elapsed(), tl.peak_allocated.event_index, tl.peak_reserved.event_index);
    let t = Instant::now();
    let _a = attribution::attribute(&snap, &tl, &Default::default());
    eprintln!("attribution {:?}", t.elapsed());
    let t = Instant::now();
    let _s = oom::allocator_state_at(&snap, d, tl.peak_reserved.event_index);
    eprintln!("state at res peak {:?}", t.elapsed());
    let t = Instant::now();
    let _l = leaks::leaks_device(&snap, d, tl.peak_allocated.bytes);
    eprintln!("leaks {:?}", t.elapsed());
    let t = Instant::now();
    let _x = analyze::analyze(&snap, &Default::default());
    eprintln!("analyze all {:?}", t.elapsed());
}
