"""Checks that the builds tests/run.sh makes agree on the features of every dependency they
share, and of the workspace's own crates, so that each reuses what the one before compiled.

    python3 tests/feature_sets.py

Cargo picks a dependency's features from the packages one command builds: `cargo build -p
aim-capi` (the C API, without `aim serve`), `pip install ./python` (maturin builds the
Python package alone) and `cargo test --workspace` (with the dev-dependencies) would each
compile Cranelift and everything above it again if one crate below had other features in
them. `tools/workspace-hack` enables the union; this script lists, from `cargo tree`, every
crate whose features still differ between those builds, and fails if there is one (add the
features it prints to tools/workspace-hack/Cargo.toml).
"""
import re
import subprocess
import sys

# The package selections tests/run.sh and tests/cross_aarch64.sh build, whether the build
# includes dev-dependencies (test targets), and the architecture it compiles for.
BUILDS = {
    "aim and its command line (cargo build --release)": (["-p", "aim", "-p", "aim-cli"], False, "x86_64"),
    "the workspace's tests (cargo test --workspace)": (["--workspace"], True, "x86_64"),
    "the C API (cargo build -p aim-capi -p aim-runtime-capi)": (["-p", "aim-capi", "-p", "aim-runtime-capi"], False,
                                                                "x86_64"),
    "the Python package (pip install ./python)": (["-p", "aim-python"], False, "x86_64"),
    "the AArch64 tests (cross_aarch64.sh)": (
        ["-p", "aim-kernels", "-p", "aim-runtime", "-p", "aim-onnx", "-p", "aim-compiler", "-p", "aim",
         "--no-default-features"], True, "aarch64"),
    "libaim_runtime (cross_aarch64.sh)": (["-p", "aim-runtime-capi"], False, "aarch64"),
}
# Crates only ever compiled for the target, never for the host (as a build script's or a
# proc-macro's dependency): builds for two architectures share no artifact of them, so their
# features need to agree only between builds for the same one. Cranelift's code generator
# is built for AArch64 without the x86-64 backend (aim-compiler's `cross` off there).
TARGET_ONLY = {"cranelift-codegen"}
# The workspace's own crates, also compiled only for the target: a member with other
# features in one build (a `default` feature that a workspace-wide build turns on and a
# dependent does not, say) is compiled again there, with every member above it.
MEMBERS = set()
# Differences that are chosen, and what they cost: the C API and the Python package build
# aim without `aim serve` (no tokio, axum or tonic in libaim.so or the wheel), so aim's own
# library is compiled once more for them (they share that build with each other).
CHOSEN = {("aim", frozenset({"the C API (cargo build -p aim-capi -p aim-runtime-capi)",
                             "the Python package (pip install ./python)"}))}
LINE = re.compile(r"^(\S+) (v\S+)(?: \([^)]*\))*(?: \[([^\]]*)\])?")


def features(selection, dev):
    """{(crate, version): set of feature sets} for one build."""
    edges = "normal,build,dev" if dev else "normal,build"
    out = subprocess.run(["cargo", "tree", "-q", "--locked", *selection, "-e", edges, "--prefix", "none",
                          "-f", "{p} [{f}]"], check=True, capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        m = LINE.match(line.replace(" (*)", "").replace(" (proc-macro)", ""))
        if m:
            found.setdefault((m.group(1), m.group(2)), set()).add(frozenset(filter(None, (m.group(3) or "").split(","))))
            if "(/" in line:  # a workspace member (a local path)
                MEMBERS.add(m.group(1))
    return found


def check(crate, seen):
    """1 (and the feature sets printed) when the builds in `seen` disagree on `crate`, else 0."""
    # A crate built for the host (under a proc-macro) and for the target can have two
    # feature sets in one build; what must agree is the union, which the hack enables.
    if len({frozenset().union(*v) for v in seen.values()}) <= 1:
        return 0
    for name, builds in CHOSEN:
        # Chosen: the other builds agree among themselves, and so do the chosen ones.
        rest = {b: v for b, v in seen.items() if b not in builds}
        chosen = {b: v for b, v in seen.items() if b in builds}
        if name == crate[0] and rest and chosen and all(
                len({frozenset().union(*v) for v in part.values()}) <= 1 for part in (rest, chosen)):
            return 0
    print(f"{crate[0]} {crate[1]} has other features in other builds:")
    for name, sets in seen.items():
        print(f"  {name}: " + " | ".join(",".join(sorted(s)) or "(none)" for s in sorted(sets, key=sorted)))
    print()
    return 1


def main():
    builds = {name: features(selection, dev) for name, (selection, dev, _) in BUILDS.items()}
    crates = sorted(set().union(*builds.values()))
    every = set(BUILDS)
    by_arch = [{n for n, b in BUILDS.items() if b[2] == arch} for arch in sorted({b[2] for b in BUILDS.values()})]
    bad = 0
    for crate in crates:
        for group in by_arch if crate[0] in TARGET_ONLY | MEMBERS else [every]:
            bad += check(crate, {name: b[crate] for name, b in builds.items() if crate in b and name in group})
    if bad:
        print(f"{bad} shared crates are built with other features by other builds: add the union to "
              "tools/workspace-hack/Cargo.toml (a dependency), or make the builds agree (a workspace member)",
              file=sys.stderr)
        sys.exit(1)
    print(f"feature sets: the {len(BUILDS)} builds agree on all {len(crates)} shared crates")


if __name__ == "__main__":
    main()
