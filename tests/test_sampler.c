/*
 * test_sampler.c — src/sample: each filter against hand-computed
 * distributions, penalties with a sliding history, greedy ties, seed
 * determinism, a chi-square check of temperature sampling, no allocation
 * while sampling, bad parameters, allocation failures.
 */
#include "testutil.h"
#include "base/base.h"
#include "sample/sampler.h"

#include <math.h>
#include <string.h>

/* Neutral params: every filter off, temperature 1. */
static sampler_params neutral(void)
{
    sampler_params p = sampler_params_default();
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    return p;
}

static sampler *open_s(const sampler_params *p, int32_t n)
{
    sampler *s;
    char err[BASE_ERR_CAP] = "";
    keel_status st = sampler_open(p, n, &s, err);
    if (st) fail_msg("sampler_open: %s", err);
    return s;
}

/* Logits whose softmax is exactly probs. */
static void logits_of(const double *probs, float *logits, int n)
{
    for (int i = 0; i < n; i++)
        logits[i] = (float)log(probs[i]);
}

static void test_greedy_and_ties(void **state)
{
    (void)state;
    sampler_params p = neutral();
    p.temperature = 0.0f;
    sampler *s = open_s(&p, 6);
    float l[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f, NAN};
    int32_t t;
    assert_ok(sampler_sample(s, l, &t));
    assert_int_equal(t, 1); /* tie 1 vs 3: lowest id */
    const sampler_cand *c;
    int64_t n;
    assert_ok(sampler_candidates(s, l, &c, &n));
    assert_int_equal(n, 1);
    assert_int_equal(c[0].id, 1);
    assert_close(c[0].p, 1.0, 0);
    p.temperature = -1.0f;
    sampler_close(s);
    s = open_s(&p, 6);
    assert_ok(sampler_sample(s, l, &t));
    assert_int_equal(t, 1);
    /* all non-finite: refused */
    float bad[6] = {NAN, -INFINITY, NAN, NAN, -INFINITY, NAN};
    assert_status(sampler_sample(s, bad, &t), KEEL_EINVAL);
    /* +inf wins */
    float inf[6] = {1, INFINITY, 3, 0, 0, 0};
    assert_ok(sampler_sample(s, inf, &t));
    assert_int_equal(t, 1);
    sampler_close(s);
    /* +inf with temperature: all mass on it */
    p = neutral();
    s = open_s(&p, 6);
    for (int i = 0; i < 20; i++) {
        assert_ok(sampler_sample(s, inf, &t));
        assert_int_equal(t, 1);
    }
    sampler_close(s);
}

static void test_penalties(void **state)
{
    (void)state;
    sampler_params p = neutral();
    p.temperature = 0;
    p.repeat_penalty = 2.0f;
    p.penalty_last_n = 3;
    sampler *s = open_s(&p, 4);
    float l[4] = {4.0f, 3.0f, -1.0f, 0.0f};
    /* seen: 0 and 2; 0 -> 4/2 = 2, 2 -> -1*2 = -2 */
    assert_ok(sampler_accept(s, 0));
    assert_ok(sampler_accept(s, 2));
    int32_t t;
    assert_ok(sampler_sample(s, l, &t));
    assert_int_equal(t, 1);
    sampler_close(s);

    p = neutral();
    p.repeat_penalty = 2.0f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.penalty_last_n = 3;
    s = open_s(&p, 4);
    assert_ok(sampler_accept(s, 3)); /* leaves the window below */
    assert_ok(sampler_accept(s, 0));
    assert_ok(sampler_accept(s, 0));
    assert_ok(sampler_accept(s, 2));
    assert_status(sampler_accept(s, 4), KEEL_EINVAL);
    assert_status(sampler_accept(s, -1), KEEL_EINVAL);
    const sampler_cand *c;
    int64_t n;
    assert_ok(sampler_candidates(s, l, &c, &n));
    assert_int_equal(n, 4);
    /* 0: 4/2 - 2*0.25 - 0.5 = 1;  1: 3;  2: -1*2 - 0.25 - 0.5 = -2.75;  3: 0 (outside window) */
    float want[4] = {1.0f, 3.0f, -2.75f, 0.0f};
    double z = 0;
    for (int i = 0; i < 4; i++)
        z += exp(want[i]);
    for (int64_t i = 0; i < n; i++) {
        assert_close(c[i].logit, want[c[i].id], 1e-6);
        assert_close(c[i].p, exp(want[c[i].id]) / z, 1e-6);
    }
    assert_int_equal(c[0].id, 1); /* sorted best first */
    assert_int_equal(c[1].id, 0);
    assert_int_equal(c[2].id, 3);
    assert_int_equal(c[3].id, 2);
    /* reset clears the history */
    sampler_reset(s);
    assert_ok(sampler_candidates(s, l, &c, &n));
    for (int64_t i = 0; i < n; i++)
        assert_close(c[i].logit, l[c[i].id], 0);
    sampler_close(s);
}

