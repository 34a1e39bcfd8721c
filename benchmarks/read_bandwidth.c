/* Read bandwidth of this machine now: the ceiling that decode (bound by weight reads) is measured against.
 * Portable C (no intrinsics): the compiler vectorises the sum for whatever -march it is given.
 *   cc -O3 -march=native -fopenmp benchmarks/read_bandwidth.c -o /tmp/read_bandwidth && /tmp/read_bandwidth [MiB] [T..]
 * Prints one line per thread count: "threads T: G GB/s" (best of 5 passes over the array, bytes read / time). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    const size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 1024, n = mib * ((size_t)1 << 20) / sizeof(float);
    int threads[8] = {1, 2}, nt = 2;
    if (argc > 2) {
        nt = 0;
        for (int i = 2; i < argc && nt < 8; i++) threads[nt++] = atoi(argv[i]);
    }
    float *a = aligned_alloc(64, n * sizeof(float));
    if (a == NULL || n == 0) {
        fprintf(stderr, "read_bandwidth: cannot allocate %zu MiB\n", mib);
        return 1;
    }
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) a[i] = (float)(i & 7);
    for (int t = 0; t < nt; t++) {
        double best = 1e30, check = 0.0;
        for (int r = 0; r < 5; r++) {
            const double t0 = omp_get_wtime();
            float tot = 0.0f;
            /* an OpenMP simd reduction: the compiler may keep many vector partial sums (the order is free) */
#pragma omp parallel for simd num_threads(threads[t]) schedule(static) reduction(+ : tot)
            for (size_t i = 0; i < n; i++) tot += a[i];
            const double dt = omp_get_wtime() - t0;
            if (dt < best) best = dt;
            check += tot;
        }
        printf("threads %d: %.1f GB/s\n", threads[t], (double)n * sizeof(float) / best / 1e9);
        if (check == 1.0) printf("(never)\n"); /* keeps the sums live */
    }
    free(a);
    return 0;
}
