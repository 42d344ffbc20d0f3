//! Generates the C API's header from capi/src (and the custom-op ABI's types, which live in
//! runtime/src/custom_library.rs) into OUT_DIR/aim.h, with capi/cbindgen.toml.

use std::path::Path;

fn main() {
    let capi = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../capi");
    println!("cargo:rerun-if-changed={}", capi.join("src").display());
    println!("cargo:rerun-if-changed={}", capi.join("cbindgen.toml").display());
    let custom = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../runtime/src/custom_library.rs");
    println!("cargo:rerun-if-changed={}", custom.display());
    let config = cbindgen::Config::from_file(capi.join("cbindgen.toml")).expect("capi/cbindgen.toml");
    let out = Path::new(&std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("aim.h");
    let mut made = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(capi.join("src/lib.rs"))
        .with_src(&custom)
        .generate()
        .expect("cbindgen reads the C API (capi/src)")
        .write(&mut made);
    std::fs::write(&out, made).expect("writes OUT_DIR/aim.h");
}
