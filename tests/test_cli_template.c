/*
 * test_cli_template.c — `keel template` end to end (build/keel via KEEL_BIN):
 * help, rendering a file with variables and a fixed time, built-in names,
 * the template's refusals and syntax errors as exit status 1 with
 * "keel: template: <message>", unreadable files, a failing stdout, and a
 * model's own template (-m): a generated GGUF without one renders ChatML,
 * the same model rewritten with tokenizer.chat_template renders that, and
 * --chat-template overrides it. keel_model_chat_template is checked on both
 * models. With fixtures, a few fixture templates are rendered through the CLI
 * and compared with the reference bytes.
 */
#include "testutil.h"

#include "model/gguf.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_out[1 << 20];
static char g_dir[] = "/tmp/keel_test_tmpl_XXXXXX";

static int run(const char *cmd, char *buf, size_t cap, bool merge)
{
    char full[8192];
    snprintf(full, sizeof full, "%s%s", cmd, merge ? " 2>&1" : " 2>/dev/null");
    FILE *p = popen(full, "r");
    assert_non_null(p);
    size_t n = fread(buf, 1, cap - 1, p);
    buf[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *bin(void)
{
    const char *b = getenv("KEEL_BIN");
    return b && *b ? b : "./keel";
}

static const char *tmp_path(const char *name)
{
    static char path[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(path[k], sizeof path[k], "%s/%s", g_dir, name);
    return path[k];
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
}

static int setup(void **state)
{
    (void)state;
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static const char g_vars[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
    "\"content\": \"Hi\"}], \"add_generation_prompt\": true, \"bos_token\": \"<s>\"}";

static void test_help_and_files(void **state)
{
    (void)state;
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s template -h", bin());
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    assert_non_null(strstr(g_out, "--vars"));
    assert_non_null(strstr(g_out, "--chat-template"));
    assert_non_null(strstr(g_out, "--now"));
    snprintf(cmd, sizeof cmd, "%s help", bin());
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    assert_non_null(strstr(g_out, "template"));
    snprintf(cmd, sizeof cmd, "%s template", bin());
    assert_int_equal(run(cmd, g_out, sizeof g_out, true), 2);

    const char *vars = tmp_path("vars.json");
    write_file(vars, g_vars);
    const char *t = tmp_path("t.jinja");
    write_file(t, "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                  "{{ strftime_now('%d %b %Y') }}{{ '\\n' if add_generation_prompt }}");
    snprintf(cmd, sizeof cmd, "%s template --file %s --vars %s --now 2026-01-15T09:30:00", bin(), t,
             vars);
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    assert_string_equal(g_out, "[system] Be brief.\n[user] Hi\n15 Jan 2026\n");
    /* -f is --file; without --vars the variables are empty */
    snprintf(cmd, sizeof cmd, "%s template -f %s", bin(), t);
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    assert_int_equal(strlen(g_out), 11); /* just the date */
    /* a built-in by name */
    snprintf(cmd, sizeof cmd, "%s template --chat-template chatml --vars %s", bin(), vars);
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    assert_string_equal(g_out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi"
                               "<|im_end|>\n<|im_start|>assistant\n");
}

static void test_refusals(void **state)
{
    (void)state;
    char cmd[4096];
    const char *vars = tmp_path("vars.json");
    write_file(vars, g_vars);
    const char *t = tmp_path("refuse.jinja");
    write_file(t, "{% if messages[0].role == 'system' %}\n{{ raise_exception('System role not "
                  "supported') }}{% endif %}");
    snprintf(cmd, sizeof cmd, "%s template --file %s --vars %s", bin(), t, vars);
    assert_int_equal(run(cmd, g_out, sizeof g_out, true), 1);
    assert_non_null(strstr(g_out, "keel: template: template line 2: System role not supported"));
    write_file(t, "ok\n{% for x in %}");
    assert_int_equal(run(cmd, g_out, sizeof g_out, true), 1);
    assert_non_null(strstr(g_out, "keel: template: "));
    assert_non_null(strstr(g_out, "template line 2"));
    /* nothing reaches stdout when the template refuses */
    write_file(t, "partial {{ raise_exception('no') }}");
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 1);
    assert_string_equal(g_out, "");
    snprintf(cmd, sizeof cmd, "%s template --file %s/missing.jinja --vars %s", bin(), g_dir, vars);
    assert_int_equal(run(cmd, g_out, sizeof g_out, true), 1);
    assert_non_null(strstr(g_out, "cannot read"));
    snprintf(cmd, sizeof cmd, "%s template --chat-template chatml --vars %s/missing.json", bin(),
             g_dir);
    assert_int_equal(run(cmd, g_out, sizeof g_out, true), 1);
    assert_non_null(strstr(g_out, "missing.json"));
    const char *bad = tmp_path("bad.json");
    write_file(bad, "{\"messages\": [");
    snprintf(cmd, sizeof cmd, "%s template --chat-template chatml --vars %s", bin(), bad);
    assert_int_equal(run(cmd, g_out, sizeof g_out, true), 1);
    assert_non_null(strstr(g_out, "JSON"));
    snprintf(cmd, sizeof cmd, "%s template --chat-template chatml --vars %s --now tomorrow", bin(),
             vars);
    assert_int_equal(run(cmd, g_out, sizeof g_out, true), 1);
    assert_non_null(strstr(g_out, "YYYY-MM-DD"));
    /* a failing stdout is an error */
    snprintf(cmd, sizeof cmd, "(%s template --chat-template chatml --vars %s > /dev/full) 2>&1", bin(),
             vars);
    assert_int_equal(run(cmd, g_out, sizeof g_out, true), 1);
    assert_non_null(strstr(g_out, "writing the output failed"));
    snprintf(cmd, sizeof cmd, "%s template --chat-template chatml --bogus", bin());
    assert_int_equal(run(cmd, g_out, sizeof g_out, true), 2);
}

/* Copies a GGUF file and adds tokenizer.chat_template. */
static void copy_with_template(const char *from, const char *to, const char *tmpl)
{
    gguf *g = NULL;
    gguf_writer *w = NULL;
    char err[256];
    assert_ok(gguf_open_file(from, &g, err));
    assert_ok(gguf_writer_open(&w));
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        const char *key = gguf_key_at(g, i);
        const gguf_value *v = gguf_value_at(g, i);
        if (strcmp(key, "general.alignment") == 0) continue;
        /* the payload as the file has it: arrays and strings start with their header */
        size_t hdr = v->type == GGUF_TYPE_ARRAY ? 12 : v->type == GGUF_TYPE_STRING ? 8 : 0;
        assert_ok(gguf_writer_add_raw(w, key, v->type, v->data - hdr, v->nbytes + hdr));
    }
    assert_ok(gguf_writer_add_str(w, "tokenizer.chat_template", tmpl));
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        assert_ok(gguf_writer_add_tensor(w, t->name, t->dtype, t->n_dims, t->ne, t->data, t->nbytes));
    }
    assert_ok(gguf_writer_write_path(w, to));
    gguf_writer_close(w);
    gguf_close(g);
}

static void test_model_template(void **state)
{
    (void)state;
    char cmd[4096], err[256];
    const char *plain = tmp_path("plain.gguf");
    keel_gen_params gp = keel_gen_params_default();
    gp.arch = "qwen3";
    gp.n_layer = 1;
    gp.n_embd = 64;
    gp.n_head = 2;
    gp.n_head_kv = 1;
    assert_ok(keel_gen_model(&gp, plain, err));
    const char *with = tmp_path("with.gguf");
    const char *tmpl = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}"
                       "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";
    copy_with_template(plain, with, tmpl);

    /* the API */
    keel_model_params mp = keel_model_params_default();
    keel_model *m;
    const char *src;
    size_t len;
    mp.path = plain;
    assert_ok(keel_model_open(&mp, &m, err));
    assert_status(keel_model_chat_template(m, &src, &len), KEEL_ENOENT);
    keel_model_close(m);
    mp.path = with;
    assert_ok(keel_model_open(&mp, &m, err));
    assert_ok(keel_model_chat_template(m, &src, &len));
    assert_int_equal(len, strlen(tmpl));
    assert_memory_equal(src, tmpl, len);
    assert_status(keel_model_chat_template(m, NULL, &len), KEEL_EINVAL);
    keel_model_close(m);

    /* the CLI */
    const char *vars = tmp_path("vars.json");
    write_file(vars, g_vars);
    snprintf(cmd, sizeof cmd, "%s template -m %s --vars %s", bin(), with, vars);
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    assert_string_equal(g_out, "<s><system>Be brief.<user>Hi<assistant>");
    snprintf(cmd, sizeof cmd, "%s template -m %s --vars %s", bin(), plain, vars);
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    assert_string_equal(g_out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi"
                               "<|im_end|>\n<|im_start|>assistant\n");
    snprintf(cmd, sizeof cmd, "%s template -m %s --chat-template llama3 --vars %s", bin(), with,
             vars);
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    assert_string_equal(g_out, "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief."
                               "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi"
                               "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    const char *own = tmp_path("own.jinja");
    write_file(own, "{{ messages|length }}");
    snprintf(cmd, sizeof cmd, "%s template -m %s --chat-template %s --vars %s", bin(), with, own,
             vars);
    assert_int_equal(run(cmd, g_out, sizeof g_out, false), 0);
    assert_string_equal(g_out, "2");
    snprintf(cmd, sizeof cmd, "%s template -m %s/none.gguf --vars %s", bin(), g_dir, vars);
    assert_int_equal(run(cmd, g_out, sizeof g_out, true), 1);
    assert_non_null(strstr(g_out, "cannot open"));
}

/* A few fixture templates through the CLI, byte for byte. */
static void test_fixture_templates(void **state)
{
    (void)state;
    const char *p = test_fixture("templates/cases.json");
    if (!p) return;
    char dir[1024], cmd[4096];
    snprintf(dir, sizeof dir, "%s", p);
    *strrchr(dir, '/') = 0;
    json_error_t je;
    json_t *cases = json_load_file(p, 0, &je);
    assert_non_null(cases);
    static const char *const names[] = {"meta-llama-Llama-3.1-8B-Instruct", "openai-gpt-oss-120b",
                                        "google-gemma-2-2b-it"};
    const json_t *list = json_object_get(cases, "cases");
    const char *vars = tmp_path("case.json");
    int checked = 0;
    for (size_t i = 0; i < BASE_ARRAY_LEN(names); i++) {
        char path[2048];
        snprintf(path, sizeof path, "%s/%s.expected.json", dir, names[i]);
        json_t *exp = json_load_file(path, 0, &je);
        assert_non_null(exp);
        for (size_t c = 0; c < json_array_size(list); c++) {
            const json_t *cs = json_array_get(list, c), *want = json_array_get(exp, c);
            json_t *v = json_object();
            json_object_set(v, "messages", json_object_get(cs, "messages"));
            if (json_object_get(cs, "tools")) json_object_set(v, "tools", json_object_get(cs, "tools"));
            json_object_set(v, "add_generation_prompt", json_object_get(cs, "add_generation_prompt"));
            json_object_set(v, "bos_token", json_object_get(cases, "bos_token"));
            json_object_set(v, "eos_token", json_object_get(cases, "eos_token"));
            assert_int_equal(json_dump_file(v, vars, JSON_COMPACT), 0);
            json_decref(v);
            snprintf(cmd, sizeof cmd, "%s template --file %s/%s.jinja --vars %s --now %s", bin(), dir,
                     names[i], vars, json_string_value(json_object_get(cases, "now")));
            const json_t *out = json_object_get(want, "output");
            int rc = run(cmd, g_out, sizeof g_out, out == NULL);
            if (out) {
                assert_int_equal(rc, 0);
                assert_string_equal(g_out, json_string_value(out));
            } else {
                const char *msg = strchr(json_string_value(json_object_get(want, "error")), ':') + 2;
                assert_int_equal(rc, 1);
                assert_non_null(strstr(g_out, msg));
            }
            checked++;
        }
        json_decref(exp);
    }
    printf("cli: %d fixture cases rendered through keel template\n", checked);
    json_decref(cases);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help_and_files),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_model_template),
        cmocka_unit_test(test_fixture_templates),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
