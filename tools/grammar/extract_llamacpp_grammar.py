#!/usr/bin/env python3
"""Extract llama.cpp's GBNF acceptance cases into tests/data/grammar/.

From tests/test-grammar-integration.cpp it takes:
  - every test_grammar(desc, GRAMMAR, {passing...}, {failing...}) call
    (strings are C++ literals: "..." with escapes, R\"\"\"(...)\"\"\" raw strings,
    adjacent literals and `+`; token(N) pieces, llama.cpp's special-token
    matches, are written as <[N]> and the case is marked "tokens": true);
  - the grammars the file expects to be refused: test_build_grammar_fails(V)
    and the missing-root / missing-reference / custom-root checks, each from
    its `const std::string V = ...;` definition.
test_schema cases (JSON Schema, converted by llama.cpp's json-schema-to-grammar)
are counted and not extracted.  It also copies grammars/*.gbnf byte for byte.
Only the test data is taken, never llama.cpp's code.

Standard library only.

    extract_llamacpp_grammar.py --repo /path/to/llama.cpp[.git] [--commit REV] [--out DIR]
"""

import argparse
import json
import os
import re
import subprocess
import sys

SOURCE = "tests/test-grammar-integration.cpp"


def git(repo, *args):
    return subprocess.run(["git", "-C", repo] + list(args), check=True, capture_output=True).stdout


def lex(src):
    """C++ tokens that matter here: strings, identifiers, numbers, punctuation."""
    toks, i, n = [], 0, len(src)
    esc = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0", "a": "\a",
           "b": "\b", "f": "\f", "v": "\v", "?": "?"}
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            i = src.index("\n", i) if "\n" in src[i:] else n
        elif src.startswith("/*", i):
            i = src.index("*/", i) + 2
        elif c.isspace():
            i += 1
        elif src.startswith('R"', i):
            j = src.index("(", i)
            delim = src[i + 2:j]
            end = src.index(")" + delim + '"', j)
            toks.append(("str", src[j + 1:end]))
            i = end + len(delim) + 2
        elif c == '"':
            j, out = i + 1, []
            while src[j] != '"':
                if src[j] == "\\":
                    e = src[j + 1]
                    if e == "x":
                        m = re.match(r"[0-9a-fA-F]+", src[j + 2:])
                        out.append(chr(int(m.group(0), 16)))
                        j += 2 + len(m.group(0))
                        continue
                    if e == "u":
                        out.append(chr(int(src[j + 2:j + 6], 16)))
                        j += 6
                        continue
                    out.append(esc[e])
                    j += 2
                else:
                    out.append(src[j])
                    j += 1
            toks.append(("str", "".join(out)))
            i = j + 1
        elif c.isalpha() or c == "_":
            m = re.match(r"[A-Za-z_][A-Za-z0-9_:]*", src[i:])
            toks.append(("id", m.group(0)))
            i += len(m.group(0))
        elif c.isdigit():
            m = re.match(r"[0-9]+", src[i:])
            toks.append(("num", int(m.group(0))))
            i += len(m.group(0))
        else:
            toks.append(("p", c))
            i += 1
    return toks


class Parser:
    def __init__(self, toks):
        self.t, self.i = toks, 0

    def peek(self):
        return self.t[self.i] if self.i < len(self.t) else ("eof", None)

    def take(self, kind, val=None):
        k, v = self.peek()
        if k != kind or (val is not None and v != val):
            raise SystemExit(f"parse error at token {self.i}: want {kind} {val!r}, got {k} {v!r}")
        self.i += 1
        return v

    def expr(self):
        """Concatenation of literals, token(N) and string variables. Returns (text, uses_tokens)."""
        parts, tokens = [], False
        while True:
            k, v = self.peek()
            if k == "str":
                parts.append(self.take("str"))
            elif k == "id" and v == "token":
                self.take("id")
                self.take("p", "(")
                parts.append("<[%d]>" % self.take("num"))
                self.take("p", ")")
                tokens = True
            elif k == "p" and v == "+":
                self.take("p")
            else:
                break
        if not parts:
            raise SystemExit(f"parse error at token {self.i}: expected a string expression, got {self.peek()}")
        return "".join(parts), tokens

    def string_list(self):
        self.take("p", "{")
        out, tokens = [], False
        while self.peek() != ("p", "}"):
            s, t = self.expr()
            out.append(s)
            tokens |= t
            if self.peek() == ("p", ","):
                self.take("p")
        self.take("p", "}")
        return out, tokens


