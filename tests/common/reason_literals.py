#!/usr/bin/python3
"""Finds reasons written as string literals where an error is made.

Usage: reason_literals.py DIR...
Prints every call of WithReason( or WithForeignReason( under the DIRs (.cc and .h
files) whose reason, the last argument, holds a string literal, and exits 1 if there
is any. Reasons are named by their catalogue constant (agent/common/errors.h); a
foreign reason (a peer's, a CUDA error name) is a variable, never a literal.
"""
import os
import re
import sys

CALL = re.compile(r"\b(WithReason|WithForeignReason)\(")


def close_of(text, at):
    """The index of the parenthesis closing the call whose arguments start at `at`,
    and the start of its last top-level argument."""
    depth, last, i, quoted = 1, at, at, None
    while i < len(text):
        c = text[i]
        if quoted:
            if c == "\\":
                i += 1
            elif c == quoted:
                quoted = None
        elif c in "\"'":
            quoted = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i, last
        elif c == "," and depth == 1:
            last = i + 1
        i += 1
    return len(text), last


def literal_reasons(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    for m in CALL.finditer(text):
        end, last = close_of(text, m.end())
        if '"' in text[last:end]:
            line = text.count("\n", 0, m.start()) + 1
            yield line, " ".join(text[m.start():end + 1].split())[:120]


def main(dirs):
    found = 0
    for top in dirs:
        for root, _, files in os.walk(top):
            for name in sorted(files):
                if not name.endswith((".cc", ".h")):
                    continue
                path = os.path.join(root, name)
                for line, call in literal_reasons(path):
                    print(f"{path}:{line}: a literal reason: {call}")
                    found += 1
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
