//! Arbitrary text into the IR parser: a model or a clean error. A model that parses prints
//! back to text that parses to the same model, and the verifier and type inference take
//! it without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(m) = aim_ir::text::parse_model(text) else { return };
    let printed = aim_ir::text::print_model(&m, aim_ir::text::TensorDetail::Full);
    let again =
        aim_ir::text::parse_model(&printed).unwrap_or_else(|e| panic!("printed text does not parse: {e}\n{printed}"));
    let reprinted = aim_ir::text::print_model(&again, aim_ir::text::TensorDetail::Full);
    assert_eq!(printed, reprinted, "the text does not round-trip");
    let mut g = m.graph;
    if aim_ir::verify(&g).is_ok() {
        let _ = aim_ir::infer::infer_types(&mut g);
    }
});
