#!/usr/bin/env bash
# Layer write throughput: cudastack vs `tar | pigz -p 2 -6` and `tar | zstd -T2 -3`.
#
# The tree (~2 GB, built once under $BENCH_DIR/tree and reused) mimics a CUDA layer:
#   ~1.3 GB  real shared libraries from /usr/lib copied several times (ELF, compressible
#            like libcublas/libcudnn), with symlink chains as packages ship them
#   ~0.4 GB  random bytes (incompressible: already-compressed wheels, fatbins)
#   ~0.3 GB  text (headers, docs, Python sources: /usr/share and /usr/include copies)
# Every tool reads the same tree from the page cache (a warm-up pass runs first) and
# writes its output to a file on the same disk and fsyncs it (`sync FILE`), because
# cudastack's blob store fsyncs every blob before it becomes visible. Ratio = their time / our time
# (>= 1 means cudastack is at least as fast). Peak RSS from /usr/bin/time -v.
# Usage: scripts/bench-layers.sh [BENCH_DIR]   (default /tmp/cudastack-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_DIR=${1:-/tmp/cudastack-bench}
TREE=$BENCH_DIR/tree
OUT=$BENCH_DIR/out
mkdir -p "$BENCH_DIR"

if [ ! -f "$TREE/.complete" ]; then
    echo "building the ~2 GB test tree in $TREE" >&2
    rm -rf "$TREE"; mkdir -p "$TREE"
    libs=$(find /usr/lib/x86_64-linux-gnu /usr/lib/gcc /usr/libexec -maxdepth 3 -type f -size +100k 2>/dev/null | head -n 2000)
    copy=0
    while [ "$(du -sm "$TREE" | cut -f1)" -lt 1300 ]; do
        dest=$TREE/usr/local/cuda/lib64/copy$copy
        mkdir -p "$dest"
        for f in $libs; do
            name=$(basename "$f")
            cp -p "$f" "$dest/$name.1.2.3" 2>/dev/null || continue
            ln -sf "$name.1.2.3" "$dest/$name.1"
            ln -sf "$name.1" "$dest/$name"
            [ "$(du -sm "$TREE" | cut -f1)" -ge 1300 ] && break
        done
        copy=$((copy + 1))
    done
    mkdir -p "$TREE/opt/random"
    for i in $(seq 1 8); do head -c 50M /dev/urandom > "$TREE/opt/random/blob$i.bin"; done
    mkdir -p "$TREE/usr/share/text"
    i=0
    while [ "$(du -sm "$TREE/usr/share/text" | cut -f1)" -lt 300 ]; do
        mkdir -p "$TREE/usr/share/text/$i"
        cp -r /usr/include /usr/share/doc "$TREE/usr/share/text/$i/" 2>/dev/null || true
        i=$((i + 1))
    done
    touch "$TREE/.complete"
fi
echo "tree: $(du -sh --apparent-size "$TREE" | cut -f1), $(find "$TREE" | wc -l) entries" >&2

cargo build --release --quiet --example layer_bench
BENCH=target/release/examples/layer_bench

# Warm the page cache so every run reads the same way.
tar -cf - -C "$TREE" . > /dev/null

measure() { # name, command...; prints "name seconds rss_mib cpu_seconds"
    local name=$1; shift
    rm -rf "$OUT"; mkdir -p "$OUT"
    local log=$BENCH_DIR/$name.time
    local start end
    start=$(date +%s.%N)
    /usr/bin/time -v -o "$log" "$@" > "$BENCH_DIR/$name.stdout"
    end=$(date +%s.%N)
    local rss
    rss=$(awk -F': ' '/Maximum resident set size/ {printf "%.1f", $2/1024}' "$log")
    local seconds cpu
    seconds=$(echo "$end - $start" | bc -l)
    cpu=$(awk -F': ' '/User time|System time/ {s += $2} END {printf "%.2f", s}' "$log")
    printf '%s %.2f %s %s\n' "$name" "$seconds" "$rss" "$cpu"
}

results=$(
    measure pigz6 sh -c "tar -cf - -C '$TREE' . | pigz -p 2 -6 > '$OUT/layer.tar.gz' && sync '$OUT/layer.tar.gz'"
    measure cudastack-gzip6 $BENCH "$TREE" "$OUT/store" gzip:6 2
    measure zstd3 sh -c "tar -cf - -C '$TREE' . | zstd -q -T2 -3 > '$OUT/layer.tar.zst' && sync '$OUT/layer.tar.zst'"
    measure cudastack-zstd3 $BENCH "$TREE" "$OUT/store" zstd:3 2
    measure tar sh -c "tar -cf - -C '$TREE' . > '$OUT/layer.tar' && sync '$OUT/layer.tar'"
    measure cudastack-none $BENCH "$TREE" "$OUT/store" none 2
)
rm -rf "$OUT"
load=$(cut -d' ' -f1-3 /proc/loadavg)
echo "$results" | awk -v load="$load" '
    { t[$1] = $2; r[$1] = $3; c[$1] = $4 }
    END {
        printf "%-18s %9s %12s %12s\n", "run", "wall s", "CPU s", "peak RSS MiB"
        split("pigz6 cudastack-gzip6 zstd3 cudastack-zstd3 tar cudastack-none", order, " ")
        for (i = 1; i <= 6; i++) { k = order[i]; printf "%-18s %9.2f %12.2f %12.1f\n", k, t[k], c[k], r[k] }
        printf "\nratios (theirs / ours; >= 1 means cudastack is at least as fast)\n"
        printf "%-28s %8s %8s\n", "", "wall", "CPU"
        printf "%-28s %7.2fx %7.2fx\n", "vs tar | pigz -p 2 -6", t["pigz6"] / t["cudastack-gzip6"], c["pigz6"] / c["cudastack-gzip6"]
        printf "%-28s %7.2fx %7.2fx\n", "vs tar | zstd -T2 -3", t["zstd3"] / t["cudastack-zstd3"], c["zstd3"] / c["cudastack-zstd3"]
        printf "%-28s %7.2fx %7.2fx\n", "vs tar (no compression)", t["tar"] / t["cudastack-none"], c["tar"] / c["cudastack-none"]
        printf "load average during the run: %s\n", load
    }'
for name in cudastack-gzip6 cudastack-zstd3 cudastack-none; do
    echo "$name: $(cat "$BENCH_DIR/$name.stdout")"
done
