/*
 * test_memory_rs.c — the recurrent half of the memory core (issue 11):
 * the exact plan with state slots and checkpoints, the failing allocator,
 * zero state for new sequences, copy on write between forks, the
 * transactional seq_rm (restore a checkpoint at or before p0, or refuse
 * with KEEL_ESTATE naming the nearest, nothing changed), ring rows in a
 * checkpoint, position edits and compaction on a hybrid, slot exhaustion,
 * the checkpoint caps, and the checker catching a corrupted half. The
 * differential driver (fuzz_memory presets 5-7) covers the same through
 * random operations; these pin the messages and the boundary cases.
 */
#include "testutil.h"
#include "memory/memory.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONV_K 4
#define CONV_C 3
#define STATE_F 5

static keel_mem_layer attn_layer(keel_mem_layer_kind kind)
{
    keel_mem_layer l = keel_mem_layer_default();
    l.kind = kind;
    l.n_kv_heads = 1;
    l.n_heads = 2;
    l.head_dim_k = l.head_dim_v = 32;
    l.k_dtype = l.v_dtype = KEEL_DTYPE_F32;
    l.rope.n_rot = 32;
    l.window = 4;
    l.n_sink = 1;
    return l;
}

static keel_mem_layer rs_layer(void)
{
    keel_mem_layer l = keel_mem_layer_default();
    l.kind = KEEL_MEM_LAYER_RECURRENT;
    l.rs.conv_kernel = CONV_K;
    l.rs.conv_channels = CONV_C;
    l.rs.state_floats = STATE_F;
    return l;
}

typedef struct hyb {
    keel_mem_layer layers[3];
    keel_mem_config cfg;
    keel_mem *m;
} hyb;

/* full attention (layer 0), recurrent (1), sliding window 4 + 1 sink (2) */
static void hyb_open(hyb *h, int32_t n_seq, int32_t n_ckpt, int32_t n_slots)
{
    h->layers[0] = attn_layer(KEEL_MEM_LAYER_FULL);
    h->layers[1] = rs_layer();
    h->layers[2] = attn_layer(KEEL_MEM_LAYER_SLIDING);
    h->cfg = keel_mem_config_default();
    h->cfg.layers = h->layers;
    h->cfg.n_layers = 3;
    h->cfg.n_ctx = 256;
    h->cfg.n_seq_max = n_seq;
    h->cfg.n_batch_max = 16;
    h->cfg.n_threads = 1;
    h->cfg.n_ckpt = n_ckpt;
    h->cfg.n_rs_slots = n_slots;
    char err[BASE_ERR_CAP] = "";
    keel_status st = keel_mem_open(&h->cfg, &h->m, err);
    if (st != KEEL_OK) fail_msg("open: %s", err);
}

/* Places n tokens of seq s continuing it, writes K/V from the position and
 * advances the recurrent state by `state += pos + 1` (a history-dependent
 * value: the state of a sequence is the sum of (pos + 1) of its tokens). */
static void feed(keel_mem *m, int32_t s, int32_t n)
{
    int32_t pos[16], seq[16], cells[32];
    int32_t p = keel_mem_seq_pos_max(m, s) + 1;
    for (int32_t i = 0; i < n; i++) {
        pos[i] = p + i;
        seq[i] = s;
    }
    keel_mem_batch b = {n, pos, seq, NULL, NULL, NULL};
    assert_ok(keel_mem_place(m, &b, cells));
    float k[16 * 32], v[16 * 32];
    for (int32_t i = 0; i < n * 32; i++) {
        k[i] = (float)(pos[i / 32] % 7) * 0.1f + (float)(i % 32) * 0.01f;
        v[i] = (float)pos[i / 32];
    }
    for (int32_t l = 0; l < 3; l += 2)
        assert_ok(keel_mem_write(m, l, n, cells + (size_t)keel_mem_layer_group(m, l) * (size_t)n, k, v));
    for (int32_t i = 0; i < n; i++) {
        float *conv, *st;
        assert_ok(keel_mem_rs_state(m, 1, s, &conv, &st));
        memmove(conv, conv + CONV_C, (CONV_K - 2) * CONV_C * sizeof(float));
        for (int32_t c = 0; c < CONV_C; c++) conv[(CONV_K - 2) * CONV_C + c] = (float)pos[i];
        for (int32_t j = 0; j < STATE_F; j++) st[j] += (float)(pos[i] + 1);
    }
}

