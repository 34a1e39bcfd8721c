/* Attention and small-op kernels (pure C, no Python). Strides are in floats; every row's last dimension is
 * contiguous. Each returns CUCA_OK or a negative CUCA_E* code. n_threads <= 0 means every CPU this process may use (pool.h).
 *
 * Batch invariance: the float operations that produce one output row (or one (row, head) of attention) depend
 * only on that row's inputs and its own position, never on how many rows are in the call, where the row sits,
 * or how many threads run. */
#ifndef CUCA_OPS_H
#define CUCA_OPS_H
#include <stddef.h>
#include <stdint.h>

/* Causal (optionally sliding-window) grouped-query attention over a KV cache of floats, or of IEEE halves
 * when kv16 is set (both caches the same type; strides count elements).
 * q: (M, n_head, hd_k) at q + i*q_s0 + h*q_s1; k: (n_kv_head, n_ctx, hd_k) at k + g*k_s0 + j*hd_k;
 * v: (n_kv_head, n_ctx, hd_v) at v + g*v_s0 + j*hd_v; out: (M, n_head, hd_v) at out + i*o_s0 + h*o_s1.
 * Row i sees keys [max(0, q_pos[i] - window + 1), min(q_pos[i] + 1, n_kv)) (window 0: from 0). */
typedef struct {
    const float *q;
    ptrdiff_t q_s0, q_s1;
    const void *k, *v;
    ptrdiff_t k_s0, v_s0;
    int kv16;
    const int32_t *q_pos;
    int M, n_head, n_kv_head, hd_k, hd_v, n_ctx, n_kv, window;
    float scale, softcap; /* scores: softcap * tanh(scale * q.k / softcap) (softcap 0: scale * q.k) */
    float *out;
    ptrdiff_t o_s0, o_s1;
    int n_threads;
} cuca_attention_args;

int cuca_attention(const cuca_attention_args *a);

/* Rows are addressed as base + a*s0 + b*s1 for a < n0, b < n1, each n floats long. */
typedef struct {
    ptrdiff_t s0, s1;
} cuca_rows;

/* block.c: a layer's attention in one call, the kernels of its steps in their order (their bits): q (M, H, hd)
 * normed (q_norm, weight q_w or none) and roped in place; where k is given (the layer owns K/V), v (may be k)
 * normed without weight (v_norm) or copied, and k normed (k_norm, weight k_w or none) or copied, into the float32
 * cache rows pos[0] .. pos[0]+M-1 of each kv head (pos one ascending run), k roped there; then attention of q over
 * the first n_kv cache positions into out (M, H, hd). k / v: (M, Hkv, hd); caches (Hkv, n_ctx, hd). */
typedef struct {
    float *q;
    cuca_rows qs;
    const float *k, *v; /* NULL k: the layer reads K/V another layer wrote */
    cuca_rows ks, vs;
    const float *q_w, *k_w;
    int q_norm, k_norm, v_norm;
    float eps;
    const int32_t *pos;
    int n_rot, neox;
    float freq_base, freq_scale;
    const float *freq_factors;
    float *k_cache, *v_cache;
    int M, H, Hkv, hd, n_ctx, n_kv, window;
    float scale, softcap;
    float *out;
    cuca_rows os;
    int n_threads;
} cuca_attn_core_args;
int cuca_attn_core_f32(const cuca_attn_core_args *a);

/* out = x / sqrt(mean(x^2) + eps) * w (w may be NULL); out may be x. */
int cuca_rms_norm_f32(const float *x, cuca_rows xs, const float *w, float eps, float *out, cuca_rows os,
                      int64_t n0, int64_t n1, int64_t n, int n_threads);
/* The residual step of a block: x += rms_norm(y) * w_y where norm_y (else x += y), then x *= scale (1: left
 * out), then out = rms_norm(x) * w_out where norm_out (out is scratch otherwise). w_y / w_out may be NULL (no
 * weight). out must not overlap x or y; y must not overlap x. */
typedef struct {
    float *x;
    cuca_rows xs;
    const float *y;
    cuca_rows ys;
    const float *w_y, *w_out;
    int norm_y, norm_out;
    float eps, scale;
    float *out;
    cuca_rows os;
    int64_t n0, n1, n;
    int n_threads;
} cuca_residual_args;
int cuca_residual_norm_f32(const cuca_residual_args *a);
/* In place RoPE on x (M rows, n_head heads of hd floats), rotating the first n_rot dims of each head. */
int cuca_rope_f32(float *x, cuca_rows xs, const int32_t *pos, int64_t M, int64_t n_head, int64_t hd, int n_rot,
                  float freq_base, int neox, const float *freq_factors, float freq_scale, int n_threads);
