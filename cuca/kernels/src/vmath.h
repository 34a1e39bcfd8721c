/* A small SIMD layer shared by the attention and small-op kernels.
 *
 * One vector type `vf` of VL floats with the handful of operations the kernels need, compiled for the widest
 * ISA this build targets: AVX-512 (16 lanes), AVX2+FMA (8 lanes) or portable C (8 lanes held in a struct,
 * left to the compiler to vectorise). Every operation is lane-wise, so the result in one lane never depends on
 * the other lanes or on where a value sits in a vector; reductions use one fixed tree. That is what makes the
 * kernels batch invariant. Results may differ between builds for different ISAs, never within one build.
 */
#ifndef CUCA_VMATH_H
#define CUCA_VMATH_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#define CUCA_INLINE static inline __attribute__((always_inline))

/* expf polynomial (Cephes-style, about 1 ulp on the reduced range) */
#define VM_LOG2E 1.44269504088896341f
/* exp(x) is exactly 0 for x below this (every ISA): exp(-87.33) = 1.18e-38 is still a normal float */
#define VM_EXP_LO -87.33f
#define VM_LN2_HI 0.693359375f
#define VM_LN2_LO (-2.12194440e-4f)
#define VM_EP0 1.9875691500e-4f
#define VM_EP1 1.3981999507e-3f
#define VM_EP2 8.3334519073e-3f
#define VM_EP3 4.1665795894e-2f
#define VM_EP4 1.6666665459e-1f
#define VM_EP5 5.0000001201e-1f

/* tanh(x)/x ~ polynomial in x^2 on [0, 0.625] (relative error ~1e-7 after float evaluation) */
#define VM_TANH_CUT 0.625f
#define VM_TP1 (-0.3333325982093811f)
#define VM_TP2 0.13331127166748047f
#define VM_TP3 (-0.05372106656432152f)
#define VM_TP4 0.02059098333120346f
#define VM_TP5 (-0.0056599839590489864f)

/* IEEE half -> float, exact (normals, subnormals, zeros, infinities, NaNs) */
static inline float vm_h2f(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
    if (e == 0x1f) {
        bits = sign | 0x7f800000u | (m << 13);
    } else if (e) {
        bits = sign | ((e + 112u) << 23) | (m << 13);
    } else if (m) { /* subnormal: normalise */
        e = 113;
        while (!(m & 0x400u)) {
            m <<= 1;
            --e;
        }
        bits = sign | (e << 23) | ((m & 0x3ffu) << 13);
    } else {
        bits = sign;
    }
    union {
        uint32_t u;
        float f;
    } c = {bits};
    return c.f;
}

