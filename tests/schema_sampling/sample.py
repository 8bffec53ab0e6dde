#!/usr/bin/env python3
"""Sampling under JSON Schemas: every output keel generates under a schema
must be an instance of it, by an independent validator.

Schemas: every distinct schema of tests/data/jsts (JSON-Schema-Test-Suite
draft 2020-12, both groups) that keel_grammar_compile_schema accepts, and
the tool-parameter schemas of tests/schema_sampling/tools.json. For each,
--seeds generations at temperature 1 with a random-weight qwen2 model that
this script makes (`keel gen-model`, vocabulary 512), through libkeel's
keel_complete with the "json_schema" option (ctypes, one engine for all).
An output that ends with finish_reason "stop" is complete; one cut by
max_tokens ("length") is counted as unfinished (not a failure of the
grammar, but reported). Every complete output is parsed with Python's json
(reals as Decimal, so that multipleOf, bounds and "integer" are exact as in
keel; duplicate member names counted apart: a validator sees only the
last) and validated with Debian's python3-jsonschema (Draft202012Validator;
no network: remote references fail; an exception of the validator itself,
e.g. 4.10 failing to resolve some $anchor references, counts the output
"unvalidated", reported). The validator is first run on the suite's own
instances of each suite schema: where it rejects instances the suite calls
valid (4.10 ignores additionalProperties when it evaluates
unevaluatedProperties, for one), an output it calls invalid is listed as
doubtful, not failed; where it accepts invalid ones (Debian's email check
is only "has an @"), the check is weaker there (listed). It has a
FormatChecker for the formats keel asserts: a format counts as asserted
when keel compiles {"type": "string", "format": F} and rejects the text
"?". Formats that Debian's jsonschema cannot check (date-time, time,
hostname, duration, json-pointer, relative-json-pointer: their checkers
need packages Debian lacks) are checked by the small RFC 3339 / 1123 / 6901
checkers below, which must agree with every string of the suite's
optional/format tests for them (checked at start).

Exit 0: every complete output valid, no engine error; 1: otherwise; 77:
python3-jsonschema is missing (apt-get install python3-jsonschema); 2: usage.

    sample.py --keel build/keel --lib build/libkeel.so [--seeds 3] [--max-tokens 384]
              [--out DIR] [--json] [--min-schemas N]
"""

import argparse
import ctypes
import datetime
import decimal
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