/* The state of s must be the sum over positions lo..hi of (pos + 1). */
static void expect_state(keel_mem *m, int32_t s, int32_t lo, int32_t hi)
{
    float want = 0.0f;
    for (int32_t p = lo; p <= hi; p++) want += (float)(p + 1);
    int32_t k = m->seq_slot[s];
    assert_true(k >= 0);
    const float *st = m->rs_data + (size_t)k * m->rs_slot_floats + m->rs_state_off[0];
    const float *conv = m->rs_data + (size_t)k * m->rs_slot_floats + m->rs_conv_off[0];
    assert_close(st[0], want, 0.0);
    assert_close(conv[(CONV_K - 2) * CONV_C], (float)hi, 0.0);
    assert_int_equal(keel_mem_seq_pos_max(m, s), hi);
}

static void test_plan_exact_and_failing_allocator(void **state)
{
    (void)state;
    hyb h;
    hyb_open(&h, 3, 4, 0);
    size_t need = 0;
    assert_ok(keel_mem_config_bytes(&h.cfg, &need));
    keel_mem_close(h.m);
    test_alloc_install(0);
    keel_mem *m = NULL;
    assert_ok(keel_mem_open(&h.cfg, &m, NULL));
    assert_int_equal(test_alloc_live_bytes(), (int64_t)need);
    /* slots: one per sequence (n_rs_slots 0), conv rounded to 16 floats */
    assert_int_equal(keel_mem_rs_bytes(m), 3 * (16 + 16) * sizeof(float));
    assert_true(keel_mem_ckpt_record_bytes(m) > 32 * sizeof(float));
    assert_int_equal(keel_mem_ckpt_bytes(m), 3 * 4 * keel_mem_ckpt_record_bytes(m));
    assert_true(keel_mem_is_recurrent(m));
    keel_mem_close(m);
    assert_int_equal(test_alloc_live_bytes(), 0);
    test_alloc_uninstall();
    /* byte cap: fewer records; below one record is refused at open */
    keel_mem_config c2 = h.cfg;
    hyb_open(&h, 3, 4, 0);
    size_t rec = keel_mem_ckpt_record_bytes(h.m);
    keel_mem_close(h.m);
    c2.ckpt_bytes = 2 * rec + 7;
    assert_ok(keel_mem_open(&c2, &m, NULL));
    assert_int_equal(m->n_ckpt, 2);
    keel_mem_close(m);
    c2.ckpt_bytes = rec - 1;
    char err[BASE_ERR_CAP];
    assert_status(keel_mem_open(&c2, &m, err), KEEL_EINVAL);
    assert_non_null(strstr(err, "below one checkpoint record"));
    /* checkpoints of full attention alone (it needs none); a bad recurrent shape */
    keel_mem_layer full = attn_layer(KEEL_MEM_LAYER_FULL);
    keel_mem_config c3 = keel_mem_config_default();
    c3.layers = &full;
    c3.n_layers = 1;
    c3.n_ckpt = 2;
    assert_status(keel_mem_open(&c3, &m, err), KEEL_EINVAL);
    assert_non_null(strstr(err, "checkpoints need recurrent or sliding layers"));
    keel_mem_layer bad = rs_layer();
    bad.rs.conv_kernel = 0;
    c3.layers = &bad;
    c3.n_ckpt = 0;
    assert_status(keel_mem_open(&c3, &m, err), KEEL_EINVAL);
    assert_non_null(strstr(err, "conv_kernel 0"));
}

static keel_status open_close(void *ctx)
{
    hyb *h = ctx;
    keel_mem *m = NULL;
    keel_status st = keel_mem_open(&h->cfg, &m, NULL);
    keel_mem_close(m);
    return st;
}