static void test_top_k_top_p_min_p(void **state)
{
    (void)state;
    const double probs[5] = {0.05, 0.5, 0.15, 0.3, 0.0};
    float l[5];
    logits_of(probs, l, 4);
    l[4] = -INFINITY; /* dropped */
    const sampler_cand *c;
    int64_t n;

    sampler_params p = neutral();
    p.top_k = 2;
    sampler *s = open_s(&p, 5);
    assert_ok(sampler_candidates(s, l, &c, &n));
    assert_int_equal(n, 2);
    assert_int_equal(c[0].id, 1);
    assert_int_equal(c[1].id, 3);
    assert_close(c[0].p, 0.5 / 0.8, 1e-6);
    assert_close(c[1].p, 0.3 / 0.8, 1e-6);
    sampler_close(s);

    struct {
        float top_p;
        int64_t n;
    } tp[] = {{0.49f, 1}, {0.7f, 2}, {0.79f, 2}, {0.81f, 3}, {0.96f, 4}, {1.0f, 4}};
    for (size_t i = 0; i < sizeof tp / sizeof tp[0]; i++) {
        p = neutral();
        p.top_p = tp[i].top_p;
        s = open_s(&p, 5);
        assert_ok(sampler_candidates(s, l, &c, &n));
        if (n != tp[i].n)
            fail_msg("top_p %g kept %lld, want %lld", (double)tp[i].top_p, (long long)n,
                     (long long)tp[i].n);
        double mass = 0;
        for (int64_t k = 0; k < n; k++)
            mass += probs[c[k].id];
        for (int64_t k = 0; k < n; k++)
            assert_close(c[k].p, probs[c[k].id] / mass, 1e-6);
        sampler_close(s);
    }
    /* min_keep keeps more than top_p would */
    p = neutral();
    p.top_p = 0.1f;
    p.min_keep = 3;
    s = open_s(&p, 5);
    assert_ok(sampler_candidates(s, l, &c, &n));
    assert_int_equal(n, 3);
    sampler_close(s);

    /* min_p 0.2: keep p >= 0.1 (p_max 0.5): ids 1, 3, 2 */
    p = neutral();
    p.min_p = 0.2f;
    s = open_s(&p, 5);
    assert_ok(sampler_candidates(s, l, &c, &n));
    assert_int_equal(n, 3);
    assert_int_equal(c[2].id, 2);
    assert_close(c[2].p, 0.15 / 0.95, 1e-6);
    sampler_close(s);
    p.min_p = 0.61f; /* 0.3 < 0.305: only id 1 */
    s = open_s(&p, 5);
    assert_ok(sampler_candidates(s, l, &c, &n));
    assert_int_equal(n, 1);
    sampler_close(s);

    /* the chain in order: top_k 3 -> top_p 0.85 (of the renormalised 3)
     * -> min_p -> temperature 0.5 */
    p = neutral();
    p.top_k = 3;
    p.top_p = 0.85f;
    p.min_p = 0.01f;
    p.temperature = 0.5f;
    s = open_s(&p, 5);
    assert_ok(sampler_candidates(s, l, &c, &n));
    /* top 3 renormalised: .5/.95 = .526, .3/.95 = .316 (cum .842 < .85), .158 -> keep 3 */
    assert_int_equal(n, 3);
    double z = 0.25 + 0.09 + 0.0225; /* p^(1/T) = p^2 */
    assert_close(c[0].p, 0.25 / z, 1e-5);
    assert_close(c[1].p, 0.09 / z, 1e-5);
    assert_close(c[2].p, 0.0225 / z, 1e-5);
    sampler_close(s);
}

