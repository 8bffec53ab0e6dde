/*
 * memory.h — private interface of src/memory: cell tables, columns, the
 * keel_mem object, attention over the cache. See docs/memory.md.
 *
 * Layout
 *   keel_mem
 *     groups[g]            layers of the same kind (full / sliding(window, sinks))
 *       tables[stream]     one cell table per stream (1 when unified)
 *         cell metadata    pos, stamp, seq bitset            [cap]
 *         columns[c]       K / V rows of each layer of the group, head-major:
 *                          data[(head * cap + cell) * head_row_bytes]
 *
 * Invariants (checked by keel_mem_check, design.md section 3)
 *   T1 a cell is empty (pos == -1, empty seq set) or occupied (pos >= 0,
 *      non-empty seq set); n_used counts occupied cells.
 *   T2 every row access is data + (head * cap + cell) * head_row_bytes with
 *      cell < cap produced by the table (slot search or iteration); nothing
 *      derives a row from a token count or a position.
 *   T3 in split streams, a table's cells belong only to its stream's sequence.
 *   T4 a sliding table keeps, per sequence, its n_sink lowest (pos, stamp)
 *      cells and every cell a query at positions >= its last placement needs.
 *   T5 unless compacted, a sequence a sliding table holds is held by every full
 *      table up to at least the same last position.
 *   T6 every occupied cell lies in [lo_mark, hi_mark), and every cell
 *      holding sequence s in [seq_lo[s], seq_hi[s]), all marks in [0, cap]:
 *      what iterates over the cells of a decode step (attention's gathers
 *      and thread split) reads that range, not [0, cap), so a short
 *      conversation in a large cache costs what its cells cost; and a
 *      sequence's own range does not move when another sequence's cells do.
 */
#ifndef KEEL_MEMORY_H
#define KEEL_MEMORY_H

#include "../tensor/tensor.h"

#define MEM_SEQ_MAX 256
#define MEM_SEQ_WORDS_MAX (MEM_SEQ_MAX / 64)
#define MEM_NO_EVICT INT32_MIN
#define MEM_SPLIT_MIN_CELLS 128 /* see keel_mem.split_min_cells */
#define MEM_CELL_PROTECTED 1u /* cflags: compaction keeps the cell */

/* Layers with K/V columns (full or sliding); NONE and RECURRENT have none. */
static inline bool mem_layer_has_kv(const keel_mem_layer *l)
{
    return l->kind == KEEL_MEM_LAYER_FULL || l->kind == KEEL_MEM_LAYER_SLIDING;
}

typedef enum mem_col_kind {
    MEM_COL_K = 0,   /* keys: rotated (opt) + quantized, RoPE'd at stored position */
    MEM_COL_V = 1,   /* values: rotated (opt) + quantized */
    MEM_COL_IDX = 2, /* sparse-attention indexer keys: one head, rotated (opt) +
                        quantized, RoPE'd (opt) at stored position */
} mem_col_kind;

/* Columns a layer registers with its table: K, V and, with an indexer,
 * IDX, at layer_col + kind. */
static inline int32_t mem_layer_n_cols(const keel_mem_layer *l)
{
    return !mem_layer_has_kv(l) ? 0 : l->idx_head_dim > 0 ? 3 : 2;
}

/* What a layer's column of a kind stores (the descriptor's source). */
typedef struct mem_col_spec {
    keel_dtype dtype;
    int32_t n_heads, head_dim;
    const keel_mem_rot *rot;
    const keel_rope *rope; /* NULL: no position (V) */
} mem_col_spec;

static inline mem_col_spec mem_layer_col_spec(const keel_mem_layer *l, int32_t kind)
{
    mem_col_spec c;
    if (kind == MEM_COL_K) {
        c.dtype = l->k_dtype;
        c.n_heads = l->n_kv_heads;
        c.head_dim = l->head_dim_k;
        c.rot = &l->k_rot;
        c.rope = &l->rope;
    } else if (kind == MEM_COL_V) {
        c.dtype = l->v_dtype;
        c.n_heads = l->n_kv_heads;
        c.head_dim = l->head_dim_v;
        c.rot = &l->v_rot;
        c.rope = NULL;
    } else {
        c.dtype = l->idx_dtype;
        c.n_heads = 1;
        c.head_dim = l->idx_head_dim;
        c.rot = &l->idx_rot;
        c.rope = &l->idx_rope;
    }
    return c;
}

