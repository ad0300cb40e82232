#!/usr/bin/env python3
"""How long pulling an image takes, from its compressed layer sizes alone (issue 21, "no layer
much larger than needed for parallel pulls"). Used to decide where docs/build.md cuts layers.

The model is how Docker and containerd pull: at most SLOTS layers download at once, started in
image order (Docker's `max-concurrent-downloads` is 3); each connection gets at most CONN MB/s
and all share a LINK of MB/s; a layer is unpacked once it is downloaded and the layer below it
is unpacked (an unpacked layer is keyed by its chain ID, so layers apply in order), at UNPACK
MB/s of compressed input. It prints when the downloads end and when the last layer is unpacked.

    scripts/pull-model.py LAYOUT [REF]              the sizes of an OCI layout's image
    scripts/pull-model.py --sizes 30,1171,670,...   sizes in MB
    --split I:PARTS   replace layer I (0-based) by PARTS equal layers (what-if)
"""
import argparse
import json
import os


def layout_sizes(layout, ref):
    """The compressed layer sizes (MB) of `ref` in an OCI layout."""
    def blob(digest):
        algorithm, hex_digest = digest.split(":")
        with open(os.path.join(layout, "blobs", algorithm, hex_digest)) as f:
            return json.load(f)

    with open(os.path.join(layout, "index.json")) as f:
        index = json.load(f)
    for descriptor in index["manifests"]:
        if descriptor.get("annotations", {}).get("org.opencontainers.image.ref.name") == ref:
            manifest = blob(descriptor["digest"])
            return [layer["size"] / 1e6 for layer in manifest["layers"]]
    raise SystemExit(f"{layout} has no image named {ref!r}: see its index.json")


def pull(sizes, slots, conn, link, unpack, step=0.01):
    """(seconds until every layer is downloaded, seconds until the last is unpacked)."""
    pending, active, left, done, now = list(range(len(sizes))), [], {}, {}, 0.0
    while pending or active:
        while pending and len(active) < slots:
            layer = pending.pop(0)
            active.append(layer)
            left[layer] = sizes[layer]
        rate = min(conn, link / len(active))
        now += step
        for layer in list(active):
            left[layer] -= rate * step
            if left[layer] <= 0:
                active.remove(layer)
                done[layer] = now
    unpacked = 0.0
    for layer, size in enumerate(sizes):
        unpacked = max(unpacked, done[layer]) + size / unpack
    return max(done.values()), unpacked


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layout", nargs="?")
    parser.add_argument("ref", nargs="?", default="latest")
    parser.add_argument("--sizes", help="comma-separated compressed sizes in MB")
    parser.add_argument("--split", help="I:PARTS, replace layer I by PARTS equal layers")
    parser.add_argument("--unpack", type=float, default=150.0, help="MB/s (default 150)")
    args = parser.parse_args()
    if args.sizes:
        sizes = [float(s) for s in args.sizes.split(",")]
    elif args.layout:
        sizes = layout_sizes(args.layout, args.ref)
    else:
        parser.error("give an OCI layout or --sizes")
    if args.split:
        index, parts = (int(x) for x in args.split.split(":"))
        sizes[index:index + 1] = [sizes[index] / parts] * parts
    print("layers (MB):", ", ".join(f"{s:.0f}" for s in sizes))
    print("conn MB/s  link MB/s  slots  downloaded s  unpacked s")
    for conn, link in [(40, 1000), (40, 80), (100, 1000), (1000, 1000)]:
        for slots in (3, 10):
            downloaded, unpacked = pull(sizes, slots, conn, link, args.unpack)
            print(f"{conn:9} {link:10} {slots:6} {downloaded:13.1f} {unpacked:11.1f}")


if __name__ == "__main__":
    main()
