#!/usr/bin/env bash
# Build $DIST/rebootd-<version>-1.x86_64.rpm from packaging/rebootd.spec.
#
# The spec builds from source with cargo, as a distribution build would. Here it is given the
# static binaries of packaging/build-static.sh instead (--define "prebuilt_dir ..."), so a second
# release build is not needed; REBOOTD_RPM_FROM_SOURCE=1 builds from source instead (slow, and
# needs the crates: network or a vendored source).
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "$0")/lib.sh"

command -v rpmbuild >/dev/null || { echo "rpmbuild is missing (Debian: apt-get install rpm)" >&2; exit 1; }
top=$(mktemp -d)
trap 'rm -rf "$top"' EXIT
mkdir -p "$top"/{SOURCES,SPECS,BUILD,RPMS,SRPMS}

# Source0: the repository at this version, without build output and VCS data.
tar -C "$REPO" --exclude=./target --exclude='./target-*' --exclude=./.git \
    --transform "s,^\.,rebootd-$VERSION," -czf "$top/SOURCES/rebootd-$VERSION.tar.gz" .
sed "s/^Version:.*/Version:        $VERSION/" "$REPO/packaging/rebootd.spec" >"$top/SPECS/rebootd.spec"

defines=(--define "_topdir $top")
if [ "${REBOOTD_RPM_FROM_SOURCE:-0}" != 1 ]; then
    require_static_binaries
    defines+=(--define "prebuilt_dir $STATIC_DIR")
fi
# --nodeps: on a Debian build host rpm's database knows nothing of the BuildRequires.
rpmbuild -bb --nodeps --target x86_64 "${defines[@]}" "$top/SPECS/rebootd.spec"
rm -f "$DIST"/rebootd-*.rpm
find "$top/RPMS" -name '*.rpm' -exec cp {} "$DIST/" \;
ls "$DIST"/rebootd-*.rpm