/* Largest head row (elements) over the columns of a layer (1 without KV). */
static inline int32_t mem_layer_dim_max(const keel_mem_layer *l)
{
    int32_t d = 1;
    if (!mem_layer_has_kv(l)) return d;
    d = l->head_dim_k > d ? l->head_dim_k : d;
    d = l->head_dim_v > d ? l->head_dim_v : d;
    return l->idx_head_dim > d ? l->idx_head_dim : d;
}

/* A column: one per-token datum of one layer, registered with a table. Its
 * descriptor records exactly what is stored (design.md rule 4). */
typedef struct mem_col {
    mem_col_kind kind;
    int32_t layer;
    keel_dtype dtype;      /* storage type */
    int32_t n_heads;       /* KV heads */
    int32_t head_dim;      /* elements per head row */
    size_t head_row_bytes; /* tensor_row_bytes(dtype, head_dim) */
    keel_mem_rot rot;      /* rot.block resolved (> 0) when enabled */
    float *signs;          /* [rot.block] +-1 sign diagonal, or NULL (no rotation or seed 0) */
    keel_rope rope;        /* K, IDX: RoPE of stored keys (freq_factors copied below) */
    float *freq_factors;   /* [rope.n_rot / 2] owned copy, or NULL */
    double *rope_rates;    /* [rope.n_rot / 2] angle per position per pair, K / IDX with rope */
    uint8_t *data;         /* [n_heads][cap][head_row_bytes] */
    size_t data_bytes;
} mem_col;

typedef struct mem_table {
    int32_t cap;          /* cells */
    int32_t n_used;       /* occupied cells */
    int32_t seq_words;    /* 64-bit words per seq bitset */
    int32_t stream;       /* -1 when unified, else the stream's sequence */
    int32_t head;         /* slot search start (ring order, locality) */
    int32_t lo_mark;      /* T6: no occupied cell below (cap when none has been since the last refresh) */
    int32_t hi_mark;      /* T6: no occupied cell at or above (0 likewise); free_cell keeps both tight */
    int32_t *pos;         /* [cap] position, -1 when empty */
    uint64_t *stamp;      /* [cap] placement order (ties of equal positions) */
    uint64_t *seq;        /* [cap][seq_words] sequence sets */
    uint8_t *flags;       /* [cap] scratch marks of the operation in progress, 0 between ops */
    uint8_t *cflags;      /* [cap] persistent cell flags (MEM_CELL_*) */
    int32_t *newpos;      /* [cap] target positions of a renumbering in progress */
    int32_t *seq_min;     /* [n_seq] smallest position of s in this table, -1 none */
    int32_t *seq_max;     /* [n_seq] largest position of s, -1 none */
    int32_t *seq_cells;   /* [n_seq] cells holding s */
    int32_t *seq_lo;      /* [n_seq] T6: no cell holding s below (cap when none since the last refresh) */
    int32_t *seq_hi;      /* [n_seq] T6: none at or above (0 likewise); widened by mem_seq_set */
    int32_t n_seq;        /* n_seq_max of the memory */
    mem_col *cols;        /* [n_cols] */
    int32_t n_cols;
    /* sliding */
    bool sliding;
    int32_t window, n_sink;
    int32_t *evict_max;   /* [n_seq_max] highest position forgotten by the ring,
                             MEM_NO_EVICT if none (may be negative after edits) */
    /* lazily computed sink thresholds: cell c of s is a sink iff
     * (pos, stamp) <= (sink_pos[s], sink_stamp[s]) */
    bool sinks_dirty;
    int32_t *sink_pos;    /* [n_seq_max] -1: no sinks */
    uint64_t *sink_stamp; /* [n_seq_max] */
    int32_t *heap_pos;    /* [n_sink] work space of mem_table_update_sinks */
    uint64_t *heap_stamp; /* [n_sink] */
} mem_table;

