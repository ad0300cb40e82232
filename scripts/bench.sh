#!/usr/bin/env bash
# cudastack against what users run today, side by side, on the same local inputs (issue 9):
#
#   cold build     cudastack build          vs  docker build (FROM the same base rootfs,
#                                               COPY the same wheels, pip install --no-index)
#                                           vs  buildah bud (when installed)
#   rebuild        after adding one package (a second recipe sharing base, CUDA and cuDNN)
#   no-op rebuild  cudastack build again (target: < 1 s)
#   (cudastack builds run with --no-verify: docker build verifies nothing either)
#   image size     vs the docker-built image and vs the naive image (system CUDA/cuDNN in
#                  /usr/local/cuda plus pip's own nvidia-* copies)
#   push           bytes uploaded for the second recipe after the first, to a local registry
#   peak RSS       of cudastack during the cold build (/usr/bin/time -v)
#
# Inputs both tools share: the wheels of the recipe's lock (from the cudastack blob cache,
# hard-linked into the Docker build context) and the base root filesystem (cudastack's own
# staged mmdebstrap tree; Docker gets the same tree through `docker import` of cudastack's
# base layer). cudastack's "cold" build starts from a fresh cache dir holding only those
# inputs: every layer is tarred, compressed and audited from scratch.
#
# Usage: scripts/bench.sh [RECIPE]      (default recipes/torch2.4.1-cu121-py3.11.yaml)
# Env:   BENCH_DIR (scratch, default /tmp/cudastack-bench-stack), BENCH_OUT (default
#        docs/benchmarks.md), CUDASTACK_BIN (default target/release/cudastack, built if
#        missing), CUDASTACK_CACHE_DIR (the warm cache, default ~/.cache/cudastack),
#        BENCH_REGISTRY_PORT (default 5055), BENCH_KEEP=1 keeps the scratch dir.
# Needs: docker (daemon running), jq, /usr/bin/time; docker-registry for the push row.
# Everything it creates (Docker images tagged cudastack-bench*, the registry process,
# the scratch dir) is removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RECIPE=${1:-recipes/torch2.4.1-cu121-py3.11.yaml}
WORK=${BENCH_DIR:-/tmp/cudastack-bench-stack}
OUT_MD=${BENCH_OUT:-docs/benchmarks.md}
MAIN_CACHE=${CUDASTACK_CACHE_DIR:-$HOME/.cache/cudastack}
BIN=${CUDASTACK_BIN:-target/release/cudastack}
PORT=${BENCH_REGISTRY_PORT:-5055}
EXTRA_PACKAGE=pyyaml==6.0.2
PIP_VERSION=24.2
TAG=cudastack-bench

log() { echo "[bench $(date -u +%H:%M:%S)] $*" >&2; }
die() { log "error: $*"; exit 1; }
now() { date +%s.%N; }
secs() { echo "$2 - $1" | bc -l | xargs printf '%.1f'; }
ratio() { if [ -n "$1" ] && [ -n "$2" ] && [ "$(echo "$2 > 0" | bc -l)" = 1 ]; then echo "$1 / $2" | bc -l | xargs printf '%.2f'; else echo "n/a"; fi; }
gib() { echo "$1 / 1073741824" | bc -l | xargs printf '%.2f GiB'; }
mib() { echo "$1 / 1048576" | bc -l | xargs printf '%.1f MiB'; }

for tool in docker jq bc; do command -v $tool >/dev/null || die "$tool is not installed"; done
[ -x /usr/bin/time ] || die "/usr/bin/time is not installed (apt-get install time)"
docker info >/dev/null 2>&1 || die "the Docker daemon is not running (dockerd &)"
if [ ! -x "$BIN" ]; then
    log "building $BIN"
    cargo build --release --quiet
fi
BIN=$(realpath "$BIN")