class Keel:
    """The few libkeel calls this needs (include/keel.h), through ctypes."""

    def __init__(self, lib):
        self.lib = ctypes.CDLL(lib)
        L = self.lib
        vp, cp, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
        L.keel_grammar_compile_schema.argtypes = [cp, sz, ctypes.POINTER(vp), cp]
        L.keel_grammar_compile_schema.restype = ctypes.c_int
        L.keel_grammar_close.argtypes = [vp]
        L.keel_grammar_match.argtypes = [vp, cp, sz, ctypes.POINTER(ctypes.c_bool), cp]
        L.keel_grammar_match.restype = ctypes.c_int
        L.keel_grammar_accepts_nothing.argtypes = [vp, ctypes.POINTER(ctypes.c_bool), cp]
        L.keel_grammar_accepts_nothing.restype = ctypes.c_int
        L.keel_engine_open.argtypes = [cp, ctypes.POINTER(vp), cp]
        L.keel_engine_open.restype = ctypes.c_int
        L.keel_engine_close.argtypes = [vp]
        L.keel_engine_last_error.argtypes = [vp]
        L.keel_engine_last_error.restype = cp
        L.keel_complete.argtypes = [vp, cp, cp, cp, vp, vp, ctypes.c_char_p, sz]
        L.keel_complete.restype = ctypes.c_int
        L.keel_status_name.argtypes = [ctypes.c_int]
        L.keel_status_name.restype = cp
        self.engine = None
        self.resp = ctypes.create_string_buffer(1 << 20)

    def compile(self, schema_text):
        """None when compiled (then closed), else the refusal message."""
        g, err = ctypes.c_void_p(), ctypes.create_string_buffer(256)
        b = schema_text.encode("utf-8")
        st = self.lib.keel_grammar_compile_schema(b, len(b), ctypes.byref(g), err)
        if st != 0:
            return err.value.decode("utf-8", "replace") or self.lib.keel_status_name(st).decode()
        return g

    def accepts_nothing(self, g):
        empty, err = ctypes.c_bool(), ctypes.create_string_buffer(256)
        st = self.lib.keel_grammar_accepts_nothing(g, ctypes.byref(empty), err)
        if st != 0:
            raise RuntimeError(err.value.decode("utf-8", "replace"))
        return empty.value

    def match(self, g, text):
        ok, err = ctypes.c_bool(), ctypes.create_string_buffer(256)
        b = text.encode("utf-8")
        st = self.lib.keel_grammar_match(g, b, len(b), ctypes.byref(ok), err)
        return st == 0 and ok.value

    def open(self, model):
        e, err = ctypes.c_void_p(), ctypes.create_string_buffer(256)
        opts = json.dumps({"model": model, "n_ctx": 1024, "n_threads": 2, "n_slots": 1})
        st = self.lib.keel_engine_open(opts.encode(), ctypes.byref(e), err)
        if st != 0:
            raise RuntimeError(f"keel_engine_open: {err.value.decode()}")
        self.engine = e

    def complete(self, options):
        st = self.lib.keel_complete(self.engine, None, json.dumps(options).encode("utf-8"), None, None, None,
                                    self.resp, len(self.resp))
        if st != 0:
            return None, f"{self.lib.keel_status_name(st).decode()}: " \
                         f"{self.lib.keel_engine_last_error(self.engine).decode('utf-8', 'replace')}"
        return json.loads(self.resp.value.decode("utf-8")), None

    def close(self):
        if self.engine:
            self.lib.keel_engine_close(self.engine)
            self.engine = None


# ---- format checkers Debian's jsonschema lacks (RFC 3339, RFC 1123) ---------------

# [0-9], not \d (Unicode digits), and \Z, not $ (which allows a final newline)
_TIME = re.compile(r"([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?([zZ]|[+-]([0-9]{2}):([0-9]{2}))\Z")
_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})\Z")
# RFC 3339 appendix A: a unit may be left out only at the ends (P1Y2D is not a duration)
_N = "[0-9]+"
_DUR_TIME = f"T({_N}H({_N}M({_N}S)?)?|{_N}M({_N}S)?|{_N}S)"
_DUR = re.compile(f"P((({_N}D)|({_N}M({_N}D)?)|({_N}Y({_N}M({_N}D)?)?))({_DUR_TIME})?|{_DUR_TIME}|{_N}W)\\Z")
_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\Z")


def _date_ok(s):
    m = _DATE.match(s)
    if not m:
        return False
    try:
        datetime.date(int(m[1]), int(m[2]), int(m[3]))
    except ValueError:
        return False
    return True


def _time_ok(s):
    m = _TIME.match(s)
    if not m:
        return False
    h, mi, se = int(m[1]), int(m[2]), int(m[3])
    if h > 23 or mi > 59 or se > 60:
        return False
    if m[6] is not None and (int(m[6]) > 23 or int(m[7]) > 59):
        return False
    if se == 60:  # a leap second: 23:59:60 in UTC
        off = 0 if m[6] is None else (int(m[6]) * 60 + int(m[7])) * (1 if m[5][0] == "+" else -1)
        utc = (h * 60 + mi - off) % (24 * 60)
        return utc == 23 * 60 + 59
    return True


def _datetime_ok(s):
    parts = re.split(r"[tT]", s)
    return len(parts) == 2 and _date_ok(parts[0]) and _time_ok(parts[1])