typedef struct mem_group {
    keel_mem_layer_kind kind;
    int32_t window, n_sink;
    int32_t n_layers;     /* layers in this group */
    int32_t n_tables;     /* streams */
    mem_table *tables;    /* [n_tables] */
} mem_group;

/* Largest attention shapes over the layers: sizes attention scratch. */
typedef struct mem_attn_dims {
    int32_t n_heads_max, g_max, dk_max, dv_max;
    size_t qrow_max;   /* bytes of one prepared query row (vec_dot type) */
    int32_t order_cap; /* deterministic mode: cells a query's ordered list may hold, else 0 */
    /* sparse attention (0 without indexer columns) */
    int32_t ih_max, ik_max, topk_max; /* indexer query heads, key dims, top_k */
    int32_t vis_cap;   /* cells a query's visible list may hold (n_ctx), else 0 */
    size_t iqrow_max;  /* bytes of one prepared indexer query row */
} mem_attn_dims;

/* A checkpoint record's header (its data lies in keel_mem.ckpt_data). */
typedef struct mem_ckpt {
    int32_t pos;      /* covers positions < pos; -1: record unused */
    int32_t pos_min;  /* the sequence's first position when taken */
    uint64_t stamp;   /* stamp of the sequence's last token when taken */
    uint64_t order;   /* take order (oldest first) */
    size_t bytes;     /* bytes of the snapshot in use */
    int32_t prio;     /* eviction: the lowest priority goes first, then the oldest
                         (not saved in sessions: a loaded record has 0) */
} mem_ckpt;

/* Per sliding group, where a checkpoint record keeps the ring's rows. */
typedef struct mem_ckpt_ring {
    size_t off;       /* byte offset in a record: int32 n, int32 evict_max, then below */
    int32_t max;      /* n_sink + window cells at most */
    size_t pos_off, stamp_off, cflags_off, rows_off; /* [max] int32 / u64 / u8; rows */
    size_t cell_bytes; /* row bytes of one cell over every column of the group */
} mem_ckpt_ring;

