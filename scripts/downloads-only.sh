#!/usr/bin/env bash
# Make DEST a cache holding only the downloads of the warm cache WARM, as hard links: every
# blob no layer entry names, and the wheel links and integrity records beside them. A build
# on it stages every tree and writes every layer, without downloading (the benchmarks').
#
# Usage: scripts/downloads-only.sh WARM DEST   (DEST must not exist; same filesystem as WARM)
set -euo pipefail
warm=${1:?usage: scripts/downloads-only.sh WARM DEST}
dest=${2:?usage: scripts/downloads-only.sh WARM DEST}
python3 - "$warm" "$dest" <<'PY'
import glob, json, os, sys
warm, dest = sys.argv[1], sys.argv[2]
layers = set()
for entry in glob.glob(f"{warm}/layers/*.json"):
    try:
        layers.add(json.load(open(entry))["digest"].split(":")[1])
    except (ValueError, KeyError):
        pass
os.makedirs(f"{dest}/blobs/sha256")
for hex in os.listdir(f"{warm}/blobs/sha256"):
    if hex not in layers:
        os.link(f"{warm}/blobs/sha256/{hex}", f"{dest}/blobs/sha256/{hex}")
PY
for dir in wheels apt-verified verified; do
    [ -d "$warm/$dir" ] && cp -al "$warm/$dir" "$dest/$dir"
done
exit 0
