#!/usr/bin/env python3
"""The longest functions under src/ (brace counting, good enough for rustfmt'd code).

Issue 17 set the bound: none over 150 lines. Usage: python3 scripts/function-lengths.py [DIR]
"""
import re, glob, sys
root = sys.argv[1] if len(sys.argv) > 1 else "src"
res = []
for f in glob.glob(root + "/**/*.rs", recursive=True):
    lines = open(f).read().split("\n")
    for i, l in enumerate(lines):
        m = re.match(r"\s*(pub(\([^)]*\))?\s+)?(async\s+)?(const\s+)?(unsafe\s+)?fn\s+(\w+)", l)
        if not m:
            continue
        depth = 0; started = False; j = i
        while j < len(lines):
            s = re.sub(r'"([^"\\]|\\.)*"', '""', lines[j])
            s = re.sub(r"'([^'\\]|\\.)'", "''", s).split("//")[0]
            if ";" in s and not started and "{" not in s:
                break
            depth += s.count("{") - s.count("}")
            if "{" in s:
                started = True
            if started and depth <= 0:
                break
            j += 1
        if started:
            res.append((j - i + 1, f, m.group(6), i + 1))
res.sort(reverse=True)
for r in res[:30]:
    print(*r)
print("over 150:", sum(r[0] > 150 for r in res), " over 120:", sum(r[0] > 120 for r in res), " over 80:", sum(r[0] > 80 for r in res))