struct keel_mem {
    keel_mem_config cfg;       /* layers points at the copy below */
    keel_mem_layer *layers;    /* [n_layers] */
    int32_t *layer_group;      /* [n_layers] group or -1 */
    int32_t *layer_col;        /* [n_layers] index of the layer's K column in its tables
                                  (V = +1, IDX = +2 when the layer has one) */
    mem_group *groups;         /* [n_groups] */
    int32_t n_groups;
    int32_t n_streams;
    int32_t n_threads;
    int32_t split_min_cells;   /* attention: a call's KV ranges are split across threads into
                                  (its largest block extent / this) parts at most
                                  (MEM_SPLIT_MIN_CELLS; the memory fuzzer lowers it to split
                                  short caches) */
    base_pool *pool;
    bool pool_shared;          /* borrowed from the caller (mem_open_shared) */
    base_arena scratch;        /* every operation's scratch, reserved at open */
    mem_attn_dims attn_dims;   /* of the layers, for keel_mem_attend */
    size_t bytes_total;        /* what open allocated (== keel_mem_config_bytes) */
    size_t block_bytes;        /* the one block holding tables, metadata and columns */
    uint64_t next_stamp;
    int64_t tokens_placed;
    int32_t max_cell_touched;  /* highest cell index any operation produced (tests) */
    int32_t *exact_from;       /* [n_seq] rewinding below this is not exact (compaction) */
    int64_t *n_compact;        /* [n_seq] compactions applied */
    int32_t *cells_high;       /* [n_seq] high-water mark of full-table cells */
    /* KeyDiff anchors: per sequence, the running sum of normalized pre-RoPE
     * keys of every full-attention K column and head */
    float *anchor;             /* [n_seq][anchor_floats] */
    size_t anchor_floats;
    size_t *anchor_off;        /* [n_layers] offset of the layer's heads, or SIZE_MAX */
    uint64_t *anchor_stamp;    /* [n_seq] cells with stamp <= this are counted */
    uint8_t *anchor_valid;     /* [n_seq] */
    /* the recurrent half (recurrent.c): one slot per sequence holding tokens,
     * shared by forks until one of them is written (copy on write) */
    int32_t n_rs_layers;
    int32_t *layer_rs;         /* [n_layers] index among recurrent layers, or -1 */
    size_t *rs_conv_off;       /* [n_rs_layers] float offset of the conv state in a slot */
    size_t *rs_state_off;      /* [n_rs_layers] float offset of the SSM state in a slot */
    size_t rs_slot_floats;     /* floats of one slot (every recurrent layer) */
    int32_t n_rs_slots;
    float *rs_data;            /* [n_rs_slots][rs_slot_floats] */
    int32_t *rs_refs;          /* [n_rs_slots] sequences using the slot */
    int32_t *seq_slot;         /* [n_seq] the sequence's slot, or -1 (no tokens) */
    int32_t *rs_pos_min;       /* [n_seq] first / last position of the sequence, -1 none */
    int32_t *rs_pos_max;
    uint64_t *rs_stamp;        /* [n_seq] stamp of its last placed token */
    /* checkpoints: n_ckpt records per sequence, each ckpt_rec_bytes */
    int32_t n_ckpt;
    size_t ckpt_rec_bytes;
    mem_ckpt *ckpts;           /* [n_seq][n_ckpt] */
    uint8_t *ckpt_data;        /* [n_seq][n_ckpt][ckpt_rec_bytes] */
    mem_ckpt_ring *ckpt_ring;  /* [n_groups] (max 0 for full groups) */
    uint64_t ckpt_order;
    /* speculation snapshots (recurrent.c): one state per sequence */
    float *spec_data;          /* [n_seq][rs_slot_floats] when spec_pos is set, else NULL */
    int32_t *spec_pos;         /* [n_seq] end + 1 at the save, -1: none */
    int32_t *spec_lo;          /* [n_seq] the sequence's first position at the save */
    uint64_t *spec_stamp;      /* [n_seq] its last placed token's stamp at the save; edits
                                  that drop checkpoints above a position drop a snapshot above
                                  it too (mem_ck_drop) */
    char err[BASE_ERR_CAP];
};

/* The recurrent half's storage (recurrent.c, session.c). */
static inline float *mem_rs_slot(const keel_mem *m, int32_t k)
{
    return m->rs_data + (size_t)k * m->rs_slot_floats;
}

static inline mem_ckpt *mem_ck(const keel_mem *m, int32_t s, int32_t i)
{
    return &m->ckpts[(size_t)s * (size_t)m->n_ckpt + (size_t)i];
}

static inline uint8_t *mem_ck_data(const keel_mem *m, int32_t s, int32_t i)
{
    return m->ckpt_data + ((size_t)s * (size_t)m->n_ckpt + (size_t)i) * m->ckpt_rec_bytes;
}

static inline int32_t mem_rs_free_slots(const keel_mem *m)
{
    int32_t n = 0;
    for (int32_t k = 0; k < m->n_rs_slots; k++) n += m->rs_refs[k] == 0;
    return n;
}

/* A free slot (the caller validated that one exists), or -1. */
static inline int32_t mem_rs_take_slot(const keel_mem *m)
{
    for (int32_t k = 0; k < m->n_rs_slots; k++)
        if (m->rs_refs[k] == 0) return k;
    return -1;
}

/* Opens a memory that runs its threads on the caller's pool (which must
 * outlive it); cfg->n_threads is ignored. */
keel_status mem_open_shared(const keel_mem_config *cfg, base_pool *pool, keel_mem **out,
                            char *err);
/* keel_mem_config_bytes for mem_open_shared (no pool of its own); the
 * caller sets cfg->n_threads to the pool's threads. */