static void test_alloc_sweep_rs(void **state)
{
    (void)state;
    hyb h;
    hyb_open(&h, 2, 2, 0);
    keel_mem_close(h.m);
    assert_true(test_alloc_sweep(open_close, &h) >= 3);
}

static void test_zero_state_and_fork(void **state)
{
    (void)state;
    hyb h;
    hyb_open(&h, 3, 4, 0);
    keel_mem *m = h.m;
    float *conv, *st;
    assert_status(keel_mem_rs_state(m, 1, 0, &conv, &st), KEEL_ESTATE);
    assert_non_null(strstr(keel_mem_last_error(m), "holds no tokens"));
    assert_status(keel_mem_rs_state(m, 0, 0, &conv, &st), KEEL_EINVAL);
    feed(m, 0, 5);
    expect_state(m, 0, 0, 4);
    assert_ok(keel_mem_check(m));
    /* a fork shares the state until it is written */
    assert_ok(keel_mem_seq_cp(m, 0, 1, -1, -1));
    assert_int_equal(m->seq_slot[0], m->seq_slot[1]);
    assert_status(keel_mem_rs_state(m, 1, 1, &conv, &st), KEEL_ESTATE);
    assert_non_null(strstr(keel_mem_last_error(m), "shares its state"));
    assert_ok(keel_mem_check(m));
    feed(m, 1, 2); /* copy on write: 1 gets its own slot, 0 is untouched */
    assert_true(m->seq_slot[0] != m->seq_slot[1]);
    expect_state(m, 0, 0, 4);
    expect_state(m, 1, 0, 6);
    /* partial copies and merging into a non-empty sequence are refused */
    uint64_t d = keel_mem_digest(m);
    assert_status(keel_mem_seq_cp(m, 0, 2, 0, 3), KEEL_ESTATE);
    assert_non_null(strstr(keel_mem_last_error(m), "would split its recurrent state"));
    assert_status(keel_mem_seq_cp(m, 0, 1, -1, -1), KEEL_ESTATE);
    assert_non_null(strstr(keel_mem_last_error(m), "cannot merge two histories"));
    assert_true(keel_mem_digest(m) == d);
    /* a token of several sequences */
    int32_t pos = 5, s01[2] = {0, 2}, n2 = 2, cells[4];
    const int32_t *sp = s01;
    keel_mem_batch b = {1, &pos, NULL, &n2, &sp, NULL};
    assert_status(keel_mem_place(m, &b, cells), KEEL_EINVAL);
    assert_non_null(strstr(keel_mem_last_error(m), "recurrent states are per sequence"));
    assert_true(keel_mem_digest(m) == d);
    /* keep and clear reach both halves */
    assert_ok(keel_mem_seq_keep(m, 1));
    assert_int_equal(m->seq_slot[0], -1);
    expect_state(m, 1, 0, 6);
    assert_ok(keel_mem_check(m));
    keel_mem_clear(m);
    assert_int_equal(m->seq_slot[1], -1);
    assert_int_equal(keel_mem_seq_pos_max(m, 1), -1);
    assert_ok(keel_mem_check(m));
    keel_mem_close(m);
}

static void test_slots_exhausted(void **state)
{
    (void)state;
    hyb h;
    hyb_open(&h, 3, 0, 2);
    keel_mem *m = h.m;
    feed(m, 0, 2);
    feed(m, 1, 2);
    uint64_t d = keel_mem_digest(m);
    int32_t pos = 0, seq = 2, cells[4];
    keel_mem_batch b = {1, &pos, &seq, NULL, NULL, NULL};
    assert_status(keel_mem_place(m, &b, cells), KEEL_EFULL);
    assert_non_null(strstr(keel_mem_last_error(m), "0 of n_rs_slots 2 are free"));
    assert_true(keel_mem_digest(m) == d);
    /* a fork needs no slot until written */
    assert_ok(keel_mem_seq_rm(m, 1, -1, -1));
    assert_ok(keel_mem_seq_cp(m, 0, 2, -1, -1));
    assert_ok(keel_mem_seq_cp(m, 0, 1, -1, -1));
    assert_int_equal(m->rs_refs[m->seq_slot[0]], 3);
    feed(m, 2, 1); /* takes the free slot */
    d = keel_mem_digest(m);
    pos = 2;
    seq = 1;
    assert_status(keel_mem_place(m, &b, cells), KEEL_EFULL);
    assert_true(keel_mem_digest(m) == d);
    assert_ok(keel_mem_check(m));
    keel_mem_close(m);
}