#if defined(__AVX512F__)
/* ------------------------------------------------------------------ AVX-512 */
#define VL 16
typedef __m512 vf;
CUCA_INLINE vf v_zero(void) { return _mm512_setzero_ps(); }
CUCA_INLINE vf v_set1(float a) { return _mm512_set1_ps(a); }
CUCA_INLINE vf v_load(const float *p) { return _mm512_loadu_ps(p); }
CUCA_INLINE void v_store(float *p, vf a) { _mm512_storeu_ps(p, a); }
/* VL halves -> floats */
CUCA_INLINE vf v_load_h(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
/* first n lanes (0 <= n < VL), the others zero / untouched */
CUCA_INLINE vf v_load_n(const float *p, int n) { return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p); }
CUCA_INLINE void v_store_n(float *p, vf a, int n) { _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1u), a); }
CUCA_INLINE vf v_add(vf a, vf b) { return _mm512_add_ps(a, b); }
CUCA_INLINE vf v_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
CUCA_INLINE vf v_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
CUCA_INLINE vf v_div(vf a, vf b) { return _mm512_div_ps(a, b); }
/* a*b + c, fused */
CUCA_INLINE vf v_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
/* max/min: when one operand is NaN the second one is returned */
CUCA_INLINE vf v_max(vf a, vf b) { return _mm512_max_ps(a, b); }
CUCA_INLINE vf v_min(vf a, vf b) { return _mm512_min_ps(a, b); }
CUCA_INLINE float v_first(vf a) { return _mm512_cvtss_f32(a); }
CUCA_INLINE float v_hmax(vf a) {
    __m256 h = _mm256_max_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    __m128 q = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_max_ps(q, _mm_movehl_ps(q, q));
    q = _mm_max_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
CUCA_INLINE float v_hsum(vf a) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
/* out lane j = horizontal sum of a[j], every lane summed by the same tree */
CUCA_INLINE vf v_reduce_t(const vf *a) {
    vf in[16], w[8], z[4], e[2];
    for (int t = 0; t < 4; ++t)
        for (int j = 0; j < 4; ++j) in[4 * t + j] = a[4 * j + t];
    for (int k = 0; k < 8; ++k)
        w[k] = _mm512_add_ps(_mm512_shuffle_f32x4(in[2 * k], in[2 * k + 1], 0x44),
                             _mm512_shuffle_f32x4(in[2 * k], in[2 * k + 1], 0xEE));
    for (int k = 0; k < 4; ++k)
        z[k] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * k], w[2 * k + 1], 0x88),
                             _mm512_shuffle_f32x4(w[2 * k], w[2 * k + 1], 0xDD));
    for (int k = 0; k < 2; ++k)
        e[k] = _mm512_add_ps(_mm512_shuffle_ps(z[2 * k], z[2 * k + 1], 0x44),
                             _mm512_shuffle_ps(z[2 * k], z[2 * k + 1], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_ps(e[0], e[1], 0x88), _mm512_shuffle_ps(e[0], e[1], 0xDD));
}
CUCA_INLINE vf v_exp(vf x) {
    /* clamp (NaN passes through); below VM_EXP_LO the result is exactly 0, never subnormal (a subnormal
     * probability makes every later multiply take a microcode assist: attention at hd 512 ran 5-6x slower) */
    const vf x0 = x;
    x = _mm512_min_ps(_mm512_set1_ps(88.7228394f), _mm512_max_ps(_mm512_set1_ps(VM_EXP_LO), x));
    vf n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(VM_LOG2E)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf r = _mm512_fnmadd_ps(n, _mm512_set1_ps(VM_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(VM_LN2_LO), r);
    vf p = _mm512_set1_ps(VM_EP0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VM_EP1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VM_EP2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VM_EP3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VM_EP4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VM_EP5));
    vf y = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
    y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
    const __mmask16 keep = _mm512_cmp_ps_mask(x0, _mm512_set1_ps(VM_EXP_LO), _CMP_NLT_UQ);
    return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(y, n));
}
CUCA_INLINE vf v_abs(vf a) { return _mm512_abs_ps(a); }
/* sign of s applied to non-negative magnitude m */
CUCA_INLINE vf v_copysign(vf m, vf s) {
    return _mm512_castsi512_ps(_mm512_or_si512(
        _mm512_castps_si512(m), _mm512_and_si512(_mm512_castps_si512(s), _mm512_set1_epi32((int)0x80000000u))));
}
/* lane-wise (a < c) ? x : y */
CUCA_INLINE vf v_select_lt(vf a, vf c, vf x, vf y) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, c, _CMP_LT_OQ), y, x);
}

