#!/usr/bin/env python3
"""Copy JSON-Schema-Test-Suite's draft 2020-12 cases into tests/data/jsts/.

Two groups, as tests/test_jsts.c reads them:
  required/  every tests/draft2020-12/*.json (the suite's required cases);
  optional/  optional/format/*.json and the optional files named in OPTIONAL.
Files are copied byte for byte from the given commit of the suite's git
repository (a bare mirror works: only `git show` / `git ls-tree` are used),
with the suite's LICENSE, an index.txt ("group path" per line, the order the
harness reads them in) and a README.md naming the commit.  Only the test
data is taken.  Standard library only.

    extract_jsts.py --repo /path/to/JSON-Schema-Test-Suite[.git] [--commit REV] [--out DIR]
"""

import argparse
import json
import os
import subprocess
import sys

DRAFT = "tests/draft2020-12"
OPTIONAL = ["ecmascript-regex.json", "non-bmp-regex.json", "bignum.json", "float-overflow.json",
            "anchor.json", "id.json", "unknownKeyword.json", "refOfUnknownKeyword.json"]


def git(repo, *args):
    return subprocess.run(["git", "-C", repo] + list(args), check=True, capture_output=True).stdout


def ls(repo, commit, folder):
    """The .json files directly inside folder at commit (blobs only)."""
    out = []
    for line in git(repo, "ls-tree", commit, folder + "/").decode().splitlines():
        meta, path = line.split("\t", 1)
        if meta.split()[1] == "blob" and path.endswith(".json"):
            out.append(path)
    return sorted(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", required=True)
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "jsts"))
    a = ap.parse_args()
    commit = git(a.repo, "rev-parse", a.commit + "^{commit}").decode().strip()
    files = [("required", p) for p in ls(a.repo, commit, DRAFT)]
    files += [("optional", p) for p in ls(a.repo, commit, DRAFT + "/optional/format")]
    files += [("optional", DRAFT + "/optional/" + n) for n in OPTIONAL]

    index, n_cases, n_tests = [], 0, 0
    for group, path in files:
        data = git(a.repo, "show", f"{commit}:{path}")
        cases = json.loads(data.decode("utf-8"))  # a file that is not the suite's format fails here
        n_cases += len(cases)
        n_tests += sum(len(c["tests"]) for c in cases)
        rel = path[len(DRAFT) + 1:]
        if group == "optional":
            rel = rel[len("optional/"):]
        dst = os.path.join(a.out, group, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "wb") as f:
            f.write(data)
        index.append(f"{group} {group}/{rel}")
    with open(os.path.join(a.out, "LICENSE"), "wb") as f:
        f.write(git(a.repo, "show", f"{commit}:LICENSE"))
    with open(os.path.join(a.out, "index.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(index) + "\n")
    n_req = sum(1 for g, _ in files if g == "required")
    with open(os.path.join(a.out, "README.md"), "w", encoding="utf-8") as f:
        f.write(f"""# JSON-Schema-Test-Suite, draft 2020-12

Test data only, copied byte for byte from
https://github.com/json-schema-org/JSON-Schema-Test-Suite at commit
`{commit}` by `tools/grammar/extract_jsts.py` (its license: LICENSE here).

- `required/`: the {n_req} files of `tests/draft2020-12/` (the required cases);
- `optional/`: `tests/draft2020-12/optional/format/*.json` (in `optional/format/`)
  and {", ".join(OPTIONAL)};
- `index.txt`: `group path` per file, in the order tests/test_jsts.c reads them;
- `floor.txt`: the least fraction of the required group's pairs that must be
  right (tests/test_jsts.c; docs/grammar-conformance.md). Not extracted: kept by hand.

{len(files)} files, {n_cases} schemas, {n_tests} (schema, instance) pairs.

Regenerate:

```
python3 tools/grammar/extract_jsts.py --repo /path/to/JSON-Schema-Test-Suite[.git] \\
    --commit {commit} --out tests/data/jsts
```
""")
    print(f"{len(files)} files ({n_req} required), {n_cases} schemas, {n_tests} pairs, commit {commit}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