keel_status mem_config_bytes_shared(const keel_mem_config *cfg, size_t *bytes, char *err);

/* Position edit pass over the cells marked in t->flags: seq_add (delta),
 * seq_div (div > 0) or renumbering (map: t->newpos). Keys are re-encoded;
 * marks are cleared. scratch: mem_edit_thread_bytes(&m->cfg) * m->n_threads
 * bytes, BASE_ALIGN-aligned, taken by the caller while validating (so the
 * pass cannot fail once the operation commits). */
void mem_edit_marked(keel_mem *m, mem_table *t, int32_t delta, int32_t div, bool map,
                     uint8_t *scratch);
/* Per-thread scratch bytes of mem_edit_marked (a multiple of BASE_ALIGN). */
size_t mem_edit_thread_bytes(const keel_mem_config *cfg);
/* Per-thread scratch of a position edit over a table whose largest head
 * row is hd floats, with ncols columns of at most nrot rotated dims:
 * x[hd] | cs[ncols][nrot + 2] | cached delta[ncols] (int64), each part
 * BASE_ALIGN-aligned and the whole rounded up, so that every thread's block
 * and every part of it is aligned whatever the head dims (odd ones too). */
typedef struct mem_edit_layout {
    size_t cs_off, cached_off, bytes;
} mem_edit_layout;
mem_edit_layout mem_edit_layout_of(size_t hd, size_t ncols, size_t nrot);
/* Per-thread scratch bytes of a K/V write (one head row of floats). */
size_t mem_write_thread_bytes(const keel_mem_config *cfg);
/* Largest sliding table capacity of cfg (0 without sliding layers). */
int32_t mem_ring_cap_max(const keel_mem_config *cfg);

/* Bytes of every K/V column of cfg (0 if cfg is invalid). */
size_t mem_config_kv_bytes(const keel_mem_config *cfg);

/* Free cells for new tokens of sequence s in its full-attention tables
 * (sliding rings always make room); INT32_MAX without full layers. */
int32_t mem_room(const keel_mem *m, int32_t s);

/* Scratch bytes keel_mem_check needs when the largest table has max_cap
 * cells (check.c). */
size_t mem_check_scratch_bytes(const keel_mem_config *cfg, int32_t max_cap);
/* Scratch bytes keel_mem_save / keel_mem_load need for a memory with
 * total_stamps stamps to rank (every table cell, each sequence's last
 * stamp, its checkpoints' and their ring cells') and n_ckpts checkpoint
 * records in all (session.c). */
size_t mem_session_scratch_bytes(size_t total_stamps, size_t n_ckpts, int32_t n_layers, int32_t hd_sum);
/* What a load checks beyond the blob and this memory (session_load.c): with
 * n_vocab > 0 every token id of the history is in [0, n_vocab); with
 * need_history a saved sequence that holds cells must come with a history
 * (an empty one is otherwise taken as none recorded). */
typedef struct mem_load_rules {
    int32_t n_vocab;
    bool need_history;
} mem_load_rules;
/* keel_mem_load with rules (keel_mem_load: no vocabulary, no history
 * needed). */
keel_status mem_session_load(keel_mem *m, int32_t seq, const void *buf, size_t len, uint64_t fingerprint,
                             unsigned flags, const mem_load_rules *rules, int32_t *tokens, int32_t cap_tokens,
                             int32_t *n_tokens, int32_t *n_pending);
/* Scratch bytes keel_mem_compact needs (compact.c). */
size_t mem_compact_scratch_bytes(const keel_mem_config *cfg, int32_t n_threads);

/* A sequence's full-attention cells as keel_decode plans the compactions
 * of a batch before it changes anything (compact.c): the cells it holds,
 * how many of them another sequence shares (an upper bound once a planned
 * compaction ran: other sequences' compactions only unshare cells) and, of
 * those, the sinks a renumbering compaction leaves in place (not copied). */
typedef struct mem_compact_est {
    int32_t cells, shared, fixed;
} mem_compact_est;
/* From the memory as it is now (scratch reset; without scratch no sink is
 * counted, which only makes the plan more conservative). */
