/* Composite sub-blocks: the kernels of a block's steps called one after another from C, so a model makes one call
 * from Python where it made several (each return to the interpreter after a weight stream meets cold caches). The
 * steps' own kernels in their order: the bits of the steps. */
#include "cuca.h"
#include "ops.h"
#include "qmatmul.h"

int cuca_mlp_f32(const cuca_mlp_args *a) {
    if (!a || a->M <= 0 || a->n_ff <= 0 || a->n_embd <= 0 || (a->act != 0 && a->act != 1) || a->n_threads < 0)
        return CUCA_EINVAL;
    float *outs[2] = {a->g, a->u};
    const int64_t lo[3] = {0, a->n_ff, 2 * a->n_ff};
    const cuca_out_split S = {2, outs, lo};
    int rc = cuca_matmul_packed_split_f32(a->gu, a->gu_wtype, a->gu_rows, a->n_embd, a->x, a->M, &S, a->n_threads);
    if (rc != CUCA_OK) return rc;
    const cuca_rows rs = {(ptrdiff_t)a->n_ff, 0};
    rc = cuca_act_mul_f32(a->act, a->g, rs, a->u, rs, a->g, rs, a->M, 1, a->n_ff, a->n_threads);
    if (rc != CUCA_OK) return rc;
    if (a->down_packed)
        return cuca_matmul_packed_f32(a->down, a->down_wtype, a->down_rows, a->n_ff, a->n_embd, a->g, a->M, a->out,
                                      a->n_threads);
    return cuca_matmul_gguf_f32(a->down, a->down_wtype, a->n_embd, a->n_ff, a->g, a->M, a->out, a->n_threads);
}
