/*
 * kernels/cpu/cpu_kernels.h: every CPU variant of every kernel family.
 *
 * _c is the plain C reference (compiled without SIMD flags), _blas calls
 * OpenBLAS through CBLAS, _avx2 and _avx512 are intrinsics compiled with
 * their own flags. Tests (tests/test_kernels.c) compare each against _c on
 * seeded random inputs of odd sizes; `dsbench kernels` times them.
 */
#ifndef DS_KERNELS_CPU_KERNELS_H
#define DS_KERNELS_CPU_KERNELS_H

#include "kernels/kernels.h"

DS_DECL_GEMM(ds_gemm_c);
DS_DECL_GEMM(ds_gemm_blas);
DS_DECL_BIAS_ADD(ds_bias_add_c);
DS_DECL_BIAS_GRAD(ds_bias_grad_c);
DS_DECL_RELU_FWD(ds_relu_fwd_c);
DS_DECL_RELU_BWD(ds_relu_bwd_c);
DS_DECL_SOFTMAX_XENT(ds_softmax_xent_c);
DS_DECL_SGD(ds_sgd_c);
DS_DECL_AXPY(ds_axpy_c);
DS_DECL_SCALE(ds_scale_c);
DS_DECL_DOT(ds_dot_c);
DS_DECL_NRM2(ds_nrm2_c);
DS_DECL_SUM(ds_sum_c);
/* Convolution: _c is direct loops, _blas is im2col + OpenBLAS SGEMM. */
DS_DECL_CONV2D_FWD(ds_conv2d_fwd_c);
DS_DECL_CONV2D_FWD(ds_conv2d_fwd_blas);
DS_DECL_CONV2D_BWD(ds_conv2d_bwd_c);
DS_DECL_CONV2D_BWD(ds_conv2d_bwd_blas);
/* Max-pool: the plain C reference; the branch-free variants below are
 * the production ops (about a tenth of a CNN step was the reference's
 * backward, its window compares mispredicted). */
DS_DECL_MAXPOOL_FWD(ds_maxpool_fwd_c);
DS_DECL_MAXPOOL_BWD(ds_maxpool_bwd_c);
DS_DECL_GATHER_IMAGES(ds_gather_images_c);

/* Convolution per ISA (simd_tmpl.c): _direct_ is direct loops over a
 * zero-padded image (any shape; the backward forms dx through the im2col
 * path when asked); the plain-suffix op takes the direct loops when c_in
 * <= DS_CONV_DIRECT_MAX_CIN (conv1 of the CNN, where im2col's GEMM has an
 * inner size of 9) and im2col + OpenBLAS otherwise. */
#define DS_CONV_DIRECT_MAX_CIN 1

#define DS_DECL_SIMD_VARIANTS(sfx) \
    DS_DECL_BIAS_ADD(ds_bias_add_##sfx); \
    DS_DECL_BIAS_GRAD(ds_bias_grad_##sfx); \
    DS_DECL_RELU_FWD(ds_relu_fwd_##sfx); \
    DS_DECL_RELU_BWD(ds_relu_bwd_##sfx); \
    DS_DECL_SGD(ds_sgd_##sfx); \
    DS_DECL_AXPY(ds_axpy_##sfx); \
    DS_DECL_SCALE(ds_scale_##sfx); \
    DS_DECL_DOT(ds_dot_##sfx); \
    DS_DECL_NRM2(ds_nrm2_##sfx); \
    DS_DECL_SUM(ds_sum_##sfx); \
    DS_DECL_MAXPOOL_FWD(ds_maxpool_fwd_##sfx); \
    DS_DECL_MAXPOOL_BWD(ds_maxpool_bwd_##sfx); \
    DS_DECL_CONV2D_FWD(ds_conv2d_fwd_##sfx); \
    DS_DECL_CONV2D_BWD(ds_conv2d_bwd_##sfx); \
    DS_DECL_CONV2D_FWD(ds_conv2d_fwd_direct_##sfx); \
    DS_DECL_CONV2D_BWD(ds_conv2d_bwd_direct_##sfx)

DS_DECL_SIMD_VARIANTS(avx2);
DS_DECL_SIMD_VARIANTS(avx512);

/* Fill the compute ops of *ops with the variants allowed by `flags`
 * (DS_CPU_*). Memory ops are the host ones. */
void ds_ops_fill_cpu(ds_ops *ops, unsigned flags);

#endif