void mem_compact_est_init(keel_mem *m, int32_t s, const keel_compact_params *p, mem_compact_est *e);
/* Plans one compaction of e under p (e->cells > p->target): returns the
 * least net number of cells it frees in its table (freed minus copies of
 * shared cells; negative when copies outweigh), and updates e to after it.
 * Exact when no cell of the sequence is shared; with shared cells and
 * renumbering, exact unless the policy keeps shared cells other than the
 * sinks at their own positions; without renumbering, exact unless it
 * evicts shared cells. keel_mem_compact's own room check (copies <= free
 * + freed) holds whenever the free cells plus this are >= 0. */
int32_t mem_compact_est_apply(mem_compact_est *e, const keel_compact_params *p);

/* ---- the recurrent half (recurrent.c) ------------------------------------ */

/* Bytes of one checkpoint record for cfg and the ring layout of each group
 * (rings may be NULL to only count). groups must be laid out already when
 * rings is given. */
size_t mem_ckpt_record_bytes(const keel_mem_config *cfg, const keel_mem *m, mem_ckpt_ring *rings);
/* Records per sequence after the byte cap (0 if none). */
int32_t mem_ckpt_count(const keel_mem_config *cfg, size_t rec_bytes);
/* Bytes of the state slots and of every checkpoint record cfg plans (0 if
 * cfg is invalid). */
void mem_config_rs_bytes(const keel_mem_config *cfg, size_t *rs, size_t *ckpt);
/* Scratch bytes of the checkpoint operations (selection of ring cells). */
size_t mem_rs_scratch_bytes(const keel_mem_config *cfg, int32_t max_cap);

/* Placement on a recurrent memory: validate (tokens of one sequence each,
 * free slots: one per sequence without a slot, and per shared slot
 * min(its sharers in the batch, refs - 1)) then commit (slots made
 * exclusive, positions, stamps). The check is KEEL_OK without recurrent
 * layers and takes any number of tokens: keel_decode runs it on the whole
 * batch before its first ubatch. */
keel_status mem_rs_place_check(keel_mem *m, const keel_mem_batch *b);
void mem_rs_place_commit(keel_mem *m, const keel_mem_batch *b, uint64_t first_stamp);
/* seq_rm / seq_cp / seq_keep / position edits / compaction / clear on a
 * recurrent memory (validate and commit inside; KEEL_ESTATE as keel.h). */
keel_status mem_rs_seq_rm(keel_mem *m, int32_t s, int32_t p0, int32_t p1);
keel_status mem_rs_seq_cp_check(keel_mem *m, int32_t src, int32_t dst, int32_t p0, int32_t p1);
void mem_rs_seq_cp_commit(keel_mem *m, int32_t src, int32_t dst);
void mem_rs_seq_keep(keel_mem *m, int32_t s);
keel_status mem_rs_edit_check(keel_mem *m, const char *what, int32_t s, int32_t p0, int32_t p1,
                              int32_t delta, int32_t div, int32_t *floor);
void mem_rs_edit_commit(keel_mem *m, int32_t s, int32_t p0, int32_t p1, int32_t delta,
                        int32_t div, int32_t floor);
void mem_rs_after_compact(keel_mem *m, int32_t s);
void mem_rs_clear(keel_mem *m);
/* A sequence's span, whether it holds tokens, and the stamp of its last
 * token (0: none), from the recurrent state on a recurrent memory, else
 * from the tables. */
int32_t mem_seq_lo(const keel_mem *m, int32_t s);
int32_t mem_seq_hi(const keel_mem *m, int32_t s);
bool mem_seq_holds(const keel_mem *m, int32_t s);
uint64_t mem_seq_last_stamp(const keel_mem *m, int32_t s);
/* Drops the checkpoints of s covering positions >= above (pos > above;
 * above < 0: all). An attention memory's checkpoints (ring rows only) are
 * dropped by every operation that changes what a sequence holds below
 * them: removals, copies into it, edits, compaction, keep, clear. */
