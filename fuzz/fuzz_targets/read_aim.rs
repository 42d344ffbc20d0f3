//! Arbitrary bytes as a `.aim` file: a program or a clean error, never a panic, an abort or
//! an allocation the file's size does not justify; verification of whatever parses.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = aim_ir::aim_file::parse_bytes(data) {
        let _ = f.verify();
    }
});