static void test_temperature_distribution(void **state)
{
    (void)state;
    /* chi-square of 40000 draws against softmax(l / T) */
    sampler_params p = neutral();
    p.temperature = 0.7f;
    p.seed = 99;
    sampler *s = open_s(&p, 4);
    float l[4] = {1.0f, 2.0f, 0.0f, -1.0f};
    double want[4], z = 0;
    for (int i = 0; i < 4; i++)
        z += want[i] = exp(l[i] / 0.7);
    for (int i = 0; i < 4; i++)
        want[i] /= z;
    int64_t counts[4] = {0};
    const int N = 40000;
    test_alloc_install(0);
    for (int i = 0; i < N; i++) {
        int32_t t;
        assert_ok(sampler_sample(s, l, &t));
        assert_ok(sampler_accept(s, t));
        counts[t]++;
    }
    assert_int_equal(test_alloc_count(), 0); /* sampling allocates nothing */
    test_alloc_uninstall();
    double chi2 = 0;
    for (int i = 0; i < 4; i++) {
        double e = want[i] * N;
        chi2 += (counts[i] - e) * (counts[i] - e) / e;
    }
    if (chi2 > 16.27) fail_msg("chi-square %.2f > 16.27 (df 3, p = 0.001)", chi2);
    sampler_close(s);
}

static void test_seed_determinism(void **state)
{
    (void)state;
    float l[64];
    test_fill_normal(l, 64, 5);
    int32_t a[200], b[200], c[200];
    uint64_t seeds[3] = {1, 1, 2};
    int32_t *outs[3] = {a, b, c};
    for (int k = 0; k < 3; k++) {
        sampler_params p = sampler_params_default();
        p.seed = seeds[k];
        p.repeat_penalty = 1.1f;
        sampler *s = open_s(&p, 64);
        for (int i = 0; i < 200; i++) {
            assert_ok(sampler_sample(s, l, &outs[k][i]));
            assert_ok(sampler_accept(s, outs[k][i]));
        }
        /* reset restarts the same stream */
        sampler_reset(s);
        int32_t t;
        assert_ok(sampler_sample(s, l, &t));
        assert_int_equal(t, outs[k][0]);
        sampler_close(s);
    }
    assert_memory_equal(a, b, sizeof a);
    assert_true(memcmp(a, c, sizeof a) != 0);
}

static void test_large_vocab_top_k(void **state)
{
    (void)state;
    /* top_k over a large vocabulary equals a full sort's first k */
    enum { V = 50000 };
    static float l[V];
    test_fill_normal(l, V, 11);
    l[123] = l[456]; /* a tie */
    sampler_params p = neutral();
    p.top_k = 40;
    sampler *s = open_s(&p, V);
    const sampler_cand *c;
    int64_t n;
    assert_ok(sampler_candidates(s, l, &c, &n));
    assert_int_equal(n, 40);
    for (int64_t i = 1; i < n; i++)
        assert_true(c[i - 1].logit > c[i].logit ||
                    (c[i - 1].logit == c[i].logit && c[i - 1].id < c[i].id));
    /* nothing outside beats the 40th */
    int better = 0;
    for (int i = 0; i < V; i++)
        better += l[i] > c[39].logit;
    assert_int_equal(better, 39);
    sampler_close(s);
}

