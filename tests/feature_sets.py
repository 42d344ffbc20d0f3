"""Checks that the builds tests/run.sh makes agree on the features of every dependency they
share, so that each reuses what the one before compiled.

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

# The package selections tests/run.sh and tests/cross_aarch64.sh build, and whether the
# build includes dev-dependencies (test targets).
BUILDS = {
    "aim (cargo build --release)": (["-p", "aim"], False),
    "the workspace's tests (cargo test --workspace)": (["--workspace"], True),
    "the C API (cargo build -p aim-capi -p aim-runtime-capi)": (["-p", "aim-capi", "-p", "aim-runtime-capi"], False),
    "the Python package (pip install ./python)": (["-p", "aim-python"], False),
    "the AArch64 tests (cross_aarch64.sh)": (
        ["-p", "aim-ir", "-p", "aim-kernels", "-p", "aim-runtime", "-p", "aim-compiler", "-p", "aim",
         "--no-default-features"], True),
    "libaim_runtime (cross_aarch64.sh)": (["-p", "aim-runtime-capi"], False),
}
LINE = re.compile(r"^(\S+) (v\S+)(?: \([^)]*\))*(?: \[([^\]]*)\])?")


def features(selection, dev):
    """{(crate, version): set of feature sets} for one build."""
    edges = "normal,build,dev" if dev else "normal,build"
    out = subprocess.run(["cargo", "tree", "-q", "--locked", *selection, "-e", edges, "--prefix", "none",
                          "-f", "{p} [{f}]"], check=True, capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        m = LINE.match(line.replace(" (*)", "").replace(" (proc-macro)", ""))
        if m and "(/" not in line:  # workspace members (local paths) are not shared dependencies
            found.setdefault((m.group(1), m.group(2)), set()).add(frozenset(filter(None, (m.group(3) or "").split(","))))
    return found


def main():
    builds = {name: features(*how) for name, how in BUILDS.items()}
    crates = sorted(set().union(*builds.values()))
    bad = 0
    for crate in crates:
        seen = {name: b[crate] for name, b in builds.items() if crate in b}
        # A crate built for the host (under a proc-macro) and for the target can have two
        # feature sets in one build; what must agree is the union, which the hack enables.
        if len({frozenset().union(*v) for v in seen.values()}) > 1:
            bad += 1
            print(f"{crate[0]} {crate[1]} has other features in other builds:")
            for name, sets in seen.items():
                print(f"  {name}: " + " | ".join(",".join(sorted(s)) or "(none)" for s in sorted(sets, key=sorted)))
    if bad:
        print(f"{bad} shared dependencies are built with other features by other builds: "
              "add the union to tools/workspace-hack/Cargo.toml", file=sys.stderr)
        sys.exit(1)
    print(f"feature sets: the {len(BUILDS)} builds agree on all {len(crates)} shared dependencies")


if __name__ == "__main__":
    main()
