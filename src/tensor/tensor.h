/*
 * tensor.h — private interface of src/tensor: dtypes and quant formats,
 * kernels (dot, matvec, matmul, rope, wht, norms, softmax), SIMD dispatch.
 * Depends only on src/base.
 */
#ifndef KEEL_TENSOR_H
#define KEEL_TENSOR_H

#include "../base/base.h"

/* True for an id in the dtype table. */
bool tensor_dtype_valid(keel_dtype t);
/* Row bytes of n elements, 0 if invalid (n not a block multiple, unknown). */
size_t tensor_row_bytes(keel_dtype t, int64_t n);

#endif /* KEEL_TENSOR_H */