def _hostname_ok(s):
    """RFC 1123 labels of letters, digits and hyphens, 63 bytes each, 253 in all; an A-label
    (xn--) must be valid Punycode, and valid IDNA when python3-idna is there; no other label
    has hyphens in positions 3 and 4 (RFC 5891 4.2.3.1)."""
    if not s or len(s) > 253:
        return False
    for label in s.split("."):
        if not _LABEL.match(label):
            return False
        if label[2:4] == "--":
            if label[:4].lower() != "xn--":
                return False
            try:
                u = label[4:].encode("ascii").decode("punycode")
            except (UnicodeError, ValueError):
                return False
            if not u or u.isascii():
                return False
            try:
                import idna
                idna.decode(label)
            except ImportError:
                pass
            except (idna.IDNAError, UnicodeError, ValueError):
                return False
    return True


_JPTR = r"(/([^~/]|~[01])*)*"
_JPTR_RE = re.compile(_JPTR + r"\Z", re.S)
_RJPTR_RE = re.compile(r"(0|[1-9][0-9]*)(#|" + _JPTR + r")\Z", re.S)

OWN_CHECKERS = {"json-pointer": lambda s: bool(_JPTR_RE.match(s)),  # RFC 6901
                "relative-json-pointer": lambda s: bool(_RJPTR_RE.match(s)),  # draft-handrews-relative-json-pointer
                "date-time": _datetime_ok, "time": _time_ok, "hostname": _hostname_ok,
                "duration": lambda s: bool(_DUR.match(s)), "date": _date_ok}
FORMATS = ["date", "time", "date-time", "duration", "uuid", "email", "idn-email", "hostname", "idn-hostname",
           "ipv4", "ipv6", "uri", "uri-reference", "iri", "iri-reference", "uri-template", "json-pointer",
           "relative-json-pointer", "regex"]


def self_check(suite_dir):
    """The checkers above on known cases (so that a broken one cannot pass everything)."""
    cases = [("date-time", "1963-06-19T08:30:06.283185Z", True), ("date-time", "1990-12-31T15:59:60-08:00", True),
             ("date-time", "1963-06-19 08:30:06Z", False), ("date-time", "2020-02-30T00:00:00Z", False),
             ("time", "08:30:06+01:00", True), ("time", "24:00:00Z", False), ("time", "08:30:06", False),
             ("hostname", "www.example.com", True), ("hostname", "-a.com", False), ("hostname", "a" * 64, False),
             ("duration", "P4DT12H30M5S", True), ("duration", "PT", False), ("duration", "P1W", True),
             ("duration", "P2W1D", False), ("duration", "P1Y2D", False), ("duration", "P1D\n", False),
             ("date", "2020-02-29", True), ("date", "2021-02-29", False), ("date", "2020-0\u09ea-01", False),
             ("hostname", "xn--X", False), ("hostname", "example.", False), ("hostname", "xn--4dbc5h", True),
             ("json-pointer", "/a~1b/~0", True), ("json-pointer", "a", False), ("json-pointer", "/~2", False),
             ("relative-json-pointer", "1#", True), ("relative-json-pointer", "01/a", False)]
    for f, s, want in cases:
        if OWN_CHECKERS[f](s) != want:
            raise AssertionError(f"format checker {f} on {s!r}: {not want}, expected {want}")
    # and every string of the suite's format assertion tests for them
    for f, fn in OWN_CHECKERS.items():
        path = os.path.join(suite_dir, "optional", "format", f + ".json")
        with open(path, encoding="utf-8") as fp:
            for c in json.load(fp):
                for t in c["tests"]:
                    if isinstance(t["data"], str) and fn(t["data"]) != t["valid"]:
                        raise AssertionError(f"format checker {f} on {t['data']!r} ({t['description']}): "
                                             f"{not t['valid']}, the suite says {t['valid']}")


def make_checker(jsonschema, asserted):
    """A FormatChecker for the asserted formats only; the others stay annotations."""
    fc = jsonschema.FormatChecker(formats=())
    known = jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers
    unchecked = []
    for f in asserted:
        if f in OWN_CHECKERS:
            fn = OWN_CHECKERS[f]
            fc.checks(f)(lambda x, fn=fn: not isinstance(x, str) or fn(x))
        elif f in known:
            fc.checkers[f] = known[f]
        else:
            unchecked.append(f)
    return fc, unchecked


