/*
 * dtype.c — the dtype table: names, block sizes and block bytes, with ids
 * and layouts equal to GGUF's ggml_type so files map byte for byte.
 */
#include "tensor.h"

#include <string.h>
#include <strings.h>

typedef struct dtype_info {
    const char *name;
    int64_t block;      /* elements per block */
    size_t block_bytes; /* bytes per block */
    bool can_quantize;  /* keel writes this type, not only reads it */
} dtype_info;

/* clang-format off */
static const dtype_info g_dtypes[KEEL_DTYPE_COUNT_] = {
    [KEEL_DTYPE_F32] = {"f32", 1, 4, true},
    [KEEL_DTYPE_F16] = {"f16", 1, 2, true},
    [KEEL_DTYPE_Q4_0] = {"q4_0", 32, 18, true},
    [KEEL_DTYPE_Q4_1] = {"q4_1", 32, 20, true},
    [KEEL_DTYPE_Q5_0] = {"q5_0", 32, 22, true},
    [KEEL_DTYPE_Q5_1] = {"q5_1", 32, 24, true},
    [KEEL_DTYPE_Q8_0] = {"q8_0", 32, 34, true},
    [KEEL_DTYPE_Q8_1] = {"q8_1", 32, 36, true},
    [KEEL_DTYPE_Q2_K] = {"q2_K", 256, 84, false},
    [KEEL_DTYPE_Q3_K] = {"q3_K", 256, 110, false},
    [KEEL_DTYPE_Q4_K] = {"q4_K", 256, 144, true},
    [KEEL_DTYPE_Q5_K] = {"q5_K", 256, 176, true},
    [KEEL_DTYPE_Q6_K] = {"q6_K", 256, 210, true},
    [KEEL_DTYPE_Q8_K] = {"q8_K", 256, 292, true},
    [KEEL_DTYPE_I8] = {"i8", 1, 1, false},
    [KEEL_DTYPE_I16] = {"i16", 1, 2, false},
    [KEEL_DTYPE_I32] = {"i32", 1, 4, false},
    [KEEL_DTYPE_I64] = {"i64", 1, 8, false},
    [KEEL_DTYPE_F64] = {"f64", 1, 8, false},
    [KEEL_DTYPE_BF16] = {"bf16", 1, 2, true},
};
/* clang-format on */

static const dtype_info *dtype_get(keel_dtype t)
{
    if ((unsigned)t >= KEEL_DTYPE_COUNT_ || !g_dtypes[t].name) return NULL;
    return &g_dtypes[t];
}

bool tensor_dtype_valid(keel_dtype t)
{
    return dtype_get(t) != NULL;
}

const char *keel_dtype_name(keel_dtype t)
{
    const dtype_info *d = dtype_get(t);
    return d ? d->name : NULL;
}

keel_status keel_dtype_from_name(const char *name, keel_dtype *out)
{
    if (!name || !out) return KEEL_EINVAL;
    for (int i = 0; i < KEEL_DTYPE_COUNT_; i++) {
        if (g_dtypes[i].name && strcasecmp(g_dtypes[i].name, name) == 0) {
            *out = (keel_dtype)i;
            return KEEL_OK;
        }
    }
    return KEEL_EINVAL;
}

int64_t keel_dtype_block_size(keel_dtype t)
{
    const dtype_info *d = dtype_get(t);
    return d ? d->block : 0;
}

size_t keel_dtype_block_bytes(keel_dtype t)
{
    const dtype_info *d = dtype_get(t);
    return d ? d->block_bytes : 0;
}

keel_status keel_dtype_row_bytes(keel_dtype t, int64_t n, size_t *out)
{
    const dtype_info *d = dtype_get(t);
    if (!d || n < 0 || n % d->block != 0) return KEEL_EINVAL;
    size_t blocks;
    if (!size_from_i64(n / d->block, &blocks)) return KEEL_EINVAL;
    if (!size_mul(blocks, d->block_bytes, out)) return KEEL_EOVERFLOW;
    return KEEL_OK;
}

size_t tensor_row_bytes(keel_dtype t, int64_t n)
{
    size_t out = 0;
    if (keel_dtype_row_bytes(t, n, &out) != KEEL_OK) return 0;
    return out;
}

bool keel_dtype_can_quantize(keel_dtype t)
{
    const dtype_info *d = dtype_get(t);
    return d ? d->can_quantize : false;
}
