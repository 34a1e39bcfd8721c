/* Composite sub-blocks: the kernels of a block's steps called one after another from C, so a model makes one call
 * from Python where it made several (each return to the interpreter after a weight stream meets cold caches). The
 * steps' own kernels in their order: the bits of the steps. */
#include <stdlib.h>
#include <string.h>

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

/* n0 x n1 rows of n floats from src to dst (strides in floats) */
static void ac_copy(const float *src, cuca_rows ss, float *dst, cuca_rows ds, int n0, int n1, int n) {
    for (int i = 0; i < n0; i++)
        for (int h = 0; h < n1; h++)
            memcpy(dst + i * ds.s0 + h * ds.s1, src + i * ss.s0 + h * ss.s1, sizeof(float) * (size_t)n);
}

int cuca_attn_core_f32(const cuca_attn_core_args *a) {
    if (!a || a->M <= 0 || a->H <= 0 || a->Hkv <= 0 || a->hd <= 0 || a->n_ctx <= 0 || a->pos[0] < 0 ||
        a->pos[0] + a->M > a->n_ctx)
        return CUCA_EINVAL;
    const int M = a->M, nt = a->n_threads;
    int rc;
    if (a->q_norm && (rc = cuca_rms_norm_f32(a->q, a->qs, a->q_w, a->eps, a->q, a->qs, M, a->H, a->hd, nt)) != CUCA_OK)
        return rc;
    rc = cuca_rope_f32(a->q, a->qs, a->pos, M, a->H, a->hd, a->n_rot, a->freq_base, a->neox, a->freq_factors,
                       a->freq_scale, nt);
    if (rc != CUCA_OK) return rc;
    if (a->k) { /* k and v are only read (v may be k's own projection): the cache rows take the results */
        const cuca_rows cs = {a->hd, (ptrdiff_t)a->n_ctx * a->hd};
        float *kd = a->k_cache + (ptrdiff_t)a->pos[0] * a->hd, *vd = a->v_cache + (ptrdiff_t)a->pos[0] * a->hd;
        if (a->v_norm) {
            if ((rc = cuca_rms_norm_f32(a->v, a->vs, NULL, a->eps, vd, cs, M, a->Hkv, a->hd, nt)) != CUCA_OK) return rc;
        } else {
            ac_copy(a->v, a->vs, vd, cs, M, a->Hkv, a->hd);
        }
        if (a->k_norm) {
            if ((rc = cuca_rms_norm_f32(a->k, a->ks, a->k_w, a->eps, kd, cs, M, a->Hkv, a->hd, nt)) != CUCA_OK) return rc;
        } else {
            ac_copy(a->k, a->ks, kd, cs, M, a->Hkv, a->hd);
        }
        rc = cuca_rope_f32(kd, cs, a->pos, M, a->Hkv, a->hd, a->n_rot, a->freq_base, a->neox, a->freq_factors,
                           a->freq_scale, nt);
        if (rc != CUCA_OK) return rc;
    }
    const cuca_attention_args A = {
        .q = a->q, .q_s0 = a->qs.s0, .q_s1 = a->qs.s1, .k = a->k_cache, .v = a->v_cache,
        .k_s0 = (ptrdiff_t)a->n_ctx * a->hd, .v_s0 = (ptrdiff_t)a->n_ctx * a->hd, .kv16 = 0, .q_pos = a->pos, .M = M,
        .n_head = a->H, .n_kv_head = a->Hkv, .hd_k = a->hd, .hd_v = a->hd, .n_ctx = a->n_ctx, .n_kv = a->n_kv,
        .window = a->window, .scale = a->scale, .softcap = a->softcap, .out = a->out, .o_s0 = a->os.s0,
        .o_s1 = a->os.s1, .n_threads = nt};
    return cuca_attention(&A);
}

int cuca_gdn_core_f32(const cuca_gdn_core_args *a) {
    if (!a || a->M <= 0 || a->H <= 0 || a->dk <= 0 || a->dv <= 0 || a->K < 1 || a->P < 0 || (a->P > 0 && !a->pend))
        return CUCA_EINVAL;
    const int M = a->M, H = a->H, dk = a->dk, dv = a->dv, nt = a->n_threads;
    const ptrdiff_t C = 2 * (ptrdiff_t)H * dk + (ptrdiff_t)H * dv, HV = (ptrdiff_t)H * dv;
    /* scratch: beta, g (M, H), x (M, C), o (M, H, dv) */
    float *beta = (float *)malloc(sizeof(float) * (size_t)M * (size_t)(2 * H + C + HV));
    if (!beta) return CUCA_ENOMEM;
    float *g = beta + (size_t)M * H, *x = g + (size_t)M * H, *o = x + (size_t)M * C;
    int rc = cuca_gate_sigmoid_f32(a->yb, H, beta, H, M, H, nt);
    if (rc == CUCA_OK) rc = cuca_gate_decay_f32(a->ya, H, a->a, a->dt, g, H, M, H, nt);
    if (rc == CUCA_OK) {
        const cuca_causal_conv_args cv = {a->window, a->mixed, a->taps, a->raw, x, C, C, C, C, C, M, C, a->K, nt};
        rc = cuca_causal_conv_f32(&cv);
    }
    const cuca_rows xr = {C, 0}, hr = {HV, dv};
    if (rc == CUCA_OK) rc = cuca_act_mul_f32(0, x, xr, a->ones, xr, x, xr, M, 1, C, nt);
    if (rc == CUCA_OK) {
        const cuca_deltanet_args D = {
            .q = x, .k = x + (ptrdiff_t)H * dk, .v = x + 2 * (ptrdiff_t)H * dk, .g = g, .beta = beta, .q_s0 = C,
            .q_s1 = dk, .k_s0 = C, .k_s1 = dk, .v_s0 = C, .v_s1 = dv, .g_s0 = H, .b_s0 = H, .state = a->state,
            .snaps = NULL, .out = o, .o_s0 = HV, .o_s1 = dv, .T = M, .H = H, .dk = dk, .dv = dv, .eps = a->l2_eps,
            .scale = a->scale, .n_threads = nt, .pend = a->pend, .rec = a->rec, .P = a->P, .defer = a->defer};
        rc = cuca_deltanet_f32(&D);
    }
    if (rc == CUCA_OK) rc = cuca_rms_norm_f32(o, hr, a->norm_w, a->norm_eps, a->y, hr, M, H, dv, nt);
    if (rc == CUCA_OK) rc = cuca_act_mul_f32(0, a->z, hr, a->y, hr, a->y, hr, M, H, dv, nt);
    free(beta);
    return rc;
}
