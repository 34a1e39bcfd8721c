/* Read bandwidth of this machine now, 1 and 2 threads: the ceiling that decode (bound by weight reads) is measured
 * against.  gcc -O2 -march=native -fopenmp benchmarks/read_bandwidth.c -o /tmp/read_bandwidth && /tmp/read_bandwidth */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <omp.h>
int main(){ size_t n=(size_t)1<<28; /* 1 GiB of floats */ float *a=aligned_alloc(64,n*4); 
#pragma omp parallel for
 for(size_t i=0;i<n;i++) a[i]=1.0f;
 for(int th=1;th<=2;th++){ double best=1e9; for(int r=0;r<5;r++){ double t=omp_get_wtime(); float tot=0;
#pragma omp parallel for num_threads(th) reduction(+:tot)
  for(size_t i=0;i<n;i+=64){ __m512 s=_mm512_setzero_ps(); for(int j=0;j<64;j+=16) s=_mm512_add_ps(s,_mm512_load_ps(a+i+j)); tot+=_mm512_reduce_add_ps(s);} 
  double dt=omp_get_wtime()-t; if(dt<best)best=dt; if(tot==1.0f)printf("x");}
  printf("threads %d: %.1f GB/s\n", th, n*4/best/1e9);} return 0; }