void mem_ck_drop(keel_mem *m, int32_t s, int32_t above);
/* Releases seq s's slot and checkpoints (the sequence was emptied). */
void mem_rs_drop_seq(keel_mem *m, int32_t s);
/* keel_mem_check's part for the recurrent half (x: scratch of the largest
 * head row); digest of it. */
keel_status mem_rs_check(keel_mem *m, float *x);
uint64_t mem_rs_digest(const keel_mem *m, uint64_t h);

/* Attention-half removal of s's cells with p0 <= pos < p1 (s < 0: all),
 * and its bookkeeping (mem.c); cannot fail. */
void mem_attn_rm(keel_mem *m, int32_t s, int32_t p0, int32_t p1);
/* Largest / smallest position of s over the attention tables, -1 none. */
int32_t mem_tables_pos_max(const keel_mem *m, int32_t s);
int32_t mem_tables_pos_min(const keel_mem *m, int32_t s);
/* The table of group g that holds sequence s. */
static inline mem_table *mem_table_of(const keel_mem *m, int32_t g, int32_t s)
{
    return &m->groups[g].tables[m->n_streams == 1 ? 0 : s];
}

/* ---- table (table.c) ----------------------------------------------------- */

static inline bool mem_seq_has(const mem_table *t, int32_t cell, int32_t s)
{
    return (t->seq[(size_t)cell * (size_t)t->seq_words + (size_t)(s >> 6)] >> (s & 63)) & 1u;
}
static inline void mem_seq_set(mem_table *t, int32_t cell, int32_t s)
{
    t->seq[(size_t)cell * (size_t)t->seq_words + (size_t)(s >> 6)] |= (uint64_t)1 << (s & 63);
    if (cell < t->seq_lo[s]) t->seq_lo[s] = cell; /* T6 */
    if (cell >= t->seq_hi[s]) t->seq_hi[s] = cell + 1;
}
static inline void mem_seq_unset(mem_table *t, int32_t cell, int32_t s)
{
    t->seq[(size_t)cell * (size_t)t->seq_words + (size_t)(s >> 6)] &= ~((uint64_t)1 << (s & 63));
}
bool mem_seq_empty(const mem_table *t, int32_t cell);
int32_t mem_seq_count(const mem_table *t, int32_t cell);

/* Pointer to the row of head h at cell of column c. cell must come from
 * the table (cell < cap): checked, NULL otherwise. */
static inline uint8_t *mem_col_row(const mem_table *t, const mem_col *c, int32_t head, int32_t cell)
{
    if (BASE_UNLIKELY(cell < 0 || cell >= t->cap || head < 0 || head >= c->n_heads)) return NULL;
    return c->data + ((size_t)head * (size_t)t->cap + (size_t)cell) * c->head_row_bytes;
}

/* Group cell ids (what keel_mem_place returns): stream * cap + cell.
 * Decodes and bounds-checks one; false if out of range. */
static inline bool mem_cell_decode(const mem_group *g, int32_t id, const mem_table **t,
                                   int32_t *cell)
{
    int32_t cap = g->tables[0].cap;
    if (id < 0 || id / cap >= g->n_tables) return false;
    *t = &g->tables[id / cap];
    *cell = id % cap;
    return true;
}

/* Frees a cell (all sequences), clearing its metadata. */
void mem_table_free_cell(mem_table *t, int32_t cell);
/* Copies cell src to free cell dst: metadata (not seq set) and all columns. */
void mem_table_copy_cell(mem_table *t, int32_t dst, int32_t src);
/* The same from another table of the group (same columns: split streams). */
void mem_table_copy_cell_from(mem_table *td, int32_t dst, const mem_table *ts, int32_t src);
/* Copy on write: if cell is shared with other sequences, copies it (all
 * columns) to a free cell and moves s there. Returns the cell that now holds
 * s alone. The caller has checked that a free cell exists. */