static void test_rewind_transactional(void **state)
{
    (void)state;
    hyb h;
    hyb_open(&h, 2, 3, 0);
    keel_mem *m = h.m;
    feed(m, 0, 10);
    uint64_t d = keel_mem_digest(m);
    /* no checkpoint: refused, nearest none */
    assert_status(keel_mem_seq_rm(m, 0, 6, -1), KEEL_ESTATE);
    assert_non_null(strstr(keel_mem_last_error(m), "needs a checkpoint at or before 6"));
    assert_non_null(strstr(keel_mem_last_error(m), "has none"));
    assert_true(keel_mem_digest(m) == d);
    assert_int_equal(keel_mem_seq_rewind_min(m, 0), 10);
    assert_int_equal(keel_mem_ckpt_find(m, 0, 6), -1);
    assert_int_equal(keel_mem_ckpt_find(m, 0, 12), 12); /* past the end: nothing to restore */
    /* checkpoints at 10, 14 and 18 */
    assert_ok(keel_mem_ckpt_take(m, 0));
    assert_ok(keel_mem_ckpt_take(m, 0)); /* same position: no-op */
    feed(m, 0, 4);
    assert_ok(keel_mem_ckpt_take(m, 0));
    feed(m, 0, 4);
    assert_ok(keel_mem_ckpt_take(m, 0));
    feed(m, 0, 3); /* ends at 20 */
    keel_mem_ckpt_info info[4];
    int32_t n = 0;
    keel_mem_ckpt_list(m, 0, info, 4, &n);
    assert_int_equal(n, 3);
    assert_int_equal(info[0].pos, 10);
    assert_int_equal(info[2].pos, 18);
    assert_int_equal(info[0].pos_min, 0);
    assert_true(info[0].bytes > STATE_F * sizeof(float));
    assert_int_equal(keel_mem_seq_rewind_min(m, 0), 10);
    assert_ok(keel_mem_check(m));
    /* the middle and the start cannot go */
    d = keel_mem_digest(m);
    assert_status(keel_mem_seq_rm(m, 0, 3, 8), KEEL_ESTATE);
    assert_non_null(strstr(keel_mem_last_error(m), "from its start or middle"));
    assert_status(keel_mem_seq_rm(m, 0, 0, 8), KEEL_ESTATE);
    /* before the oldest checkpoint: refused, the nearest named */
    assert_status(keel_mem_seq_rm(m, 0, 9, -1), KEEL_ESTATE);
    assert_non_null(strstr(keel_mem_last_error(m), "the nearest is at 10"));
    assert_true(keel_mem_digest(m) == d);
    /* at 16: the checkpoint at 14 is restored, 18 is dropped */
    assert_int_equal(keel_mem_ckpt_find(m, 0, 16), 14);
    assert_ok(keel_mem_seq_rm(m, 0, 16, -1));
    expect_state(m, 0, 0, 13);
    keel_mem_ckpt_list(m, 0, info, 4, &n);
    assert_int_equal(n, 2);
    assert_int_equal(info[1].pos, 14);
    assert_ok(keel_mem_check(m));
    /* it continues exactly as a recomputation would */
    feed(m, 0, 3);
    expect_state(m, 0, 0, 16);
    /* the oldest is dropped past n_ckpt */
    assert_ok(keel_mem_ckpt_take(m, 0));
    feed(m, 0, 1);
    assert_ok(keel_mem_ckpt_take(m, 0));
    keel_mem_ckpt_list(m, 0, info, 4, &n);
    assert_int_equal(n, 3);
    assert_int_equal(info[0].pos, 14);
    assert_int_equal(info[2].pos, 18);
    /* everything can always go */
    assert_ok(keel_mem_seq_rm(m, 0, -1, -1));
    assert_int_equal(m->seq_slot[0], -1);
    keel_mem_ckpt_list(m, 0, info, 4, &n);
    assert_int_equal(n, 0);
    assert_int_equal(keel_mem_seq_rewind_min(m, 0), 0);
    assert_ok(keel_mem_check(m));
    /* take on an empty sequence / a memory without recurrent layers */
    assert_status(keel_mem_ckpt_take(m, 0), KEEL_ESTATE);
    assert_status(keel_mem_ckpt_take(m, 7), KEEL_EINVAL);
    keel_mem_close(m);
}

