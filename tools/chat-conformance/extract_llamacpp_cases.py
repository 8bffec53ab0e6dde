#!/usr/bin/env python3
"""Extract llama.cpp's chat-parser test cases (tests/test-chat.cpp) into JSON.

The cases in test-chat.cpp are fluent builder chains on a `peg_tester`:

    auto tst = peg_tester("models/templates/X.jinja", detailed_debug);
    tst.test("model output").tools({ special_function_tool }).expect(message_assist_call).run();

This script tokenizes the C++ source and evaluates the small subset of C++ the
test file uses to build those chains: string literals (escapes, adjacent
literal concatenation, raw strings, std::string(...), `+`), aggregate
initialisation of common_chat_tool / common_chat_msg / common_chat_tool_call
(field order read from common/chat.h), the message helper functions
(simple_assist_msg & co., modelled in Python and pinned to the source by a
fingerprint), the enum constants (read from common/chat.h and common/common.h),
global and block-local variables, range-for loops over literal lists and
calls to file-local functions (test_lfm2_parser).  Every `.run()` chain in the
file must be evaluated; anything that cannot be evaluated fails loudly with
the source line.

Standard library only.

    extract_llamacpp_cases.py --repo /path/to/llama.cpp[.git] [--commit REV] [--out DIR]
    extract_llamacpp_cases.py --check [--out DIR] [--repo ... to also re-extract and compare]
"""

import argparse
import bisect
import collections
import hashlib
import json
import os
import re
import subprocess
import sys

SOURCE_PATH = "tests/test-chat.cpp"
HEADERS = ("common/chat.h", "common/common.h")
TEMPLATE_DIR = "models/templates/"
EXTRACTED_BY = "tools/chat-conformance/extract_llamacpp_cases.py"
DEFAULT_OUT = "tests/data/chat-conformance"
CASES_FILE = "llamacpp_cases.json"

# Cases whose expected message carries text of the prompt, not of the model:
# reported apart by keel's conformance test, one line of reason each.
PROMPT_THINK = ("expected content starts with %s, which the generation prompt wrote (reasoning_format none), "
                "not the model")
DISPUTED = {
    "Qwen3.5-4B:2121": PROMPT_THINK % '"<think>\\n"',
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16:2669": PROMPT_THINK % '"<think>\\n"',
    "Cohere2MoE:2848": PROMPT_THINK % '"<|START_THINKING|>"',
    "Apriel-1.6-15b-Thinker-fixed:5807": "expected reasoning starts with \"Here are my reasoning steps:\\n\", "
                                         "which the generation prompt wrote, not the model",
    "Apriel-1.6-15b-Thinker-fixed:5815": "expected reasoning starts with \"Here are my reasoning steps:\\n\", "
                                         "which the generation prompt wrote, not the model",
}


class ExtractError(Exception):
    pass


def fail(line, msg):
    where = "%s:%s: " % (SOURCE_PATH, line) if line is not None else ""
    raise ExtractError(where + msg)


# --------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------

class Tok:
    __slots__ = ("kind", "val", "line", "pos")

    def __init__(self, kind, val, line, pos):
        self.kind = kind      # 'id' 'num' 'str' 'chr' 'p'
        self.val = val        # for 'str': (prefix, bytes)
        self.line = line
        self.pos = pos

    def is_p(self, v):
        return self.kind == "p" and self.val == v

    def is_id(self, v=None):
        return self.kind == "id" and (v is None or self.val == v)

    def __repr__(self):
        return "Tok(%s,%r,%d)" % (self.kind, self.val, self.line)


