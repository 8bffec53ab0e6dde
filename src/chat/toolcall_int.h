/*
 * toolcall_int.h — what the toolcall_*.c files share: the incremental JSON
 * scanner, the format specification table and small byte-buffer helpers.
 * Not used outside src/chat/toolcall*.
 */
#ifndef KEEL_CHAT_TOOLCALL_INT_H
#define KEEL_CHAT_TOOLCALL_INT_H

#include "toolcall.h"

/* ---- growable byte buffer with a NUL after len ---------------------------- */

typedef struct tc_buf {
    char *p;    /* [cap] bytes, p[len] == '\0' when p != NULL */
    size_t len; /* bytes used */
    size_t cap; /* bytes allocated */
} tc_buf;

keel_status tc_buf_append(tc_buf *b, const char *s, size_t n);
void tc_buf_free(tc_buf *b);
/* Appends s as the body of a JSON string (no quotes): escapes '"', '\\' and
 * control characters; other bytes pass through. */
keel_status tc_buf_append_escaped(tc_buf *b, const char *s, size_t n);

/* ---- incremental JSON scanner ---------------------------------------------- */

/*
 * Validates one JSON value byte by byte without building it (RFC 8259
 * syntax; UTF-8 of strings is not checked), with an explicit stack (no
 * recursion) of at most JS_MAX_DEPTH containers. Feeding stops at the end
 * of the value: a top-level number ends at the first byte after it, which
 * is then not consumed (JS_R_DONE_BEFORE).
 */
#define JS_MAX_DEPTH 512

typedef enum js_result {
    JS_R_CONT = 0,        /* byte consumed, value not complete */
    JS_R_DONE = 1,        /* byte consumed, value complete */
    JS_R_DONE_BEFORE = 2, /* value was complete before this byte (not consumed) */
    JS_R_BAD = 3,         /* byte not valid here (not consumed) */
} js_result;

typedef struct json_scan {
    uint8_t stack[JS_MAX_DEPTH / 8]; /* bit d: container at depth d+1 is an object */
    int32_t depth;                   /* open containers */
    uint8_t st;                      /* JS_* state */
    uint8_t sub;                     /* literal index / \u digits seen */
    uint8_t lit;                     /* which literal (0 true, 1 false, 2 null) */
    uint8_t key;                     /* the string being scanned is an object key */
    int64_t n;                       /* bytes consumed */
} json_scan;

/* Starts before a value (leading whitespace allowed). */
void json_scan_init(json_scan *s);
/* Starts inside an object just after a member's value (",", "}" or
 * whitespace next): the rest of an object whose start was already seen. */
void json_scan_init_after_member(json_scan *s);
js_result json_scan_byte(json_scan *s, uint8_t c);
/* At end of input: JS_R_DONE if the value is complete (a top-level number
 * that was waiting for a delimiter), JS_R_BAD otherwise. */
js_result json_scan_end(json_scan *s);
/* Inside a string now (for callers that decode string arguments). */
bool json_scan_in_string(const json_scan *s);

/* ---- atomic sub-parsers over held bytes ------------------------------------ */

typedef enum tc_pr {
    TC_MORE = 0, /* prefix of something that could still parse: need more bytes */
    TC_FAIL = 1, /* cannot parse */
    TC_OK = 2,
} tc_pr;

