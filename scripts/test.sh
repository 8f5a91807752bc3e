#!/usr/bin/env bash
# Run the whole test suite: unit tests, the lab's stand-in tests and the end-to-end tests with
# real etcd (3.4 and 3.5), real dbus-daemons and real rebootd processes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --workspace --all-targets
cargo test --workspace --no-fail-fast
