/*
 * cmd_template.c — `keel template`: renders a chat template with variables
 * from a JSON file and prints the text. The template is --chat-template
 * (a file or a built-in name), else --file, else the model's own (-m),
 * else ChatML for a model without one.
 */
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char *g_usage =
    "usage: keel template --file T.jinja [--vars VARS.json] [--now 2026-01-15T09:30:00]\n"
    "       keel template -m MODEL [--vars VARS.json] [--chat-template FILE|NAME] [--now T]\n"
    "  --file, -f F           the template (Jinja2, as transformers renders it)\n"
    "  -m, --model MODEL      use the model's tokenizer.chat_template (ChatML if it has none)\n"
    "  --chat-template X      a template file, or a built-in: chatml, llama3, gemma, mistral, qwen3\n"
    "  --vars F               JSON object of the variables: messages, tools,\n"
    "                         add_generation_prompt, bos_token, eos_token, ... (default {})\n"
    "  --now T                the time strftime_now formats (default: local time)\n"
    "  -h, --help             this text";

typedef struct tmpl_opts {
    const char *vars, *now, *chat_template;
} tmpl_opts;

static bool template_flag(cli_opts *o, const char *a, const char *v, bool *takes)
{
    tmpl_opts *t = o->user;
    (void)takes;
    if (strcmp(a, "--vars") == 0) {
        t->vars = v;
    } else if (strcmp(a, "--now") == 0) {
        t->now = v;
    } else if (strcmp(a, "--chat-template") == 0) {
        t->chat_template = v;
    } else {
        return false;
    }
    return true;
}

/* A template source: a built-in name (when allowed) or a file (malloc'd
 * into *owned). */
static int load_source(const char *what, bool builtin, const char **src, size_t *len, char **owned)
{
    if (builtin && keel_chat_template_builtin(what, src) == KEEL_OK) {
        *len = strlen(*src);
        return 0;
    }
    *owned = cli_read_file(what, len);
    if (!*owned) {
        fprintf(stderr, "keel: template: cannot read %s: %s\n", what, strerror(errno));
        return 1;
    }
    *src = *owned;
    return 0;
}

int cmd_template(int argc, char **argv)
{
    cli_opts o;
    tmpl_opts t = {NULL, NULL, NULL};
    cli_opts_init(&o);
    o.extra = template_flag;
    o.user = &t;
    int rc = cli_parse(argc, argv, &o, g_usage);
    if (rc) return rc == 1 ? 0 : rc;
    if (!t.chat_template && !o.file && !o.model.path) {
        fprintf(stderr, "keel: template: give --file T.jinja, --chat-template, or -m MODEL\n%s\n",
                g_usage);
        return 2;
    }
    keel_model *m = NULL;
    keel_chat_template *ct = NULL;
    char *owned = NULL, *vars = NULL, *out = NULL;
    const char *src = NULL;
    size_t len = 0, vars_len = 0;
    char err[256] = "";
    if (t.chat_template) {
        rc = load_source(t.chat_template, true, &src, &len, &owned);
    } else if (o.file) {
        rc = load_source(o.file, false, &src, &len, &owned);
    } else {
        rc = cli_open_model(&o, &m);
        if (!rc) {
            keel_status st = keel_model_chat_template(m, &src, &len);
            if (st == KEEL_ENOENT) {
                st = keel_chat_template_builtin("chatml", &src);
                if (st == KEEL_OK) len = strlen(src);
            }
            if (st != KEEL_OK) {
                rc = cli_fail("template", st, "the model's tokenizer.chat_template");
            }
        }
    }
    if (!rc && t.vars) {
        vars = cli_read_file(t.vars, &vars_len);
        if (!vars) {
            fprintf(stderr, "keel: template: cannot read %s: %s\n", t.vars, strerror(errno));
            rc = 1;
        }
    }
    if (!rc) {
        keel_status st = keel_chat_template_open(src, len, &ct, err);
        if (st != KEEL_OK) rc = cli_fail("template", st, err);
    }
    if (!rc) {
        const char *vj = vars ? vars : "{}";
        size_t vn = vars ? vars_len : 2, need = 0, cap = 1 << 16;
        keel_status st = KEEL_ENOMEM;
        for (int tries = 0; tries < 2; tries++) {
            free(out);
            out = malloc(cap);
            if (!out) {
                st = KEEL_ENOMEM;
                break;
            }
            st = keel_chat_template_render(ct, vj, vn, t.now, out, cap, &need, err);
            if (st != KEEL_ERANGE) break;
            cap = need + 1;
        }
        if (st != KEEL_OK) {
            /* the template's own message (raise_exception) without the status text */
            if (st == KEEL_EINVAL && err[0])
                fprintf(stderr, "keel: template: %s\n", err);
            else
                cli_fail("template", st, err);
            rc = 1;
        } else if (fwrite(out, 1, need, stdout) != need || fflush(stdout) != 0 || ferror(stdout)) {
            fprintf(stderr, "keel: template: writing the output failed: %s\n", strerror(errno));
            rc = 1;
        }
    }
    free(out);
    free(vars);
    free(owned);
    keel_chat_template_close(ct);
    keel_model_close(m);
    return rc;
}
