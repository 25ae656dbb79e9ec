#!/usr/bin/env python3
"""A ratchet on C++ function length (scripts/test.sh, stage lint).

No function in agent/, services/, clients/ or tools/ may be longer than LIMIT lines,
except those in scripts/lint/long_functions.txt, each of which may not grow past its
listed length. The list holds the long functions of the day the check began; it may
only shrink: when one gets shorter (or is split, renamed or deleted), lower or drop
its entry (--update does both; it never adds or raises one).

The rule, measured by a brace-matching scanner, not a compiler:
- Comments, string and character literals (raw strings too) and preprocessor lines
  are blanked first; line numbers are kept.
- A function is a brace block at namespace or class scope whose header (the text
  since the last ';', '{' or '}') has a parenthesised group outside any '=' and does
  not start with namespace/class/struct/union/enum: free functions, member
  functions defined in or out of their class, constructors (brace initialisers in
  the member-initialiser list are part of the header), operators, and TEST-like
  macros. Lambdas and blocks inside a function count towards that function.
- Its length is the count of lines from the line of its opening '{' to the line of
  its closing '}', both included (so a one-line body is 1, `{` + 3 lines + `}` is 5),
  blank and comment lines included.
- Its name is the qualified name before its parameter list (ABSL_* style
  annotations skipped); an entry is `LENGTH PATH NAME`, with `#2`, `#3` appended
  to the later ones of a file's overloads of one name, in file order.

Usage: function_length.py [--update | --init] [--list FILE] [--limit N]
  (no option)  check; exit 1 on a function that grew or a new one over LIMIT
  --update     lower shrunk entries, drop ones under LIMIT or gone; then check
  --init       write the list afresh from the tree (only when the rule changes)
"""
import argparse
import os
import re
import subprocess
import sys

LIMIT = 60
DIRS = ("agent", "services", "clients", "tools")
EXTS = (".cc", ".h", ".cpp", ".hpp", ".cu", ".cuh")
HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
DEFAULT_LIST = os.path.join(HERE, "long_functions.txt")


def blank(text):
    """Comments, literals and preprocessor lines become spaces; newlines stay."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c in " \t":
            out.append(c)
            i += 1
            continue
        if line_start and c == "#":  # a preprocessor line, with its continuations
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append(" \n")
                    i += 2
                    continue
                out.append(" ")
                i += 1
            continue
        line_start = c == "\n"
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and text.startswith('"', i + 1) and not (
                i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 2:j]))
            i = j
        elif c == "'" and is_digit_separator(text, i):
            out.append(c)
            i += 1
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else c)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def is_digit_separator(text, i):
    j = i
    while j > 0 and (text[j - 1].isalnum() or text[j - 1] in "_'."):
        j -= 1
    return j < i and text[j].isdigit()


def matching(code, i, open_c, close_c):
    """The index of the bracket closing the one at i."""
    depth = 0
    for j in range(i, len(code)):
        if code[j] == open_c:
            depth += 1
        elif code[j] == close_c:
            depth -= 1
            if depth == 0:
                return j
    return len(code) - 1


SCOPE_RE = re.compile(r"^(template\s*<.*>\s*)?(inline\s+)?(namespace|class|struct|union|enum)\b|"
                      r'^extern\s*"', re.S)


ACCESS_RE = re.compile(r"^(\s*(public|private|protected)\s*:(?!:))+")


def top_level(header):
    """The header with each (...) group reduced to '()'; operators named plainly."""
    h = re.sub(r"\boperator\s*(\(\)|[^\s(]+)", "operator_", header)
    out, depth = [], 0
    for c in h:
        if c == "(":
            if depth == 0:
                out.append("(")
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                out.append(")")
        elif depth == 0:
            out.append(c)
    return "".join(out)


NAME_RE = re.compile(r"((?:[A-Za-z_]\w*(?:<[^()]*?>)?\s*::\s*)*~?\s*"
                     r"(?:operator\s*(?:\(\)|[^\s(]+)|[A-Za-z_]\w*))\s*$")
NOT_NAMES = {"alignas", "decltype", "noexcept", "requires", "__attribute__", "sizeof"}


def function_name(header):
    """The qualified name before the parameter list: that of the first top-level
    (...) group not after a keyword or an ALL_CAPS macro (an annotation); a TEST-like
    macro's own name when there is no other."""
    names, depth = [], 0
    for k, c in enumerate(header):
        if c == "(":
            if depth == 0 and not header[:k].rstrip().endswith("operator"):
                m = NAME_RE.search(header[:k])
                names.append(re.sub(r"\s+", "", m.group(1)) if m else "")
            depth += 1
        elif c == ")":
            depth -= 1
    for name in names:
        last = name.split("::")[-1]
        if name and last not in NOT_NAMES and not re.fullmatch(r"[A-Z][A-Z0-9_]*", last):
            return name
    return names[0] if names and names[0] else "<anonymous>"


