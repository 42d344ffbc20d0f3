//! Arbitrary bytes as an inference request through the server's decode path: an optional
//! `Inference-Header-Content-Length` value (the bytes before the first newline; none when
//! that line is empty) and the body after it. A request decodes into tensors of exactly the
//! bytes their shapes say, or is refused with a 400 — never a panic, an abort or an
//! allocation the body does not justify.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    aim::serve::protocol::decode_check(data);
});