/* Attention of one query of seq s at position p over layer l. */
/* Checkpoint priorities: when the records are full, the lowest priority
 * goes first (the oldest among equals); a new checkpoint that every record
 * outranks is not kept; a rewind restores the protected one, exactly. */
static void test_ckpt_priorities(void **state)
{
    (void)state;
    hyb h;
    hyb_open(&h, 1, 3, 0);
    keel_mem *m = h.m;
    feed(m, 0, 6);
    assert_ok(keel_mem_ckpt_take_prio(m, 0, 3)); /* at 6: the system prompt's end */
    assert_status(keel_mem_ckpt_take_prio(m, 0, -1), KEEL_EINVAL);
    for (int32_t i = 0; i < 5; i++) { /* periodic ones at 10, 14, 18, 22, 26 */
        feed(m, 0, 4);
        assert_ok(keel_mem_ckpt_take(m, 0));
    }
    keel_mem_ckpt_info info[4];
    int32_t n = 0;
    keel_mem_ckpt_list(m, 0, info, 4, &n);
    assert_int_equal(n, 3); /* the protected one and the two newest */
    assert_int_equal(info[0].pos, 6);
    assert_int_equal(info[0].priority, 3);
    assert_int_equal(info[1].pos, 22);
    assert_int_equal(info[2].pos, 26);
    assert_int_equal(info[2].priority, 0);
    /* raise 26, then take at 30 with priority 1: the priority-0 one at 22 goes */
    assert_ok(keel_mem_ckpt_set_prio(m, 0, 26, 2));
    assert_status(keel_mem_ckpt_set_prio(m, 0, 23, 2), KEEL_ENOENT);
    assert_non_null(strstr(keel_mem_last_error(m), "no checkpoint at 23"));
    feed(m, 0, 4);
    assert_ok(keel_mem_ckpt_take_prio(m, 0, 1));
    keel_mem_ckpt_list(m, 0, info, 4, &n);
    assert_int_equal(n, 3);
    assert_int_equal(info[0].pos, 6);
    assert_int_equal(info[1].pos, 26);
    assert_int_equal(info[2].pos, 30);
    /* a periodic one now ranks below all three: not kept, nothing changes */
    feed(m, 0, 4);
    uint64_t d = keel_mem_digest(m);
    assert_ok(keel_mem_ckpt_take(m, 0));
    assert_true(keel_mem_digest(m) == d);
    keel_mem_ckpt_list(m, 0, info, 4, &n);
    assert_int_equal(info[2].pos, 30);
    /* taken again at the same end with a higher priority: raised in place */
    assert_ok(keel_mem_ckpt_take_prio(m, 0, 3)); /* at 34: 30 (priority 1) goes */
    keel_mem_ckpt_list(m, 0, info, 4, &n);
    assert_int_equal(info[2].pos, 34);
    assert_int_equal(info[2].priority, 3);
    assert_ok(keel_mem_check(m));
    /* the divergence right after the system prompt: the protected one */
    assert_ok(keel_mem_seq_rm(m, 0, 8, -1));
    expect_state(m, 0, 0, 5);
    assert_ok(keel_mem_check(m));
    keel_mem_close(m);
}

