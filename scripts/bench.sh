#!/usr/bin/env bash
# cudastack against what users run today, side by side in one run, on the same inputs (issue 21):
#
#   1. default build (gzip OCI layout, ready to push)  vs  docker build (legacy builder)
#                                                       vs  buildah bud + buildah push oci: (when installed)
#   2. build --load (into the Docker daemon)            vs  docker build
#   3. build --push (to a local registry)               vs  docker build + docker push
#   4. cold build from an empty cache, downloads and    vs  downloading the same files alone (curl,
#      the Debian base included                             8 at a time)
#   5. rebuild after adding one package, and after changing one code file: seconds, and the
#      bytes the push after it uploads against the image's size
#   6. cudastack pull                                    vs  skopeo copy (to an OCI layout), docker pull
#   7. peak RSS of every cudastack command; the cache's size on disk per image
#   (cudastack builds run with --no-verify: docker build verifies nothing either; no-op rebuild
#   and image size rows are kept from issue 9)
#
# Inputs both tools share: the wheels of the recipe's lock (from the cudastack blob cache,
# hard-linked into the Docker build context), the recipe's code directory (COPY / `copy:`), and the
# base root filesystem (cudastack's own staged mmdebstrap tree; Docker gets the same tree through
# `docker import` of cudastack's base layer). cudastack's "cold" builds (rows 1-3) start from a
# fresh cache dir holding only those inputs: every layer is tarred, compressed and audited from
# scratch; row 4 starts from an empty one.
#
# Usage: scripts/bench.sh [RECIPE]      (default recipes/torch2.4.1-cu121-py3.11.yaml)
# Env:   BENCH_DIR (scratch, default /tmp/cudastack-bench-stack), BENCH_OUT (default
#        docs/benchmarks.md), CUDASTACK_BIN (default target/release/cudastack, built if
#        missing), CUDASTACK_CACHE_DIR (the warm cache, default ~/.cache/cudastack),
#        BENCH_REGISTRY_PORT (default 5055), BENCH_KEEP=1 keeps the scratch dir.
# Needs: docker (daemon running), docker-registry, skopeo, jq, bc, curl, /usr/bin/time; about
# 30 GB free. Everything it creates (Docker images tagged cudastack-bench* or pulled from the
# bench registry, the registry process, the scratch dir) is removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
RECIPE=${1:-recipes/torch2.4.1-cu121-py3.11.yaml}
WORK=${BENCH_DIR:-/tmp/cudastack-bench-stack}
OUT_MD=${BENCH_OUT:-docs/benchmarks.md}
MAIN_CACHE=${CUDASTACK_CACHE_DIR:-$HOME/.cache/cudastack}
BIN=${CUDASTACK_BIN:-target/release/cudastack}
PORT=${BENCH_REGISTRY_PORT:-5055}
REG=localhost:$PORT
EXTRA_PACKAGE=pyyaml==6.0.2
PIP_VERSION=24.2
TAG=cudastack-bench

log() { echo "[bench $(date -u +%H:%M:%S)] $*" >&2; }
die() { log "error: $*"; exit 1; }
ratio() { if [ -n "$1" ] && [ -n "$2" ] && [ "$(echo "$2 > 0" | bc -l)" = 1 ]; then echo "$1 / $2" | bc -l | xargs printf '%.2f'; else echo "n/a"; fi; }
sum() { echo "$1 + $2" | bc -l | xargs printf '%.1f'; }
gib() { echo "$1 / 1073741824" | bc -l | xargs printf '%.2f GiB'; }
mib() { echo "$1 / 1048576" | bc -l | xargs printf '%.1f MiB'; }
pct() { echo "100 * $1 / $2" | bc -l | xargs printf '%.2f%%'; }
verdict() { if [ "$(echo "$1 $2 $3" | bc -l)" = 1 ]; then echo "met"; else echo "missed"; fi; }