PUNCTS = sorted(["::", "->", "...", "<<=", ">>=", "<<", ">>", "<=", ">=", "==", "!=", "&&", "||",
                 "++", "--", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", ".*", "->*"],
                key=len, reverse=True)
SIMPLE_ESC = {"n": 10, "t": 9, "r": 13, "\\": 92, '"': 34, "'": 39, "?": 63,
              "a": 7, "b": 8, "f": 12, "v": 11}
STR_PREFIXES = ("u8", "L", "u", "U")
RAW_PREFIXES = ("R", "u8R", "LR", "uR", "UR")


def decode_escapes(body, line):
    """Decode the body of a (non-raw) C++ string literal into bytes."""
    out = bytearray()
    i = 0
    n = len(body)
    while i < n:
        c = body[i]
        if c != "\\":
            out += c.encode("utf-8")
            i += 1
            continue
        if i + 1 >= n:
            fail(line, "dangling backslash in string literal")
        e = body[i + 1]
        if e in SIMPLE_ESC:
            out.append(SIMPLE_ESC[e])
            i += 2
        elif e == "x":
            j = i + 2
            while j < n and body[j] in "0123456789abcdefABCDEF":
                j += 1
            if j == i + 2:
                fail(line, "\\x without hex digits")
            v = int(body[i + 2:j], 16)
            if v > 0xFF:
                fail(line, "\\x escape out of range: %s" % body[i:j])
            out.append(v)
            i = j
        elif e in "01234567":
            j = i + 1
            while j < n and j < i + 4 and body[j] in "01234567":
                j += 1
            v = int(body[i + 1:j], 8)
            if v > 0xFF:
                fail(line, "octal escape out of range")
            out.append(v)
            i = j
        elif e in "uU":
            k = 4 if e == "u" else 8
            hexd = body[i + 2:i + 2 + k]
            if len(hexd) != k or not re.fullmatch(r"[0-9a-fA-F]+", hexd):
                fail(line, "bad \\%s escape" % e)
            out += chr(int(hexd, 16)).encode("utf-8")
            i += 2 + k
        else:
            fail(line, "unknown escape \\%s" % e)
    return bytes(out)


def tokenize(text):
    line_starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def line_of(pos):
        return bisect.bisect_right(line_starts, pos)

    toks = []
    i = 0
    n = len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if c == "\n":
            at_line_start = True
            i += 1
            continue
        if c in " \t\r\f\v":
            i += 1
            continue
        if c == "#" and at_line_start:
            # preprocessor directive, with backslash continuations
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    i += 2
                    continue
                i += 1
            continue
        at_line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                fail(line_of(i), "unterminated comment")
            i = j + 2
            continue
        m = re.compile(r"[A-Za-z_][A-Za-z_0-9]*").match(text, i)
        if m:
            word = m.group(0)
            j = m.end()
            if j < n and text[j] == '"' and word in RAW_PREFIXES:
                k = text.find("(", j + 1)
                delim = text[j + 1:k]
                if k < 0 or len(delim) > 16 or re.search(r'[\s\\()"]', delim):
                    fail(line_of(i), "bad raw string delimiter")
                end_marker = ")" + delim + '"'
                e = text.find(end_marker, k + 1)
                if e < 0:
                    fail(line_of(i), "unterminated raw string")
                body = text[k + 1:e]
                toks.append(Tok("str", (word[:-1], body.encode("utf-8")), line_of(i), i))
                i = e + len(end_marker)
                continue
            if j < n and text[j] in "\"'" and word in STR_PREFIXES:
                i0 = i
                i = j
                kind, body, i = _lex_quoted(text, i, line_of)
                if kind == "str":
                    toks.append(Tok("str", (word, decode_escapes(body, line_of(i0))), line_of(i0), i0))
                else:
                    toks.append(Tok("chr", word + "'" + body + "'", line_of(i0), i0))
                continue
            toks.append(Tok("id", word, line_of(i), i))
            i = j
            continue
        if c.isdigit() or (c == "." and i + 1 < n and text[i + 1].isdigit()):
            m = re.compile(r"[0-9.][0-9A-Za-z_.']*").match(text, i)
            toks.append(Tok("num", m.group(0), line_of(i), i))
            i = m.end()
            continue
        if c in "\"'":
            i0 = i
            kind, body, i = _lex_quoted(text, i, line_of)
            if kind == "str":
                toks.append(Tok("str", ("", decode_escapes(body, line_of(i0))), line_of(i0), i0))
            else:
                toks.append(Tok("chr", "'" + body + "'", line_of(i0), i0))
            continue
        for p in PUNCTS:
            if text.startswith(p, i):
                toks.append(Tok("p", p, line_of(i), i))
                i += len(p)
                break
        else:
            toks.append(Tok("p", c, line_of(i), i))
            i += 1
    return toks


def _lex_quoted(text, i, line_of):
    q = text[i]
    j = i + 1
    n = len(text)
    while j < n and text[j] != q:
        if text[j] == "\\":
            j += 2
            continue
        if text[j] == "\n":
            fail(line_of(i), "newline in quoted literal")
        j += 1
    if j >= n:
        fail(line_of(i), "unterminated literal")
    return ("str" if q == '"' else "chr"), text[i + 1:j], j + 1


OPEN = {"(": ")", "{": "}", "[": "]"}
CLOSE = {")", "}", "]"}


def match_close(toks, i):
    """Index of the bracket closing toks[i] (which is ( { or [)."""
    stack = []
    j = i
    while j < len(toks):
        t = toks[j]
        if t.kind == "p":
            if t.val in OPEN:
                stack.append(OPEN[t.val])
            elif t.val in CLOSE:
                if not stack or stack[-1] != t.val:
                    fail(t.line, "unbalanced %r" % t.val)
                stack.pop()
                if not stack:
                    return j
        j += 1
    fail(toks[i].line, "unclosed %r" % toks[i].val)


def find_at_depth0(toks, i, end, val):
    """First index in [i, end) of punct `val` outside any brackets, or -1."""
    j = i
    while j < end:
        t = toks[j]
        if t.kind == "p":
            if t.val == val:
                return j
            if t.val in OPEN:
                j = match_close(toks, j) + 1
                continue
            if t.val in CLOSE:
                fail(t.line, "unexpected %r" % t.val)
        j += 1
    return -1


def split_commas(toks, i, end):
    """Split [i, end) at depth-0 commas; returns list of (a, b) ranges; drops a trailing empty item."""
    parts = []
    start = i
    j = i
    while j < end:
        t = toks[j]
        if t.kind == "p" and t.val in OPEN:
            j = match_close(toks, j) + 1
            continue
        if t.is_p(","):
            parts.append((start, j))
            start = j + 1
        j += 1
    parts.append((start, end))
    if parts and parts[-1][0] == parts[-1][1]:
        parts.pop()
    for a, b in parts:
        if a == b:
            fail(toks[min(a, len(toks) - 1)].line, "empty list item")
    return parts


# --------------------------------------------------------------------------
# Header facts: struct field order and enums (read, not assumed)
# --------------------------------------------------------------------------

def parse_structs_and_enums(text):
    toks = tokenize(text)
    structs = {}
    enums = {}
    i = 0
    while i < len(toks):
        t = toks[i]
        if t.is_id("struct") and i + 2 < len(toks) and toks[i + 1].kind == "id" and toks[i + 2].is_p("{"):
            name = toks[i + 1].val
            end = match_close(toks, i + 2)
            fields = []
            j = i + 3
            while j < end:
                # one member declaration / definition
                k = j
                has_paren = False
                while k < end and not toks[k].is_p(";"):
                    if toks[k].is_p("{"):
                        if has_paren:
                            break
                        k = match_close(toks, k) + 1
                        continue
                    if toks[k].is_p("("):
                        has_paren = True
                        k = match_close(toks, k) + 1
                        continue
                    k += 1
                stmt = toks[j:k]
                if k < end and toks[k].is_p("{"):       # method body
                    k = match_close(toks, k)
                    if k + 1 < end and toks[k + 1].is_p(";"):
                        k += 1
                elif stmt and not has_paren and stmt[0].val not in ("using", "static", "friend", "typedef"):
                    eq = [x for x, s in enumerate(stmt) if s.is_p("=") or s.is_p("{")]
                    decl = stmt[:eq[0]] if eq else stmt
                    if len(decl) >= 2 and decl[-1].kind == "id":
                        fields.append((render_type(decl[:-1]), decl[-1].val))
                j = k + 1
            structs[name] = fields
            i = end + 1
            continue
        if t.is_id("enum") and i + 2 < len(toks) and toks[i + 1].kind == "id":
            k = i + 2
            if toks[k].is_p(":"):
                while not toks[k].is_p("{"):
                    k += 1
            if toks[k].is_p("{"):
                end = match_close(toks, k)
                members = []
                for a, b in split_commas(toks, k + 1, end):
                    members.append(toks[a].val)
                enums[toks[i + 1].val] = members
                i = end + 1
                continue
        i += 1
    return structs, enums


def tok_text(t):
    if t.kind == "str":
        return '"%s"' % t.val[1].decode("utf-8", "replace")
    return t.val


def render_type(toks):
    s = ""
    for t in toks:
        v = t.val
        if t.kind == "id" and s and (s[-1].isalnum() or s[-1] == "_"):
            s += " "
        s += v
    return s.replace("const ", "").strip()


def enum_prefix(members):
    p = os.path.commonprefix(members)
    return p[:p.rfind("_") + 1]


# --------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------

class Opaque:
    """A local we could not (or need not) evaluate; using it is an error."""

    def __init__(self, line, why):
        self.line = line
        self.why = why


class Tester:
    def __init__(self, path):
        self.path = path


class ToolVal:
    def __init__(self, key, fields):
        self.key = key
        self.fields = fields   # dict name/description/parameters -> bytes


class Val:
    def __init__(self, hint, v):
        self.hint = hint
        self.v = v


class Scope:
    def __init__(self, parent=None):
        self.parent = parent
        self.vars = {}

    def lookup(self, name):
        s = self
        while s is not None:
            if name in s.vars:
                return s.vars[name]
            s = s.parent
        return None


# Expression AST -----------------------------------------------------------

class N:
    def __init__(self, kind, line, **kw):
        self.kind = kind
        self.line = line
        self.__dict__.update(kw)


class ExprParser:
    def __init__(self, toks, i, end):
        self.toks = toks
        self.i = i
        self.end = end

    def peek(self):
        return self.toks[self.i] if self.i < self.end else None

    def line(self):
        t = self.peek()
        return t.line if t else self.toks[self.end - 1].line

    def parse_all(self):
        e = self.expr()
        if self.i != self.end:
            fail(self.toks[self.i].line, "cannot evaluate expression near %r" % (self.toks[self.i].val,))
        return e

    def expr(self):
        left = self.unary()
        while self.peek() is not None and self.peek().is_p("+"):
            line = self.peek().line
            self.i += 1
            right = self.unary()
            left = N("add", line, a=left, b=right)
        return left

    def unary(self):
        t = self.peek()
        if t is not None and t.is_p("-") and self.i + 1 < self.end and self.toks[self.i + 1].kind == "num":
            self.i += 2
            return N("num", t.line, text="-" + self.toks[self.i - 1].val)
        return self.primary()

    def primary(self):
        t = self.peek()
        if t is None:
            fail(self.line(), "expression expected")
        if t.kind == "str":
            parts = []
            while self.peek() is not None and self.peek().kind == "str":
                pfx, b = self.peek().val
                if pfx not in ("", "u8"):
                    fail(self.peek().line, "unsupported string literal prefix %r" % pfx)
                parts.append(b)
                self.i += 1
            return N("str", t.line, b=b"".join(parts))
        if t.kind == "num":
            self.i += 1
            return N("num", t.line, text=t.val)
        if t.kind == "id":
            if t.val in ("true", "false"):
                self.i += 1
                return N("bool", t.line, v=(t.val == "true"))
            name = t.val
            self.i += 1
            while self.peek() is not None and self.peek().is_p("::"):
                self.i += 1
                nt = self.peek()
                if nt is None or nt.kind != "id":
                    fail(t.line, "bad qualified name")
                name += "::" + nt.val
                self.i += 1
            nt = self.peek()
            if nt is not None and nt.is_p("("):
                close = match_close(self.toks, self.i)
                args = [ExprParser(self.toks, a, b).parse_all() for a, b in split_commas(self.toks, self.i + 1, close)]
                self.i = close + 1
                return N("call", t.line, name=name, args=args)
            if nt is not None and nt.is_p("{"):
                close = match_close(self.toks, self.i)
                items = [ExprParser(self.toks, a, b).parse_all() for a, b in split_commas(self.toks, self.i + 1, close)]
                self.i = close + 1
                return N("typed_brace", t.line, name=name, items=items)
            return N("id", t.line, name=name)
        if t.is_p("{"):
            close = match_close(self.toks, self.i)
            items = [ExprParser(self.toks, a, b).parse_all() for a, b in split_commas(self.toks, self.i + 1, close)]
            self.i = close + 1
            return N("brace", t.line, items=items)
        if t.is_p("("):
            close = match_close(self.toks, self.i)
            inner = ExprParser(self.toks, self.i + 1, close).parse_all()
            self.i = close + 1
            return inner
        fail(t.line, "cannot evaluate expression starting with %r" % (t.val,))


# --------------------------------------------------------------------------
# The extractor
# --------------------------------------------------------------------------

# Python models of the message helpers in test-chat.cpp.  Each is pinned to
# the source by a fingerprint of its definition (tokens joined by spaces); if
# llama.cpp changes a helper, extraction fails until the model is reviewed.
HELPER_FINGERPRINTS = {
    "simple_assist_msg": "9c5488285401d017",
    "message_with_tool_calls": "fed1b9ad871db1b8",
    "message_with_tool_calls_and_reasoning": "656ee9d29c4403b4",
    "message_with_reasoning_content_and_multiple_tool_calls": "24df5af766db3cc5",
    "message_with_content_and_tool_call": "3818ebda63ea9295",
    "message_with_reasoning_and_tool_call": "6fcf45e23b9ac7cb",
}

STR = "str"
BOOL = "bool"
MSG = ("struct", "common_chat_msg")
TOOL = ("struct", "common_chat_tool")
CALL = ("struct", "common_chat_tool_call")
PART = ("struct", "common_chat_msg_content_part")
PAIR_SS = ("pair", STR, STR)


def vec(h):
    return ("vec", h)


BUILDER_METHODS = {
    # name: (argument hint or None for no argument, optional)
    "reasoning_format": ("enum", "common_reasoning_format"),
    "tools": vec(TOOL),
    "enable_thinking": BOOL,
    "parallel_tool_calls": BOOL,
    "add_generation_prompt": BOOL,
    "continue_final_message": ("enum", "common_chat_continuation"),
    "json_schema": STR,
    "is_partial": BOOL,
    "expect_reconstruction": BOOL,
    "expect": MSG,
    "expect_content": STR,
    "expect_reasoning": STR,
    "expect_tool_calls": vec(CALL),
    "tool_choice": ("enum", "common_chat_tool_choice"),
    "messages": vec(MSG),
}


# What each builder setter must assign in class peg_test_builder (checked against the source).
BUILDER_TARGETS = {
    "reasoning_format": "tc_.params.reasoning_format",
    "tools": "tc_.params.tools",
    "enable_thinking": "tc_.params.enable_thinking",
    "parallel_tool_calls": "tc_.params.parallel_tool_calls",
    "add_generation_prompt": "tc_.params.add_generation_prompt",
    "continue_final_message": "tc_.params.continue_final_message",
    "json_schema": "tc_.params.json_schema",
    "is_partial": "tc_.is_partial",
    "expect_reconstruction": "tc_.expect_reconstruction",
    "expect": "tc_.expect",
    "expect_content": "tc_.expect.content",
    "expect_reasoning": "tc_.expect.reasoning_content",
    "expect_tool_calls": "tc_.expect.tool_calls",
    "tool_choice": "tc_.params.tool_choice",
    "messages": "tc_.params.messages",
}


def fingerprint(toks):
    h = hashlib.sha256()
    for t in toks:
        h.update(repr(t.val).encode("utf-8"))
        h.update(b" ")
    return h.hexdigest()[:16]


class Extractor:
    def __init__(self, source_text, header_texts):
        self.toks = tokenize(source_text)
        self.structs = {}
        self.enums = {}
        for ht in header_texts:
            s, e = parse_structs_and_enums(ht)
            self.structs.update(s)
            self.enums.update(e)
        for need in ("common_chat_msg", "common_chat_tool", "common_chat_tool_call", "common_chat_msg_content_part"):
            if need not in self.structs:
                fail(None, "struct %s not found in headers" % need)
        for need in ("common_reasoning_format", "common_chat_continuation", "common_chat_tool_choice"):
            if need not in self.enums:
                fail(None, "enum %s not found in headers" % need)
        self.tool_registry = collections.OrderedDict()   # key -> fields
        self.cases = []
        self.run_sites = set()       # token index of every `. run ( )` in the file
        self.run_done = set()
        self.functions = {}          # name -> dict(params, body_start, body_end, start)
        self.globals = Scope()
        self.helper_fps = {}
        self.call_depth = 0
        for k in range(len(self.toks) - 3):
            if self.toks[k].is_p(".") and self.toks[k + 1].is_id("run") and self.toks[k + 2].is_p("(") \
                    and self.toks[k + 3].is_p(")"):
                self.run_sites.add(k)

    # ---- top level ---------------------------------------------------------

    def scan_top_level(self):
        toks = self.toks
        i = 0
        n = len(toks)
        while i < n:
            start = i
            j = i
            prev = None
            func_body = None
            while j < n:
                t = toks[j]
                if t.is_p(";"):
                    break
                if t.is_p("{"):
                    close = match_close(toks, j)
                    if prev is not None and (prev.is_p(")") or prev.is_id("const") or prev.is_id("override")
                                             or prev.is_id("noexcept")):
                        func_body = (j, close)
                        break
                    j = close + 1
                    prev = toks[close]
                    continue
                if t.kind == "p" and t.val in ("(", "["):
                    close = match_close(toks, j)
                    j = close + 1
                    prev = toks[close]
                    continue
                if t.kind == "p" and t.val in CLOSE:
                    fail(t.line, "unexpected %r at top level" % t.val)
                prev = t
                j += 1
            if func_body is not None:
                self.record_function(start, func_body[0], func_body[1])
                i = func_body[1] + 1
                continue
            if start < j:
                self.global_statement(start, j)
            i = j + 1

    def record_function(self, start, body_open, body_close):
        toks = self.toks
        # name: identifier right before the first depth-0 '(' of the header
        p = find_at_depth0(toks, start, body_open, "(")
        if p <= start or toks[p - 1].kind != "id":
            return   # operators, lambdas etc.: not callable by name from the test code
        name = toks[p - 1].val
        if p - 2 >= start and toks[p - 2].is_p("::"):
            return   # out-of-class member definitions
        pclose = match_close(toks, p)
        params = []
        for a, b in split_commas(toks, p + 1, pclose):
            eq = find_at_depth0(toks, a, b, "=")
            decl_end = eq if eq >= 0 else b
            # an unnamed parameter (e.g. `const T & /* rules */`) gets a placeholder name
            params.append(toks[decl_end - 1].val if toks[decl_end - 1].kind == "id" else "<unnamed>")
        info = dict(name=name, params=params, start=start, body=(body_open, body_close),
                    line=toks[p - 1].line)
        if name in self.functions:
            info["overloaded"] = True
        self.functions[name] = info
        if name in HELPER_FINGERPRINTS:
            self.helper_fps[name] = fingerprint(toks[start:body_close + 1])

    def global_statement(self, a, b):
        # Only variable declarations matter at file scope; type definitions etc. are ignored.
        if self.toks[a].kind == "id" and self.toks[a].val in ("class", "struct", "enum", "union", "template",
                                                             "using", "typedef", "namespace", "extern"):
            return
        self.declaration(a, b, self.globals, at_file_scope=True)

    # ---- helpers ------------------------------------------------------------

    def check_helpers(self, allow_unpinned=False):
        bad = []
        for name, fp in HELPER_FINGERPRINTS.items():
            got = self.helper_fps.get(name)
            if got is None:
                bad.append("%s: not defined in the source" % name)
            elif got != fp and not allow_unpinned:
                bad.append("%s (line %d): definition changed (fingerprint %s, expected %s); "
                           "review the Python model and update HELPER_FINGERPRINTS"
                           % (name, self.functions[name]["line"], got, fp))
        if bad:
            fail(None, "message helpers:\n  " + "\n  ".join(bad))

    def empty_struct(self, sname):
        d = collections.OrderedDict()
        for ftype, fname in self.structs[sname]:
            h = self.type_hint(ftype)
            d[fname] = self.default_of(h, None)
        return d

    def helper_call(self, name, args, line):
        def sam(content, reasoning=b"", tool_name=b"", arguments=b"", id_=b""):
            msg = self.empty_struct("common_chat_msg")
            msg["role"] = b"assistant"
            msg["content"] = content
            msg["reasoning_content"] = reasoning
            if tool_name or id_:
                tc = self.empty_struct("common_chat_tool_call")
                tc["name"], tc["arguments"], tc["id"] = tool_name, arguments, id_
                msg["tool_calls"].append(tc)
            return msg

        def multi(reasoning, content, pairs):
            msg = self.empty_struct("common_chat_msg")
            msg["role"] = b"assistant"
            msg["content"] = content
            msg["reasoning_content"] = reasoning
            for nm, ar in pairs:
                tc = self.empty_struct("common_chat_tool_call")
                tc["name"], tc["arguments"], tc["id"] = nm, ar, b""
                msg["tool_calls"].append(tc)
            return msg

        table = {
            "simple_assist_msg": ([STR, STR, STR, STR, STR], 1, sam),
            "message_with_tool_calls": ([STR, STR], 2, lambda n_, a_: sam(b"", b"", n_, a_)),
            "message_with_tool_calls_and_reasoning": ([STR, STR, STR], 3, lambda n_, a_, r_: sam(b"", r_, n_, a_)),
            "message_with_reasoning_content_and_multiple_tool_calls": ([STR, STR, vec(PAIR_SS)], 3, multi),
            "message_with_content_and_tool_call": ([STR, STR, STR], 3, lambda c_, n_, a_: sam(c_, b"", n_, a_)),
            "message_with_reasoning_and_tool_call": ([STR, STR, STR], 3, lambda r_, n_, a_: sam(b"", r_, n_, a_)),
        }
        hints, min_args, fn = table[name]
        if not (min_args <= len(args) <= len(hints)):
            fail(line, "%s: expected %d..%d arguments, got %d" % (name, min_args, len(hints), len(args)))
        vals = [self.ev(a, h, self.cur_scope) for a, h in zip(args, hints)]
        return fn(*vals)

    # ---- types --------------------------------------------------------------

    def type_hint(self, tstr):
        t = tstr.replace(" ", "").replace("&", "")
        if t in ("std::string", "char*", "std::string_view"):
            return STR
        if t == "bool":
            return BOOL
        if t in ("common_chat_msg", "common_chat_tool", "common_chat_tool_call", "common_chat_msg_content_part"):
            return ("struct", t)
        m = re.fullmatch(r"std::vector<(.*)>", t)
        if m:
            inner = self.type_hint(m.group(1))
            return vec(inner) if inner is not None else None
        if t == "std::pair<std::string,std::string>":
            return PAIR_SS
        if t in self.enums:
            return ("enum", t)
        if t == "peg_tester":
            return "tester"
        return None

    def default_of(self, hint, line):
        if hint == STR:
            return b""
        if hint == BOOL:
            return False
        if isinstance(hint, tuple) and hint[0] == "vec":
            return []
        if isinstance(hint, tuple) and hint[0] == "struct":
            return self.empty_struct(hint[1])
        fail(line, "no default value for %r" % (hint,))

    # ---- expression evaluation ---------------------------------------------

    def ev(self, node, hint, scope):
        saved = getattr(self, "cur_scope", None)
        self.cur_scope = scope
        try:
            return self._ev(node, hint, scope)
        finally:
            self.cur_scope = saved

    def _lookup(self, node, scope, hint):
        v = scope.lookup(node.name)
        if v is None:
            fail(node.line, "unknown identifier %r" % node.name)
        if isinstance(v, Opaque):
            fail(node.line, "%r is used here, but its definition at line %d could not be evaluated: %s"
                 % (node.name, v.line, v.why))
        if isinstance(v, Tester):
            if hint is None:
                return v
            fail(node.line, "%r is a tester, not a value" % node.name)
        if hint is not None and v.hint != hint:
            fail(node.line, "%r has type %r, expected %r" % (node.name, v.hint, hint))
        return v.v

    def _ev(self, node, hint, scope):
        k = node.kind
        if hint is None:
            # infer (used for `auto` locals and function arguments)
            if k in ("str", "add"):
                return Val(STR, self._ev(node, STR, scope))
            if k == "bool":
                return Val(BOOL, node.v)
            if k == "id":
                v = scope.lookup(node.name)
                if isinstance(v, (Val, Tester)):
                    return v
                return Val(*self._infer_id(node, scope))
            if k == "call" and node.name in HELPER_FINGERPRINTS:
                return Val(MSG, self._ev(node, MSG, scope))
            if k == "call" and node.name == "std::string":
                return Val(STR, self._ev(node, STR, scope))
            if k == "call" and node.name == "peg_tester":
                return self.make_tester(node, scope)
            if k == "typed_brace":
                h = self.type_hint(node.name)
                if h is not None:
                    return Val(h, self._ev(node, h, scope))
            fail(node.line, "cannot evaluate this expression (no type known)")

        if k == "id":
            if isinstance(hint, tuple) and hint[0] == "enum":
                members = self.enums[hint[1]]
                if node.name in members:
                    return node.name[len(enum_prefix(members)):].lower()
            if hint == BOOL and node.name in ("true", "false"):
                return node.name == "true"
            return self._lookup(node, scope, hint)

        if hint == STR:
            if k == "str":
                return node.b
            if k == "add":
                return self._ev(node.a, STR, scope) + self._ev(node.b, STR, scope)
            if k == "call" and node.name == "std::string":
                if len(node.args) != 1:
                    fail(node.line, "std::string(...) with %d arguments" % len(node.args))
                return self._ev(node.args[0], STR, scope)
            if k in ("brace", "typed_brace") and (k == "brace" or node.name == "std::string"):
                if len(node.items) == 0:
                    return b""
                if len(node.items) == 1:
                    return self._ev(node.items[0], STR, scope)
            fail(node.line, "expected a string expression")

        if hint == BOOL:
            if k == "bool":
                return node.v
            fail(node.line, "expected true/false")

        if isinstance(hint, tuple) and hint[0] == "enum":
            fail(node.line, "expected a %s constant" % hint[1])

        if isinstance(hint, tuple) and hint[0] == "vec":
            if k != "brace":
                fail(node.line, "expected a braced list for %r" % (hint,))
            return [self._ev(it, hint[1], scope) for it in node.items]

        if hint == PAIR_SS:
            if k != "brace" or len(node.items) != 2:
                fail(node.line, "expected a {string, string} pair")
            return (self._ev(node.items[0], STR, scope), self._ev(node.items[1], STR, scope))

        if isinstance(hint, tuple) and hint[0] == "struct":
            sname = hint[1]
            if k == "call" and sname == "common_chat_msg" and node.name in HELPER_FINGERPRINTS:
                return self.helper_call(node.name, node.args, node.line)
            if k == "typed_brace" and node.name != sname:
                fail(node.line, "%s{...} where %s is expected" % (node.name, sname))
            if k in ("brace", "typed_brace"):
                fields = self.structs[sname]
                if len(node.items) > len(fields):
                    fail(node.line, "too many initializers for %s" % sname)
                d = self.empty_struct(sname)
                for it, (ftype, fname) in zip(node.items, fields):
                    fh = self.type_hint(ftype)
                    if fh is None:
                        fail(it.line, "cannot initialise %s.%s of type %s" % (sname, fname, ftype))
                    d[fname] = self._ev(it, fh, scope)
                if sname == "common_chat_tool":
                    return self.new_tool(None, d, node.line)
                return d
            fail(node.line, "cannot evaluate a %s from this expression" % sname)

        fail(node.line, "cannot evaluate expression as %r" % (hint,))

    def _infer_id(self, node, scope):
        for ename, members in self.enums.items():
            if node.name in members:
                return ("enum", ename), node.name[len(enum_prefix(members)):].lower()
        v = scope.lookup(node.name)
        if isinstance(v, Opaque):
            self._lookup(node, scope, None)
        fail(node.line, "unknown identifier %r" % node.name)

    def make_tester(self, node, scope):
        if not node.args:
            fail(node.line, "peg_tester() without a template path")
        path = self.ev(node.args[0], STR, scope).decode("utf-8")
        if not path.startswith(TEMPLATE_DIR) or "/" in path[len(TEMPLATE_DIR):]:
            fail(node.line, "template path %r is not under %s" % (path, TEMPLATE_DIR))
        return Tester(path)

    def new_tool(self, var_name, fields, line):
        key = var_name if var_name else "%s@L%d" % (fields["name"].decode("utf-8"), line)
        if key in self.tool_registry and self.tool_registry[key] != fields:
            key = "%s@L%d" % (key, line)
        if key in self.tool_registry and self.tool_registry[key] != fields:
            fail(line, "tool key collision for %r" % key)
        tv = ToolVal(key, fields)
        self.tool_registry.setdefault(key, fields)
        return tv

    # ---- statements -----------------------------------------------------------

    def sentinel(self, a, b, scope):
        """Does [a, b) contain anything that produces test cases?"""
        for k in range(a, b):
            t = self.toks[k]
            if k in self.run_sites:
                return t
            if t.kind == "id":
                if t.val == "peg_tester":
                    return t
                if isinstance(scope.lookup(t.val), Tester):
                    return t
                f = self.functions.get(t.val)
                if f is not None and self.function_has_runs(t.val) and k + 1 < b and self.toks[k + 1].is_p("("):
                    return t
        return None

    def function_has_runs(self, name, seen=None):
        seen = seen or set()
        if name in seen:
            return False
        seen.add(name)
        f = self.functions[name]
        a, b = f["body"]
        for k in range(a, b):
            if k in self.run_sites:
                return True
            t = self.toks[k]
            if t.kind == "id" and t.val in self.functions and k + 1 < b and self.toks[k + 1].is_p("(") \
                    and self.function_has_runs(t.val, seen):
                return True
        return False

    def statement_end(self, i, end):
        j = find_at_depth0(self.toks, i, end, ";")
        if j < 0:
            fail(self.toks[i].line, "statement without ';'")
        return j

    def control_extent(self, i, end):
        """End (exclusive) of a control statement starting at i (if/while/for/switch/do/try)."""
        toks = self.toks
        t = toks[i]
        if t.val in ("if", "while", "switch", "for"):
            j = i + 1
            if toks[j].is_id("constexpr"):
                j += 1
            close = match_close(toks, j)
            j = self.sub_statement_end(close + 1, end)
            if t.val == "if" and j < end and toks[j].is_id("else"):
                j = self.sub_statement_end(j + 1, end)
            return j
        if t.val == "do":
            j = self.sub_statement_end(i + 1, end)
            return self.statement_end(j, end) + 1
        if t.val == "try":
            j = match_close(toks, i + 1) + 1
            while j < end and toks[j].is_id("catch"):
                close = match_close(toks, j + 1)
                j = match_close(toks, close + 1) + 1
            return j
        fail(t.line, "unexpected control statement")

    def sub_statement_end(self, i, end):
        t = self.toks[i]
        if t.is_p("{"):
            return match_close(self.toks, i) + 1
        if t.kind == "id" and t.val in ("if", "while", "switch", "for", "do", "try"):
            return self.control_extent(i, end)
        return self.statement_end(i, end) + 1

    def run_block(self, i, end, scope):
        while i < end:
            i = self.run_stmt(i, end, scope)

    def run_stmt(self, i, end, scope):
        toks = self.toks
        t = toks[i]
        if t.is_p(";"):
            return i + 1
        if t.is_p("{"):
            close = match_close(toks, i)
            self.run_block(i + 1, close, Scope(scope))
            return close + 1
        if t.is_id("for"):
            return self.run_for(i, end, scope)
        if t.kind == "id" and t.val in ("if", "while", "switch", "do", "try"):
            j = self.control_extent(i, end)
            s = self.sentinel(i, j, scope)
            if s is not None:
                fail(t.line, "test cases inside `%s` (line %d) cannot be evaluated" % (t.val, s.line))
            return j
        if t.kind == "id" and t.val in ("return", "break", "continue", "goto", "throw"):
            j = self.statement_end(i, end)
            fail(t.line, "`%s` in a function that defines test cases is not supported" % t.val)
        j = self.statement_end(i, end)
        self.simple_statement(i, j, scope)
        return j + 1

    def run_for(self, i, end, scope):
        toks = self.toks
        hopen = i + 1
        hclose = match_close(toks, hopen)
        body_end = self.sub_statement_end(hclose + 1, end)
        colon = find_at_depth0(toks, hopen + 1, hclose, ":")
        if colon < 0:
            s = self.sentinel(i, body_end, scope)
            if s is not None:
                fail(toks[i].line, "test cases inside a non-range `for` (line %d) cannot be evaluated" % s.line)
            return body_end
        var = toks[colon - 1]
        if var.kind != "id":
            fail(var.line, "unsupported range-for declaration")
        rng = ExprParser(toks, colon + 1, hclose).parse_all()
        if rng.kind != "brace":
            s = self.sentinel(i, body_end, scope)
            if s is not None:
                fail(toks[i].line, "range-for over a non-literal list with test cases (line %d)" % s.line)
            return body_end
        values = [self.ev(it, None, scope) for it in rng.items]
        for v in values:
            inner = Scope(scope)
            inner.vars[var.val] = v
            if toks[hclose + 1].is_p("{"):
                self.run_block(hclose + 2, body_end - 1, Scope(inner))
            else:
                self.run_stmt(hclose + 1, body_end, inner)
        return body_end

    def simple_statement(self, a, b, scope):
        toks = self.toks
        t = toks[a]
        if t.kind == "id" and isinstance(scope.lookup(t.val), Tester):
            self.run_chain(a, b, scope)
            return
        if self.declaration(a, b, scope, at_file_scope=False):
            return
        if t.kind == "id" and a + 1 < b and toks[a + 1].is_p("(") and t.val in self.functions \
                and self.function_has_runs(t.val):
            close = match_close(toks, a + 1)
            if close + 1 != b:
                fail(t.line, "unsupported call expression")
            self.call_function(t.val, a, close, scope)
            return
        if t.kind == "id" and a + 1 < b and toks[a + 1].is_p("."):
            v = scope.lookup(t.val)
            if isinstance(v, Val):
                self.member_assign(v, a, b, scope)
                return
        s = self.sentinel(a, b, scope)
        if s is not None:
            fail(t.line, "statement with test cases (line %d) cannot be evaluated" % s.line)
        # anything else (logging, assertions, opaque locals) produces no cases

    def member_assign(self, v, a, b, scope):
        toks = self.toks
        t = toks[a]
        if not (v.hint == MSG and a + 3 < b and toks[a + 2].kind == "id" and toks[a + 3].is_p("=")):
            fail(t.line, "unsupported mutation of %r" % t.val)
        field = toks[a + 2].val
        ftypes = dict((fn, ft) for ft, fn in self.structs["common_chat_msg"])
        if field not in ftypes:
            fail(t.line, "common_chat_msg has no field %r" % field)
        h = self.type_hint(ftypes[field])
        node = ExprParser(toks, a + 4, b).parse_all()
        v.v[field] = self.ev(node, h, scope)

    def declaration(self, a, b, scope, at_file_scope):
        """Try to read [a, b) as a variable declaration; bind it and return True if it is one."""
        toks = self.toks
        k = a
        while k < b and toks[k].kind == "id" and toks[k].val in ("static", "const", "constexpr", "inline"):
            k += 1
        if k >= b or toks[k].kind != "id":
            return False
        tstart = k
        k += 1
        while k + 1 < b and toks[k].is_p("::") and toks[k + 1].kind == "id":
            k += 2
        if k < b and toks[k].is_p("<"):
            depth = 0
            while k < b:
                if toks[k].is_p("<"):
                    depth += 1
                elif toks[k].is_p(">"):
                    depth -= 1
                elif toks[k].is_p(">>"):
                    depth -= 2
                k += 1
                if depth <= 0:
                    break
            if depth != 0:
                return False
        while k < b and (toks[k].is_id("const") or (toks[k].kind == "p" and toks[k].val in ("*", "&", "&&"))):
            k += 1
        if k >= b or toks[k].kind != "id":
            return False
        name_tok = toks[k]
        tstr = render_type(toks[tstart:k])
        init = k + 1
        if init < b and not (toks[init].kind == "p" and toks[init].val in ("=", "{", "(")):
            return False
        if toks[tstart].val in ("return", "delete", "throw", "case", "goto", "else", "using", "typedef"):
            return False
        name = name_tok.val
        line = name_tok.line
        hint = "auto" if toks[tstart].val == "auto" and tstr == "auto" else self.type_hint(tstr)
        try:
            if hint is None:
                s = self.sentinel(a, b, scope)
                if s is not None:
                    fail(line, "declaration of unsupported type %r involves test cases" % tstr)
                val = Opaque(line, "type %s is not modelled" % tstr)
            elif init == b:
                val = Tester(None) if hint == "tester" else Val(hint, self.default_of(hint, line))
                if hint == "tester":
                    fail(line, "peg_tester without arguments")
            elif toks[init].is_p("("):
                close = match_close(toks, init)
                if hint == "tester":
                    args = [ExprParser(toks, x, y).parse_all() for x, y in split_commas(toks, init + 1, close)]
                    val = self.make_tester(N("call", line, name="peg_tester", args=args), scope)
                elif hint == STR:
                    args = [ExprParser(toks, x, y).parse_all() for x, y in split_commas(toks, init + 1, close)]
                    if len(args) != 1:
                        fail(line, "std::string constructor with %d arguments" % len(args))
                    val = Val(STR, self.ev(args[0], STR, scope))
                else:
                    val = Opaque(line, "constructor-style initialisation is not modelled")
            else:
                start = init + 1 if toks[init].is_p("=") else init
                node = ExprParser(toks, start, b).parse_all()
                if hint == "auto":
                    val = self.ev(node, None, scope)
                elif hint == "tester":
                    val = self.make_tester(node, scope) if node.kind == "call" and node.name == "peg_tester" \
                        else fail(line, "unsupported peg_tester initialisation")
                else:
                    val = Val(hint, self.ev(node, hint, scope))
        except ExtractError as e:
            if self.sentinel(a, b, scope) is not None:
                raise
            val = Opaque(line, str(e))
        if isinstance(val, Val) and val.hint == TOOL:
            # a named tool: register under its variable name
            tv = val.v
            val = Val(TOOL, self.rename_tool(tv, name, line))
        scope.vars[name] = val
        return True

    def rename_tool(self, tv, name, line):
        # tv was registered under an inline key by the struct evaluator; re-key it
        if tv.key in self.tool_registry and tv.key.endswith("@L%d" % line) and tv.key.startswith(
                tv.fields["name"].decode("utf-8") + "@L"):
            del self.tool_registry[tv.key]
        return self.new_tool(name, tv.fields, line)

    def call_function(self, name, a, close, caller_scope):
        toks = self.toks
        f = self.functions[name]
        if f.get("overloaded"):
            fail(toks[a].line, "call to overloaded function %s" % name)
        args = [ExprParser(toks, x, y).parse_all() for x, y in split_commas(toks, a + 2, close)]
        if len(args) > len(f["params"]):
            fail(toks[a].line, "too many arguments to %s" % name)
        fscope = Scope(self.globals)
        for pname, node in zip(f["params"], args):
            try:
                fscope.vars[pname] = self.ev(node, None, caller_scope)
            except ExtractError as e:
                fscope.vars[pname] = Opaque(toks[a].line, str(e))
        for pname in f["params"][len(args):]:
            fscope.vars[pname] = Opaque(toks[a].line, "defaulted parameter is not modelled")
        self.call_depth += 1
        if self.call_depth > 20:
            fail(toks[a].line, "recursion too deep")
        self.run_block(f["body"][0] + 1, f["body"][1], fscope)
        self.call_depth -= 1

    # ---- the builder chain ----------------------------------------------------------

    def run_chain(self, a, b, scope):
        toks = self.toks
        tester = scope.lookup(toks[a].val)
        if not (toks[a + 1].is_p(".") and toks[a + 2].is_id("test") and toks[a + 3].is_p("(")):
            fail(toks[a].line, "expected %s.test(...)" % toks[a].val)
        test_line = toks[a + 2].line
        calls = []
        k = a + 1
        while k < b:
            if not (toks[k].is_p(".") and k + 2 < b and toks[k + 1].kind == "id" and toks[k + 2].is_p("(")):
                fail(toks[k].line, "unexpected %r in builder chain" % (toks[k].val,))
            close = match_close(toks, k + 2)
            args = [ExprParser(toks, x, y).parse_all() for x, y in split_commas(toks, k + 3, close)]
            calls.append((toks[k + 1].val, args, toks[k + 1].line, k))
            k = close + 1
        if calls[-1][0] != "run" or calls[-1][1]:
            fail(test_line, "builder chain does not end in .run()")
        run_k = calls[-1][3]
        if run_k not in self.run_sites:
            fail(test_line, "internal: run site not indexed")
        for c in calls[1:-1]:
            if c[0] == "run":
                fail(c[2], ".run() in the middle of a chain")
        input_node = calls[0][1]
        if len(input_node) != 1:
            fail(test_line, "test() takes one argument")
        case = collections.OrderedDict()
        inp = self.ev(input_node[0], STR, scope)
        st = dict(reasoning_format=None, enable_thinking=None, tool_choice=None, parallel_tool_calls=None,
                  json_schema=None, add_generation_prompt=True, continue_final_message=None, tools=[],
                  messages=[], is_partial=False, expect=self.empty_struct("common_chat_msg"))
        for name, args, line, _ in calls[1:-1]:
            if name not in BUILDER_METHODS:
                fail(line, "unknown builder method .%s()" % name)
            hint = BUILDER_METHODS[name]
            if name == "expect_reconstruction" and not args:
                continue
            if len(args) != 1:
                fail(line, ".%s() takes one argument" % name)
            v = self.ev(args[0], hint, scope)
            if name in ("reasoning_format", "enable_thinking", "tool_choice", "parallel_tool_calls",
                        "add_generation_prompt", "continue_final_message", "is_partial"):
                st[name] = v
            elif name == "json_schema":
                try:
                    st[name] = json.loads(v.decode("utf-8"), object_pairs_hook=collections.OrderedDict)
                except ValueError as e:
                    fail(line, "json_schema is not valid JSON: %s" % e)
            elif name == "tools":
                st["tools"] = [tv.key for tv in v]
            elif name == "messages":
                st["messages"] = v
            elif name == "expect":
                st["expect"] = v
            elif name == "expect_content":
                st["expect"]["content"] = v
            elif name == "expect_reasoning":
                st["expect"]["reasoning_content"] = v
            elif name == "expect_tool_calls":
                st["expect"]["tool_calls"] = v
            elif name == "expect_reconstruction":
                pass
            else:
                fail(line, "internal: unhandled method %s" % name)
        if not st["messages"]:
            msg_user = self.globals.lookup("message_user")
            if not isinstance(msg_user, Val) or msg_user.hint != MSG:
                fail(test_line, "default message_user is not defined")
            st["messages"] = [msg_user.v]
        self.run_done.add(run_k)

        exp = st["expect"]
        if exp["role"] not in (b"", b"assistant"):
            fail(test_line, "expected message has role %r" % exp["role"])
        for f in ("content_parts", "tool_name", "tool_call_id"):
            if exp[f]:
                fail(test_line, "expected message sets %s, which the output format cannot carry" % f)

        def s(bv, line=test_line):
            try:
                return bv.decode("utf-8")
            except UnicodeDecodeError:
                fail(line, "string is not valid UTF-8: %r" % bv)

        messages = []
        for m in st["messages"]:
            if m["content_parts"]:
                fail(test_line, "message with content_parts cannot be written")
            om = collections.OrderedDict()
            om["role"] = s(m["role"])
            om["content"] = s(m["content"])
            if m["reasoning_content"]:
                om["reasoning_content"] = s(m["reasoning_content"])
            if m["tool_calls"]:
                om["tool_calls"] = [collections.OrderedDict([
                    ("id", s(tc["id"])), ("type", "function"),
                    ("function", collections.OrderedDict([("name", s(tc["name"])),
                                                          ("arguments", s(tc["arguments"]))]))])
                    for tc in m["tool_calls"]]
            if m["tool_call_id"]:
                om["tool_call_id"] = s(m["tool_call_id"])
            if m["tool_name"]:
                om["name"] = s(m["tool_name"])
            messages.append(om)

        path = tester.path
        tname = path[len(TEMPLATE_DIR):]
        case["id"] = None
        case["line"] = test_line
        case["template"] = tname
        case["input"] = s(inp)
        case["is_partial"] = st["is_partial"]
        case["reasoning_format"] = st["reasoning_format"]
        case["enable_thinking"] = st["enable_thinking"]
        case["tool_choice"] = st["tool_choice"]
        case["parallel_tool_calls"] = st["parallel_tool_calls"]
        case["json_schema"] = st["json_schema"]
        case["add_generation_prompt"] = st["add_generation_prompt"]
        case["continue_final_message"] = st["continue_final_message"]
        case["tools"] = st["tools"]
        case["messages"] = messages
        case["expect"] = collections.OrderedDict([
            ("content", s(exp["content"])),
            ("reasoning_content", s(exp["reasoning_content"])),
            ("tool_calls", [collections.OrderedDict([("name", s(tc["name"])), ("arguments", s(tc["arguments"])),
                                                     ("id", s(tc["id"]))]) for tc in exp["tool_calls"]]),
        ])
        case["continuation"] = bool(messages) and messages[-1]["role"] == "assistant"
        case["disputed"] = None
        self.cases.append(case)

    def check_builder(self):
        """The modelled builder semantics must match class peg_test_builder and test_peg_parser."""
        toks = self.toks
        cls = None
        for k in range(len(toks) - 2):
            if toks[k].is_id("class") and toks[k + 1].is_id("peg_test_builder") and toks[k + 2].is_p("{"):
                cls = (k + 2, match_close(toks, k + 2))
                break
        if cls is None:
            fail(None, "class peg_test_builder not found")
        a, b = cls
        found = {}
        ctor_ok = False
        k = a
        while k < b:
            if toks[k].is_id("peg_test_builder") and toks[k + 1].is_p("&") and toks[k + 2].kind == "id" \
                    and toks[k + 3].is_p("("):
                name = toks[k + 2].val
                body = find_at_depth0(toks, match_close(toks, k + 3) + 1, b, "{")
                end = match_close(toks, body)
                eq = find_at_depth0(toks, body + 1, end, "=")
                found[name] = "".join(tok_text(t) for t in toks[body + 1:eq]) if eq > 0 else None
                k = end + 1
                continue
            if toks[k].is_id("add_generation_prompt") and toks[k + 1].is_p("=") and toks[k + 2].is_id("true"):
                ctor_ok = True
            k += 1
        problems = []
        if found.keys() != BUILDER_TARGETS.keys():
            problems.append("builder methods changed: added %s, removed %s" % (
                sorted(found.keys() - BUILDER_TARGETS.keys()), sorted(BUILDER_TARGETS.keys() - found.keys())))
        for name, target in BUILDER_TARGETS.items():
            if name in found and found[name] != target:
                problems.append(".%s() now assigns %s (modelled: %s)" % (name, found[name], target))
        if not ctor_ok:
            problems.append("builder no longer defaults add_generation_prompt = true")
        f = self.functions.get("test_peg_parser")
        body = "" if f is None else " ".join(tok_text(t) for t in toks[f["body"][0]:f["body"][1]])
        for needle in ("if ( tc . params . messages . empty ( ) ) { tc . params . messages = { message_user } ; }",
                       'if ( tc . expect . role . empty ( ) ) { tc . expect . role = "assistant" ; }'):
            if needle not in body:
                problems.append("test_peg_parser no longer contains: %s" % needle)
        if problems:
            fail(None, "builder semantics:\n  " + "\n  ".join(problems))

    # ---- driver ---------------------------------------------------------------------

    def extract(self, allow_unpinned=False):
        self.scan_top_level()
        self.check_helpers(allow_unpinned)
        self.check_builder()
        if "main" not in self.functions:
            fail(None, "main() not found")
        roots = []
        ma, mb = self.functions["main"]["body"]
        for k in range(ma, mb):
            t = self.toks[k]
            if t.kind == "id" and t.val in self.functions and self.toks[k + 1].is_p("(") \
                    and t.val not in roots and self.function_has_runs(t.val):
                roots.append(t.val)
        if not roots:
            fail(None, "no test function with .run() chains is called from main()")
        for r in roots:
            f = self.functions[r]
            fscope = Scope(self.globals)
            for p in f["params"]:
                fscope.vars[p] = Opaque(f["line"], "parameter %s of %s comes from the command line" % (p, r))
            self.run_block(f["body"][0] + 1, f["body"][1], fscope)
        missing = sorted(self.run_sites - self.run_done)
        if missing:
            fail(self.toks[missing[0]].line, "%d .run() chain(s) never evaluated (first here); lines: %s"
                 % (len(missing), ", ".join(str(self.toks[m].line) for m in missing)))
        # ids
        groups = collections.Counter((c["template"], c["line"]) for c in self.cases)
        seen = collections.Counter()
        for c in self.cases:
            stem = c["template"][:-len(".jinja")] if c["template"].endswith(".jinja") else c["template"]
            key = (c["template"], c["line"])
            if groups[key] > 1:
                seen[key] += 1
                c["id"] = "%s:%d:%d" % (stem, c["line"], seen[key])
            else:
                c["id"] = "%s:%d" % (stem, c["line"])
        ids = [c["id"] for c in self.cases]
        if len(set(ids)) != len(ids):
            fail(None, "duplicate case ids")
        unknown = sorted(set(DISPUTED) - set(ids))
        if unknown:
            fail(None, "DISPUTED names cases that do not exist: " + ", ".join(unknown))
        for c in self.cases:
            c["disputed"] = DISPUTED.get(c["id"])
        return roots


# --------------------------------------------------------------------------
# git, output, check
# --------------------------------------------------------------------------

def git(repo, *args):
    try:
        r = subprocess.run(["git", "-C", repo] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           check=True)
    except subprocess.CalledProcessError as e:
        raise ExtractError("git %s failed: %s" % (" ".join(args), e.stderr.decode("utf-8", "replace").strip()))
    return r.stdout


def tool_json(fields, key):
    try:
        params = json.loads(fields["parameters"].decode("utf-8"), object_pairs_hook=collections.OrderedDict)
    except ValueError as e:
        raise ExtractError("tool %s: parameters are not valid JSON: %s" % (key, e))
    return collections.OrderedDict([
        ("type", "function"),
        ("function", collections.OrderedDict([
            ("name", fields["name"].decode("utf-8")),
            ("description", fields["description"].decode("utf-8")),
            ("parameters", params),
        ])),
    ])


def build(repo, commit, repo_name, allow_unpinned=False):
    full = git(repo, "rev-parse", "--verify", commit + "^{commit}").decode().strip()
    src = git(repo, "show", "%s:%s" % (full, SOURCE_PATH)).decode("utf-8")
    headers = [git(repo, "show", "%s:%s" % (full, h)).decode("utf-8") for h in HEADERS]
    ex = Extractor(src, headers)
    roots = ex.extract(allow_unpinned)
    used_tools = []
    for c in ex.cases:
        for t in c["tools"]:
            if t not in used_tools:
                used_tools.append(t)
    tools = collections.OrderedDict()
    for key, fields in ex.tool_registry.items():
        if "@L" not in key or key in used_tools:
            tools[key] = tool_json(fields, key)
    doc = collections.OrderedDict([
        ("source", collections.OrderedDict([
            ("repo", repo_name), ("commit", full), ("path", SOURCE_PATH), ("extracted_by", EXTRACTED_BY)])),
        ("tools", tools),
        ("cases", ex.cases),
    ])
    info = dict(chains=len(ex.run_sites), roots=roots, commit=full,
                date=git(repo, "log", "-1", "--format=%cI", full).decode().strip(),
                helper_fps=ex.helper_fps)
    return doc, info


def dump(doc):
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def summary(doc, chains=None):
    cases = doc["cases"]
    if chains is not None:
        print("chains found: %d" % chains)
    print("cases written: %d" % len(cases))
    print("continuation cases: %d" % sum(1 for c in cases if c["continuation"]))
    print("partial cases: %d" % sum(1 for c in cases if c["is_partial"]))
    print("tools: %d" % len(doc["tools"]))
    per = collections.Counter(c["template"] for c in cases)
    print("per template (%d templates):" % len(per))
    for t in sorted(per):
        print("  %4d  %s" % (per[t], t))


def write(out_dir, doc, repo, commit):
    os.makedirs(out_dir, exist_ok=True)
    tdir = os.path.join(out_dir, "templates")
    os.makedirs(tdir, exist_ok=True)
    needed = sorted(set(c["template"] for c in doc["cases"]))
    for name in needed:
        data = git(repo, "show", "%s:%s%s" % (commit, TEMPLATE_DIR, name))
        with open(os.path.join(tdir, name), "wb") as f:
            f.write(data)
    for name in os.listdir(tdir):
        if name not in needed:
            os.remove(os.path.join(tdir, name))
    with open(os.path.join(out_dir, CASES_FILE), "w", encoding="utf-8", newline="\n") as f:
        f.write(dump(doc))


def check(out_dir, repo=None, repo_name=None):
    path = os.path.join(out_dir, CASES_FILE)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    doc = json.loads(text, object_pairs_hook=collections.OrderedDict)
    problems = []
    src = doc.get("source", {})
    if not re.fullmatch(r"[0-9a-f]{40}", src.get("commit", "")):
        problems.append("source.commit is not a 40-hex hash")
    for k in ("repo", "path", "extracted_by"):
        if not src.get(k):
            problems.append("source.%s missing" % k)
    tools = doc.get("tools", {})
    for key, t in tools.items():
        fn = t.get("function", {})
        if t.get("type") != "function" or not fn.get("name") or not isinstance(fn.get("parameters"), dict):
            problems.append("tool %s malformed" % key)
    cases = doc.get("cases", [])
    if not cases:
        problems.append("no cases")
    ids = collections.Counter(c["id"] for c in cases)
    for i, n in ids.items():
        if n > 1:
            problems.append("duplicate id %s" % i)
    keys = ["id", "line", "template", "input", "is_partial", "reasoning_format", "enable_thinking", "tool_choice",
            "parallel_tool_calls", "json_schema", "add_generation_prompt", "continue_final_message", "tools",
            "messages", "expect", "continuation", "disputed"]
    tdir = os.path.join(out_dir, "templates")
    for c in cases:
        cid = c.get("id")
        if list(c.keys()) != keys:
            problems.append("%s: keys %s" % (cid, list(c.keys())))
            continue
        if not os.path.isfile(os.path.join(tdir, c["template"])):
            problems.append("%s: template %s missing" % (cid, c["template"]))
        stem = c["template"][:-len(".jinja")]
        if not re.fullmatch(re.escape(stem) + ":%d(:[0-9]+)?" % c["line"], cid):
            problems.append("%s: id does not match template/line" % cid)
        for t in c["tools"]:
            if t not in tools:
                problems.append("%s: tool %s does not resolve" % (cid, t))
        if not c["messages"]:
            problems.append("%s: no messages" % cid)
        elif c["continuation"] != (c["messages"][-1]["role"] == "assistant"):
            problems.append("%s: continuation flag inconsistent" % cid)
        e = c["expect"]
        if list(e.keys()) != ["content", "reasoning_content", "tool_calls"]:
            problems.append("%s: expect keys" % cid)
        for tc in e["tool_calls"]:
            if list(tc.keys()) != ["name", "arguments", "id"]:
                problems.append("%s: expect tool_call keys" % cid)
        for m in c["messages"]:
            if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                problems.append("%s: message without role/content" % cid)
        if c["reasoning_format"] not in (None, "none", "auto", "deepseek", "deepseek_legacy"):
            problems.append("%s: reasoning_format %r" % (cid, c["reasoning_format"]))
        if c["tool_choice"] not in (None, "auto", "required", "none"):
            problems.append("%s: tool_choice %r" % (cid, c["tool_choice"]))
    used = set(c["template"] for c in cases)
    if os.path.isdir(tdir):
        extra = set(os.listdir(tdir)) - used
        if extra:
            problems.append("unused template files: %s" % sorted(extra))
    if dump(doc) != text:
        problems.append("%s is not in canonical form (regenerate it)" % path)
    if repo is not None:
        fresh, info = build(repo, src["commit"], repo_name or src["repo"])
        if dump(fresh) != text:
            problems.append("re-extraction from %s at %s differs from %s" % (repo, src["commit"], path))
        for name in used:
            want = git(repo, "show", "%s:%s%s" % (src["commit"], TEMPLATE_DIR, name))
            with open(os.path.join(tdir, name), "rb") as f:
                if f.read() != want:
                    problems.append("template %s differs from the commit" % name)
        print("re-extracted from %s: %d chains" % (repo, info["chains"]))
    summary(doc)
    if problems:
        for p in problems[:50]:
            print("CHECK FAILED: " + p, file=sys.stderr)
        return 1
    print("check OK")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", help="llama.cpp git dir (bare) or checkout")
    ap.add_argument("--commit", default="HEAD", help="revision to read (default HEAD); recorded as a full hash")
    ap.add_argument("--out", default=DEFAULT_OUT, help="output directory (default %(default)s)")
    ap.add_argument("--repo-name", default="ngxson/llama.cpp", help="recorded as source.repo")
    ap.add_argument("--check", action="store_true",
                    help="verify the output directory (and, with --repo, that it matches a fresh extraction)")
    ap.add_argument("--print-fingerprints", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        if args.check:
            return check(args.out, args.repo, args.repo_name)
        if not args.repo:
            ap.error("--repo is required unless --check")
        if args.print_fingerprints:
            _, info = build(args.repo, args.commit, args.repo_name, allow_unpinned=True)
            for k, v in info["helper_fps"].items():
                print('    "%s": "%s",' % (k, v))
            return 0
        doc, info = build(args.repo, args.commit, args.repo_name)
        write(args.out, doc, args.repo, info["commit"])
        print("source: %s %s (%s) %s" % (args.repo_name, info["commit"], info["date"], SOURCE_PATH))
        print("test functions: %s" % ", ".join(info["roots"]))
        summary(doc, info["chains"])
        print("wrote %s" % os.path.join(args.out, CASES_FILE))
        return 0
    except ExtractError as e:
        print("error: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
