#!/usr/bin/env bash
# Build $DIST/rebootd.raw: a systemd-sysext image (squashfs) for Flatcar, from the static binaries
# of packaging/build-static.sh. Install it as /etc/extensions/rebootd.raw (the file name must stay
# rebootd.raw: it has to match usr/lib/extension-release.d/extension-release.rebootd).
#
#   usr/bin/rebootd, usr/bin/rebootctl
#   usr/lib/systemd/system/rebootd.service (ExecStart=/usr/bin/rebootd, as shipped)
#   usr/lib/systemd/system/multi-user.target.wants/rebootd.service -> ../rebootd.service
#     (merging the extension enables the unit; `systemctl mask rebootd` to keep it off)
#   usr/lib/rebootd/config.d/00-default.toml
#   usr/lib/extension-release.d/extension-release.rebootd
#
# SYSEXT_ID (default flatcar) and SYSEXT_LEVEL (default 1.0, Flatcar's) go into the
# extension-release file; SYSEXT_ID=_any makes an image any distribution's systemd-sysext (252
# or later) merges: the binaries are static.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "$0")/lib.sh"

require_static_binaries
command -v mksquashfs >/dev/null || { echo "mksquashfs is missing (apt-get install squashfs-tools)" >&2; exit 1; }
id=${SYSEXT_ID:-flatcar}
level=${SYSEXT_LEVEL:-1.0}

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
chmod 0755 "$root"
install -D -m 0755 "$STATIC_DIR/rebootd" "$root/usr/bin/rebootd"
install -D -m 0755 "$STATIC_DIR/rebootctl" "$root/usr/bin/rebootctl"
install -D -m 0644 "$REPO/systemd/rebootd.service" "$root/usr/lib/systemd/system/rebootd.service"
mkdir -p "$root/usr/lib/systemd/system/multi-user.target.wants"
ln -s ../rebootd.service "$root/usr/lib/systemd/system/multi-user.target.wants/rebootd.service"
install -D -m 0644 "$REPO/packaging/config.d/00-default.toml" "$root/usr/lib/rebootd/config.d/00-default.toml"
mkdir -p "$root/usr/lib/extension-release.d"
{
    echo "ID=$id"
    # SYSEXT_LEVEL is only compared when ID names a distribution.
    [ "$id" = _any ] || echo "SYSEXT_LEVEL=$level"
    echo "ARCHITECTURE=x86-64"
} >"$root/usr/lib/extension-release.d/extension-release.rebootd"

rm -f "$DIST/rebootd.raw"
# Owned by root whoever builds it; fixed timestamps so the same inputs give the same image.
mksquashfs "$root" "$DIST/rebootd.raw" -all-root -noappend -quiet -no-progress \
    -mkfs-time "${SOURCE_DATE_EPOCH:-0}" -all-time "${SOURCE_DATE_EPOCH:-0}"
echo "sysext image: $DIST/rebootd.raw ($(tr '\n' ' ' <"$root/usr/lib/extension-release.d/extension-release.rebootd"))"
