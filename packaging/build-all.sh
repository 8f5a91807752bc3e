#!/usr/bin/env bash
# Build and check every shipping artifact: static binaries, .deb, .rpm, sysext image; then
# packaging/check-artifacts.sh. One release build (build-static.sh); the packagers reuse it.
#   CARGO_TARGET_DIR  cargo's target directory (default: the repository's target/)
#   REBOOTD_DIST      where the artifacts go (default: $CARGO_TARGET_DIR/dist)
#   SKIP_DEPS=1       do not run install-build-deps.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

step() {
    local name=$1 start=$SECONDS
    shift
    echo "=== $name"
    "$@"
    echo "=== $name: $((SECONDS - start)) s"
}
total=$SECONDS
[ "${SKIP_DEPS:-0}" = 1 ] || step "build dependencies" "$here/install-build-deps.sh"
step "static binaries" "$here/build-static.sh"
step ".deb" "$here/build-deb.sh"
step ".rpm" "$here/build-rpm.sh"
step "sysext" "$here/build-sysext.sh"
step "check" "$here/check-artifacts.sh"
echo "=== all artifacts built and checked in $((SECONDS - total)) s"
