//! Arbitrary bytes into the ONNX importer, verifier, type inference and op check: each
//! must give Ok or an error, never a panic, an abort or a hang.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    aim::check_model_bytes(data);
});
