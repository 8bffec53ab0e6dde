/*
 * cmd_bench.c — `keel bench <name> [options]`: runs a library benchmark and
 * prints its table (or JSON with --json) to stdout; errors go to stderr
 * (exit 2 for a usage error, 1 when the benchmark fails).
 */
#include "cli.h"

#include <string.h>

static const char *g_usage =
    "usage: keel bench kernels [-t N] [--gemm] [--json]\n"
    "       keel bench attention [--quick] [--ctx 1024,4096,...] [--kv f16|q8_0|q4_0] [--shape L,KVH,H,D]\n"
    "                              [--tokens N] [--json]\n"
    "       keel bench -m MODEL [-p 512] [-n 128] [-d 0,...] [-t N] [-r 3] [-ub 512] [-c N] [--ctk T] [--ctv T]\n"
    "                  [--profile] [--tokenizer F] [--json]\n"
    "       keel bench -m MODEL --kv-compact P [--kv-trigger 1024] [--kv-target N] [-n 128] [-t N] [--json]\n"
    "       keel bench session -m MODEL [-c 4096] [--ctk T] [--ctv T] [--dir /tmp] [-r 3] [-t N] [--json]\n"
    "       keel bench grammar -m MODEL [-n 256] [-t N] [-s SEED] [--json-schema FILE] [--text FILE]\n"
    "                  [--seg-cost N] [--dump PREFIX] [--json]\n"
    "       (every form also takes --simd scalar|avx2|avx512|auto: the kernel path, as KEEL_SIMD)\n"
    "\n"
    "kernels     tensor kernels beside the memory read bandwidth and the fp32 FMA peak (about 30 s)\n"
    "  -t N        also time matvec with N threads, N in [1, 256]\n"
    "  --gemm      add the GEMM strategy comparison behind the matmul choice\n"
    "attention   decode attention over a filled cache, f16/q8_0/q4_0, rotation off/on\n"
    "            (GB/s beside the read bandwidth and the multiply bound from the FMA peak)\n"
    "  --quick     fewer contexts and repetitions\n"
    "  --ctx LIST  context lengths, up to 8, each in [64, 4194304] (1024,4096,16384,65536)\n"
    "  --kv T      only this cache type\n"
    "  --shape L,KVH,H,D  layers, KV heads, query heads, head dim (32,8,32,128; the 124M test model:\n"
    "              12,4,12,64)\n"
    "  --tokens N  a speculative verify batch of N tokens, [2, 64], in one call beside the same N\n"
    "              tokens one call each (as N decode steps)\n"
    "-m MODEL    prompt (pp) and generation (tg) speed, llama-bench style; tg rows give the bytes read\n"
    "            per token and the bound from the read bandwidth, pp rows the FLOP/s beside the FMA peak\n"
    "  -p N        prompt tokens, [0, 65536] (512)\n"
    "  -n N        generated tokens, [0, 65536] (128)\n"
    "  -d LIST     cache depths: tokens in the cache before each test, ascending, up to 8 (0)\n"
    "  -ub N       prompt tokens per forward chunk, [1, 65536] (512)\n"
    "  -c N        cache cells, from what the largest depth and test need to 16777216 (that need)\n"
    "  --profile   where the time of the prompt (per token) and of one decode step goes (kernels by\n"
    "              shape and dtype, threads), per depth\n"
    "  -t N        threads, [1, 256] (all CPUs)\n"
    "  -r N        repetitions, [1, 64] (3)\n"
    "  --ctk T, --ctv T  KV cache types (f16)\n"
    "  --tokenizer F     llama2.c tokenizer for a .bin checkpoint\n"
    "  --kv-compact P    instead: compaction cost (window keydiff knorm random), trigger in\n"
    "                    [2, 16777216] (1024), target below it (trigger / 2)\n"
    "session     session save/load MB/s (buffer and file) beside memcpy and plain write+fsync/read\n"
    "  -c N        tokens in the saved cache, [16, 1048576] (4096); --dir D: where the files go (/tmp)\n"
    "grammar     constrained decoding: token mask time per token under a JSON grammar beside the decode\n"
    "            step (temperature 1, -n tokens, -s seed; --json-schema FILE: that schema instead);\n"
    "            vocabulary trie build, compile time, a 30-property schema's compile time; the sampled\n"
    "            tokens replayed without decoding (a fresh matcher, then every mask cached)\n"
    "  --text FILE     replay the tokens of FILE (a sentence of the grammar) instead\n"
    "  --seg-cost N    gram_limits.seg_max_cost (0: every new stack walks the whole trie)\n"
    "  --dump PREFIX   write PREFIX.gbnf and PREFIX.tokens for tools/grammar/llama_grammar_bench.cpp\n"
    "--json      one JSON object instead of the table\n"
    "-h, --help  this text";

int cmd_bench(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("%s\n", g_usage);
            return 0;
        }
    const char *name;
    int first;
    if (argc >= 2 && strcmp(argv[1], "-m") == 0) {
        name = "model"; /* keel bench -m MODEL ...: the model benchmark */
        first = 1;
    } else if (argc >= 2 && argv[1][0] != '-') {
        name = argv[1];
        first = 2;
    } else {
        fprintf(stderr, "%s\n", g_usage);
        return 2;
    }
    /* KEEL_SIMD checked, then --simd PATH (any position) applied here and
     * not passed on */
    if (cli_simd(NULL, NULL) != 0) return 2;
    int n_rest = 0;
    for (int i = first; i < argc; i++) {
        if (strcmp(argv[i], "--simd") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "keel: option --simd needs a value\n");
                return 2;
            }
            if (cli_simd("--simd", argv[++i]) != 0) return 2;
            continue;
        }
        argv[first + n_rest++] = argv[i];
    }
    char err[256] = "";
    keel_status st = keel_bench_run(name, n_rest, argv + first, cli_write_file, stdout, err);
    if (st == KEEL_OK) return 0;
    if (!cli_flush_stdout()) return 1; /* a failed write can make a benchmark fail */
    fprintf(stderr, "keel: %s\n", err[0] ? err : keel_strerror(st));
    if (st == KEEL_ENOENT || st == KEEL_EINVAL) {
        fprintf(stderr, "(keel bench -h lists the benchmarks and their options)\n");
        return 2;
    }
    return 1;
}
