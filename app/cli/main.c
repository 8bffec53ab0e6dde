/*
 * main.c — the keel CLI entry: dispatches to one command per file.
 */
#include "cli.h"
#include "../server/srv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct cli_command {
    const char *name;
    int (*fn)(int argc, char **argv); /* argv[0] is the command name */
    const char *usage;
} cli_command;

static const cli_command g_commands[] = {
    {"demo", cmd_demo, "demo [-m MODEL] [--turns N]                a long agentic session under a memory budget"},
    {"chat", cmd_chat, "chat -m MODEL [--system TEXT] [--tools F]   a conversation in the terminal (chat -h)"},
    {"run", cmd_run, "run -m MODEL -p PROMPT [-n N] [--temp T] ...  generate text (run -h)"},
    {"tokenize", cmd_tokenize, "tokenize -m MODEL -p TEXT [--ids]          print token ids and pieces"},
    {"inspect", cmd_inspect, "inspect MODEL [-c CTX] [--ctk T]           hyperparameters, tensors, memory plan"},
    {"perplexity", cmd_perplexity, "perplexity -m MODEL -f TEXT -c N [-b N]    llama-perplexity's method"},
    {"eval-compaction", cmd_eval_compaction,
     "eval-compaction -m MODEL -f TEXT [--json]  compaction quality: PPL and KL vs full context\n"
     "  eval-compaction ... --task retrieval       recall of a planted fact (eval-compaction -h)"},
    {"bench", cmd_bench,
     "bench kernels|attention [options]         kernel and attention benchmarks (bench -h)\n"
     "  bench -m MODEL [-p 512] [-n 128] [--json]  prompt and generation speed"},
    {"template", cmd_template, "template --file T.jinja --vars V.json      render a chat template (template -h)"},
    {"grammar", cmd_grammar,
     "grammar --gbnf F | --json-schema F [--test T.jsonl]  texts against a grammar (accept/reject)"},
    {"gen-model", cmd_gen_model,
     "gen-model --arch A [options] --out F      write a random-weight GGUF model"},
    {"serve", cmd_serve, "serve -m MODEL [--port 8080] [-np N] ...     OpenAI/Anthropic HTTP server (serve -h)"},
    {"bench-serve", cmd_bench_serve,
     "bench-serve [-m MODEL] [--json]           server throughput and TTFT at concurrency 1..8"},
};

void cli_write_file(void *user, const char *text, size_t n)
{
    fwrite(text, 1, n, (FILE *)user);
}

int cli_fail(const char *what, keel_status st, const char *detail)
{
    fprintf(stderr, "keel: %s: %s", what, keel_strerror(st));
    if (detail && *detail) fprintf(stderr, ": %s", detail);
    fputc('\n', stderr);
    return 1;
}

/* Library warnings (e.g. unused tensors in a model) go to stderr. */
static void cli_log(void *user, keel_log_level level, const char *message)
{
    (void)user;
    fprintf(stderr, "keel: %s: %s\n", level >= KEEL_LOG_ERROR ? "error" : "warning", message);
}

static void usage(FILE *f)
{
    fprintf(f, "keel %s — LLM inference runtime for long agentic sessions\n\n", keel_version());
    fprintf(f, "usage: keel <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof g_commands / sizeof g_commands[0]; i++)
        fprintf(f, "  %s\n", g_commands[i].usage);
    fprintf(f, "  help                                       this text\n");
    fprintf(f, "  --version                                  print the version\n");
}

/* OpenBLAS chose its generic kernels on a CPU it does not know: run again
 * with the ones that use the CPU's SIMD (keel_blas_coretype_advice). The
 * variable is read when the process loads OpenBLAS, hence the exec; once,
 * and never over the user's own setting. On failure, go on as is (the
 * library warns). */
static void blas_restart(char **argv)
{
    const char *want = keel_blas_coretype_advice();
    if (!want || getenv("OPENBLAS_CORETYPE")) return;
    if (setenv("OPENBLAS_CORETYPE", want, 1) != 0) return;
    execv("/proc/self/exe", argv);
    unsetenv("OPENBLAS_CORETYPE"); /* exec failed: nothing changed */
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    blas_restart(argv);
    keel_set_log(cli_log, NULL, KEEL_LOG_WARN);
    const char *cmd = argv[1];
    int rc = -1;
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        printf("keel %s\n", keel_version());
        rc = 0;
    } else if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        rc = 0;
    }
    for (size_t i = 0; rc < 0 && i < sizeof g_commands / sizeof g_commands[0]; i++)
        if (strcmp(cmd, g_commands[i].name) == 0) rc = g_commands[i].fn(argc - 1, argv + 1);
    if (rc < 0) {
        fprintf(stderr, "keel: unknown command '%s' (try 'keel help')\n", cmd);
        return 2;
    }
    /* every write is checked: output lost to a full disk or a closed pipe
     * is an error, even when the command itself succeeded */
    if (!cli_flush_stdout() && rc == 0) rc = 1;
    if (fclose(stdout) != 0 && rc == 0) {
        fprintf(stderr, "keel: closing standard output: %s\n", strerror(errno));
        rc = 1;
    }
    return rc;
}
