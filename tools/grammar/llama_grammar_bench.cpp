// llama_grammar_bench.cpp — llama.cpp's grammar sampler on the grammar and
// the token sequence of a `keel bench grammar --dump PREFIX` run, for the
// comparison in docs/grammar.md ("## Measured"). Built by hand against a
// llama.cpp build (not part of keel's build), LLAMA its source tree:
//
//   g++ -O2 -std=c++17 tools/grammar/llama_grammar_bench.cpp -I$LLAMA/include -I$LLAMA/ggml/include
//       -L$LLAMA/build/bin -lllama -lggml -lggml-base -Wl,-rpath,$LLAMA/build/bin -o llama_grammar_bench
//   ./llama_grammar_bench MODEL.gguf PREFIX [--max N] [--json]
//
// MODEL.gguf is loaded with vocab_only. PREFIX.gbnf is the grammar (start
// rule root), PREFIX.tokens the sampled ids, one a line, "reset" where keel's
// matcher started over (llama_sampler_reset here). Per token it times
// llama_sampler_apply on a llama_token_data_array of all n_vocab tokens
// with random logits (the grammar sampler's cost does not depend on the
// values), then llama_sampler_accept of the recorded token; a recorded token
// that llama.cpp's mask bans is counted (keel and llama.cpp disagree).
#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

static double now_us()
{
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static void quiet(ggml_log_level, const char *, void *) {}

static double pct(std::vector<double> v, double p)
{
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    long i = (long)std::ceil(p * (double)v.size()) - 1;
    return v[(size_t)std::max(0L, std::min(i, (long)v.size() - 1))];
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf PREFIX [--max N] [--json]\n", argv[0]);
        return 2;
    }
    bool json = false;
    long max_tokens = -1; // the first N tokens only (llama.cpp takes up to 0.2 s a token here)
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) json = true;
        else if (strcmp(argv[i], "--max") == 0 && i + 1 < argc) max_tokens = atol(argv[++i]);
    }
    std::string prefix = argv[2];
    std::ifstream gf(prefix + ".gbnf");
    std::ifstream tf(prefix + ".tokens");
    if (!gf || !tf) {
        fprintf(stderr, "cannot read %s.gbnf / %s.tokens\n", prefix.c_str(), prefix.c_str());
        return 1;
    }
    std::stringstream gs;
    gs << gf.rdbuf();
    std::string gbnf = gs.str();
    std::vector<int> seq; // -1: reset
    for (std::string line; std::getline(tf, line);) {
        if (line.empty()) continue;
        seq.push_back(line == "reset" ? -1 : atoi(line.c_str()));
    }
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    double t0 = now_us();
    llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    double load_ms = (now_us() - t0) * 1e-3;
    const llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    t0 = now_us();
    llama_sampler *gram = llama_sampler_init_grammar(vocab, gbnf.c_str(), "root");
    double init_ms = (now_us() - t0) * 1e-3;
    if (!gram) {
        fprintf(stderr, "llama.cpp refuses the grammar\n");
        return 1;
    }
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::vector<float> logits((size_t)n_vocab);
    std::vector<llama_token_data> cur((size_t)n_vocab);
    std::vector<double> t_apply, t_accept;
    int banned = 0, resets = 0;
    for (int tok : seq) {
        if (max_tokens >= 0 && (long)t_apply.size() >= max_tokens) break;
        if (tok < 0) {
            llama_sampler_reset(gram);
            resets++;
            continue;
        }
        for (int i = 0; i < n_vocab; i++) cur[(size_t)i] = {i, nd(rng), 0.0f};
        llama_token_data_array arr = {cur.data(), (size_t)n_vocab, -1, false};
        double a = now_us();
        llama_sampler_apply(gram, &arr);
        double b = now_us();
        if (tok >= n_vocab || std::isinf(cur[(size_t)tok].logit)) banned++;
        double c = now_us();
        llama_sampler_accept(gram, tok);
        double d = now_us();
        t_apply.push_back(b - a);
        t_accept.push_back(d - c);
    }
    double sum_a = 0, sum_c = 0;
    for (double x : t_apply) sum_a += x;
    for (double x : t_accept) sum_c += x;
    size_t n = t_apply.size();
    if (json) {
        printf("{\"bench\":\"llama_grammar\",\"n_vocab\":%d,\"tokens\":%zu,\"resets\":%d,\"vocab_load_ms\":%.1f,"
               "\"grammar_init_ms\":%.3f,\"apply_us_median\":%.1f,\"apply_us_mean\":%.1f,\"apply_us_p99\":%.1f,"
               "\"apply_us_max\":%.1f,\"accept_us_mean\":%.2f,\"recorded_tokens_banned\":%d}\n",
               n_vocab, n, resets, load_ms, init_ms, pct(t_apply, 0.5), n ? sum_a / (double)n : 0.0,
               pct(t_apply, 0.99), pct(t_apply, 1.0), n ? sum_c / (double)n : 0.0, banned);
    } else {
        printf("llama.cpp grammar sampler: %s.gbnf, %zu tokens (%d resets), n_vocab %d\n", prefix.c_str(), n, resets,
               n_vocab);
        printf("| measure | value |\n|---|---|\n");
        printf("| vocabulary load (vocab_only) | %.1f ms |\n", load_ms);
        printf("| llama_sampler_init_grammar | %.3f ms |\n", init_ms);
        printf("| llama_sampler_apply per token, median / mean / p99 / max | %.1f / %.1f / %.1f / %.1f us |\n",
               pct(t_apply, 0.5), n ? sum_a / (double)n : 0.0, pct(t_apply, 0.99), pct(t_apply, 1.0));
        printf("| llama_sampler_accept per token, mean | %.2f us |\n", n ? sum_c / (double)n : 0.0);
        printf("| recorded tokens llama.cpp bans | %d |\n", banned);
    }
    llama_sampler_free(gram);
    llama_model_free(model);
    return 0;
}
