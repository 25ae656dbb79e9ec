#!/usr/bin/env python3
"""Do a .deb's declared Depends cover what its binaries load?

  deps_cover.py DEB ROOT [--without PKG]...

ROOT is the .deb unpacked (dpkg-deb -x). Every library `ldd` resolves for each ELF
file under ROOT/usr/bin is mapped to its Debian package (dpkg -S); each package must
be declared in Depends or be pulled in by one declared (the installed packages'
dependencies, followed to the end): ldd lists a library's own libraries too. Every
declared dependency must also hold on this machine (installed, version relation
true), or the package would not install where it was built. --without drops a
declared dependency, to show the check catches a missing one. Exit 1 on a gap.
"""
import re
import subprocess
import sys
from pathlib import Path


def run(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def declared(deb: str) -> list[list[tuple[str, str, str]]]:
    """Depends as alternatives of (name, relation, version)."""
    field = run("dpkg-deb", "-f", deb, "Depends").strip()
    groups = []
    for group in filter(None, (g.strip() for g in field.split(","))):
        alts = []
        for alt in group.split("|"):
            m = re.fullmatch(r"\s*([a-z0-9][a-z0-9+.-]+)(?::\w+)?\s*(?:\((<<|<=|=|>=|>>)\s*([^)]+)\))?\s*", alt)
            if not m:
                sys.exit(f"deps_cover: cannot read dependency '{alt}'")
            alts.append((m.group(1), m.group(2) or "", (m.group(3) or "").strip()))
        groups.append(alts)
    return groups


def installed() -> dict[str, tuple[str, str]]:
    """Every installed package: (version, its Depends and Pre-Depends), in one query."""
    out = run("dpkg-query", "-W",
              "-f=${Package}\t${Status}\t${Version}\t${Depends}, ${Pre-Depends}\n")
    packages = {}
    for line in out.splitlines():
        name, status, version, deps = line.split("\t")
        if status.endswith(" installed"):
            packages[name] = (version, deps)
    return packages


def holds(packages, name: str, relation: str, version: str) -> bool:
    if name not in packages:
        return False
    if not relation:
        return True
    op = {"<<": "lt", "<=": "le", "=": "eq", ">=": "ge", ">>": "gt"}[relation]
    have = packages[name][0]
    return subprocess.run(["dpkg", "--compare-versions", have, op, version]).returncode == 0


def owners(paths: set[str]) -> dict[str, str]:
    """The package holding each path, tried with and without /usr (merged /usr)."""
    variants = {}
    for path in paths:
        for v in {path, str(Path(path).resolve())}:
            variants[v] = path
            variants[v[4:] if v.startswith("/usr/") else "/usr" + v] = path
    out = subprocess.run(["dpkg", "-S", *variants], capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        package, _, held = line.partition(": ")
        if held in variants:
            found[variants[held]] = package.split(",")[0].split(":")[0].strip()
    for path in paths - found.keys():
        sys.exit(f"deps_cover: no package holds {path}")
    return found


def closure(packages, names: set[str]) -> set[str]:
    """`names` and every installed package they depend on, to the end."""
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen or name not in packages:
            continue
        seen.add(name)
        for group in packages[name][1].split(","):
            for alt in group.split("|"):
                m = re.match(r"\s*([a-z0-9][a-z0-9+.-]+)", alt)
                if m:
                    todo.append(m.group(1))
    return seen


def main() -> int:
    deb, root, *rest = sys.argv[1:]
    without = {rest[i + 1] for i, a in enumerate(rest) if a == "--without"}
    groups = [g for g in declared(deb) if not any(name in without for name, _, _ in g)]
    packages = installed()
    failed = False
    for group in groups:
        if not any(holds(packages, *alt) for alt in group):
            print(f"deps_cover: declared {group} does not hold on this machine")
            failed = True
    names = {name for group in groups for name, _, _ in group}
    covered = closure(packages, names)
    loads = []  # (binary, library path)
    for binary in sorted(Path(root, "usr/bin").iterdir()):
        if binary.read_bytes()[:4] != b"\x7fELF":
            continue
        for line in run("ldd", str(binary)).splitlines():
            m = re.search(r"=>\s*(/\S+)", line)
            if m:
                loads.append((binary.name, m.group(1)))
    if not loads:
        sys.exit("deps_cover: ldd found no libraries: no binaries under usr/bin?")
    package_of = owners({path for _, path in loads})
    for binary, path in loads:
        if package_of[path] not in covered:
            print(f"deps_cover: {binary} loads {path} ({package_of[path]}), "
                  "which Depends does not cover")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