#elif defined(__AVX2__) && defined(__FMA__)
/* ------------------------------------------------------------------ AVX2 + FMA */
#define VL 8
typedef __m256 vf;
static inline __m256i vm_mask8(int n) {
    static const int32_t m[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256((const __m256i *)(m + 8 - n));
}
CUCA_INLINE vf v_zero(void) { return _mm256_setzero_ps(); }
CUCA_INLINE vf v_set1(float a) { return _mm256_set1_ps(a); }
CUCA_INLINE vf v_load(const float *p) { return _mm256_loadu_ps(p); }
CUCA_INLINE void v_store(float *p, vf a) { _mm256_storeu_ps(p, a); }
#if defined(__F16C__)
CUCA_INLINE vf v_load_h(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
#else
CUCA_INLINE vf v_load_h(const uint16_t *p) {
    float t[8];
    for (int i = 0; i < 8; ++i) t[i] = vm_h2f(p[i]);
    return _mm256_loadu_ps(t);
}
#endif
CUCA_INLINE vf v_load_n(const float *p, int n) { return _mm256_maskload_ps(p, vm_mask8(n)); }
CUCA_INLINE void v_store_n(float *p, vf a, int n) { _mm256_maskstore_ps(p, vm_mask8(n), a); }
CUCA_INLINE vf v_add(vf a, vf b) { return _mm256_add_ps(a, b); }
CUCA_INLINE vf v_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
CUCA_INLINE vf v_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
CUCA_INLINE vf v_div(vf a, vf b) { return _mm256_div_ps(a, b); }
CUCA_INLINE vf v_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
CUCA_INLINE vf v_max(vf a, vf b) { return _mm256_max_ps(a, b); }
CUCA_INLINE vf v_min(vf a, vf b) { return _mm256_min_ps(a, b); }
CUCA_INLINE float v_first(vf a) { return _mm256_cvtss_f32(a); }
CUCA_INLINE float v_hmax(vf a) {
    __m128 q = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    q = _mm_max_ps(q, _mm_movehl_ps(q, q));
    q = _mm_max_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
CUCA_INLINE float v_hsum(vf a) {
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
CUCA_INLINE vf v_reduce_t(const vf *a) {
    vf in[8], w[4], e[2];
    for (int t = 0; t < 4; ++t)
        for (int j = 0; j < 2; ++j) in[2 * t + j] = a[4 * j + t];
    for (int k = 0; k < 4; ++k)
        w[k] = _mm256_add_ps(_mm256_permute2f128_ps(in[2 * k], in[2 * k + 1], 0x20),
                             _mm256_permute2f128_ps(in[2 * k], in[2 * k + 1], 0x31));
    for (int k = 0; k < 2; ++k)
        e[k] = _mm256_add_ps(_mm256_shuffle_ps(w[2 * k], w[2 * k + 1], 0x44),
                             _mm256_shuffle_ps(w[2 * k], w[2 * k + 1], 0xEE));
    return _mm256_add_ps(_mm256_shuffle_ps(e[0], e[1], 0x88), _mm256_shuffle_ps(e[0], e[1], 0xDD));
}
CUCA_INLINE vf v_exp(vf x0) {
    const vf lo = _mm256_set1_ps(VM_EXP_LO), hi = _mm256_set1_ps(88.3762626647949f);
    vf x = _mm256_min_ps(hi, _mm256_max_ps(lo, x0));
    vf n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(VM_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf r = _mm256_fnmadd_ps(n, _mm256_set1_ps(VM_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(VM_LN2_LO), r);
    vf p = _mm256_set1_ps(VM_EP0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VM_EP1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VM_EP2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VM_EP3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VM_EP4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VM_EP5));
    vf y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x0, lo, _CMP_LT_OQ));
    return _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x0, hi, _CMP_GT_OQ));
}
CUCA_INLINE vf v_abs(vf a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
CUCA_INLINE vf v_copysign(vf m, vf s) { return _mm256_or_ps(m, _mm256_and_ps(s, _mm256_set1_ps(-0.0f))); }
CUCA_INLINE vf v_select_lt(vf a, vf c, vf x, vf y) { return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, c, _CMP_LT_OQ)); }

#else
/* ------------------------------------------------------------------ portable C: 8 lanes in a struct */
#define VL 8
typedef struct { float f[8]; } vf;
#define VM_LOOP(expr)            \
    vf r_;                       \
    for (int i = 0; i < 8; ++i) { \
        r_.f[i] = (expr);        \
    }                            \
    return r_
