#!/usr/bin/env bash
# order-symbols.sh [musl|gnu]: make packaging/rebootd.order (musl, the static binaries that ship;
# the default) or packaging/rebootd.gnu.order (glibc, `cargo build --release`) again: the
# functions rebootd runs from start to idle, which build.rs asks the linker (rust-lld) to place
# together at the start of .text so that idle rebootd keeps only that part of its code resident
# (docs/benchmark-history.md, 4e).
#
# Steps: build rebootd (build.rs has the linker write its map into OUT_DIR); start it
# idle through `rebootd-lab bench idle` (etcd backend and drain configured, as the bench measures
# it) under valgrind's callgrind; 15 s after it logs that it is idle, dump the functions it ran; write
# their symbols, in address order, to the list. Run it after a toolchain update or
# a large change to start-up; a stale list only costs memory (names no longer there are skipped).
# Needs valgrind, python3, etcd (as the lab's tests); musl: the musl target (build-static.sh).
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "$0")/lib.sh"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
case "${1:-musl}" in
musl) # the static binaries that ship
    bash "$REPO/packaging/build-static.sh"
    dir=$STATIC_DIR
    list=$REPO/packaging/rebootd.order
    ;;
gnu) # cargo build --release (glibc)
    cargo build --release --locked --manifest-path "$REPO/Cargo.toml" -p rebootd --bin rebootd
    dir=$TARGET_DIR/release
    list=$REPO/packaging/rebootd.gnu.order
    ;;
*)
    echo "usage: $0 [musl|gnu]" >&2
    exit 2
    ;;
esac
# The map of that link: the newest of the build script's output directories.
# shellcheck disable=SC2012 # names made by cargo: no spaces
map=$(ls -t "$dir"/build/rebootd-*/out/rebootd.map | head -n 1)
cargo build --locked --manifest-path "$REPO/Cargo.toml" -p rebootd-lab --bin rebootd-lab

# The lab finds rebootd by the last part of its path: a wrapper named rebootd runs the real one
# under callgrind (exec keeps the pid, which the wrapper writes down with its config directory).
mkdir "$work/bin"
cat >"$work/bin/rebootd" <<EOF
#!/bin/sh
echo "\$\$ \$(dirname "\$2")" >"$work/pid"
exec valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file="$work/callgrind.out" \
    "$dir/rebootd" "\$@"
EOF
chmod +x "$work/bin/rebootd"
# The bench waits --settle after READY=1, then gives up (it cannot find a process named rebootd
# under valgrind) and stops etcd, the bus and rebootd itself: 60 s is the time to dump.
"$TARGET_DIR/debug/rebootd-lab" bench idle --duration 1m --settle 60s --rebootd "$work/bin/rebootd" \
    >"$work/bench.log" 2>&1 &
bench=$!
node_dir=/nonexistent
for _ in $(seq 50); do
    if [ -s "$work/pid" ]; then
        read -r pid node_dir <"$work/pid"
        if grep -q "idle: waiting for a trigger" "$node_dir/rebootd.log" 2>/dev/null; then
            break
        fi
    fi
    sleep 1
done
grep -q "idle: waiting for a trigger" "$node_dir/rebootd.log" || {
    echo "rebootd did not reach idle under callgrind; bench log:" >&2
    cat "$work/bench.log" >&2
    exit 1
}
# Idle for a while first: tokio's idle blocking threads exit after 10 s, which runs code too.
sleep 15
callgrind_control --dump "$pid" >/dev/null
# The dump is complete when its last line (totals) is there.
for _ in $(seq 60); do
    if grep -qs '^totals:' "$work"/callgrind.out.*; then break; fi
    sleep 1
done
wait "$bench" || true

python3 - "$map" "$work"/callgrind.out.* >"$list" <<'EOF'
# The .text input sections (one function each: rustc and musl use function sections) that hold
# an instruction callgrind saw run in rebootd; printed as symbol names, in address order.
import bisect, re, sys
rx = re.compile(r'^\s*([0-9a-f]+)\s+([0-9a-f]+)\s+([0-9a-f]+)\s+(\d+)( +)(\S.*)$')
secs, cur, in_text = [], None, False
for line in open(sys.argv[1]):
    m = rx.match(line.rstrip('\n'))
    if not m:
        continue
    vma, size, depth, name = int(m.group(1), 16), int(m.group(3), 16), len(m.group(5)), m.group(6)
    if depth < 4:  # an output section
        in_text, cur = name == '.text', None
    elif not in_text:
        continue
    elif depth < 12:  # an input section: path:(.text.SYMBOL)
        sec = name[name.rfind(':(') + 2:-1] if name.endswith(')') else ''
        sym = sec[len('.text.'):] if sec.startswith('.text.') else ''
        for p in ('unlikely.', 'hot.', 'startup.', 'exit.', 'split.'):
            if sym.startswith(p):
                sym = sym[len(p):]
        cur = [vma, size, [sym] if sym else []]
        secs.append(cur)
    elif cur is not None and not cur[2]:  # a symbol in a section named just .text
        cur[2].append(name)
secs.sort()
starts = [s[0] for s in secs]
addrs = set()
for out in sys.argv[2:]:
    at, obs, ob = 0, {}, None
    for line in open(out):
        # An object is named where it first appears, as ob= (the current one) or cob= (called).
        if line.startswith(('ob=', 'cob=')):
            m = re.match(r'c?ob=\((\d+)\)(?: (.*))?', line.strip())
            if m.group(2):
                obs[m.group(1)] = m.group(2)
            if line.startswith('ob='):
                ob = obs.get(m.group(1))
            continue
        t = line.split()
        if not t:
            continue
        if t[0].startswith('0x'):
            at = int(t[0], 16)
        elif t[0][0] in '+-' and t[0][1:].isdigit():
            at += int(t[0])
        elif t[0] != '*':
            continue
        if ob and ob.endswith('/rebootd'):
            addrs.add(at)
def sections_hit(base):
    hit = set()
    for a in addrs:
        i = bisect.bisect_right(starts, a - base) - 1
        if i >= 0 and a - base < secs[i][0] + secs[i][1]:
            hit.add(i)
    return hit
# valgrind loads a dynamically linked PIE at 0x108000 and reports run-time addresses; a static
# PIE's come out as in the file. Take the base that puts the addresses into functions.
hit = max((sections_hit(b) for b in (0, 0x108000)), key=len)
syms = [secs[i][2][0] for i in sorted(hit) if secs[i][2]]
size = sum(secs[i][1] for i in hit)
sys.stderr.write(f'{len(syms)} of {len(secs)} functions ran, {size // 1024} kB of code\n')
print('\n'.join(syms))
EOF
echo "wrote $list ($(wc -l <"$list") symbols)"
