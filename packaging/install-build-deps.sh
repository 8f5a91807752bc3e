#!/usr/bin/env bash
# Install what the packaging scripts need, skipping what is already there (Debian/Ubuntu, root):
#   squashfs-tools (mksquashfs, unsquashfs), musl-tools (musl-gcc, for ring's C code), rpm
#   (rpmbuild, rpm2cpio), cpio, ignition (ignition-validate), shellcheck, file, binutils (readelf);
#   the Rust target x86_64-unknown-linux-musl; cargo-deb (pinned; built from crates.io, ~4 min).
set -euo pipefail

CARGO_DEB_VERSION=3.8.0
packages=(squashfs-tools musl-tools rpm cpio ignition shellcheck file binutils python3)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
target=${REBOOTD_STATIC_TARGET:-x86_64-unknown-linux-musl}
rustup target list --installed | grep -qx "$target" || rustup target add "$target"
if ! cargo deb --version 2>/dev/null | grep -q "$CARGO_DEB_VERSION"; then
    cargo install --locked "cargo-deb@$CARGO_DEB_VERSION"
fi
echo "build dependencies present"
