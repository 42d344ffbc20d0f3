//! Arbitrary bytes as an `.npz` archive: arrays or a clean error, never a panic, an abort
//! or an allocation the archive's size does not justify.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = aim::npz::read_npz_bytes(data, "fuzz.npz");
    let _ = aim::npz::parse_npy(data);
});
