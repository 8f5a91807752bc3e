#!/usr/bin/env bash
# Build statically linked release binaries of rebootd and rebootctl, copy them to $DIST as
# rebootd-x86_64-linux / rebootctl-x86_64-linux (the names the Ignition config downloads) and
# write $DIST/SHA512SUMS (the values for the Ignition config's verification.hash).
#
# Default target x86_64-unknown-linux-musl: a self-contained binary that runs on any x86-64 Linux
# (Flatcar, Fedora CoreOS, Debian, RHEL), with musl's resolver (/etc/hosts and /etc/resolv.conf,
# no NSS modules). REBOOTD_STATIC_TARGET=x86_64-unknown-linux-gnu builds a static glibc binary
# instead (+crt-static), for hosts without the musl target; glibc then warns that NSS modules
# cannot be loaded, and name lookups also skip them.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "$0")/lib.sh"

if ! rustup target list --installed | grep -qx "$STATIC_TARGET"; then
    rustup target add "$STATIC_TARGET"
fi
case "$STATIC_TARGET" in
*-musl)
    # Crates with C parts (ring) need a C compiler for musl: Debian's musl-tools gives musl-gcc.
    if command -v musl-gcc >/dev/null; then
        cc_var=CC_${STATIC_TARGET//-/_}
        export "$cc_var=${!cc_var:-musl-gcc}"
    fi
    ;;
*-gnu)
    export RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static"
    ;;
esac

cargo build --release --locked --manifest-path "$REPO/Cargo.toml" -p rebootd --bins --target "$STATIC_TARGET"

for b in "${BINARIES[@]}"; do
    assert_static "$STATIC_DIR/$b"
    install -m 0755 "$STATIC_DIR/$b" "$DIST/$b-x86_64-linux"
    file "$STATIC_DIR/$b"
done
(cd "$DIST" && sha512sum rebootd-x86_64-linux rebootctl-x86_64-linux >SHA512SUMS)
echo "static binaries in $DIST (sha512 in $DIST/SHA512SUMS)"