# ---- schemas ----------------------------------------------------------------------

def suite_schemas(suite_dir):
    """(name, schema, [(instance, valid, required group)...]) per distinct schema; the tests of
    duplicates are pooled (they check the validator, below)."""
    out, seen = [], {}
    with open(os.path.join(suite_dir, "index.txt"), encoding="utf-8") as f:
        files = [line.split() for line in f if line.strip()]
    for group, rel in files:
        with open(os.path.join(suite_dir, rel), encoding="utf-8") as f:
            cases = json.load(f)
        for i, c in enumerate(cases):
            key = json.dumps(c["schema"], sort_keys=True)
            tests = [(t["data"], t["valid"], group == "required") for t in c["tests"]]
            if key in seen:
                seen[key][2].extend(tests)
                continue
            seen[key] = (f"{rel}#{i} {c['description']}", c["schema"], tests)
            out.append(seen[key])
    return out


def exact(v):
    """v with every real as a Decimal of its shortest spelling, so that the validator compares,
    divides (multipleOf) and tells integers exactly, as keel's grammars do, where Python's
    floats would round 71474129235551920.41 to an integer."""
    return json.loads(json.dumps(v), parse_float=decimal.Decimal)


def make_validator_class(jsonschema):
    """Draft202012Validator whose "integer" also takes a Decimal with no fraction."""
    base = jsonschema.Draft202012Validator

    def is_integer(checker, x):
        if isinstance(x, decimal.Decimal):
            return x.is_finite() and x == x.to_integral_value()
        return base.TYPE_CHECKER.is_type(x, "integer")
    return jsonschema.validators.extend(base, type_checker=base.TYPE_CHECKER.redefine("integer", is_integer))


