/* kernels/cpu/blas.c: GEMM through CBLAS (OpenBLAS), row-major. */
#include "config.h"

#include <cblas.h>

#include "kernels/cpu/cpu_kernels.h"

DS_DECL_GEMM(ds_gemm_blas)
{
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb,
                beta, c, ldc);
}

void ds_blas_set_threads(int n)
{
    openblas_set_num_threads(n > 0 ? n : 1);
}
