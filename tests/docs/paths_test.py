#!/usr/bin/env python3
"""Checks that the docs name the tree as it is.

(a) docs/HACKING.md's folder map (its "## Folder map" section) names every top-level
    and second-level folder that holds a tracked file, as `folder` or `folder/`.
(b) Every repo path that a doc (*.md) or a C++, proto, Python or shell comment writes
    (a word that starts with a top-level folder: agent/, services/, ...) exists.
    Placeholders match anything in one path segment: `<word>`, `*`, `NN`; `{a,b}`
    means either. docs/bench/** (raw logs, diffs) is not read.
(c) Every relative markdown link [text](target) of a doc resolves to a file or folder.

Usage: paths_test.py [SOURCE_DIR]. Exit 0 when all hold, 1 with one line per miss.
Reads only the tree (git ls-files); needs no build.
"""
import fnmatch
import itertools
import os
import re
import subprocess
import sys

ROOTS = ("agent", "services", "clients", "tools", "tests", "scripts", "deploy", "docs",
         "api", "cmake", "examples", "dashboards")
# A word that starts with a top-level folder and a slash, not inside another path
# (build/agent/..., ../docs/..., a URL) or a word (subagent/).
PATH_RE = re.compile(r"(?<![\w./~$-])(?:%s)/[\w.\-/<>*{},]*" % "|".join(ROOTS))
LINK_RE = re.compile(r"\]\(([^)\s]+)\)")
COMMENT = {".h": "//", ".cc": "//", ".cu": "//", ".proto": "//", ".py": "#", ".sh": "#"}
NOT_READ = ("docs/bench/", "tests/fuzz/corpus/")


def tracked(root):
    """The tree's files: git's tracked and not-ignored ones; outside a git checkout
    (an exported tree), every file but build outputs and hidden folders."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], check=True, capture_output=True).stdout
        return [f for f in out.decode().split("\0")
                if f and os.path.lexists(os.path.join(root, f))]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for here, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if not d.startswith((".git", "build", "__pycache__"))
                       and not (here == root and d.startswith(".") and d != ".ci")]
            links = [d for d in dirs if os.path.islink(os.path.join(here, d))]  # as git
            files += [os.path.relpath(os.path.join(here, n), root) for n in names + links]
        return files


def folders_of(files, root):
    """Every folder that holds a file, and every link to a folder."""
    dirs = {f for f in files if os.path.isdir(os.path.join(root, f))}
    for f in files:
        parts = f.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    return dirs


def map_section(text):
    m = re.search(r"^## Folder map\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    return m.group(1) if m else ""


def expand_braces(path):
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return list(itertools.chain.from_iterable(
        expand_braces(path[:m.start()] + alt + path[m.end():])
        for alt in m.group(1).split(",")))


def exists(path, names, root, here):
    """True when `path` is in the tree: a file or folder, a pattern matching one, the
    same relative to the folder `here` of the file that names it, or a build target
    (no extension) that its folder's CMakeLists.txt declares."""
    path = path.split("#")[0].rstrip("/")
    if path in names or (here and os.path.join(here, path) in names):
        return True
    folder, base = os.path.split(path)
    cmake = os.path.join(root, folder, "CMakeLists.txt")
    if "." not in base and os.path.exists(cmake) and re.search(
            r"\b%s\b" % re.escape(base), open(cmake).read()):
        return True
    patterns = [re.sub(r"<[^>/]*>|\bNN\b", "*", p) for p in expand_braces(path)]
    return all(any("*" in p and fnmatch.fnmatchcase(n, p) or n == p for n in names)
               for p in patterns)


def paths_in(text):
    for m in PATH_RE.finditer(text):
        word = m.group(0).rstrip(".,:;")
        if "{" in word and "}" not in word:  # a brace that the line broke
            word = word[:word.index("{")]
        yield word


def comments(path, text):
    ext = os.path.splitext(path)[1]
    if path.endswith(".md"):
        return text
    marker = COMMENT.get(ext)
    if marker is None and text.startswith("#!") and "sh" in text.split("\n", 1)[0]:
        marker = "#"
    if marker is None:
        return ""
    return "\n".join(line.split(marker, 1)[1] for line in text.splitlines()
                     if marker in line)


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), "..", ".."))
    files = tracked(root)
    dirs = folders_of(files, root)
    names = set(files) | dirs
    for link in [d for d in dirs if os.path.islink(os.path.join(root, d))]:
        target = os.path.relpath(os.path.realpath(os.path.join(root, link)), root)
        names |= {link + n[len(target):] for n in names if n.startswith(target + "/")}
    misses = []

    hacking = os.path.join(root, "docs", "HACKING.md")
    folder_map = map_section(open(hacking).read()) if os.path.exists(hacking) else ""
    if not folder_map:
        misses.append("docs/HACKING.md: no '## Folder map' section")
    for d in sorted(d for d in dirs if d.count("/") <= 1 and not d.startswith("docs/bench/")):
        if "`%s`" % d not in folder_map and "`%s/`" % d not in folder_map:
            misses.append("docs/HACKING.md: the folder map does not name %s/" % d)

    for f in sorted(files):
        if f.startswith(NOT_READ) or os.path.islink(os.path.join(root, f)):
            continue
        if os.path.isdir(os.path.join(root, f)):
            continue
        try:
            text = open(os.path.join(root, f), encoding="utf-8").read()
        except (UnicodeDecodeError, IsADirectoryError):
            continue
        for n, line in enumerate(comments(f, text).splitlines() if f.endswith(".md")
                                 else [comments(f, text)], 1):
            for p in paths_in(line):
                if not exists(p, names, root, os.path.dirname(f)):
                    where = "%s:%d" % (f, n) if f.endswith(".md") else f
                    misses.append("%s: names %s, which is not in the tree" % (where, p))
        if f.endswith(".md"):
            base = os.path.dirname(f)
            for n, line in enumerate(text.splitlines(), 1):
                for target in LINK_RE.findall(line):
                    if re.match(r"[a-z]+:|#|/", target):
                        continue
                    rel = os.path.normpath(os.path.join(base, target.split("#")[0]))
                    if rel not in names:
                        misses.append("%s:%d: links to %s, which is not in the tree"
                                      % (f, n, target))

    for m in misses:
        print(m)
    print("%d files read, %d misses" % (len(files), len(misses)))
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
