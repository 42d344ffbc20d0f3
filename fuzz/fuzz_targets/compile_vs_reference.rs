//! Random small well-typed graphs (`fuzz/graphgen.rs`) on the cpu backend against the
//! reference backend: the same outputs within the per-op tolerance, or an error from both —
//! never a panic, a difference, or only one of them failing.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../graphgen.rs"]
mod graphgen;

fuzz_target!(|data: &[u8]| {
    let case = graphgen::generate(data);
    if let Err(e) = graphgen::compare(&case, 2) {
        panic!("{e}");
    }
});
