"""The package's size, and how much of it is code that already existed at a base commit.

Run: ``python3 benchmarks/size.py [--base COMMIT]`` (standard library and git only).

It counts the physical lines of ``dynamo_trio/`` at ``HEAD`` and splits them with
``git blame -w -M -C`` (whitespace ignored, moved and copied lines followed to where they
came from):

- **whole modules of later features** (the engines, the KServe gRPC server, the media
  endpoints and their mock engines: none existed at the base) are left out of the count;
- the counted lines last written by a commit listed in ``size_features.tsv`` (commits after
  the base that added a feature the base did not have) are that feature's;
- every other line is **code that existed at the base**, as it reads now: lines untouched
  since, and lines rewritten, moved or fixed after it.

It also prints the module docstrings' lines, at the base and now.
"""

from __future__ import annotations

import argparse
import ast
import collections
import csv
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "dynamo_trio"
FEATURES = Path(__file__).with_name("size_features.tsv")
LATER_FEATURE_MODULES = (
    "engines/",
    "kserve/",
    "llm/_images.py",
    "llm/_videos.py",
    "llm/_speech.py",
    "llm/_media.py",
    "mocker/_media.py",
    "mocker/_codecs.py",
    "mocker/_tensor.py",
)


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True
    ).stdout


def modules(commit: str) -> list[str]:
    """The package's Python modules at ``commit``, as repository paths."""
    names = git("ls-tree", "-r", "--name-only", commit, PACKAGE).split()
    return [name for name in names if name.endswith(".py")]


def is_later_feature(path: str) -> bool:
    inside = path.removeprefix(PACKAGE + "/")
    return any(
        inside.startswith(m) if m.endswith("/") else inside == m for m in LATER_FEATURE_MODULES
    )


def docstring_lines(source: str) -> int:
    """Lines of the module docstring, its quotes included."""
    tree = ast.parse(source)
    first = tree.body[0] if tree.body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return (first.end_lineno or first.lineno) - first.lineno + 1
    return 0


def blamed_commits(path: str) -> list[str]:
    """The commit that last wrote each line of ``path`` at HEAD."""
    out = git("blame", "-w", "-M", "-C", "--line-porcelain", "HEAD", "--", path)
    commits = []
    for line in out.splitlines():
        head = line.split(" ")
        if len(head) >= 3 and len(head[0]) == 40 and head[1].isdigit() and head[2].isdigit():
            commits.append(head[0])
    return commits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="4ecc51a", help="the commit to compare with")
    base = parser.parse_args().base
    if git("rev-parse", "--is-shallow-repository").strip() == "true":
        sys.exit("a shallow clone has no history to blame: git fetch --unshallow")

    with FEATURES.open() as rows:
        feature_of = {
            row["commit"]: row["feature"]
            for row in csv.DictReader(rows, delimiter="\t", quoting=csv.QUOTE_NONE)
        }
    before_base = set(git("rev-list", base).split())

    now = modules("HEAD")
    counted = [path for path in now if not is_later_feature(path)]
    total = sum(len((REPO / path).read_text().splitlines()) for path in now)
    by_origin: collections.Counter[str] = collections.Counter()
    for path in counted:
        for commit in blamed_commits(path):
            if commit in before_base:
                by_origin["unchanged since the base"] += 1
                continue
            feature = next((f for c, f in feature_of.items() if commit.startswith(c)), None)
            by_origin[f"later feature: {feature}" if feature else "rewritten since the base"] += 1
    counted_lines = sum(by_origin.values())
    later = sum(n for origin, n in by_origin.items() if origin.startswith("later feature"))

    then = modules(base)
    then_total = sum(len(git("show", f"{base}:{path}").splitlines()) for path in then)
    docs_then = [docstring_lines(git("show", f"{base}:{path}")) for path in then]
    docs_now = {path: docstring_lines((REPO / path).read_text()) for path in now}
    longest = max(docs_now, key=docs_now.__getitem__)

    print(f"{PACKAGE}/ at {base}: {then_total:,} lines in {len(then)} modules")
    print(f"{PACKAGE}/ at HEAD: {total:,} lines in {len(now)} modules")
    print(f"  whole modules of later features: {total - counted_lines:,}")
    print(f"  counted: {counted_lines:,}")
    for origin, n in sorted(by_origin.items()):
        print(f"    {origin}: {n:,}")
    print(f"code that existed at the base, as it reads now: {counted_lines - later:,}")
    print(
        f"module docstrings: {sum(docs_then):,} lines at the base (longest {max(docs_then)}), "
        f"{sum(docs_now.values()):,} now (longest {docs_now[longest]}, {longest}; "
        f"{sum(n > 15 for n in docs_now.values())} over 15)"
    )


if __name__ == "__main__":
    main()
