# shellcheck shell=bash disable=SC2034
# Shared by the packaging scripts (sourced, not run): where things are and what version this is.
#   REPO        the repository root
#   TARGET_DIR  cargo's target directory ($CARGO_TARGET_DIR, default REPO/target)
#   DIST        where artifacts go ($REBOOTD_DIST, default TARGET_DIR/dist)
#   VERSION     the rebootd package version from Cargo.toml
#   STATIC_TARGET  the Rust target of the static binaries ($REBOOTD_STATIC_TARGET, default musl)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
DIST=${REBOOTD_DIST:-$TARGET_DIR/dist}
STATIC_TARGET=${REBOOTD_STATIC_TARGET:-x86_64-unknown-linux-musl}
STATIC_DIR=$TARGET_DIR/$STATIC_TARGET/release
VERSION=$(cargo metadata --no-deps --format-version 1 --manifest-path "$REPO/Cargo.toml" |
    python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "rebootd"))')
BINARIES=(rebootd rebootctl)
mkdir -p "$DIST"

# The static binaries must exist (build-static.sh makes them): every packager uses them.
require_static_binaries() {
    local b
    for b in "${BINARIES[@]}"; do
        if [ ! -x "$STATIC_DIR/$b" ]; then
            echo "missing $STATIC_DIR/$b: run packaging/build-static.sh first" >&2
            exit 1
        fi
    done
}

# Fails unless the ELF file has no dynamic section entries for shared libraries and no interpreter.
assert_static() {
    local f=$1
    if readelf -d "$f" 2>/dev/null | grep -q '(NEEDED)' || readelf -l "$f" | grep -q 'INTERP'; then
        echo "$f is dynamically linked:" >&2
        file "$f" >&2
        exit 1
    fi
}