int32_t mem_table_split(mem_table *t, int32_t cell, int32_t s);
/* The occupied extent: lo = the first cell holding a position, hi = one
 * past the last (lo = hi = 0 when the table is empty). Every cell outside
 * [lo, hi) is free. Reads pos[] inward from the marks (T6): O(1) when they
 * are tight, as free_cell and refresh leave them. */
void mem_table_extent(const mem_table *t, int32_t *lo, int32_t *hi);
/* The same for the cells holding sequence s (inward from seq_lo/seq_hi):
 * it depends on s's cells only, not on what other sequences hold. */
void mem_table_seq_extent(const mem_table *t, int32_t s, int32_t *lo, int32_t *hi);
/* Records that cell is occupied now (T6). Every write of a position into
 * an empty cell calls it (occupy and copy_cell do). */
static inline void mem_table_mark_used(mem_table *t, int32_t cell)
{
    if (cell < t->lo_mark) t->lo_mark = cell;
    if (cell >= t->hi_mark) t->hi_mark = cell + 1;
}
/* Next free cell at or after t->head (wrapping); -1 if none. Advances head. */
int32_t mem_table_find_free(mem_table *t);
/* Is cell a sink of s (sliding tables; recomputes thresholds if dirty). */
bool mem_table_is_sink(mem_table *t, int32_t cell, int32_t s);
void mem_table_update_sinks(mem_table *t, int32_t n_seq);
/* Recomputes seq_min/seq_max/seq_cells, n_used and the tight marks (T6)
 * from the cells, and marks sinks dirty. O(cap). */
void mem_table_refresh(mem_table *t);
/* Sorts v[0..n) ascending under less (heap sort: in place, iterative,
 * O(n log n) at worst; O(n) when v is already in order, as a single
 * sequence's cells placed in position order are, or is a rotation of an
 * order, as a ring's are after it wrapped: deterministic attention sorts a
 * token's visible cells per layer). Not stable. */
typedef bool (*mem_less_fn)(const void *ctx, int32_t a, int32_t b);
void mem_heap_sort(int32_t *v, int32_t n, mem_less_fn less, const void *ctx);
/* Occupies free cell with pos/stamp for sequence s (stats updated). */
void mem_table_occupy(mem_table *t, int32_t cell, int32_t pos, uint64_t stamp, int32_t s);

/* ---- columns (column.c) -------------------------------------------------- */

/* Scratch floats a column's encode/shift path needs per thread (the decoded
 * row; cos/sin tables are the caller's, n_rot floats). */
size_t mem_col_scratch_floats(const mem_col *c);
/* Encodes one head row: x (f32 [head_dim], clobbered) -> rotated, quantized row. */
void mem_col_encode(const mem_col *c, float *x, uint8_t *row);
/* Decodes one head row to f32 (dequantize, then undo the rotation). */
void mem_col_decode(const mem_col *c, const uint8_t *row, float *x);
/* Position edits: cs[n_rot] <- the rotation by delta positions (magnitude
 * 1); then per stored key row: decode, un-rotate, RoPE by cs, rotate,
 * encode. x: mem_col_scratch_floats(c) floats. No-ops for rope NONE. */
void mem_col_shift_cs(const mem_col *c, int64_t delta, float *cs);
void mem_col_shift_row(const mem_col *c, uint8_t *row, const float *cs, float *x);

/* Rotates a query head (f32 [head_dim]) into the column's storage basis:
 * x <- H D x per block (identity when rotation is off). */
void mem_col_rotate(const mem_col *c, float *x);
/* Undoes the rotation on an output head row: x <- D H x per block. */
void mem_col_unrotate(const mem_col *c, float *x);

/* ---- attention (attn.c) -------------------------------------------------- */

/* The attention shapes of a configuration (attn.c). */
mem_attn_dims mem_attn_dims_of(const keel_mem_config *cfg, const keel_mem_layer *layers);
/* Scratch bytes keel_mem_attend needs for this memory's configuration. */
size_t mem_attn_scratch_bytes(const keel_mem_config *cfg, const keel_mem_layer *layers,
                              int32_t n_threads, int32_t max_cap);

#endif /* KEEL_MEMORY_H */
