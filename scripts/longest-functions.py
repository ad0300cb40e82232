#!/usr/bin/env python3
"""The longest functions in src/ at a git revision: `scripts/longest-functions.py [REV] [N]`.

A brace-matching scan (a function ends at the first line holding only `}` at its own
indent), good enough to compare revisions for the redesign notes; rustfmt's layout is
what makes it hold.
"""
import io
import re
import subprocess
import sys
import tarfile

rev = sys.argv[1] if len(sys.argv) > 1 else "HEAD"
most = int(sys.argv[2]) if len(sys.argv) > 2 else 5
archive = subprocess.run(["git", "archive", rev, "src"], capture_output=True, check=True).stdout
found = []
with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
    for member in tar.getmembers():
        if not member.name.endswith(".rs"):
            continue
        lines = tar.extractfile(member).read().decode().split("\n")
        for start, line in enumerate(lines):
            head = re.match(r"^(\s*)(pub(\([^)]*\))?\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)", line)
            if not head:
                continue
            indent, end = head.group(1), start
            while end < len(lines) and lines[end].rstrip() != indent + "}":
                end += 1
            found.append((end - start + 1, member.name, head.group(6)))
for length, path, name in sorted(found, reverse=True)[:most]:
    print(length, path, name)
