#!/usr/bin/env bash
# Two cudastack binaries side by side on the same build (issue 35: what one change did):
#
#   1. every layer from warm downloads: a fresh cache holding only hard links of the downloads
#      of a warm cache, `build RECIPE --no-verify --layout DIR`: every tree staged, every layer
#      written and audited; wall, CPU, peak RSS, then `cudastack cache` of that cache;
#   2. a team change on that cache: the same recipe without its `source_date_epoch`, built with
#      another SOURCE_DATE_EPOCH, so every team layer (config, packages) is new and the stack's
#      cached: the audit stage's time (its progress line to the next one).
#
# Usage: scripts/bench-binaries.sh OLD_BIN NEW_BIN [RECIPE]
#        (default recipes/torch2.4.1-cu121-py3.11.yaml; the recipe's lock must be next to it)
# Env:   WARM_CACHE (the cache whose downloads are linked, default ~/.cache/cudastack, it must
#        hold the recipe's downloads), BENCH_DIR (scratch, default /tmp/cudastack-bench-binaries;
#        removed at the end unless BENCH_KEEP=1).
# Needs: python3, /usr/bin/time, and the scratch on the warm cache's filesystem (hard links).
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=$1
NEW=$2
RECIPE=${3:-recipes/torch2.4.1-cu121-py3.11.yaml}
WARM=${WARM_CACHE:-$HOME/.cache/cudastack}
WORK=${BENCH_DIR:-/tmp/cudastack-bench-binaries}
rm -rf "$WORK"
mkdir -p "$WORK"
[ "${BENCH_KEEP:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT

# The recipe as a team would write it (no source_date_epoch), and its lock.
TEAM=$WORK/team
mkdir -p "$TEAM"
sed '/^source_date_epoch/d' "$RECIPE" > "$TEAM/team.yaml"
cp "${RECIPE%.yaml}.lock" "$TEAM/team.lock"

run() { # label binary
    local label=$1 bin=$2 cache=$WORK/cache-$1
    scripts/downloads-only.sh "$WARM" "$cache"
    "$bin" lock "$TEAM/team.yaml" > /dev/null 2>&1
    /usr/bin/time -v "$bin" build "$RECIPE" --no-verify --layout "$WORK/layout-$label" \
        --cache-dir "$cache" > "$WORK/$label-cold.log" 2>&1
    local wall user sys rss
    wall=$(grep 'Elapsed (wall' "$WORK/$label-cold.log" | awk '{print $NF}')
    user=$(grep 'User time' "$WORK/$label-cold.log" | awk '{print $NF}')
    sys=$(grep 'System time' "$WORK/$label-cold.log" | awk '{print $NF}')
    rss=$(grep 'Maximum resident' "$WORK/$label-cold.log" | awk '{print int($NF / 1024)}')
    local total trees
    total=$("$bin" --json cache --cache-dir "$cache" | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["total_bytes"] / 2**30, 2))')
    trees=$("$bin" --json cache --cache-dir "$cache" | python3 -c 'import json,sys; k=json.load(sys.stdin)["kinds"]; print(round(k["staged-trees"]["bytes"] / 2**30, 2), round((k["downloads"]["bytes"] + k["layer-blobs"]["bytes"]) / 2**30, 2))')
    SOURCE_DATE_EPOCH=1800000001 /usr/bin/time -v "$bin" build "$TEAM/team.yaml" --no-verify \
        --layout "$WORK/team-$label" --cache-dir "$cache" > "$WORK/$label-team.log" 2>&1
    local audit team_wall
    audit=$(python3 - "$WORK/$label-team.log" <<'EOF'
import re, sys
times = [(float(m.group(1)), m.group(2)) for m in re.finditer(r"^\[\s*([\d.]+)s\] (\S+)", open(sys.argv[1]).read(), re.M)]
for (t, stage), (after, _) in zip(times, times[1:]):
    if stage == "audit":
        print(f"{after - t:.1f}")
        break
EOF
)
    team_wall=$(grep 'Elapsed (wall' "$WORK/$label-team.log" | awk '{print $NF}')
    echo "| $label | $wall | $user s | $sys s | $rss MiB | $total GiB (staged trees ${trees% *} GiB; downloads + layer blobs ${trees#* } GiB) | $team_wall (audit ${audit} s) |"
}

echo "| binary | every layer, warm downloads: wall | user CPU | sys CPU | peak RSS | cache after | team change: wall |"
echo "|---|---|---|---|---|---|---|"
run old "$OLD"
run new "$NEW"
