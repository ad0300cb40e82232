#!/usr/bin/env bash
# Print the Docker image ID (the config digest) of an OCI layout's image named REF
# (default `latest`): what `docker rmi` takes to remove that image once loaded.
#
# Usage: scripts/layout-image-id.sh LAYOUT [REF]
set -euo pipefail
python3 - "${1:?usage: scripts/layout-image-id.sh LAYOUT [REF]}" "${2:-latest}" <<'PY'
import json, sys
layout, ref = sys.argv[1], sys.argv[2]
entries = json.load(open(f"{layout}/index.json"))["manifests"]
entry = next(e for e in entries
             if e.get("annotations", {}).get("org.opencontainers.image.ref.name") == ref)
manifest = json.load(open(f"{layout}/blobs/sha256/" + entry["digest"].split(":")[1]))
print(manifest["config"]["digest"])
PY