def extract(src):
    toks = lex(src)
    cases, refused, n_schema = [], [], 0
    strvars = {}  # name -> [(token index, text)]: a use takes the nearest definition before it
    for i, (k, v) in enumerate(toks):
        # const std::string NAME = <expr>;
        if k == "id" and v == "std::string" and i > 0 and toks[i - 1] == ("id", "const") and toks[i + 2] == ("p", "="):
            p = Parser(toks)
            p.i = i + 3
            if p.peek()[0] == "str":
                strvars.setdefault(toks[i + 1][1], []).append((i, p.expr()[0]))
    def var(name, at):
        found = [text for j, text in strvars.get(name, []) if j < at]
        return found[-1] if found else None  # None: a parameter inside a helper's definition

    for i, (k, v) in enumerate(toks):
        if k != "id" or toks[i + 1] != ("p", "(") or (i > 0 and toks[i - 1][1] in ("void", "bool")):
            continue
        if v == "test_schema":
            n_schema += 1
        elif v == "test_grammar":
            p = Parser(toks)
            p.i = i + 2
            desc, _ = p.expr()
            p.take("p", ",")
            grammar, _ = p.expr()
            p.take("p", ",")
            good, t1 = p.string_list()
            p.take("p", ",")
            bad, t2 = p.string_list()
            cases.append({"desc": desc, "grammar": grammar, "pass": good, "fail": bad, "tokens": t1 or t2 or "<[" in grammar})
        elif v == "test_build_grammar_fails":
            name = toks[i + 2][1]
            refused.append({"desc": "left recursion (" + name + ")", "grammar": var(name, i)})
        elif (v == "parse" and toks[i - 1] == ("p", ".") and toks[i - 2] == ("id", "parsed_grammar")) or \
                v == "build_grammar_with_root":
            name = toks[i + 2][1]
            if var(name, i) is None:
                continue
            root = toks[i + 4][1] if toks[i + 3] == ("p", ",") else None
            if v == "build_grammar_with_root" and root != "root":
                continue  # a custom start rule name: keel's start rule is always root
            refused.append({"desc": "no root / undefined rule (" + name + ")", "grammar": var(name, i)})
    return cases, refused, n_schema


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", required=True)
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "grammar"))
    a = ap.parse_args()
    commit = git(a.repo, "rev-parse", a.commit).decode().strip()
    src = git(a.repo, "show", f"{commit}:{SOURCE}").decode("utf-8")
    cases, refused, n_schema = extract(src)
    os.makedirs(os.path.join(a.out, "grammars"), exist_ok=True)
    names = [l for l in git(a.repo, "ls-tree", "--name-only", commit, "grammars/").decode().split("\n")
             if l.endswith(".gbnf")]
    for path in names:
        with open(os.path.join(a.out, "grammars", os.path.basename(path)), "wb") as f:
            f.write(git(a.repo, "show", f"{commit}:{path}"))
    doc = {
        "source": {"repository": "https://github.com/ngxson/llama.cpp", "commit": commit, "file": SOURCE,
                   "extracted_by": "tools/grammar/extract_llamacpp_grammar.py"},
        "schema_cases_not_extracted": n_schema,
        "cases": cases,
        "refused": refused,
        "grammar_files": sorted(os.path.basename(p) for p in names),
    }
    with open(os.path.join(a.out, "llamacpp_grammar_cases.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(cases)} grammar cases ({sum(c['tokens'] for c in cases)} with token references), "
          f"{sum(len(c['pass']) + len(c['fail']) for c in cases)} texts, {len(refused)} refused grammars, "
          f"{n_schema} schema cases skipped, {len(names)} grammar files", file=sys.stderr)


if __name__ == "__main__":
    main()