REGISTRY_PID=
cleanup() {
    [ -n "$REGISTRY_PID" ] && kill "$REGISTRY_PID" 2>/dev/null || true
    for image in $(docker images --format '{{.Repository}}:{{.Tag}}' | grep "^$TAG" || true); do
        docker rmi -f "$image" >/dev/null 2>&1 || true
    done
    docker builder prune -f >/dev/null 2>&1 || true
    if [ -z "${BENCH_KEEP:-}" ]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT
rm -rf "$WORK"
mkdir -p "$WORK/recipes"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------- inputs (not timed)
NAME=$(basename "$RECIPE" .yaml)
NAME2=$NAME-plus1
cp "$RECIPE" "$WORK/recipes/$NAME.yaml"
cp "${RECIPE%.yaml}.lock" "$WORK/recipes/$NAME.lock"
R1=$WORK/recipes/$NAME.yaml
R2=$WORK/recipes/$NAME2.yaml
# The second recipe: the same stack plus one package (base, CUDA and cuDNN layers shared).
sed -e "s/^name: .*/name: $NAME2/" "$RECIPE" > "$R2"
if grep -q '^packages:' "$R2"; then
    sed -i -e "s/^packages: \[\(.*\)\]/packages: [\1, \"$EXTRA_PACKAGE\"]/" "$R2"
else
    echo "packages: [\"$EXTRA_PACKAGE\"]" >> "$R2"
fi
log "locking $R2 (PyPI)"
"$BIN" -q lock "$R2" >/dev/null

log "warming the main cache ($MAIN_CACHE): the recipe's wheels and base rootfs"
"$BIN" -q build "$R1" --no-verify --cache-dir "$MAIN_CACHE" --layout "$WORK/warm1" >/dev/null
rm -rf "$WORK/warm1"

# Where a locked wheel's bytes are: the main cache, or (the second recipe's extra wheels)
# downloaded here once and checked against the lock's sha256.
mkdir -p "$WORK/downloads"
blob() { # lock, hex -> path
    local hex=$2 url
    if [ -e "$MAIN_CACHE/blobs/sha256/$hex" ]; then echo "$MAIN_CACHE/blobs/sha256/$hex"; return; fi
    if [ ! -e "$WORK/downloads/$hex" ]; then
        url=$(jq -r --arg h "sha256:$hex" '.artifacts[] | select(.sha256 == $h) | .url' "$1")
        curl -sfL -o "$WORK/downloads/$hex" "$url" || die "failed to download $url"
        echo "$hex  $WORK/downloads/$hex" | sha256sum -c --quiet - || die "$url does not match its lock"
    fi
    echo "$WORK/downloads/$hex"
}

# A fresh cache: the locked wheels and the staged base rootfs, nothing else.
seed_cache() { # dir
    mkdir -p "$1/blobs/sha256" "$1/staging"
    for lock in "$WORK/recipes/$NAME.lock" "$WORK/recipes/$NAME2.lock"; do
        for hex in $(jq -r '.artifacts[].sha256 | sub("^sha256:"; "")' "$lock"); do
            [ -e "$1/blobs/sha256/$hex" ] || ln "$(blob "$lock" "$hex")" "$1/blobs/sha256/$hex"
        done
    done
    for facts in "$MAIN_CACHE"/staging/*.facts.json; do
        base=${facts%.facts.json}
        cp -al "$base" "$1/staging/"
        cp "$base.complete" "$facts" "$1/staging/"
    done
}
seed_cache "$WORK/cache"

# Docker build contexts: the same wheel files under their wheel names, plus pip itself
# (the base has python3 but no pip, as cudastack's installer needs none).
PIP_DIR=${TMPDIR:-/tmp}/cudastack-bench-pip
if ! ls "$PIP_DIR"/pip-$PIP_VERSION-*.whl >/dev/null 2>&1; then
    python3 -m pip download -q --no-deps --only-binary=:all: -d "$PIP_DIR" "pip==$PIP_VERSION"
fi
PIP_WHEEL=$(basename "$(ls "$PIP_DIR"/pip-$PIP_VERSION-*.whl)")
make_context() { # lock, dir
    mkdir -p "$2/wheels"
    jq -r '.artifacts[] | "\(.sha256 | sub("^sha256:"; "")) \(.filename)"' "$1" | while read -r hex file; do
        ln "$(blob "$1" "$hex")" "$2/wheels/$file"
    done
    cp "$PIP_DIR/$PIP_WHEEL" "$2/$PIP_WHEEL"
    cat > "$2/Dockerfile" <<EOF
FROM $TAG-base:latest
COPY $PIP_WHEEL /tmp/$PIP_WHEEL
COPY wheels/ /wheels/
RUN python3 /tmp/$PIP_WHEEL/pip install --no-index --no-deps --break-system-packages --root-user-action=ignore --disable-pip-version-check /wheels/*.whl
EOF
}
make_context "$WORK/recipes/$NAME.lock" "$WORK/ctx1"
make_context "$WORK/recipes/$NAME2.lock" "$WORK/ctx2"

# ---------------------------------------------------------------- cudastack
log "cudastack: cold build of $NAME"
t0=$(now)
/usr/bin/time -v -o "$WORK/cold.time" "$BIN" --json build "$R1" --no-verify --cache-dir "$WORK/cache" --layout "$WORK/img1" > "$WORK/cold.json"
CS_COLD=$(secs "$t0" "$(now)")
CS_RSS_KIB=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$WORK/cold.time")
CS_RSS=$(mib $((CS_RSS_KIB * 1024)))
log "cold: $CS_COLD s, peak RSS $CS_RSS"

log "cudastack: no-op rebuild"
t0=$(now)
"$BIN" --json build "$R1" --no-verify --cache-dir "$WORK/cache" --layout "$WORK/img1" > "$WORK/noop.json"
CS_NOOP=$(secs "$t0" "$(now)")
NOOP_CACHED=$(jq '[.layers[] | select(.cached)] | length' "$WORK/noop.json")/$(jq '.layers | length' "$WORK/noop.json")

log "cudastack: rebuild with $EXTRA_PACKAGE added"
t0=$(now)
"$BIN" --json build "$R2" --no-verify --cache-dir "$WORK/cache" --layout "$WORK/img2" > "$WORK/rebuild.json"
CS_REBUILD=$(secs "$t0" "$(now)")
REBUILT=$(jq -r '[.layers[] | select(.cached | not) | .name] | join(", ")' "$WORK/rebuild.json")

# The same cold build with uncompressed layers: what a local `docker load` takes, and the
# like-for-like comparison with `docker build`, which stores layers uncompressed too.
log "cudastack: cold build, --compression none"
seed_cache "$WORK/cache-none"
t0=$(now)
"$BIN" -q build "$R1" --no-verify --compression none --cache-dir "$WORK/cache-none" --layout "$WORK/img-none" > /dev/null
CS_COLD_NONE=$(secs "$t0" "$(now)")
rm -rf "$WORK/cache-none" "$WORK/img-none"

# Uncompressed size: what Docker counts once the image is loaded.
uncompressed() { # report json -> bytes
    local total=0 digest size
    for digest in $(jq -r '.layers[].digest' "$1"); do
        size=$(jq -r --arg d "$digest" 'select(.digest == $d) | .uncompressed_size' "$WORK"/cache/layers/*.json | head -n1)
        total=$((total + size))
    done
    echo $total
}
CS_SIZE=$(uncompressed "$WORK/cold.json")
CS_SIZE_GZ=$(jq '.size' "$WORK/cold.json")
CS2_SIZE_GZ=$(jq '.size' "$WORK/rebuild.json")
BASE_DIGEST=$(jq -r '.layers[] | select(.name == "base") | .digest | sub("^sha256:"; "")' "$WORK/cold.json")

# ---------------------------------------------------------------- push
PUSH_ROW="| push of the second recipe to a local registry (bytes) | skipped: cudastack push unavailable | | |"
if "$BIN" push --help >/dev/null 2>&1 && command -v docker-registry >/dev/null; then
    mkdir -p "$WORK/registry"
    cat > "$WORK/registry.yml" <<EOF
version: 0.1
storage: { filesystem: { rootdirectory: $WORK/registry }, delete: { enabled: true } }
http: { addr: 127.0.0.1:$PORT }
log: { level: error }
EOF
    docker-registry serve "$WORK/registry.yml" > "$WORK/registry.log" 2>&1 &
    REGISTRY_PID=$!
    for _ in $(seq 50); do curl -sf "http://127.0.0.1:$PORT/v2/" >/dev/null && break; sleep 0.2; done
    log "cudastack push: first recipe, then the second"
    "$BIN" push "$WORK/img1" "localhost:$PORT/bench:1" --json > "$WORK/push1.json"
    t0=$(now)
    "$BIN" push "$WORK/img2" "localhost:$PORT/bench:2" --json > "$WORK/push2.json"
    CS_PUSH_S=$(secs "$t0" "$(now)")
    CS_PUSH=$(jq '.bytes_uploaded' "$WORK/push2.json")
    PUSH_ROW="| push of the second recipe after the first (bytes uploaded) | $(mib "$CS_PUSH") in $CS_PUSH_S s | whole image, no layer sharing: $(mib "$CS2_SIZE_GZ") | $(ratio "$CS_PUSH" "$CS2_SIZE_GZ") |"
    kill "$REGISTRY_PID"; REGISTRY_PID=
    rm -rf "$WORK/registry"
elif "$BIN" push --help >/dev/null 2>&1; then
    PUSH_ROW="| push of the second recipe to a local registry (bytes) | skipped: docker-registry is not installed | | |"
fi

log "importing cudastack's base layer into Docker"
docker import "$WORK/img1/blobs/sha256/$BASE_DIGEST" "$TAG-base:latest" >/dev/null
rm -rf "$WORK/img1" "$WORK/img2" "$WORK/cache"

# ---------------------------------------------------------------- docker
# The Docker image of this stack takes about 8 GB, plus the build context while it builds.
free_gib() { df -BG --output=avail /var/lib/docker 2>/dev/null | tail -n1 | tr -dc 0-9; }
[ "$(free_gib)" -ge 14 ] || die "only $(free_gib) GiB free under /var/lib/docker; the docker build needs about 14"
log "docker build: cold ($NAME)"
t0=$(now)
docker build -q -t "$TAG:one" "$WORK/ctx1" > /dev/null
D_COLD=$(secs "$t0" "$(now)")
D_SIZE=$(docker image inspect -f '{{.Size}}' "$TAG:one")
COPY_LAYER=$(docker history --no-trunc --format '{{.Size}}\t{{.CreatedBy}}' --human=false "$TAG:one" | awk -F'\t' '/COPY dir:|COPY wheels|ADD dir:/ {print $1; exit}')
COPY_LAYER=${COPY_LAYER:-0}

log "the naive image: the docker-built image plus a system copy of pip's CUDA/cuDNN"
# Measured, not built (a third multi-GB image does not fit beside the others on a shared
# disk): the naive image is this one plus `cp -a nvidia/*/lib/. /usr/local/cuda/lib64` and
# the same for include/, i.e. plus the bytes of those directories, minus the COPY-wheels
# layer (a naive image installs from an index, it does not keep the wheels).
NVIDIA_BYTES=$(docker run --rm --entrypoint /bin/sh "$TAG:one" -c 'du -scb /usr/local/lib/python3*/dist-packages/nvidia/*/lib /usr/local/lib/python3*/dist-packages/nvidia/*/include 2>/dev/null | tail -n1 | cut -f1')
NAIVE_SIZE=$(( D_SIZE - COPY_LAYER + NVIDIA_BYTES ))
# The first image goes before the rebuild to keep disk use near one image (about 8 GB):
# Docker's rebuild could reuse only FROM and the small pip COPY from it anyway, since the
# wheels COPY changes and every step after it runs again.
docker rmi -f "$TAG:one" >/dev/null
log "docker build: rebuild with $EXTRA_PACKAGE added"
t0=$(now)
docker build -q -t "$TAG:two" "$WORK/ctx2" > /dev/null
D_REBUILD=$(secs "$t0" "$(now)")
docker rmi -f "$TAG:two" >/dev/null

BUILDAH_ROW="| cold build (s) | | buildah: not installed | |"
if command -v buildah >/dev/null; then
    log "buildah bud: cold"
    t0=$(now)
    buildah bud -q --layers=false -t "$TAG:buildah" "$WORK/ctx1" >/dev/null
    B_COLD=$(secs "$t0" "$(now)")
    buildah rmi "$TAG:buildah" >/dev/null 2>&1 || true
    BUILDAH_ROW="| cold build (s) | $CS_COLD | buildah bud: $B_COLD | $(ratio "$CS_COLD" "$B_COLD") |"
fi
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------- table
verdict() { # value op target
    if [ "$(echo "$1 $2 $3" | bc -l)" = 1 ]; then echo "met"; else echo "missed"; fi
}
SIZE_RATIO=$(ratio "$CS_SIZE" "$NAIVE_SIZE")
RSS_MIB=$(echo "$CS_RSS_KIB / 1024" | bc)
mkdir -p "$(dirname "$OUT_MD")"
cat > "$OUT_MD" <<EOF
# Benchmarks: cudastack against what users run today

Produced by \`scripts/bench.sh $RECIPE\` (one command; rerun it to refresh this file).

- Date: $(date -u +"%Y-%m-%d %H:%M UTC")
- Machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(free -g | awk '/Mem:/ {print $2}') GiB RAM, Docker $(docker version -f '{{.Server.Version}}'), storage driver $(docker info -f '{{.Driver}}')
- Load average (1/5/15 min) before: $LOAD_BEFORE, after: $LOAD_AFTER (other builds shared the CPUs; times are wall clock)
- cudastack $("$BIN" --version | cut -d' ' -f2), release build; compression gzip level 6 (the default)
- Inputs shared by both tools: the $(jq '.artifacts | length' "$WORK/recipes/$NAME.lock" 2>/dev/null || echo "") locked wheels of \`$NAME\` (hard links from the cudastack cache) and the same Debian base root filesystem (Docker: \`docker import\` of cudastack's base layer)

| Measure | cudastack | Alternative | Ratio (cudastack / alternative) |
|---|---|---|---|
| cold build (s) | $CS_COLD | docker build: $D_COLD | $(ratio "$CS_COLD" "$D_COLD") |
| cold build, uncompressed layers (\`--compression none\`, for a local \`docker load\`) (s) | $CS_COLD_NONE | docker build: $D_COLD | $(ratio "$CS_COLD_NONE" "$D_COLD") |
$BUILDAH_ROW
| rebuild after adding \`$EXTRA_PACKAGE\` (s) | $CS_REBUILD (rebuilt: $REBUILT) | docker build: $D_REBUILD | $(ratio "$CS_REBUILD" "$D_REBUILD") |
| no-op rebuild (s) | $CS_NOOP ($NOOP_CACHED layers cached) | | |
| image size, uncompressed | $(gib "$CS_SIZE") ($(gib "$CS_SIZE_GZ") gzip) | docker build: $(gib "$D_SIZE") | $(ratio "$CS_SIZE" "$D_SIZE") |
| image size vs the naive image | $(gib "$CS_SIZE") | naive: $(gib "$NAIVE_SIZE") | $SIZE_RATIO |
$PUSH_ROW
| peak RSS of the cold build | $CS_RSS | | |

Targets (issue 9): cold build <= 0.5x docker build: **$(verdict "$(ratio "$CS_COLD" "$D_COLD")" "<=" 0.5)** with gzip layers,
**$(verdict "$(ratio "$CS_COLD_NONE" "$D_COLD")" "<=" 0.5)** with uncompressed ones (docker build compresses nothing);
no-op rebuild < 1 s: **$(verdict "$CS_NOOP" "<" 1)**; image >= 30% smaller than naive: **$(verdict "$SIZE_RATIO" "<=" 0.7)**;
peak RSS < 300 MiB: **$(verdict "$RSS_MIB" "<" 300)**.

## What was run

- cudastack cold: \`cudastack --json build $NAME.yaml --cache-dir FRESH --layout DIR\` under \`/usr/bin/time -v\`,
  FRESH holding only the locked wheels and the staged base rootfs (so base, CUDA, cuDNN, Python
  and config layers are all tarred, gzip-compressed, written to the blob store and audited).
- cudastack rebuild: the same recipe plus \`$EXTRA_PACKAGE\` (recipe \`$NAME2\`), same cache.
- cudastack no-op: the cold command again.
- docker build (legacy builder, as \`docker build\` runs by default on this Docker):
  \`\`\`Dockerfile
$(sed 's/^/  /' "$WORK/ctx1/Dockerfile")
  \`\`\`
  with \`wheels/\` holding the same wheel files. The rebuild runs it with the second recipe's wheels
  (the COPY layer changes, so pip installs everything again).
- naive image: what \`FROM nvidia/cuda:*-cudnn-runtime\` + \`pip install torch\` gives, a system
  CUDA/cuDNN beside pip's own nvidia-* copies: the docker-built image without its COPY-wheels layer
  ($(gib "$COPY_LAYER")) plus the bytes of every \`nvidia/*/lib\` and \`nvidia/*/include\` in it
  ($(gib "$NVIDIA_BYTES"), \`du -scb\` inside the image), which is what copying them to /usr/local/cuda adds.
- the first Docker image is removed before the Docker rebuild (disk); that rebuild could only have
  reused FROM and the pip COPY, since the wheels COPY changes.
- push: \`cudastack push DIR localhost:$PORT/bench:N --json\` to a local \`docker-registry\`, the first
  recipe then the second; \`bytes_uploaded\` of the second against its whole compressed size.
EOF
log "wrote $OUT_MD"
cat "$OUT_MD"
