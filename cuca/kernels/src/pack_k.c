/* The AVX-512 build's in-place packings of the K formats (cuca_pack_rows 1 or 2: every row keeps its place and size,
 * only the bytes of each superblock are reordered for the tile kernels of matmul_k.c). Plain C, run once at load. */
#include "packed.h"

/* the 208 code and scale bytes of one raw Q6_K superblock in k6p_tile's order (d stays at 208) */
static void k6_codes(const uint8_t *blk, uint8_t *dst) {
    uint8_t x[QKK]; /* the 6-bit codes in value order (the Q6_K layout: ql nibbles, qh bit pairs) */
    for (int n = 0; n < QKK; n++) {
        const int h = n / 128, qq = n % 128 / 32, l = n % 32;
        const uint8_t lq = blk[64 * h + 32 * (qq & 1) + l], hq = blk[128 + 32 * h + l];
        x[n] = (uint8_t)((qq < 2 ? lq & 0x0F : lq >> 4) | ((hq >> (2 * qq)) & 3) << 4);
    }
    memset(dst, 0, 192);
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 64; j++) { /* byte j = 4i + t of u[k]: value 16i + 4k + t */
            const uint8_t c = x[16 * (j / 4) + 4 * k + j % 4];
            dst[64 * (k / 2) + j] |= (uint8_t)((c & 0x0F) << (4 * (k % 2)));
            dst[128 + j] |= (uint8_t)((c >> 4) << (2 * k));
        }
    memcpy(dst + 192, blk + 192, 18);
}

int cuca_k6_pack(const void *w, int64_t n_out, int64_t n_in, void *dst) {
    if (n_out <= 0 || n_in <= 0 || n_in % QKK) return CUCA_EINVAL;
    const size_t n = (size_t)(n_out / 2 * 2) * (size_t)(n_in / QKK), all = (size_t)n_out * (size_t)(n_in / QKK);
    for (size_t i = 0; i < n; i++) k6_codes((const uint8_t *)w + i * 210, (uint8_t *)dst + i * 210);
    memcpy((uint8_t *)dst + n * 210, (const uint8_t *)w + n * 210, (all - n) * 210); /* an odd last row stays raw */
    return CUCA_OK;
}

/* one raw Q5_K superblock (176 bytes) in k5p_tile's order: d and dmin kept; the 8 scales and 8 mins (6 bits each,
 * GGUF's split layout) as fields 0-15 of a 96-bit little-endian stream; qword k of the 32 high-bit bytes = the 64
 * 5th bits of u[k], bit j for byte j; then byte j of code half h (64 bytes) = u[2h] in bits 0-3 and u[2h + 1] in
 * bits 4-7, where qword q of u[k] is raw code qword 4 (q / 2) + k, its high nibbles for odd q (the qword permute of
 * q5k_tile) */
static void k5_codes(const uint8_t *blk, uint8_t *dst) {
    const uint8_t *s = blk + 4, *qs = blk + 48;
    uint8_t f[16];
    for (int j = 0; j < 8; j++) {
        f[j] = j < 4 ? s[j] & 63 : (uint8_t)((s[j + 4] & 0x0F) | (s[j - 4] >> 6) << 4);
        f[8 + j] = j < 4 ? s[j + 4] & 63 : (uint8_t)((s[j + 4] >> 4) | (s[j] >> 6) << 4);
    }
    memcpy(dst, blk, 4);
    memset(dst + 4, 0, 172);
    for (int i = 0; i < 16; i++)
        for (int b = 0; b < 6; b++)
            if (f[i] >> b & 1) dst[4 + (6 * i + b) / 8] |= (uint8_t)(1u << ((6 * i + b) % 8));
    for (int k = 0; k < 4; k++)
        for (int q = 0; q < 8; q++)
            for (int t = 0; t < 8; t++) {
                const int j = 8 * q + t; /* byte j of u[k] */
                const uint8_t c = qs[8 * (4 * (q / 2) + k) + t], u = q & 1 ? c >> 4 : c & 0x0F;
                dst[48 + 64 * (k / 2) + j] |= (uint8_t)(u << (4 * (k % 2)));
                /* q5k_tile: the 5th bit of byte j = 8i + t of u[k] is bit 8t + i of raw qh qword k */
                if (blk[16 + 8 * k + t] >> q & 1) dst[16 + 8 * k + j / 8] |= (uint8_t)(1u << (j % 8));
            }
}

int cuca_k5_pack(const void *w, int64_t n_out, int64_t n_in, void *dst) {
    if (n_out <= 0 || n_in <= 0 || n_in % QKK) return CUCA_EINVAL;
    const size_t n = (size_t)n_out * (size_t)(n_in / QKK);
    for (size_t i = 0; i < n; i++) k5_codes((const uint8_t *)w + i * 176, (uint8_t *)dst + i * 176);
    return CUCA_OK;
}