/* x = cap * tanh(x / cap) in place (cap > 0, finite), rows as for act_mul */
int cuca_softcap_f32(float *x, cuca_rows xs, int64_t n0, int64_t n1, int64_t n, float cap, int n_threads);
/* out = act(g) * u with act = silu (kind 0) or gelu_tanh (kind 1) */
int cuca_act_mul_f32(int kind, const float *g, cuca_rows gs, const float *u, cuca_rows us, float *out,
                     cuca_rows os, int64_t n0, int64_t n1, int64_t n, int n_threads);

/* Gated DeltaNet recurrence, token by token (deltanet.c). q, k: (T, H, dk) raw (L2-normalised inside with eps,
 * q then scaled); v, out: (T, H, dv); g (log-decay), beta: (T, H); state: (H, dk, dv) contiguous, updated in place;
 * snaps: NULL or (>= T-1, H, dk, dv) contiguous, receiving the state after each token but the last. Strides count
 * floats: q + t*q_s0 + h*q_s1, likewise k, v, out; g + t*g_s0 + h, beta + t*b_s0 + h. */
typedef struct {
    const float *q, *k, *v, *g, *beta;
    ptrdiff_t q_s0, q_s1, k_s0, k_s1, v_s0, v_s1, g_s0, b_s0;
    float *state, *snaps, *out;
    ptrdiff_t o_s0, o_s1;
    int T, H, dk, dv;
    float eps, scale;
    int n_threads;
    /* deferred commit (pend NULL: none). A token's record is its normalised k, d = beta (v - kv) and decay exp(g):
     * dk + dv + 1 floats per head, (tokens, H, dk + dv + 1) contiguous. The P records in pend are applied to the
     * state first (S = exp(g) S + k d^T, the same float operations as their own pass) and stored: committed. The
     * new tokens' records go to rec (NULL: none); with defer, the state after them is not stored (they stay
     * pending: a rollback is dropping records). snaps must be NULL then. */
    const float *pend;
    float *rec;
    int P, defer;
} cuca_deltanet_args;

int cuca_deltanet_f32(const cuca_deltanet_args *a);

/* The hybrid layers' element-wise ops (hybrid.c). Depthwise causal conv: raw (M+K-1, C) = [window (K-1, C) | x
 * (M, C)], out[i] = sum_j raw[i+j] * taps[j] over j = 0..K-1 (float products, summed in tap order), then
 * window = raw[M:] (the next window). Row strides count floats; rows are contiguous; the arrays are disjoint. */
typedef struct {
    float *window;
    const float *x, *taps;
    float *raw, *out;
    ptrdiff_t w_s0, x_s0, t_s0, r_s0, o_s0;
    int64_t M, C;
    int K, n_threads;
} cuca_causal_conv_args;

int cuca_causal_conv_f32(const cuca_causal_conv_args *a);
/* out = 1 / (1 + exp(-x)) per element, in double; (M, n) rows, out may be x */
int cuca_gate_sigmoid_f32(const float *x, ptrdiff_t x_s0, float *out, ptrdiff_t o_s0, int64_t M, int64_t n,
                          int n_threads);
/* DeltaNet log-decay out[r, h] = a[h] * softplus(alpha[r, h] + dt[h]), in double; out may be alpha */
int cuca_gate_decay_f32(const float *alpha, ptrdiff_t x_s0, const float *a, const float *dt, float *out,
                        ptrdiff_t o_s0, int64_t M, int64_t n, int n_threads);

/* block.c: a Gated DeltaNet layer between its input projections and its output projection, in one call, the
 * kernels of its steps in their order (their bits): beta = sigmoid(yb), g = decay(ya, a, dt); x = the causal conv
 * of mixed after window (raw, window as cuca_causal_conv_args), then silu(x) as act_mul's silu times ones; the
 * recurrence (one sequence, deferred records as cuca_deltanet_args) over q = x[:, :H dk], k = x[:, H dk : 2 H dk],
 * v = x[:, 2 H dk:] into o (M, H, dv); y = silu(z) * (rms_norm(o) * norm_w), per head. Rows contiguous. */
typedef struct {
    const float *mixed, *yb, *ya, *z; /* (M, C = 2 H dk + H dv), (M, H), (M, H), (M, H dv) */
    const float *a, *dt;              /* (H,): the decay's */
    float *window;                    /* (K - 1, C): the conv's last rows, moved on in place */
    const float *taps, *ones;         /* (K, C); (M, C) of 1.0f */
    float *raw;                       /* (M + K - 1, C): [window | mixed] */
    float *state;                     /* (H, dk, dv) */
    const float *pend;                /* P pending records (NULL: none) */
    float *rec;                       /* the M new records (NULL: none) */
    int P, defer;
    const float *norm_w;              /* (dv,) */
    float norm_eps, l2_eps, scale;
    float *y;                         /* (M, H dv) */
    int M, H, dk, dv, K, n_threads;
} cuca_gdn_core_args;
int cuca_gdn_core_f32(const cuca_gdn_core_args *a);
#endif
