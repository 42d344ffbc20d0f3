//! Nothing to use: this crate exists for its `Cargo.toml`, which enables, on dependencies
//! several workspace members share, the union of the features any of them needs. Cargo
//! picks a dependency's features from the packages one command builds, so without it
//! `cargo build -p aim-capi`, `pip install ./python` and `cargo test --workspace` each
//! compiled Cranelift and everything above it again, with another feature set. Every
//! member depends on `aim-ir`, which depends on this. `tests/feature_sets.py` checks that
//! no shared dependency's features still differ between those builds.