static void test_bad_params(void **state)
{
    (void)state;
    sampler *s;
    char err[BASE_ERR_CAP];
    sampler_params p = sampler_params_default();
    assert_status(sampler_open(&p, 0, &s, err), KEEL_EINVAL);
    assert_null(s);
    p.top_p = NAN;
    assert_status(sampler_open(&p, 10, &s, err), KEEL_EINVAL);
    p = sampler_params_default();
    p.repeat_penalty = 0;
    assert_status(sampler_open(&p, 10, &s, err), KEEL_EINVAL);
    p = sampler_params_default();
    p.penalty_last_n = -1;
    assert_status(sampler_open(&p, 10, &s, err), KEEL_EINVAL);
    p = sampler_params_default();
    p.min_keep = 0;
    assert_status(sampler_open(&p, 10, &s, err), KEEL_EINVAL);
    assert_status(sampler_open(NULL, 10, &s, err), KEEL_EINVAL);
    sampler_close(NULL);
}

static keel_status open_op(void *ctx)
{
    (void)ctx;
    sampler_params p = sampler_params_default();
    sampler *s;
    keel_status st = sampler_open(&p, 1000, &s, NULL);
    sampler_close(s);
    return st;
}

static void test_alloc_sweep_sampler(void **state)
{
    (void)state;
    assert_true(test_alloc_sweep(open_op, NULL) >= 4);
}

/* The public check names the parameter and its value (issue 8 item 17). */
static void test_public_params_check(void **state)
{
    (void)state;
    char err[256];
    keel_sampler_params p = keel_sampler_params_default();
    assert_ok(keel_sampler_params_check(&p, err));
    p.temp = -1.0f; /* documented: greedy */
    assert_ok(keel_sampler_params_check(&p, err));
    p.temp = NAN;
    assert_status(keel_sampler_params_check(&p, err), KEEL_EINVAL);
    assert_string_equal(err, "temp nan: must be finite (<= 0: greedy)");
    p = keel_sampler_params_default();
    p.top_p = INFINITY;
    assert_status(keel_sampler_params_check(&p, err), KEEL_EINVAL);
    assert_string_equal(err, "top_p inf: must be finite (>= 1: off)");
    p = keel_sampler_params_default();
    p.frequency_penalty = -INFINITY;
    assert_status(keel_sampler_params_check(&p, err), KEEL_EINVAL);
    assert_string_equal(err, "frequency_penalty -inf: must be finite (0: off)");
    p = keel_sampler_params_default();
    p.repeat_penalty = 0.0f;
    assert_status(keel_sampler_params_check(&p, err), KEEL_EINVAL);
    assert_string_equal(err, "repeat_penalty 0: must be > 0 (1: off)");
    p = keel_sampler_params_default();
    p.repeat_last_n = -1;
    assert_status(keel_sampler_params_check(&p, err), KEEL_EINVAL);
    assert_string_equal(err, "repeat_last_n -1: must be >= 0 (0: off)");
    assert_status(keel_sampler_params_check(NULL, NULL), KEEL_EINVAL);
    /* open refuses what the check refuses, leaving *out NULL */
    keel_sampler *s = (keel_sampler *)&p;
    p = keel_sampler_params_default();
    p.temp = INFINITY;
    assert_status(keel_sampler_open(&p, 16, &s), KEEL_EINVAL);
    assert_null(s);
    p.temp = 0.5f;
    assert_ok(keel_sampler_open(&p, 16, &s));
    keel_sampler_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_ties),   cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_top_k_top_p_min_p), cmocka_unit_test(test_temperature_distribution),
        cmocka_unit_test(test_seed_determinism),  cmocka_unit_test(test_large_vocab_top_k),
        cmocka_unit_test(test_bad_params),        cmocka_unit_test(test_alloc_sweep_sampler),
        cmocka_unit_test(test_public_params_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