CUCA_INLINE vf v_zero(void) { VM_LOOP(0.0f); }
CUCA_INLINE vf v_set1(float a) { VM_LOOP(a); }
CUCA_INLINE vf v_load(const float *p) { VM_LOOP(p[i]); }
CUCA_INLINE void v_store(float *p, vf a) {
    for (int i = 0; i < 8; ++i) p[i] = a.f[i];
}
CUCA_INLINE vf v_load_h(const uint16_t *p) { VM_LOOP(vm_h2f(p[i])); }
CUCA_INLINE vf v_load_n(const float *p, int n) { VM_LOOP(i < n ? p[i] : 0.0f); }
CUCA_INLINE void v_store_n(float *p, vf a, int n) {
    for (int i = 0; i < n; ++i) p[i] = a.f[i];
}
CUCA_INLINE vf v_add(vf a, vf b) { VM_LOOP(a.f[i] + b.f[i]); }
CUCA_INLINE vf v_sub(vf a, vf b) { VM_LOOP(a.f[i] - b.f[i]); }
CUCA_INLINE vf v_mul(vf a, vf b) { VM_LOOP(a.f[i] * b.f[i]); }
CUCA_INLINE vf v_div(vf a, vf b) { VM_LOOP(a.f[i] / b.f[i]); }
/* not fused here (no FMA assumed): two roundings, the same everywhere in this build */
CUCA_INLINE vf v_fma(vf a, vf b, vf c) { VM_LOOP(a.f[i] * b.f[i] + c.f[i]); }
CUCA_INLINE vf v_max(vf a, vf b) { VM_LOOP(a.f[i] > b.f[i] ? a.f[i] : b.f[i]); }
CUCA_INLINE vf v_min(vf a, vf b) { VM_LOOP(a.f[i] < b.f[i] ? a.f[i] : b.f[i]); }
CUCA_INLINE float v_first(vf a) { return a.f[0]; }
CUCA_INLINE float v_hmax(vf a) {
    float m = a.f[0];
    for (int i = 1; i < 8; ++i) m = a.f[i] > m ? a.f[i] : m;
    return m;
}
CUCA_INLINE float v_hsum(vf a) {
    return ((a.f[0] + a.f[4]) + (a.f[2] + a.f[6])) + ((a.f[1] + a.f[5]) + (a.f[3] + a.f[7]));
}
CUCA_INLINE vf v_reduce_t(const vf *a) { VM_LOOP(v_hsum(a[i])); }
CUCA_INLINE vf v_exp(vf x) { VM_LOOP(x.f[i] < VM_EXP_LO ? 0.0f : expf(x.f[i])); }
CUCA_INLINE vf v_abs(vf a) { VM_LOOP(fabsf(a.f[i])); }
CUCA_INLINE vf v_copysign(vf m, vf s) { VM_LOOP(copysignf(m.f[i], s.f[i])); }
CUCA_INLINE vf v_select_lt(vf a, vf c, vf x, vf y) { VM_LOOP(a.f[i] < c.f[i] ? x.f[i] : y.f[i]); }
#undef VM_LOOP
#endif

/* first n halves (0 <= n < VL) as floats, the other lanes zero */
CUCA_INLINE vf v_load_h_n(const uint16_t *p, int n) {
    uint16_t t[VL] = {0};
    for (int i = 0; i < n; ++i) t[i] = p[i];
    return v_load_h(t);
}

/* tanh: odd polynomial near 0, 1 - 2/(exp(2|x|)+1) elsewhere; both computed on every lane, then selected */
CUCA_INLINE vf v_tanh(vf x) {
    vf ax = v_abs(x);
    vf z = v_mul(ax, ax);
    vf p = v_set1(VM_TP5);
    p = v_fma(p, z, v_set1(VM_TP4));
    p = v_fma(p, z, v_set1(VM_TP3));
    p = v_fma(p, z, v_set1(VM_TP2));
    p = v_fma(p, z, v_set1(VM_TP1));
    p = v_fma(p, z, v_set1(1.0f));
    vf small = v_mul(ax, p);
    vf e = v_exp(v_add(ax, ax));
    vf big = v_sub(v_set1(1.0f), v_div(v_set1(2.0f), v_add(e, v_set1(1.0f))));
    return v_copysign(v_select_lt(ax, v_set1(VM_TANH_CUT), small, big), x);
}

/* scalar exp through the same code as the vector one (so it agrees with it bit for bit) */
CUCA_INLINE float s_exp(float x) { return v_first(v_exp(v_set1(x))); }

#endif