static void attend_one(keel_mem *m, int32_t l, int32_t s, int32_t p, float *out)
{
    float q[2 * 32];
    for (int32_t i = 0; i < 64; i++) q[i] = (float)((i * 7) % 11) * 0.05f - 0.2f;
    keel_mem_attn a;
    memset(&a, 0, sizeof a);
    a.n_tokens = 1;
    a.n_heads = 2;
    a.q = q;
    a.pos = &p;
    a.seq = &s;
    a.out = out;
    assert_ok(keel_mem_attend(m, l, &a));
}

/* After a restore, the sliding ring holds what a recomputation of the kept
 * prefix would: its rows come from the checkpoint (the ring had forgotten
 * them), so attention at the restored end equals a fresh memory's. */
static void test_ring_rows_restored(void **state)
{
    (void)state;
    hyb h, fresh;
    hyb_open(&h, 1, 2, 0);
    hyb_open(&fresh, 1, 2, 0);
    feed(h.m, 0, 9); /* 0..8 */
    assert_ok(keel_mem_ckpt_take(h.m, 0));
    for (int i = 0; i < 3; i++) feed(h.m, 0, 7); /* to 29: the ring forgot 5..8 */
    assert_true(keel_mem_seq_rewind_min(h.m, 0) == 9);
    assert_ok(keel_mem_seq_rm(h.m, 0, 9, -1));
    feed(fresh.m, 0, 9);
    float a[64], b[64];
    for (int32_t l = 0; l < 3; l += 2) {
        attend_one(h.m, l, 0, 9, a);
        attend_one(fresh.m, l, 0, 9, b);
        for (int i = 0; i < 64; i++) assert_close(a[i], b[i], 1e-6);
    }
    expect_state(h.m, 0, 0, 8);
    assert_ok(keel_mem_check(h.m));
    keel_mem_close(h.m);
    keel_mem_close(fresh.m);
}

static void test_edits_and_compaction(void **state)
{
    (void)state;
    hyb h;
    hyb_open(&h, 2, 3, 0);
    keel_mem *m = h.m;
    feed(m, 0, 8);
    assert_ok(keel_mem_ckpt_take(m, 0)); /* at 8 */
    feed(m, 0, 8);                       /* to 15 */
    assert_ok(keel_mem_ckpt_take(m, 0)); /* at 16 */
    /* shifting the tail keeps the state (it does not depend on positions)
     * and drops the checkpoint reaching into the edited range */
    assert_ok(keel_mem_seq_add(m, 0, 10, -1, 5));
    assert_int_equal(keel_mem_seq_pos_max(m, 0), 20);
    int32_t n = 0;
    keel_mem_ckpt_info info[3];
    keel_mem_ckpt_list(m, 0, info, 3, &n);
    assert_int_equal(n, 1);
    assert_int_equal(info[0].pos, 8);
    assert_ok(keel_mem_check(m));
    /* moving the last token below another is refused */
    uint64_t d = keel_mem_digest(m);
    assert_status(keel_mem_seq_add(m, 0, 20, -1, -12), KEEL_ESTATE);
    assert_non_null(strstr(keel_mem_last_error(m), "below another of its tokens"));
    assert_true(keel_mem_digest(m) == d);
    /* a shift of everything is exact: the sequence continues after it */
    assert_ok(keel_mem_seq_add(m, 0, -1, -1, 3));
    assert_int_equal(keel_mem_seq_pos_max(m, 0), 23);
    keel_mem_ckpt_list(m, 0, info, 3, &n);
    assert_int_equal(n, 0);
    feed(m, 0, 1);
    assert_int_equal(keel_mem_seq_pos_max(m, 0), 24);
    assert_ok(keel_mem_check(m));
    /* compaction: attention only, the last token kept even without recent
     * tokens, checkpoints dropped */
    assert_ok(keel_mem_ckpt_take(m, 0));
    keel_compact_params cp = keel_compact_params_default();
    cp.policy = KEEL_COMPACT_KNORM;
    cp.trigger = 8;
    cp.target = 6;
    cp.n_sink = 1;
    cp.recent = 0.0f;
    cp.renumber = true;
    assert_ok(keel_mem_compact(m, 0, &cp));
    assert_int_equal(keel_mem_seq_pos_max(m, 0), 5);
    keel_mem_ckpt_list(m, 0, info, 3, &n);
    assert_int_equal(n, 0);
    assert_int_equal(keel_mem_seq_rewind_min(m, 0), 6);
    assert_ok(keel_mem_check(m));
    keel_mem_close(m);
}