def no_network(uri):
    raise ValueError(f"remote reference {uri} (no network here)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keel", required=True, help="the keel executable (gen-model)")
    ap.add_argument("--lib", required=True, help="libkeel.so")
    ap.add_argument("--suite", default=os.path.join(ROOT, "tests", "data", "jsts"))
    ap.add_argument("--tools", default=os.path.join(HERE, "tools.json"))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=384)
    ap.add_argument("--min-schemas", type=int, default=0, help="fail when fewer schemas were sampled")
    ap.add_argument("--out", default=None, help="folder for samples.jsonl and report.json")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    a = ap.parse_args()
    try:
        import jsonschema
        jsonschema.Draft202012Validator  # 4.x
    except (ImportError, AttributeError):
        print("schema_sampling: skipped: python3-jsonschema (4.x, Draft202012Validator) is missing; "
              "apt-get install python3-jsonschema", file=sys.stderr)
        return 77

    t0 = time.monotonic()
    self_check(a.suite)
    decimal.getcontext().prec = 2000  # exact remainders (multipleOf) of long numbers
    decimal.getcontext().Emax = 999999
    decimal.getcontext().Emin = -999999
    k = Keel(a.lib)
    tmp = tempfile.mkdtemp(prefix="keel_sampling_")
    model = os.path.join(tmp, "m.gguf")
    subprocess.run([a.keel, "gen-model", "--arch", "qwen2", "--vocab", "512", "--layers", "1", "--embd", "64",
                    "--heads", "4", "--kv-heads", "2", "--seed", "7", "--out", model], check=True,
                   stdout=subprocess.DEVNULL)

    # which formats keel asserts
    asserted = []
    for f in FORMATS:
        g = k.compile(json.dumps({"type": "string", "format": f}))
        if isinstance(g, str):
            continue
        if not k.match(g, '"?"'):
            asserted.append(f)
        k.lib.keel_grammar_close(g)
    checker, unchecked = make_checker(jsonschema, asserted)
    full_checker, _ = make_checker(jsonschema, FORMATS)  # for the suite's format assertion tests

    with open(a.tools, encoding="utf-8") as f:
        tools = [(f"tool {t['name']}", t["parameters"]) for t in json.load(f)]
    cands = [("suite", n, s, t) for n, s, t in suite_schemas(a.suite)] + [("tools", n, s, []) for n, s in tools]
    schemas, refused = [], {"suite": 0, "tools": 0}
    refused_tools = []
    Validator = make_validator_class(jsonschema)

    def validator(s, fc):
        sx = exact(s)
        res = jsonschema.RefResolver.from_schema(sx, handlers={"http": no_network, "https": no_network})
        return Validator(sx, format_checker=fc, resolver=res)

    unreliable, weak = {}, {}
    n_empty = 0
    for src, name, s, tests in cands:
        g = k.compile(json.dumps(s, ensure_ascii=False))
        if isinstance(g, str):
            refused[src] += 1
            if src == "tools":
                refused_tools.append(f"{name}: {g}")
            continue
        empty = k.accepts_nothing(g)
        k.lib.keel_grammar_close(g)
        if empty:  # nothing to sample: the engine refuses such a schema up front
            n_empty += 1
            continue
        schemas.append((src, name, s))
        # the validator on the suite's own instances of this schema (formats as the suite's
        # group has them: annotations in the required group, assertions in optional/format,
        # checked with every checker this script has)
        strict = lenient = 0
        for inst, valid, required in tests:
            try:
                ok = validator(s, None if required else full_checker).is_valid(exact(inst))
            except Exception:  # an error of the validator is a disagreement too
                ok = not valid
            strict += valid and not ok
            lenient += ok and not valid
        # rejecting a valid instance makes its "invalid" doubtful; accepting invalid ones
        # only makes the check weaker (reported)
        if strict:
            unreliable[name] = f"python3-jsonschema rejects {strict} of the suite's {len(tests)} instances that are valid"
        if lenient:
            weak[name] = f"python3-jsonschema accepts {lenient} of the suite's {len(tests)} instances that are invalid"

    k.open(model)
    n = {"outputs": 0, "complete": 0, "unfinished": 0, "valid": 0, "invalid": 0, "not_json": 0,
         "duplicate_keys": 0, "engine_errors": 0, "unvalidated": 0,
         "invalid_validator_unreliable": 0}
    bad, samples, tokens, unvalidated = [], [], 0, []
    doubtful = []
    for src, name, s in schemas:
        v = validator(s, checker)
        for seed in range(1, a.seeds + 1):
            opts = {"prompt": "The answer as JSON:", "json_schema": s, "temperature": 1.0, "seed": seed,
                    "max_tokens": a.max_tokens}
            r, err = k.complete(opts)
            n["outputs"] += 1
            rec = {"schema": name, "seed": seed}
            if err:
                n["engine_errors"] += 1
                bad.append(f"{name} seed {seed}: engine error {err}")
                rec["error"] = err
                samples.append(rec)
                continue
            text, fin = r.get("content") or "", r.get("finish_reason")
            tokens += r.get("usage", {}).get("completion_tokens", 0)
            rec.update(finish=fin, text=text)
            if fin != "stop":
                n["unfinished"] += 1
                samples.append(rec)
                continue
            n["complete"] += 1
            dup = []

            def pairs(kv, dup=dup):
                keys = [key for key, _ in kv]
                if len(set(keys)) != len(keys):
                    dup.append(keys)
                return dict(kv)
            try:
                inst = json.loads(text, object_pairs_hook=pairs, parse_float=decimal.Decimal)
            except ValueError as e:
                n["not_json"] += 1
                bad.append(f"{name} seed {seed}: not JSON ({e}): {text!r}")
                rec["verdict"] = "not json"
                samples.append(rec)
                continue
            if dup:
                n["duplicate_keys"] += 1
                rec["duplicate_keys"] = True
            try:
                errors = sorted(v.iter_errors(inst), key=lambda e: list(e.path))
            except Exception as e:  # the validator's own limits (4.10: some $anchor refs), not keel's
                n["unvalidated"] += 1
                msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                unvalidated.append(f"{name} seed {seed}: {msg}")
                rec["verdict"] = "unvalidated: " + msg
                samples.append(rec)
                continue
            if errors and name in unreliable:
                # the validator is known wrong on this schema: not counted against keel, listed
                n["invalid_validator_unreliable"] += 1
                doubtful.append(f"{name} seed {seed}: {errors[0].message} ({unreliable[name]}): {text!r}")
                rec["verdict"] = "invalid by an unreliable validator: " + errors[0].message
            elif errors:
                n["invalid"] += 1
                bad.append(f"{name} seed {seed}: invalid: {errors[0].message} at {list(errors[0].path)}: {text!r}")
                rec["verdict"] = "invalid: " + errors[0].message
            else:
                n["valid"] += 1
                rec["verdict"] = "valid"
            samples.append(rec)
    k.close()
    secs = time.monotonic() - t0

    rep = {
        "schemas": len(schemas),
        "suite_schemas": sum(1 for s in schemas if s[0] == "suite"),
        "tool_schemas": sum(1 for s in schemas if s[0] == "tools"),
        "refused": refused, "refused_tools": refused_tools,
        "seeds": a.seeds, "max_tokens": a.max_tokens,
        "formats_asserted": asserted, "formats_unchecked": unchecked,
        **n, "tokens": tokens, "seconds": round(secs, 1), "failures": bad, "unvalidated_outputs": unvalidated,
        "validator_unreliable_schemas": unreliable, "validator_weak_schemas": weak, "invalid_by_unreliable_validator": doubtful,
    }
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "samples.jsonl"), "w", encoding="utf-8") as f:
            for rec in samples:
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        with open(os.path.join(a.out, "report.json"), "w", encoding="utf-8") as f:
            json.dump(rep, f, indent=1, ensure_ascii=False)
    if a.json:
        print(json.dumps(rep, indent=1, ensure_ascii=False))
    else:
        print(f"schemas sampled: {len(schemas)} ({rep['suite_schemas']} from the suite, {rep['tool_schemas']} tools; "
              f"refused: {refused['suite']} suite, {refused['tools']} tools; accepting nothing, not sampled: {n_empty})")
        for t in refused_tools:
            print(f"  refused {t}")
        print(f"formats asserted: {asserted or 'none'}" + (f" (not checked here: {unchecked})" if unchecked else ""))
        print(f"outputs: {n['outputs']} ({a.seeds} seeds, max_tokens {a.max_tokens}); complete: {n['complete']}, "
              f"unfinished (max_tokens): {n['unfinished']}, engine errors: {n['engine_errors']}")
        print(f"complete outputs valid: {n['valid']}, invalid: {n['invalid']}, not JSON: {n['not_json']}; "
              f"with duplicate member names: {n['duplicate_keys']}")
        print(f"schemas on which python3-jsonschema rejects valid instances of the suite: {len(unreliable)}; "
              f"complete outputs it calls invalid there (not counted as failures): {n['invalid_validator_unreliable']}")
        print(f"schemas on which it accepts invalid instances of the suite (a weaker check): {len(weak)}")
        for d in doubtful[:10]:
            print("  doubtful " + d[:300])
        print(f"complete outputs the validator could not check (its own errors, not failures): {n['unvalidated']}")
        for u in unvalidated[:10]:
            print("  unvalidated " + u)
        print(f"tokens generated: {tokens}, {secs:.1f} s")
        for b in bad[:50]:
            print("FAIL " + b)
    ok = not bad and len(schemas) >= a.min_schemas
    if len(schemas) < a.min_schemas:
        print(f"FAIL only {len(schemas)} schemas sampled (--min-schemas {a.min_schemas})")
    try:
        os.unlink(model)
        os.rmdir(tmp)
    except OSError:
        pass
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
