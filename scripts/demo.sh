#!/usr/bin/env bash
# Set up and run the lab demo: a small simulated fleet (real etcd, real rebootd processes, fake
# update_engine and logind on private buses) doing a rolling reboot.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --workspace --bins
exec target/debug/rebootd-lab demo "$@"
