/* Packing on the thread pool. The packed layout keeps each group of R rows apart (the group's bytes sit where
 * its raw rows were; a tail of fewer than R rows stays raw), so cuca_pack_gguf on a range of whole groups gives
 * exactly that range's bytes of the whole tensor's packing: threads take ranges, the result never depends on
 * how many there are. */
#include "cuca.h"
#include "pool.h"
#include "qmatmul.h"

#define PACK_GROUPS 16           /* groups of R rows per item */
#define PACK_PAR_MIN (1 << 20) /* bytes below which one thread packs */

typedef struct {
    const uint8_t *w;
    uint8_t *dst;
    int wtype, rc;
    int64_t n_out, n_in, rows; /* rows per item, a multiple of R */
    size_t row_bytes;
} pack_job;

static void pack_item(void *ctx, int64_t i, int tid) {
    pack_job *J = (pack_job *)ctx;
    (void)tid;
    const int64_t r0 = i * J->rows, n = J->n_out - r0 < J->rows ? J->n_out - r0 : J->rows;
    const size_t off = (size_t)r0 * J->row_bytes;
    const int rc = cuca_pack_gguf(J->w + off, J->wtype, n, J->n_in, J->dst + off);
    if (rc != CUCA_OK) __atomic_store_n(&J->rc, rc, __ATOMIC_RELAXED);
}

int cuca_pack_gguf_threads(const void *w, int wtype, int64_t n_out, int64_t n_in, size_t nbytes, void *dst,
                           int n_threads) {
    const int R = cuca_pack_rows(wtype);
    if (R == 0) return CUCA_EUNSUPPORTED;
    if (n_out <= 0 || n_in <= 0 || nbytes % (size_t)n_out) return CUCA_EINVAL;
    pack_job J = {(const uint8_t *)w, (uint8_t *)dst, wtype, CUCA_OK, n_out, n_in, (int64_t)R * PACK_GROUPS,
                  nbytes / (size_t)n_out};
    const int64_t items = (n_out + J.rows - 1) / J.rows;
    cuca_pool_run(nbytes < PACK_PAR_MIN ? 1 : n_threads, items, 1, pack_item, &J);
    return J.rc;
}
