#!/usr/bin/env bash
# Build $DIST/rebootd_<version>-1_amd64.deb with cargo-deb from the static binaries
# (packaging/build-static.sh), so the package runs on any Debian or Ubuntu release.
# Contents and maintainer scripts: [package.metadata.deb] in Cargo.toml, packaging/debian/README.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "$0")/lib.sh"

require_static_binaries
if ! cargo deb --version >/dev/null 2>&1; then
    echo "cargo-deb is missing: cargo install cargo-deb (or packaging/install-build-deps.sh)" >&2
    exit 1
fi
rm -f "$DIST"/rebootd_*.deb
# --no-build: package what build-static.sh built (target/<triple>/release); it is already stripped.
cargo deb --manifest-path "$REPO/Cargo.toml" -p rebootd --no-build --no-strip \
    --target "$STATIC_TARGET" --output "$DIST/"
ls "$DIST"/rebootd_*.deb
