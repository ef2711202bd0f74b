//! Bundles the page's script: the modules of `assets/js/` concatenated, in the fixed order
//! of [`MODULES`], inside one function (`(function () { ... })();`), into
//! `$OUT_DIR/report.js`, which `src/lib.rs` inlines into every page with `include_str!`.
//!
//! Plain concatenation is the whole bundler: the modules are parts of one script that
//! share its scope (a function declared in one is called from another), so no `import`
//! or `export` is needed and no npm tool runs at build time. A module's top-level code
//! runs in this order; what one module reads at load time must come from an earlier one
//! (everything else runs from `main.js`, last, once all are loaded).
//!
//! Before the modules comes `const LAYOUT`: the field names of every record the page gets
//! as flat arrays, from `src/layout.rs` (compiled here too), so that the script reads each
//! field's index from the same list the Rust that writes the records is made from.

use std::fmt::Write as _;
use std::path::Path;

// The records' layouts; the build script uses their names only.
#[allow(dead_code)]
#[path = "src/layout.rs"]
mod layout;

/// The modules, in the order they are concatenated (see the module doc).
const MODULES: &[&str] = &[
    "data",
    "util",
    "page",
    "predict",
    "pools",
    "timeline",
    "roles",
    "state",
    "fragmentation",
    "whatif",
    "fit",
    "findings",
    "ranks",
    "search",
    "main",
];

fn main() {
    let dir = Path::new("assets/js");
    println!("cargo:rerun-if-changed={}", dir.display());
    println!("cargo:rerun-if-changed=src/layout.rs");
    // A module on disk but not in the list would silently be left out of the page.
    let mut on_disk: Vec<String> = std::fs::read_dir(dir)
        .expect("assets/js")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".js").map(str::to_string))
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = MODULES.iter().map(|m| m.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed, "assets/js/*.js and build.rs's MODULES must name the same modules");

    let mut out = String::from(
        "// fragscope report: owned script, inlined by crates/report. No external resource, no\n\
         // network request: everything it draws comes from the JSON in #fragscope-data, which\n\
         // crates/report computed (curves per bucket, allocator states at chosen moments).\n\
         // Bundled by crates/report/build.rs from crates/report/assets/js/*.js.\n\
         'use strict';\n\
         (function () {\n",
    );
    let _ = writeln!(out, "// The fields of each record kind, in order (crates/report/src/layout.rs).");
    let _ = writeln!(out, "const LAYOUT = {};", layout::json());
    for m in MODULES {
        let path = dir.join(format!("{m}.js"));
        println!("cargo:rerun-if-changed={}", path.display());
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let _ = writeln!(out, "\n// ==================== {m}.js ====================");
        out.push_str(&text);
        if !text.ends_with('\n') {
            out.push('\n');
        }
    }
    out.push_str("})();\n");
    let dest = Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("report.js");
    std::fs::write(&dest, out).unwrap_or_else(|e| panic!("{}: {e}", dest.display()));
}