def functions(code):
    """Yields (name, first line, length) for each function in blanked code."""
    i, n = 0, len(code)
    header_start = 0
    while i < n:
        c = code[i]
        if c in ";}":  # the end of a declaration or of a namespace's or class's body
            header_start = i + 1
        elif c == "{":
            header = ACCESS_RE.sub("", code[header_start:i]).strip()
            flat = top_level(header)
            if SCOPE_RE.match(flat):  # its body is scanned for functions like the file
                header_start = i + 1
            elif "(" in flat and "=" not in flat.split("(")[0] + flat[flat.rfind(")"):].split(
                    ":")[0]:
                # A constructor's member{init} in its initialiser list: part of the header.
                after = flat[flat.find(")"):]
                if re.search(r"(?<!:):(?!:)", after) and re.search(r"[\w>]\s*$", header):
                    i = matching(code, i, "{", "}") + 1
                    continue
                end = matching(code, i, "{", "}")
                first = code.count("\n", 0, i) + 1
                last = code.count("\n", 0, end) + 1
                yield function_name(header), first, last - first + 1
                i = end + 1
                header_start = i
                continue
            else:  # an initialiser, an enum's body, a member's {default}
                i = matching(code, i, "{", "}") + 1
                continue
        i += 1


def scan(top):
    files = subprocess.run(["git", "-C", top, "ls-files", "--", *DIRS], check=True,
                           capture_output=True, text=True).stdout.split()
    found = {}
    for path in sorted(f for f in files if f.endswith(EXTS)):
        with open(os.path.join(top, path), encoding="utf-8", errors="replace") as f:
            code = blank(f.read())
        seen = {}
        for name, line, length in functions(code):
            seen[name] = seen.get(name, 0) + 1
            key = f"{path} {name}" + (f"#{seen[name]}" if seen[name] > 1 else "")
            found[key] = (length, line)
    return found


def read_list(path):
    entries = {}
    if os.path.exists(path):
        with open(path) as f:
            for raw in f:
                line = raw.split("#", 1)[0] if raw.lstrip().startswith("#") else raw
                parts = line.split()
                if len(parts) == 3:
                    entries[f"{parts[1]} {parts[2]}"] = int(parts[0])
    return entries


def write_list(path, entries, limit):
    with open(path, "w") as f:
        f.write(f"# Functions longer than {limit} lines on the day the ratchet began, with\n"
                "# their lengths: each may only shrink. See scripts/lint/function_length.py\n"
                "# for how lines are counted. LENGTH PATH NAME\n")
        for key in sorted(entries):
            f.write(f"{entries[key]:4d} {key}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--list", default=DEFAULT_LIST)
    ap.add_argument("--limit", type=int, default=LIMIT)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--update", action="store_true")
    mode.add_argument("--init", action="store_true")
    ap.add_argument("--all", action="store_true", help="print every function's length")
    args = ap.parse_args()
    found = scan(TOP)
    if args.all:
        for key, (length, line) in sorted(found.items(), key=lambda kv: -kv[1][0]):
            print(f"{length:5d} {key} (line {line})")
        return 0
    if args.init:
        write_list(args.list, {k: v[0] for k, v in found.items() if v[0] > args.limit},
                   args.limit)
        return 0
    listed = read_list(args.list)
    failures, notes, kept = [], [], {}
    for key, allowed in listed.items():
        length = found.get(key, (0, 0))[0]
        if length <= args.limit:
            notes.append(f"{key}: now {length or 'gone'}, under {args.limit}: drop its entry")
        elif length < allowed:
            notes.append(f"{key}: {length} lines, listed at {allowed}: lower its entry")
            kept[key] = length
        else:
            kept[key] = allowed
    for key, (length, line) in sorted(found.items()):
        where = f"{key.split()[0]}:{line} {key.split()[1]}"
        if key in listed and length > listed[key]:
            failures.append(f"{where}: {length} lines, grew past its listed {listed[key]}")
        elif key not in listed and length > args.limit:
            failures.append(f"{where}: {length} lines, over the limit of {args.limit}")
    if args.update:
        write_list(args.list, kept, args.limit)
        notes = [f"updated {os.path.relpath(args.list, TOP)}"] if kept != listed else []
    for note in notes:
        print(f"function_length: {note}"
              + ("" if args.update or note.startswith("updated") else " (--update)"))
    for failure in failures:
        print(f"function_length: FAIL {failure}", file=sys.stderr)
    if failures:
        print(f"function_length: split the function (a long one may only shrink; see "
              f"{os.path.relpath(__file__, TOP)})", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