static void test_checker_catches_corruption(void **state)
{
    (void)state;
    hyb h;
    hyb_open(&h, 2, 2, 0);
    keel_mem *m = h.m;
    feed(m, 0, 4);
    assert_ok(keel_mem_ckpt_take(m, 0));
    assert_ok(keel_mem_check(m));
    m->rs_refs[m->seq_slot[0]]++;
    assert_status(keel_mem_check(m), KEEL_EINTERNAL);
    assert_non_null(strstr(keel_mem_last_error(m), "references recorded"));
    m->rs_refs[m->seq_slot[0]]--;
    m->rs_pos_max[0] = 7;
    assert_status(keel_mem_check(m), KEEL_EINTERNAL);
    m->rs_pos_max[0] = 3;
    float *conv, *st;
    assert_ok(keel_mem_rs_state(m, 1, 0, &conv, &st));
    st[2] = NAN;
    assert_status(keel_mem_check(m), KEEL_EINTERNAL);
    assert_non_null(strstr(keel_mem_last_error(m), "non-finite state"));
    st[2] = 0.0f;
    m->ckpts[0].pos = 9;
    assert_status(keel_mem_check(m), KEEL_EINTERNAL);
    assert_non_null(strstr(keel_mem_last_error(m), "outside the sequence"));
    m->ckpts[0].pos = 4;
    assert_ok(keel_mem_check(m));
    keel_mem_close(m);
}

/* Recurrent layers only (Mamba2): positions are the recorded span. */
static void test_recurrent_only(void **state)
{
    (void)state;
    keel_mem_layer l[2] = {rs_layer(), rs_layer()};
    keel_mem_config cfg = keel_mem_config_default();
    cfg.layers = l;
    cfg.n_layers = 2;
    cfg.n_seq_max = 2;
    cfg.n_ckpt = 2;
    cfg.n_threads = 1;
    keel_mem *m = NULL;
    assert_ok(keel_mem_open(&cfg, &m, NULL));
    assert_int_equal(keel_mem_n_groups(m), 0);
    int32_t pos[3] = {4, 5, 6}, seq[3] = {1, 1, 1}, cells[3];
    keel_mem_batch b = {3, pos, seq, NULL, NULL, NULL};
    assert_ok(keel_mem_place(m, &b, cells));
    assert_int_equal(keel_mem_seq_pos_min(m, 1), 4);
    assert_int_equal(keel_mem_seq_pos_max(m, 1), 6);
    assert_ok(keel_mem_ckpt_take(m, 1));
    int32_t p2 = 7;
    keel_mem_batch b2 = {1, &p2, seq, NULL, NULL, NULL};
    assert_ok(keel_mem_place(m, &b2, cells));
    assert_status(keel_mem_seq_add(m, 1, 6, -1, 2), KEEL_ESTATE); /* part of the span */
    assert_ok(keel_mem_seq_rm(m, 1, 7, -1));
    assert_int_equal(keel_mem_seq_pos_max(m, 1), 6);
    assert_ok(keel_mem_seq_add(m, 1, -1, -1, -4));
    assert_int_equal(keel_mem_seq_pos_min(m, 1), 0);
    assert_int_equal(keel_mem_seq_pos_max(m, 1), 2);
    assert_ok(keel_mem_check(m));
    keel_mem_close(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_exact_and_failing_allocator),
        cmocka_unit_test(test_alloc_sweep_rs),
        cmocka_unit_test(test_zero_state_and_fork),
        cmocka_unit_test(test_slots_exhausted),
        cmocka_unit_test(test_rewind_transactional),
        cmocka_unit_test(test_ckpt_priorities),
        cmocka_unit_test(test_ring_rows_restored),
        cmocka_unit_test(test_edits_and_compaction),
        cmocka_unit_test(test_checker_catches_corruption),
        cmocka_unit_test(test_recurrent_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