static inline bool tc_is_ws(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Index of the first non-whitespace byte of s[i..n), or n. */
size_t tc_skip_ws(const char *s, size_t n, size_t i);
/* Whether s[i..) starts with lit: TC_OK (*i advanced), TC_MORE (a proper
 * prefix of lit fills the rest of s), TC_FAIL. */
tc_pr tc_lit(const char *s, size_t n, size_t *i, const char *lit);
/* A JSON string at s[*i] ('"'): decoded into out (cap bytes incl. NUL; a
 * longer string fails). \u escapes become UTF-8 (lone surrogates U+FFFD). */
tc_pr tc_json_string(const char *s, size_t n, size_t *i, char *out, size_t cap, size_t *out_len);
/* Skips one JSON value starting at s[*i] (whitespace allowed before). */
tc_pr tc_json_skip(const char *s, size_t n, size_t *i, bool at_end);

/* ---- Python-style calls (toolcall_py.c) ------------------------------------------ */

/* Finds the end of one `name(k=v, ...)` call, byte by byte. */
typedef struct tc_py_scan {
    int32_t depth;  /* open ( [ { */
    uint8_t quote;  /* inside a string quoted by this byte, or 0 */
    bool esc;       /* after a backslash inside a string */
    bool named;     /* name bytes seen */
    bool opened;    /* '(' seen */
} tc_py_scan;

void tc_py_scan_init(tc_py_scan *s);
/* TC_MORE: continue; TC_OK: this byte closed the call; TC_FAIL: not a call. */
tc_pr tc_py_scan_byte(tc_py_scan *s, uint8_t c);
/* Converts one call s[0..n) to its name and a JSON object of its keyword
 * arguments (Python literals: strings, numbers, True/False/None, lists,
 * tuples, dicts). *ok false when it is not such a call (json then holds
 * garbage). "x.call(...)" names the tool x. KEEL_ENOMEM. */
keel_status tc_py_call(const char *s, size_t n, char *name, tc_buf *json, bool *ok);

/* MiniMax M3 (toolcall_mm3.c): an <invoke>'s body as a JSON object, typed by the
 * tool's parameters schema (may be NULL). *ok false when it is not elements. */
#define TC_MM3_NS "]<]minimax[>["
keel_status tc_mm3_args(const json_t *schema, const char *s, size_t n, tc_buf *json, bool *ok);

/* Gemma 4's call:NAME{key:value,...} (strings quoted by <|"|>), the same way. */
typedef struct tc_gemma_scan {
    int32_t depth;  /* open { [ */
    bool in_str;    /* inside <|"|>...<|"|> */
    bool named;
    uint8_t win[5]; /* the last bytes, to see <|"|> */
} tc_gemma_scan;

void tc_gemma_scan_init(tc_gemma_scan *s);
tc_pr tc_gemma_scan_byte(tc_gemma_scan *s, uint8_t c);
keel_status tc_gemma_call(const char *s, size_t n, char *name, tc_buf *json, bool *ok);

/* ---- format specification ---------------------------------------------------- */

/* What a marker found in text does. */
typedef enum tc_act {
    TC_ACT_REASON_OPEN = 1,  /* opens reasoning (only before any content) */
    TC_ACT_REASON_CLOSE = 2, /* closes reasoning */
    TC_ACT_DROP = 3,         /* structural marker without meaning for the result: removed */
    TC_ACT_BLOCK = 4,        /* opens a tool-call block of kind `arg` */
    TC_ACT_H_END = 5,        /* harmony: end of a message body */
    TC_ACT_H_START = 6,      /* harmony: <|start|> / <|channel|>: a message header follows */
    TC_ACT_RDROP = 7,        /* reasoning structure dropped from the content when reasoning is parsed */
} tc_act;

/* Kinds of tool-call blocks (what follows the block marker). */
typedef enum tc_block {
    TC_BLK_NONE = 0,
    TC_BLK_JSON = 1,      /* JSON call object(s), optionally in [ ]; close marker optional */
    TC_BLK_TAGGED = 2,    /* <tool_call>: JSON object, <function=..> XML or GLM name + arg_key */
    TC_BLK_XML = 3,       /* <invoke name=..> sequence (MiniMax M2, DSML) or one <function name=..> */
    TC_BLK_MISTRAL = 4,   /* [TOOL_CALLS]: [ json... ] or name[CALL_ID]id[ARGS]{json} */
    TC_BLK_DEEPSEEK = 5,  /* <｜tool▁calls▁begin｜> R1/V3 or V3.1 calls */
    TC_BLK_DEEPSEEK1 = 6, /* <｜tool▁call▁begin｜> seen without the block opener */
    TC_BLK_KIMI = 7,      /* <|tool_calls_section_begin|> */
    TC_BLK_KIMI1 = 8,     /* <|tool_call_begin|> without the section opener */
    TC_BLK_FUNC = 9,      /* functionary <function=name>{json}</function> */
    TC_BLK_LLAMA = 10,    /* Llama 3 bare JSON at the start / after <|python_tag|> */
    TC_BLK_HARMONY = 11,  /* gpt-oss tool call message (internal) */
    TC_BLK_GEMMA = 12,    /* Gemma 4 <|tool_call>call:name{...}<tool_call|> */
    TC_BLK_MM3 = 13,      /* MiniMax M3 ]<]minimax[>[<tool_call>: <invoke name=..> element bodies */
    TC_BLK_QFUNC = 14,    /* Qwen3-Coder <function=NAME> without its <tool_call> (some models drop it) */
    TC_BLK_RECIPIENT = 15, /* Functionary v3.2 >>>RECIPIENT\n: "all" is text, else a call with JSON */
    TC_BLK_SOLAR = 16,    /* Solar Open <|tool_calls|>: <|tool_call:begin|>ID<|tool_call:name|>NAME<|tool_call:args|> */
} tc_block;

typedef struct tc_marker {
    const char *s; /* marker bytes (NUL-terminated) */
    uint8_t act;   /* tc_act */
    uint8_t arg;   /* tc_block for TC_ACT_BLOCK */
} tc_marker;

/* XML-ish parameter syntax of one format. */
typedef struct tc_xml {
    const char *invoke_open;  /* "<invoke name=\"" ; NULL: the block marker opened the invoke */
    const char *invoke_close; /* "</invoke>" */
    const char *param_open;   /* "<parameter name=\"" */
    char param_name_end;      /* '"' (then attributes up to '>') or '>' */
    const char *param_after;  /* literal after the name (GLM "</arg_key>"), or NULL */
    const char *param_after2; /* then, after whitespace (GLM "<arg_value>"), or NULL */
    const char *param_close;  /* "</parameter>" */
    const char *block_close;  /* "</minimax:tool_call>", or NULL */
    const char *block_close2; /* an alternative block close, or NULL */
    bool strip_newlines;      /* Qwen3-Coder: one leading and trailing '\n' of a value */
    bool stream_strings;      /* string-typed values stream as they arrive */
    bool cdata;               /* unwrap <![CDATA[...]]> (MiniCPM5) */
    bool string_attr;         /* DSML: string="true|false" on the parameter says its type */
    bool type_attr;           /* Kimi K3: type="number|string|..." on the parameter says its type */
    const char *tag_end;      /* what ends a tag after its attributes; NULL: ">" */
    const char *name_end;     /* what ends an invoke's name when it is not quoted (Hy3's <tool_sep..>), or NULL */
} tc_xml;

typedef struct tc_spec {
    const tc_marker *content;   /* markers active in content, NULL-terminated list */
    const tc_marker *reasoning; /* markers active in reasoning */
    const char *reason_open;    /* for toolcall_prompt_opens_reasoning */
    const char *reason_close;
    const char *json_close;   /* TC_BLK_JSON: close marker of the block, or NULL */
    const tc_xml *xml;        /* TC_BLK_XML / <function=..> inside TC_BLK_TAGGED */
    const tc_xml *glm;        /* <tool_call>name<arg_key>.. inside TC_BLK_TAGGED */
    const char *const *raw_stops; /* where raw (invalid) arguments end, NULL-terminated */
    bool llama_start;         /* a bare JSON object at the start of output is a call */
    bool python;              /* Python-style calls in JSON blocks (LFM2, Llama built-ins) */
    bool json_whole;          /* JSON call objects are read whole: their id may follow the arguments */
    bool json_name_keyed;     /* a JSON call object may be {"NAME": {arguments}} (Apertus) */
    uint8_t starts_in_block;  /* tc_block the output starts inside (the prompt wrote its marker), or 0 */
    const char *content_prefix; /* what a continued message's content follows ("all\n"), or NULL */
    bool harmony;             /* gpt-oss message structure */
    bool muse;                /* harmony-like messages addressed to=self (reasoning), to=user (content) or
                               * to=TOOL, whose body alone may hold the call block */
} tc_spec;

const tc_spec *tc_spec_of(toolcall_format f);

/* ---- the parser's state, shared by toolcall.c (text, calls, driver, API),
 * toolcall_hdr.c (call headers, calls read whole) and toolcall_args.c
 * (arguments, XML parameters, harmony headers) -------------------------------- */

#define WS_CAP 1024    /* whitespace held before a possible marker */
#define HDR_CAP 4096   /* a call header / harmony header */

enum {
    ST_TEXT = 0,  /* content or reasoning text */
    ST_HDR,       /* a call header after a block marker / between calls (pre-commit) */
    ST_OBJ,       /* JSON call object buffered whole (arguments before name) (pre-commit) */
    ST_ARGS,      /* streaming JSON arguments */
    ST_ARGS_RAW,  /* arguments that are not JSON, raw until a stop marker */
    ST_TRAILER,   /* the rest of a JSON call object after its arguments */
    ST_CALLEND,   /* the marker that ends a call after its arguments */
    ST_XML_PARAMS, /* inside an XML call: a parameter or the close */
    ST_XML_VALUE, /* an XML parameter's value */
    ST_H_HEADER,  /* harmony message header */
    ST_PY,        /* a Python-style call read whole (pre-commit) */
    ST_MM3,       /* a MiniMax M3 invoke body, read whole, then converted */
    ST_OBJ_REST,  /* a JSON call object's members after its name, before its arguments */
    ST_R_HOLD,    /* a call marker in reasoning: held until the reasoning closes or the output ends */
};

/* block sub-kinds */
enum {
    SUB_NONE = 0,
    SUB_JSON,  /* JSON call objects */
    SUB_XML,   /* XML parameters (tc_xml) */
    SUB_GLM,   /* GLM arg_key/arg_value */
    SUB_NAMED, /* Mistral name[ARGS]{json} */
    SUB_R1,    /* DeepSeek R1 / V3: ```json fenced arguments */
    SUB_V31,   /* DeepSeek V3.1 / Kimi / functionary / harmony: JSON then an end marker */
    SUB_PY,    /* Python-style calls: LFM2 [f(a=1), g()], Llama f.call(q="x") */
    SUB_GEMMA, /* Gemma 4 call:name{k:v} */
    SUB_MM3,   /* MiniMax M3 invoke elements */
};

/* parameter value types (from the tool's JSON schema) */
enum { PT_ANY = 0, PT_STRING, PT_NUMBER, PT_INTEGER, PT_BOOL, PT_NULL, PT_OBJECT, PT_ARRAY, PT_JSON };

typedef struct tc_call {
    char id[TOOLCALL_ID_CAP];
    char *name; /* base_strdup */
    tc_buf args;
    size_t args_ev; /* bytes of args delivered as events */
    const char *error;
} tc_call;

struct toolcall_parser {
    toolcall_options o;
    char idpre[40];
    const tc_spec *sp;
    size_t max_held;
    char err[BASE_ERR_CAP];
    keel_status failed; /* sticky: KEEL_ENOMEM or an id_fn status */
    bool finished;

    tc_buf in; /* unconsumed input is in.p[pos..in.len) */
    size_t pos;

    tc_buf content, reasoning;
    size_t content_ev, reasoning_ev; /* bytes delivered as events */
    int last_stream;                 /* 0 content, 1 reasoning, 2 args of the open call, -1 */
    tc_call *calls;
    int32_t n_calls, cap_calls;
    int32_t n_malformed;
    char *errmsg;
    toolcall_call *views;

    /* machine */
    int st;
    bool reasoning_mode;
    bool skip_ws;
    bool seen_content, seen_reasoning; /* a non-whitespace text byte was classified */
    bool reason_done;
    bool fence_open; /* json_answer: an opening ``` was dropped */
    bool r_release;  /* ST_R_HOLD ended unclosed: the call marker in reasoning opens a call */
    bool h_drop; /* harmony: the message's body is dropped (a call to a tool not offered) */
    bool h_raw;  /* harmony: an analysis message kept in the content (reasoning_format none) */
    bool h_tool; /* muse: the message is addressed to a tool (its call block is a call) */
    bool llama_start_done;
    int blk, sub;
    bool blk_has_call, blk_array;
    const char *blk_close; /* close marker of the current block, or NULL */
    size_t mark_end;       /* in[pos..pos+mark_end) is whitespace + the block marker */
    int32_t call;          /* open call or -1 */
    /* arguments */
    json_scan scan;
    bool args_started, args_string;
    json_scan inner;
    bool inner_bad, inner_done, args_any;
    uint8_t esc[12];
    int esc_n;
    /* ST_OBJ, ST_PY */
    size_t obj_off, obj_len;
    tc_py_scan py;
    tc_gemma_scan gemma;
    /* XML */
    const tc_xml *xml;
    char pname[TOOLCALL_NAME_CAP];
    int ptype;
    bool p_first, v_stream, v_start, v_nl;
    size_t v_scanned;
};

typedef enum { H_CALL = 1, H_FALLBACK, H_END_BLOCK, H_PY, H_TEXT } hdr_kind; /* H_TEXT: text follows */

typedef struct hdr {
    hdr_kind kind;
    size_t used; /* header bytes consumed; H_FALLBACK: offset of the object's '{' */
    char name[TOOLCALL_NAME_CAP];
    char id[TOOLCALL_ID_CAP]; /* the id the model wrote for the call, or "" */
    int next; /* state after commit */
    int sub;
} hdr;

static inline const char *tc_cur(const toolcall_parser *p)
{
    return p->in.p ? p->in.p + p->pos : "";
}

static inline size_t tc_avail(const toolcall_parser *p)
{
    return p->in.len - p->pos;
}

extern const char tc_err_strjson[];  /* "the arguments string does not hold JSON" */
extern const char tc_err_unclosed[]; /* "the tool call is not closed" */

/* toolcall.c: output (every byte goes through these: result and events agree) */
keel_status tc_fail_nomem(toolcall_parser *p, keel_status st);
void tc_flush_stream(toolcall_parser *p, int which, bool all);
keel_status tc_emit_text(toolcall_parser *p, size_t n);
keel_status tc_out_args(toolcall_parser *p, const char *s, size_t n);
keel_status tc_out_args_str(toolcall_parser *p, const char *s);
keel_status tc_out_args_escaped(toolcall_parser *p, const char *s, size_t n);
bool tc_json_whole(const char *t, size_t n);
/* toolcall.c: tools and calls */
bool tc_tool_known(const toolcall_parser *p, const char *name);
/* The parameters schema of tool `name` ("parameters" or "input_schema"), or NULL. */
const json_t *tc_tool_params(const toolcall_parser *p, const char *name);
int tc_param_type(const toolcall_parser *p, const char *fname, const char *pname);
/* id: the model's own id for the call (kept), or NULL / "" (one is made). */
keel_status tc_start_call(toolcall_parser *p, const char *name, const char *id);
void tc_set_error(toolcall_parser *p, const char *why);
keel_status tc_end_call(toolcall_parser *p, const char *why);

/* toolcall_hdr.c */
tc_pr tc_xml_attrs(const tc_xml *x, const char *s, size_t n, size_t k, size_t *attr_end, size_t *after);
tc_pr tc_read_name(const char *s, size_t n, size_t *j, const char *stops, char *out);
bool tc_name_ok(const char *s, size_t n);
keel_status tc_block_fail(toolcall_parser *p);
void tc_block_done(toolcall_parser *p);
void tc_block_next(toolcall_parser *p);
void tc_args_begin(toolcall_parser *p);
keel_status tc_commit(toolcall_parser *p, const hdr *h, size_t consumed);
keel_status tc_h_hdr(toolcall_parser *p, bool at_end, bool *more);
keel_status tc_h_obj(toolcall_parser *p, bool at_end, bool *more);
keel_status tc_h_py(toolcall_parser *p, bool at_end, bool *more);
keel_status tc_h_obj_rest(toolcall_parser *p, bool at_end, bool *more);

/* toolcall_args.c */
keel_status tc_call_cut(toolcall_parser *p, const char *why);
keel_status tc_h_args(toolcall_parser *p, bool at_end, bool *more);
keel_status tc_h_args_raw(toolcall_parser *p, bool at_end, bool *more);
keel_status tc_h_trailer(toolcall_parser *p, bool at_end, bool *more);
keel_status tc_h_callend(toolcall_parser *p, bool at_end, bool *more);
keel_status tc_h_xml_params(toolcall_parser *p, bool at_end, bool *more);
keel_status tc_h_xml_value(toolcall_parser *p, bool at_end, bool *more);
keel_status tc_h_h_header(toolcall_parser *p, bool at_end, bool *more);
keel_status tc_h_mm3(toolcall_parser *p, bool at_end, bool *more);

#endif /* KEEL_CHAT_TOOLCALL_INT_H */
