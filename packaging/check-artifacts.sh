#!/usr/bin/env bash
# Check every artifact in $DIST (made by packaging/build-all.sh) and the shipped configs:
#  - the static binaries: no dynamic section, no interpreter, they run; SHA512SUMS matches;
#  - the .deb: control fields, exactly the expected files, the unit and default config equal to
#    the repository's, static binaries inside, maintainer scripts that enable but never start;
#  - the .rpm: the same, plus no shared-library requirements;
#  - the sysext image: exactly the expected files, extension-release, static binaries;
#  - ignition/rebootd.ign with Ignition's own validator (ignition-validate);
#  - every shell script with shellcheck.
# Fails on the first problem, naming it. Needs: dpkg-deb, rpm, rpm2cpio, cpio, unsquashfs,
# readelf, file, ignition-validate, shellcheck (packaging/install-build-deps.sh installs them).
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "$0")/lib.sh"

fail() {
    echo "check-artifacts: FAIL: $*" >&2
    exit 1
}
ok() { echo "check-artifacts: ok: $*"; }
for tool in dpkg-deb rpm rpm2cpio cpio unsquashfs readelf file ignition-validate shellcheck; do
    command -v "$tool" >/dev/null || fail "$tool is not installed (packaging/install-build-deps.sh)"
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Files (not directories) under a tree, as sorted relative paths, symlinks as "path -> target".
list_tree() {
    (cd "$1" && find . ! -type d -printf '%y %P\n' | sed 's/^l \(.*\)/\1 (link)/; s/^. //' | LC_ALL=C sort)
}
expect_tree() { # DIR WHAT EXPECTED-LINES...
    local dir=$1 what=$2
    shift 2
    printf '%s\n' "$@" | LC_ALL=C sort >"$work/expected"
    list_tree "$dir" >"$work/actual"
    diff -u "$work/expected" "$work/actual" >&2 || fail "$what: unexpected file list (- expected, + found)"
}
expect_static() { # FILE WHAT
    assert_static "$1"
    file -b "$1" | grep -Eq 'statically linked|static-pie linked' || fail "$2: $(file -b "$1")"
}
expect_same() { # FILE REPO-FILE WHAT
    cmp -s "$1" "$REPO/$2" || fail "$3: differs from $2"
}
# A maintainer script may enable the unit and try-restart it on upgrade, but never start it.
expect_no_start() { # FILE WHAT
    if grep -Ew 'start|--now|enable --now' "$1" | grep -v 'try-restart' | grep -q .; then
        fail "$2 starts the service: $(grep -Ew 'start|--now' "$1")"
    fi
}

# --- static binaries -----------------------------------------------------------------------------
for b in "${BINARIES[@]}"; do
    expect_static "$DIST/$b-x86_64-linux" "$b-x86_64-linux"
done
(cd "$DIST" && sha512sum --quiet -c SHA512SUMS) || fail "SHA512SUMS does not match the binaries"
# They run here (a Debian host, whatever libc it has): --help needs no configuration.
for b in "${BINARIES[@]}"; do
    "$DIST/$b-x86_64-linux" --help >/dev/null || fail "$b-x86_64-linux --help failed"
done
ok "static binaries: $(file -b "$DIST/rebootd-x86_64-linux" | cut -d, -f1-5)"

# --- .deb ------------------------------------------------------------------------------------------
deb=$DIST/rebootd_${VERSION}-1_amd64.deb
[ -f "$deb" ] || fail "no $deb"
info=$(dpkg-deb -f "$deb" Package Version Architecture Depends)
grep -qx "Package: rebootd" <<<"$info" || fail ".deb Package: $info"
grep -qx "Version: ${VERSION}-1" <<<"$info" || fail ".deb Version: $info"
grep -qx "Architecture: amd64" <<<"$info" || fail ".deb Architecture: $info"
grep -q "^Depends: .*dbus-system-bus.*systemd" <<<"$info" || fail ".deb Depends: $info"
mkdir "$work/deb" "$work/deb-control"
dpkg-deb -x "$deb" "$work/deb"
dpkg-deb -e "$deb" "$work/deb-control"
expect_tree "$work/deb" ".deb" \
    usr/bin/rebootd usr/bin/rebootctl \
    usr/lib/systemd/system/rebootd.service \
    usr/lib/rebootd/config.d/00-default.toml \
    usr/share/doc/rebootd/copyright usr/share/doc/rebootd/install.md \
    usr/share/doc/rebootd/migrating-from-locksmith.md
expect_static "$work/deb/usr/bin/rebootd" ".deb rebootd"
expect_static "$work/deb/usr/bin/rebootctl" ".deb rebootctl"
expect_same "$work/deb/usr/lib/systemd/system/rebootd.service" systemd/rebootd.service ".deb unit"
expect_same "$work/deb/usr/lib/rebootd/config.d/00-default.toml" packaging/config.d/00-default.toml ".deb config"
[ -f "$work/deb-control/postinst" ] || fail ".deb has no postinst"
grep -q 'deb-systemd-helper enable rebootd.service' "$work/deb-control/postinst" || fail ".deb postinst does not enable rebootd.service"
for s in preinst postinst; do # what runs at installation
    [ ! -f "$work/deb-control/$s" ] || expect_no_start "$work/deb-control/$s" ".deb $s"
