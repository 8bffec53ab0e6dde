/*
 * column.c — the write, read and position-edit paths of one column.
 *
 * A stored head row is encode(x) = quantize(H D x) per rotation block when
 * rotation is on, quantize(x) otherwise (H the normalized Walsh-Hadamard
 * matrix, D the seeded sign diagonal). decode() inverts it up to the codec's
 * rounding. Because H D is orthonormal, q . k = (H D q) . (H D k): attention
 * rotates the query instead of decoding keys, and accumulates V in the
 * rotated basis, undoing the rotation once on the output (D H).
 *
 * Position edits on keys: decode, undo the rotation, rotate by delta
 * positions with tensor_rope_delta's angles (magnitude 1), redo the rotation,
 * encode. Only the edited cells are touched; scratch is O(head_dim).
 */
#include "memory.h"

#include <math.h>
#include <string.h>

size_t mem_col_scratch_floats(const mem_col *c)
{
    return (size_t)c->head_dim;
}

void mem_col_rotate(const mem_col *c, float *x)
{
    if (!c->rot.enabled) return;
    int32_t b = c->rot.block;
    for (int32_t o = 0; o < c->head_dim; o += b) tensor_wht_forward(x + o, b, c->signs);
}

void mem_col_unrotate(const mem_col *c, float *x)
{
    if (!c->rot.enabled) return;
    int32_t b = c->rot.block;
    for (int32_t o = 0; o < c->head_dim; o += b) tensor_wht_inverse(x + o, b, c->signs);
}

void mem_col_encode(const mem_col *c, float *x, uint8_t *row)
{
    mem_col_rotate(c, x);
    tensor_quantize_row_unchecked(c->dtype, x, row, c->head_dim); /* validated at open */
}

void mem_col_decode(const mem_col *c, const uint8_t *row, float *x)
{
    tensor_dequantize_row_unchecked(c->dtype, row, x, c->head_dim); /* validated at open */
    mem_col_unrotate(c, x);
}

void mem_col_shift_cs(const mem_col *c, int64_t delta, float *cs)
{
    if (c->rope.type == KEEL_ROPE_NONE || !c->rope_rates) return;
    tensor_rope_cos_sin(c->rope_rates, c->rope.n_rot, (double)delta, 1.0f, cs);
}

void mem_col_shift_row(const mem_col *c, uint8_t *row, const float *cs, float *x)
{
    if (c->rope.type == KEEL_ROPE_NONE || !c->rope_rates) return;
    mem_col_decode(c, row, x);
    tensor_rope_apply(c->rope.type, c->rope.n_rot, cs, x, 1, c->head_dim);
    mem_col_encode(c, x, row);
}