for tool in docker jq bc curl skopeo docker-registry; do command -v $tool >/dev/null || die "$tool is not installed"; done
[ -x /usr/bin/time ] || die "/usr/bin/time is not installed (apt-get install time)"
docker info >/dev/null 2>&1 || die "the Docker daemon is not running (dockerd &)"
if [ ! -x "$BIN" ]; then
    log "building $BIN"
    cargo build --release --quiet
fi
BIN=$(realpath "$BIN")

# timed NAME CMD...: run CMD under /usr/bin/time; SECS[NAME] and RSS[NAME] (MiB) hold the figures.
declare -A SECS RSS
timed() { # returns CMD's status
    local name=$1 status=0; shift
    /usr/bin/time -f '%e %M' -o "$WORK/$name.time" "$@" || status=$?
    SECS[$name]=$(cut -d' ' -f1 "$WORK/$name.time" | tail -n1 | xargs printf '%.1f')
    RSS[$name]=$(( $(cut -d' ' -f2 "$WORK/$name.time" | tail -n1) / 1024 ))
    log "$name: ${SECS[$name]} s, peak RSS ${RSS[$name]} MiB (status $status)"
    return $status
}

REGISTRY_PID=
start_registry() { # storage dir: a registry with nothing in it
    stop_registry
    rm -rf "$1"; mkdir -p "$1"
    cat > "$WORK/registry.yml" <<EOF
version: 0.1
storage: { filesystem: { rootdirectory: $1 }, delete: { enabled: true } }
http: { addr: 127.0.0.1:$PORT }
log: { level: error }
EOF
    docker-registry serve "$WORK/registry.yml" > "$WORK/registry.log" 2>&1 &
    REGISTRY_PID=$!
    for _ in $(seq 50); do curl -sf "http://127.0.0.1:$PORT/v2/" >/dev/null && return; sleep 0.2; done
    die "docker-registry did not start: $(cat "$WORK/registry.log")"
}
stop_registry() { if [ -n "$REGISTRY_PID" ]; then kill "$REGISTRY_PID" 2>/dev/null || true; wait "$REGISTRY_PID" 2>/dev/null || true; REGISTRY_PID=; fi; }
remove_images() { # every image the bench made but the imported base (`all`: that too)
    local keep="^$TAG-base:"
    [ "${1:-}" = all ] && keep='^$'
    for image in $(docker images --format '{{.Repository}}:{{.Tag}}' | grep -E "^($TAG|$REG/)" | grep -vE "$keep" || true); do
        docker rmi -f "$image" >/dev/null 2>&1 || true
    done
}
cleanup() {
    stop_registry
    remove_images all
    docker builder prune -f >/dev/null 2>&1 || true
    if [ -z "${BENCH_KEEP:-}" ]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT
rm -rf "$WORK"
mkdir -p "$WORK/recipes/code"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------- inputs (not timed)
NAME=$(basename "$RECIPE" .yaml)
NAME2=$NAME-plus1
R1=$WORK/recipes/$NAME.yaml
R2=$WORK/recipes/$NAME2.yaml
# The team's code: a training script copied last (`copy:`; COPY in the Dockerfile). `copy:`
# shapes only the image, so the shipped lock stays fresh.
cat > "$WORK/recipes/code/train.py" <<'EOF'
import torch

model = torch.nn.Linear(16, 1)
print("parameters:", sum(p.numel() for p in model.parameters()))
EOF
{ cat "$RECIPE"; echo 'copy: [{src: code, dst: /workspace}]'; } > "$R1"
cp "${RECIPE%.yaml}.lock" "$WORK/recipes/$NAME.lock"
# The second recipe: the same stack plus one package.
sed -e "s/^name: .*/name: $NAME2/" "$R1" > "$R2"
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

# Where a locked artifact's bytes are: the main cache, or (the second recipe's extra wheels)
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

# A fresh cache: the locked artifacts and the staged base rootfs, nothing else.
seed_cache() { # dir
    rm -rf "$1"
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

# Docker build contexts: the same wheel files under their wheel names, the code, plus pip itself
# (the base has python3 but no pip, as cudastack's installer needs none).
PIP_DIR=${TMPDIR:-/tmp}/cudastack-bench-pip
if ! ls "$PIP_DIR"/pip-$PIP_VERSION-*.whl >/dev/null 2>&1; then
    python3 -m pip download -q --no-deps --only-binary=:all: -d "$PIP_DIR" "pip==$PIP_VERSION"
fi
PIP_WHEEL=$(basename "$(ls "$PIP_DIR"/pip-$PIP_VERSION-*.whl)")
make_context() { # lock, dir
    mkdir -p "$2/wheels"
    jq -r '.artifacts[] | select(.filename | endswith(".whl")) | "\(.sha256 | sub("^sha256:"; "")) \(.filename)"' "$1" | while read -r hex file; do
        ln "$(blob "$1" "$hex")" "$2/wheels/$file"
    done
    cp "$PIP_DIR/$PIP_WHEEL" "$2/$PIP_WHEEL"
    cp -r "$WORK/recipes/code" "$2/code"
    cat > "$2/Dockerfile" <<EOF
FROM $TAG-base:latest
COPY $PIP_WHEEL /tmp/$PIP_WHEEL
COPY wheels/ /wheels/
RUN python3 /tmp/$PIP_WHEEL/pip install --no-index --no-deps --break-system-packages --root-user-action=ignore --disable-pip-version-check /wheels/*.whl
COPY code/ /workspace/
EOF
}
make_context "$WORK/recipes/$NAME.lock" "$WORK/ctx1"

# ---------------------------------------------------------------- 1, 5, 7: default build, rebuilds
start_registry "$WORK/registry"
log "1. cudastack: cold build of $NAME (gzip layout)"
timed cold "$BIN" --json build "$R1" --no-verify --cache-dir "$WORK/cache" --layout "$WORK/img1" > "$WORK/cold.json"
CACHE_BYTES=$(du -sb "$WORK/cache" | cut -f1)
CACHE_KINDS=$(for kind in blobs staging layers; do printf '%s %s' "$kind" "$(gib "$(du -sb "$WORK/cache/$kind" | cut -f1)")"; done | sed 's/GiB\([a-z]\)/GiB, \1/g')
log "cold: ${SECS[cold]} s, peak RSS ${RSS[cold]} MiB, cache $(gib "$CACHE_BYTES")"

log "cudastack: no-op rebuild"
timed noop "$BIN" --json build "$R1" --no-verify --cache-dir "$WORK/cache" --layout "$WORK/img1" > "$WORK/noop.json"
NOOP_CACHED=$(jq '[.layers[] | select(.cached)] | length' "$WORK/noop.json")/$(jq '.layers | length' "$WORK/noop.json")

log "5. push of the first image, then rebuild + push after adding $EXTRA_PACKAGE"
timed push1 "$BIN" push "$WORK/img1" "$REG/bench:1" --json > "$WORK/push1.json"
timed add "$BIN" --json build "$R2" --no-verify --cache-dir "$WORK/cache" --layout "$WORK/img2" > "$WORK/add.json"
ADD_REBUILT=$(jq -r '[.layers[] | select(.cached | not) | .name] | join(", ")' "$WORK/add.json")
timed push_add "$BIN" push "$WORK/img2" "$REG/bench:2" --json > "$WORK/push-add.json"
log "5. rebuild + push after changing one code file"
echo 'print("one more line")' >> "$WORK/recipes/code/train.py"
timed code "$BIN" --json build "$R1" --no-verify --cache-dir "$WORK/cache" --layout "$WORK/img1" > "$WORK/code.json"
CODE_REBUILT=$(jq -r '[.layers[] | select(.cached | not) | .name] | join(", ")' "$WORK/code.json")
timed push_code "$BIN" push "$WORK/img1" "$REG/bench:1" --json > "$WORK/push-code.json"

# The layer media types of a layout's images (not of the referrers stored beside them: SBOMs,
# provenance, which have artifact types).
layer_media() { # layout dir
    local manifest
    for manifest in $(jq -r '.manifests[] | select(.artifactType == null) | .digest | sub("^sha256:"; "")' "$1/index.json"); do
        jq -r '.layers[]?.mediaType' "$1/blobs/sha256/$manifest"
    done | sort -u | sed 's/^application\/vnd.oci.image.layer.v1.//' | paste -sd, -
}
COLD_MEDIA=$(layer_media "$WORK/img1")
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
IMG2_GZ=$(jq '.size' "$WORK/add.json")
IMG3_GZ=$(jq '.size' "$WORK/code.json")
ADD_BYTES=$(jq '.bytes_uploaded' "$WORK/push-add.json")
CODE_BYTES=$(jq '.bytes_uploaded' "$WORK/push-code.json")
LAYER_SIZES=$(jq -r '[.layers[] | "\(.name) \(.size / 1048576 | floor) MiB"] | join(", ")' "$WORK/cold.json")
BASE_DIGEST=$(jq -r '.layers[] | select(.name == "base") | .digest | sub("^sha256:"; "")' "$WORK/cold.json")
log "importing cudastack's base layer into Docker"
docker import "$WORK/img1/blobs/sha256/$BASE_DIGEST" "$TAG-base:latest" >/dev/null
rm -rf "$WORK/img1" "$WORK/img2" "$WORK/cache"
# Rows 2-6 build the first recipe as it was.
sed -i '$d' "$WORK/recipes/code/train.py"

# ---------------------------------------------------------------- 2. build --load
seed_cache "$WORK/cache"
log "2. cudastack: cold build --load"
timed load "$BIN" --json build "$R1" --no-verify --load --cache-dir "$WORK/cache" --layout "$WORK/img-load" > "$WORK/load.json"
LOAD_MEDIA=$(layer_media "$WORK/img-load")
# The loaded image carries the recipe's tags: it goes, or row 6's docker pull would find it.
for tag in $(jq -r '.tags[]' "$WORK/load.json"); do docker rmi -f "$tag" >/dev/null 2>&1 || true; done
remove_images
rm -rf "$WORK/img-load" "$WORK/cache"

# ---------------------------------------------------------------- 3. build --push
seed_cache "$WORK/cache"
start_registry "$WORK/registry"
log "3. cudastack: cold build --push to an empty registry"
timed bpush "$BIN" --json build "$R1" --no-verify --push "$REG/bench:p" --cache-dir "$WORK/cache" --layout "$WORK/img-push" > "$WORK/bpush.json"
rm -rf "$WORK/img-push" "$WORK/cache"

# ---------------------------------------------------------------- 6. pull
log "6. pulls of $REG/bench:p: cudastack, skopeo, docker"
timed pull_cs "$BIN" -q pull "$REG/bench:p" --layout "$WORK/pull-cs" --cache-dir "$WORK/pull-cache"
rm -rf "$WORK/pull-cs" "$WORK/pull-cache"
timed pull_skopeo skopeo copy -q --src-tls-verify=false "docker://$REG/bench:p" "oci:$WORK/pull-skopeo:p"
rm -rf "$WORK/pull-skopeo"
CONFIG=$(curl -sf -H 'Accept: application/vnd.oci.image.manifest.v1+json' "http://$REG/v2/bench/manifests/p" | jq -r .config.digest)
! docker image inspect "$CONFIG" >/dev/null 2>&1 || die "Docker already has image $CONFIG: its pull would be a no-op"
timed pull_docker docker pull -q "$REG/bench:p"
remove_images

# ---------------------------------------------------------------- 4. empty cache, downloads
log "4. cudastack: build from an empty cache (downloads, Debian base)"
timed empty "$BIN" --json build "$R1" --no-verify --cache-dir "$WORK/empty" --layout "$WORK/img-empty" > "$WORK/empty.json"
rm -rf "$WORK/empty" "$WORK/img-empty"
DOWNLOAD_BYTES=$(jq '[.artifacts[].size] | add' "$WORK/recipes/$NAME.lock")
log "4. curl: the same $(jq '.artifacts | length' "$WORK/recipes/$NAME.lock") files alone, 8 at a time"
mkdir -p "$WORK/curl"
jq -r '.artifacts[] | "\(.url)\n\(.sha256 | sub("^sha256:"; ""))"' "$WORK/recipes/$NAME.lock" > "$WORK/urls"
timed curl sh -c "paste -d' ' - - < '$WORK/urls' | xargs -P 8 -n 2 sh -c 'curl -sfL -o \"$WORK/curl/\$1\" \"\$0\"'"
rm -rf "$WORK/curl"

# ---------------------------------------------------------------- docker (and buildah)
# The Docker image of this stack takes about 8 GB, plus the build context while it builds.
free_gib() { df -BG --output=avail /var/lib/docker 2>/dev/null | tail -n1 | tr -dc 0-9; }
[ "$(free_gib)" -ge 14 ] || die "only $(free_gib) GiB free under /var/lib/docker; the docker build needs about 14"
log "1-3. docker build: cold ($NAME)"
timed dbuild docker build -q -t "$TAG:one" "$WORK/ctx1"
D_SIZE=$(docker image inspect -f '{{.Size}}' "$TAG:one")
COPY_LAYER=$(docker history --no-trunc --format '{{.Size}}\t{{.CreatedBy}}' --human=false "$TAG:one" | awk -F'\t' '/COPY dir:.*wheels|COPY wheels|ADD dir:/ {print $1; exit}')
COPY_LAYER=${COPY_LAYER:-0}
NVIDIA_BYTES=$(docker run --rm --entrypoint /bin/sh "$TAG:one" -c 'du -scb /usr/local/lib/python3*/dist-packages/nvidia/*/lib /usr/local/lib/python3*/dist-packages/nvidia/*/include 2>/dev/null | tail -n1 | cut -f1')
NAIVE_SIZE=$(( D_SIZE - COPY_LAYER + NVIDIA_BYTES ))
start_registry "$WORK/registry"
log "3. docker push to an empty registry"
docker tag "$TAG:one" "$REG/dbench:1"
timed dpush docker push -q "$REG/dbench:1"
remove_images
stop_registry
rm -rf "$WORK/registry"

BUILDAH_ROW="| 1 | default build (s) | | buildah: not installed | | |"
if command -v buildah >/dev/null; then
    buildah pull -q "docker-daemon:$TAG-base:latest" >/dev/null
    log "1. buildah bud + buildah push oci:"
    # buildah keeps its own copy of every layer: it needs about 25 GB free here. A failure
    # (a full disk) is a row that says so, not the end of the benchmark.
    if timed buildah sh -c "buildah bud -q --layers=false -t '$TAG:buildah' '$WORK/ctx1' >/dev/null 2>'$WORK/buildah.err' && buildah push -q '$TAG:buildah' 'oci:$WORK/buildah-oci:one' >/dev/null 2>>'$WORK/buildah.err'"; then
        BUILDAH_ROW="| 1 | default build (s) | ${SECS[cold]} | buildah bud + buildah push oci: ${SECS[buildah]} | $(ratio "${SECS[cold]}" "${SECS[buildah]}") | |"
    else
        BUILDAH_ROW="| 1 | default build (s) | ${SECS[cold]} | buildah bud + buildah push oci: failed ($(grep -o 'no space left on device' "$WORK/buildah.err" | head -n1 || tail -c 120 "$WORK/buildah.err")) | | |"
    fi
    buildah rmi -f "$TAG:buildah" "$TAG-base:latest" >/dev/null 2>&1 || true
    buildah rm -a >/dev/null 2>&1 || true
    rm -rf "$WORK/buildah-oci"
fi
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------- table
D_PUSHED=$(sum "${SECS[dbuild]}" "${SECS[dpush]}")
MAX_RSS=0
for name in cold noop push1 add push_add code push_code load bpush pull_cs empty; do
    [ "${RSS[$name]}" -gt "$MAX_RSS" ] && MAX_RSS=${RSS[$name]}
done
SIZE_RATIO=$(ratio "$CS_SIZE" "$NAIVE_SIZE")
R1_RATIO=$(ratio "${SECS[cold]}" "${SECS[dbuild]}")
R2_RATIO=$(ratio "${SECS[load]}" "${SECS[dbuild]}")
R3_RATIO=$(ratio "${SECS[bpush]}" "$D_PUSHED")
R4_RATIO=$(ratio "${SECS[empty]}" "${SECS[curl]}")
PULL_BEST=$(printf '%s\n%s\n' "${SECS[pull_skopeo]}" "${SECS[pull_docker]}" | sort -g | head -n1)
mkdir -p "$(dirname "$OUT_MD")"
cat > "$OUT_MD" <<EOF
# Benchmarks: cudastack against what users run today

Produced by \`scripts/bench.sh $RECIPE\` (one command; every row comes from the same run; rerun it
to refresh this file).

- Date: $(date -u +"%Y-%m-%d %H:%M UTC")
- Machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(free -g | awk '/Mem:/ {print $2}') GiB RAM, Docker $(docker version -f '{{.Server.Version}}'), storage driver $(docker info -f '{{.Driver}}'), skopeo $(skopeo --version | cut -d' ' -f3)
- Load average (1/5/15 min) before: $LOAD_BEFORE, after: $LOAD_AFTER (times are wall clock)
- cudastack $("$BIN" --version | cut -d' ' -f2), release build, default compression (layers: $COLD_MEDIA)
- Inputs shared by every tool: the $(jq '[.artifacts[] | select(.filename | endswith(".whl"))] | length' "$WORK/recipes/$NAME.lock") locked wheels of \`$NAME\` (hard links from the cudastack cache), a code directory copied last, and the same Debian base root filesystem (Docker: \`docker import\` of cudastack's base layer)

| # | Measure | cudastack | Alternative | Ratio | Goal |
|---|---|---|---|---|---|
| 1 | default build: registry-ready gzip OCI layout (s) | ${SECS[cold]} | docker build: ${SECS[dbuild]} | $R1_RATIO | <= 0.5: **$(verdict "$R1_RATIO" "<=" 0.5)** |
$BUILDAH_ROW
| 2 | \`build --load\` into the Docker daemon (s) | ${SECS[load]} (layers: $LOAD_MEDIA) | docker build: ${SECS[dbuild]} | $R2_RATIO | <= 0.3: **$(verdict "$R2_RATIO" "<=" 0.3)** |
| 3 | \`build --push\` to a local registry (s) | ${SECS[bpush]} | docker build + docker push: ${SECS[dbuild]} + ${SECS[dpush]} = $D_PUSHED | $R3_RATIO | <= 0.35: **$(verdict "$R3_RATIO" "<=" 0.35)** |
| 4 | build from an empty cache, downloads included (s) | ${SECS[empty]} | the same $(gib "$DOWNLOAD_BYTES") downloaded alone (curl, 8 at a time): ${SECS[curl]} | $R4_RATIO | <= 2: **$(verdict "$R4_RATIO" "<=" 2)** |
| 5a | rebuild after adding \`$EXTRA_PACKAGE\` (s) | ${SECS[add]} (rebuilt: $ADD_REBUILT) | | | <= 10 s: **$(verdict "${SECS[add]}" "<=" 10)** |
| 5a | push after it: bytes uploaded | $(mib "$ADD_BYTES") of $(mib "$IMG2_GZ") ($(pct "$ADD_BYTES" "$IMG2_GZ")) in ${SECS[push_add]} s | | | <= 5%: **$(verdict "$ADD_BYTES / $IMG2_GZ" "<=" 0.05)** |
| 5b | rebuild after changing one code file (s) | ${SECS[code]} (rebuilt: $CODE_REBUILT) | | | <= 10 s: **$(verdict "${SECS[code]}" "<=" 10)** |
| 5b | push after it: bytes uploaded | $(mib "$CODE_BYTES") of $(mib "$IMG3_GZ") ($(pct "$CODE_BYTES" "$IMG3_GZ")) in ${SECS[push_code]} s | | | <= 5%: **$(verdict "$CODE_BYTES / $IMG3_GZ" "<=" 0.05)** |
| 6 | pull from the local registry (s) | ${SECS[pull_cs]} (\`cudastack pull\` to a layout) | skopeo copy to oci: ${SECS[pull_skopeo]}; docker pull: ${SECS[pull_docker]} | $(ratio "${SECS[pull_cs]}" "$PULL_BEST") (vs the faster) | faster than both: **$(verdict "${SECS[pull_cs]}" "<" "$PULL_BEST")** |
| 7 | peak RSS, largest of every cudastack command above (MiB) | $MAX_RSS | | | < 200: **$(verdict "$MAX_RSS" "<" 200)** |
| 7 | cache on disk after the default build (one image) | $(gib "$CACHE_BYTES") ($CACHE_KINDS) | | | |
| | no-op rebuild (s) | ${SECS[noop]} ($NOOP_CACHED layers cached) | | | < 1 s: **$(verdict "${SECS[noop]}" "<" 1)** |
| | image size, uncompressed | $(gib "$CS_SIZE") ($(gib "$CS_SIZE_GZ") compressed) | docker build: $(gib "$D_SIZE"); naive: $(gib "$NAIVE_SIZE") | $SIZE_RATIO (vs naive) | <= 0.7: **$(verdict "$SIZE_RATIO" "<=" 0.7)** |

Peak RSS (MiB) per command: default build ${RSS[cold]}, no-op ${RSS[noop]}, push ${RSS[push1]}, rebuilds ${RSS[add]} / ${RSS[code]},
pushes after them ${RSS[push_add]} / ${RSS[push_code]}, \`--load\` ${RSS[load]}, \`--push\` ${RSS[bpush]}, pull ${RSS[pull_cs]}, empty cache ${RSS[empty]}.
Layers of the default build (compressed): $LAYER_SIZES.

## What was run

- 1: \`cudastack --json build $NAME.yaml --no-verify --cache-dir FRESH --layout DIR\`, FRESH holding only
  the locked artifacts and the staged base rootfs (so every layer is tarred, compressed, written to the
  blob store and audited). docker build (legacy builder, as \`docker build\` runs by default on this Docker):
  \`\`\`Dockerfile
$(sed 's/^/  /' "$WORK/ctx1/Dockerfile")
  \`\`\`
  with \`wheels/\` holding the same wheel files and \`code/\` the same code.
- 2: the same cold build with \`--load\` (the image ends in the Docker daemon, tagged).
- 3: the same cold build with \`--push $REG/bench:p\` to an empty \`docker-registry\`; docker: \`docker push\` of the
  docker-built image to an empty registry, after the docker build.
- 4: \`cudastack build\` with an empty \`--cache-dir\`: downloads every locked wheel and .deb, stages the Debian base
  with mmdebstrap, builds; against \`curl\` of the lock's $(jq '.artifacts | length' "$WORK/recipes/$NAME.lock") URLs, 8 at a time.
- 5: on the cache of 1, after \`cudastack push\` of 1: the recipe plus \`$EXTRA_PACKAGE\` (locked beforehand), then
  one line appended to the code file; each followed by \`cudastack push\` to the same registry.
- 6: \`cudastack pull $REG/bench:p --layout DIR\` (fresh cache), \`skopeo copy docker://$REG/bench:p oci:DIR:p\`,
  \`docker pull $REG/bench:p\` (which also unpacks into the daemon's store).
- naive image: what \`FROM nvidia/cuda:*-cudnn-runtime\` + \`pip install torch\` gives, a system
  CUDA/cuDNN beside pip's own nvidia-* copies: the docker-built image without its COPY-wheels layer
  ($(gib "$COPY_LAYER")) plus the bytes of every \`nvidia/*/lib\` and \`nvidia/*/include\` in it ($(gib "$NVIDIA_BYTES")).
EOF
log "wrote $OUT_MD"
cat "$OUT_MD"