done
grep -q 'deb-systemd-invoke stop rebootd.service' "$work/deb-control/prerm" || fail ".deb prerm does not stop rebootd.service"
ok "$(basename "$deb"): files, unit, config, static binaries, enable-without-start scripts"

# --- .rpm ------------------------------------------------------------------------------------------
rpm=$DIST/rebootd-${VERSION}-1.x86_64.rpm
[ -f "$rpm" ] || fail "no $rpm"
[ "$(rpm -qp --qf '%{NAME} %{VERSION} %{ARCH}' "$rpm" 2>/dev/null)" = "rebootd $VERSION x86_64" ] ||
    fail ".rpm: $(rpm -qp --qf '%{NAME} %{VERSION} %{ARCH}' "$rpm")"
if rpm -qpR "$rpm" 2>/dev/null | grep -E '\.so|^rtld'; then fail ".rpm requires shared libraries"; fi
rpm -qpR "$rpm" 2>/dev/null | grep -qx systemd || fail ".rpm does not require systemd"
mkdir "$work/rpm"
(cd "$work/rpm" && rpm2cpio "$rpm" | cpio -idm --quiet)
rm -rf "$work/rpm/usr/lib/.build-id"
expect_tree "$work/rpm" ".rpm" \
    usr/bin/rebootd usr/bin/rebootctl \
    usr/lib/systemd/system/rebootd.service \
    usr/lib/rebootd/config.d/00-default.toml \
    "usr/share/doc/rebootd-$VERSION/install.md" \
    "usr/share/doc/rebootd-$VERSION/migrating-from-locksmith.md"
[ -d "$work/rpm/etc/rebootd/config.d" ] || fail ".rpm does not own /etc/rebootd/config.d"
expect_static "$work/rpm/usr/bin/rebootd" ".rpm rebootd"
expect_static "$work/rpm/usr/bin/rebootctl" ".rpm rebootctl"
expect_same "$work/rpm/usr/lib/systemd/system/rebootd.service" systemd/rebootd.service ".rpm unit"
expect_same "$work/rpm/usr/lib/rebootd/config.d/00-default.toml" packaging/config.d/00-default.toml ".rpm config"
# %post and %pre run at installation: neither may start rebootd (%preun stops it, which is fine).
rpm -qp --qf '%{PREIN}\n%{POSTIN}\n' "$rpm" >"$work/rpm-install-scripts" 2>/dev/null
expect_no_start "$work/rpm-install-scripts" ".rpm %pre/%post"
rpm -qp --qf '%{POSTUN}\n' "$rpm" 2>/dev/null | grep -q 'try-restart rebootd.service' ||
    fail ".rpm %postun does not try-restart on upgrade"
ok "$(basename "$rpm"): files, unit, config, static binaries, no start on install"

# --- sysext ------------------------------------------------------------------------------------------
raw=$DIST/rebootd.raw
[ -f "$raw" ] || fail "no $raw"
file -b "$raw" | grep -q '^Squashfs filesystem' || fail "rebootd.raw: $(file -b "$raw")"
unsquashfs -q -no-progress -d "$work/sysext" "$raw" >/dev/null
expect_tree "$work/sysext" "rebootd.raw" \
    usr/bin/rebootd usr/bin/rebootctl \
    usr/lib/systemd/system/rebootd.service \
    "usr/lib/systemd/system/multi-user.target.wants/rebootd.service (link)" \
    usr/lib/rebootd/config.d/00-default.toml \
    usr/lib/extension-release.d/extension-release.rebootd
[ "$(readlink "$work/sysext/usr/lib/systemd/system/multi-user.target.wants/rebootd.service")" = ../rebootd.service ] ||
    fail "rebootd.raw: the wants link does not point at ../rebootd.service"
release=$work/sysext/usr/lib/extension-release.d/extension-release.rebootd
grep -Eqx 'ID=(flatcar|_any)' "$release" || fail "extension-release: no ID=flatcar or ID=_any"
grep -qx 'ARCHITECTURE=x86-64' "$release" || fail "extension-release: no ARCHITECTURE=x86-64"
if grep -qx 'ID=flatcar' "$release"; then
    grep -qx 'SYSEXT_LEVEL=1.0' "$release" || fail "extension-release: ID=flatcar needs SYSEXT_LEVEL=1.0"
fi
expect_static "$work/sysext/usr/bin/rebootd" "sysext rebootd"
expect_static "$work/sysext/usr/bin/rebootctl" "sysext rebootctl"
expect_same "$work/sysext/usr/lib/systemd/system/rebootd.service" systemd/rebootd.service "sysext unit"
if unsquashfs -lls "$raw" | grep -E '^[-dlcbps][rwxsStT-]{9} ' | grep -v ' root/root '; then
    fail "rebootd.raw has files not owned by root"
fi
ok "rebootd.raw: files, extension-release ($(tr '\n' ' ' <"$release")), static binaries"

# --- Ignition ----------------------------------------------------------------------------------------
ignition-validate "$REPO/ignition/rebootd.ign" || fail "ignition-validate refused ignition/rebootd.ign"
ok "ignition/rebootd.ign: ignition-validate $(ignition-validate --version 2>&1 | head -1)"

# --- shell scripts -----------------------------------------------------------------------------------
(cd "$REPO" && shellcheck -x packaging/*.sh deploy/kubernetes/*.sh) || fail "shellcheck"
ok "shellcheck: packaging/*.sh deploy/kubernetes/*.sh"
echo "check-artifacts: all artifacts in $DIST are good"
