/*
 * kernels/kernels.h: the compute backend as a table of function pointers.
 *
 * Every kernel family has one signature macro (DS_DECL_*) that declares its
 * typedef and every variant, so a variant whose prototype drifts fails to
 * compile. ds_ops is filled with the plain C reference first; the CPU init
 * then overrides what the machine's SIMD supports (see cpu.h for the mask),
 * and the CUDA init builds a complete table of device kernels instead.
 *
 * Pointers handed to the compute ops of a table are that backend's memory:
 * host memory for the CPU table, device memory for the CUDA table. Move data
 * with ops->upload / ops->download. Reductions (dot, sum, nrm2) return their
 * value on the host and accumulate in double.
 *
 * A CUDA table works on one device: its compute ops are ordered on that
 * device's stream (kernels/cuda/device.h, shared with the other CUDA code of
 * the process) and ops->sync waits for them. The stream, cuBLAS handle,
 * scratch and failure state are per device: tables of one device share
 * them (reference-counted), tables of two devices share nothing.
 *
 * Matrices are row-major throughout. Fused softmax cross-entropy takes int32
 * class labels.
 */
#ifndef DS_KERNELS_KERNELS_H
#define DS_KERNELS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

enum ds_backend_kind {
    DS_BACKEND_CPU = 0,
    DS_BACKEND_CUDA = 1,
};

/* Parameters of one optimizer step (design §3). */
typedef struct ds_sgd_params {
    float lr;           /* learning rate for this step (after warm-up) */
    float momentum;     /* 0 disables the momentum buffer */
    float weight_decay; /* L2 coefficient added to the gradient */
    int nesterov;       /* 1: Nesterov momentum (needs momentum > 0) */
} ds_sgd_params;

/* C = alpha * op(A) * op(B) + beta * C, row-major, op(X) = X or X^T.
 * op(A) is m x k, op(B) is k x n, C is m x n. */
#define DS_DECL_GEMM(name) \
    void (name)(int trans_a, int trans_b, int m, int n, int k, float alpha, \
                const float *a, int lda, const float *b, int ldb, float beta, \
                float *c, int ldc)
/* y[r][c] += bias[c] for r < rows, c < cols. */
#define DS_DECL_BIAS_ADD(name) \
    void (name)(float *y, const float *bias, int rows, int cols)
/* db[c] = sum over r of dy[r][c]. */
#define DS_DECL_BIAS_GRAD(name) \
    void (name)(float *db, const float *dy, int rows, int cols)
/* y = max(x, 0); y may alias x. */
#define DS_DECL_RELU_FWD(name) \
    void (name)(float *y, const float *x, size_t n)
/* dx = y > 0 ? dy : 0, where y is the forward output; dx may alias dy. */
#define DS_DECL_RELU_BWD(name) \
    void (name)(float *dx, const float *dy, const float *y, size_t n)
/* Softmax cross-entropy over rows of logits (rows x cols). Writes the
 * gradient of the MEAN loss w.r.t. the logits into dlogits (may be NULL for
 * evaluation), returns the SUM of per-row losses in *loss_sum and the number
 * of rows whose arg-max equals the label in *correct. Host outputs. */
#define DS_DECL_SOFTMAX_XENT(name) \
    void (name)(float *dlogits, const float *logits, const int32_t *labels, \
                int rows, int cols, double *loss_sum, int64_t *correct)
/* One SGD step (design §3): g' = g + wd*theta; m = mu*m + g';
 * theta -= lr * (nesterov ? g' + mu*m : m). With momentum 0, mom is unused. */
#define DS_DECL_SGD(name) \
    void (name)(float *theta, float *mom, const float *grad, size_t n, \
                const ds_sgd_params *p)
/* y += a * x */
#define DS_DECL_AXPY(name) \
    void (name)(size_t n, float a, const float *x, float *y)
/* x *= a */
#define DS_DECL_SCALE(name) \
    void (name)(size_t n, float a, float *x)
/* sum x[i]*y[i] */
#define DS_DECL_DOT(name) \
    double (name)(size_t n, const float *x, const float *y)
/* sqrt(sum x[i]^2) */
#define DS_DECL_NRM2(name) \
    double (name)(size_t n, const float *x)
/* sum x[i] */
#define DS_DECL_SUM(name) \
    double (name)(size_t n, const float *x)

/* The shape of one 2-D convolution: k x k kernel (k odd), stride 1, "same"
 * zero padding of k/2, so the output is c_out x h x w. Images are NCHW:
 * x is batch x c_in x h x w, y is batch x c_out x h x w, the weight is
 * c_out x c_in x k x k (like torch.nn.Conv2d), the bias c_out. */
typedef struct ds_conv_shape {
    int batch, c_in, h, w, c_out, k;
} ds_conv_shape;

/* Floats of the scratch `col` a conv op may use: one image's im2col matrix,
 * (c_in*k*k) x (h*w), in the backend's memory. The plain C reference does
 * not touch it; the CUDA ops use it when they work one image at a time
 * (a batch of one, or their own larger scratch could not grow). */
static inline size_t ds_conv_col_floats(const ds_conv_shape *s)
{
    return (size_t)s->c_in * s->k * s->k * (size_t)s->h * s->w;
}

/* y = conv(x, w) + bias (overwritten). */
#define DS_DECL_CONV2D_FWD(name) \
    void (name)(float *y, const float *x, const float *w, const float *bias, \
                const ds_conv_shape *s, float *col)
/* Backward of the above given dy (batch x c_out x h x w): dw and db are
 * overwritten with the gradient summed over the batch; dx (batch x c_in x
 * h x w) is overwritten, or not formed when NULL. */
#define DS_DECL_CONV2D_BWD(name) \
    void (name)(float *dx, float *dw, float *db, const float *dy, const float *x, \
                const float *w, const ds_conv_shape *s, float *col)
/* 2x2 max-pool, stride 2, over `planes` planes of h x w (batch * channels):
 * y is planes x (h/2) x (w/2), rounded down (an odd last row or column is
 * dropped, as torch.nn.MaxPool2d(2) does). */
#define DS_DECL_MAXPOOL_FWD(name) \
    void (name)(float *y, const float *x, int planes, int h, int w)
/* dx (planes x h x w, overwritten) = dy at the first maximum of each window
 * of x (row-major order within the window), 0 elsewhere. */
#define DS_DECL_MAXPOOL_BWD(name) \
    void (name)(float *dx, const float *dy, const float *x, int planes, int h, int w)

/* A batch from a data set held in this backend's memory (uploaded once):
 * for b < batch, row i = idx ? idx[b] : first + b (idx in this backend's
 * memory), x[b][j] = (float)images[i * dim + j] * scale + shift for j < dim
 * (the product and the sum each rounded to float, no fused multiply-add,
 * so every backend gives the bits node/train/data.c's gather gives), and
 * y[b] = labels[i]. */
#define DS_DECL_GATHER_IMAGES(name) \
    void (name)(float *x, int32_t *y, const uint8_t *images, const uint8_t *labels, \
                const uint32_t *idx, size_t first, int batch, size_t dim, float scale, \
                float shift)

typedef DS_DECL_GEMM(*ds_gemm_fn);
typedef DS_DECL_BIAS_ADD(*ds_bias_add_fn);
typedef DS_DECL_BIAS_GRAD(*ds_bias_grad_fn);
typedef DS_DECL_RELU_FWD(*ds_relu_fwd_fn);
typedef DS_DECL_RELU_BWD(*ds_relu_bwd_fn);
typedef DS_DECL_SOFTMAX_XENT(*ds_softmax_xent_fn);
typedef DS_DECL_SGD(*ds_sgd_fn);
typedef DS_DECL_AXPY(*ds_axpy_fn);
typedef DS_DECL_SCALE(*ds_scale_fn);
typedef DS_DECL_DOT(*ds_dot_fn);
typedef DS_DECL_NRM2(*ds_nrm2_fn);
typedef DS_DECL_SUM(*ds_sum_fn);
typedef DS_DECL_CONV2D_FWD(*ds_conv2d_fwd_fn);
typedef DS_DECL_CONV2D_BWD(*ds_conv2d_bwd_fn);
typedef DS_DECL_MAXPOOL_FWD(*ds_maxpool_fwd_fn);
typedef DS_DECL_MAXPOOL_BWD(*ds_maxpool_bwd_fn);
typedef DS_DECL_GATHER_IMAGES(*ds_gather_images_fn);

typedef struct ds_ops {
    enum ds_backend_kind kind;
    int device;         /* the CUDA device of a CUDA table; 0 in a CPU one */
    char name[96];      /* "cpu-avx512", "cpu-ref", "cuda:0 NVIDIA H200", ... */

    /* Memory of this backend. alloc returns 64-byte aligned, zeroed memory
     * or NULL; the caller owns it and releases it with free (NULL is fine). */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    /* Host memory the backend copies fastest from and to (pinned, page-
     * locked on CUDA; ordinary on the CPU): 64-byte aligned, zeroed, or
     * NULL. Released with host_free. */
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *p);
    int (*upload)(void *dst, const void *src_host, size_t bytes);
    int (*download)(void *dst_host, const void *src, size_t bytes);
    int (*copy)(void *dst, const void *src, size_t bytes);
    int (*memzero)(void *dst, size_t bytes);
    /* Waits for every queued op; 0, or -EIO when one failed since the
     * backend started (a launch, a library status, a copy: ops that return
     * nothing record their failure for it). */
    int (*sync)(void);
    /* What failed ("k_sgd: an illegal memory access ..."), or NULL. */
    const char *(*error)(void);

    ds_gemm_fn gemm;
    ds_bias_add_fn bias_add;
    ds_bias_grad_fn bias_grad;
    ds_relu_fwd_fn relu_fwd;
    ds_relu_bwd_fn relu_bwd;
    ds_softmax_xent_fn softmax_xent;
    ds_sgd_fn sgd;
    ds_axpy_fn axpy;
    ds_scale_fn scale;
    ds_dot_fn dot;
    ds_nrm2_fn nrm2;
    ds_sum_fn sum;

    /* Image ops of the CNN (node/train/model.c); both the CPU and the CUDA
     * table have them. A table without them (NULL) makes a model that needs
     * them fail there with -ENOTSUP. */
    ds_conv2d_fwd_fn conv2d_fwd;
    ds_conv2d_bwd_fn conv2d_bwd;
    ds_maxpool_fwd_fn maxpool_fwd;
    ds_maxpool_bwd_fn maxpool_bwd;

    /* The trainer's batches from a data set resident in this backend's
     * memory (node/train/train.c uses it on a device: the images go up
     * once, and a step moves only its indices). */
    ds_gather_images_fn gather_images;
} ds_ops;

/* Fill *ops with the CPU table: the C reference, overridden by the SIMD
 * variants allowed by ds_cpu_flags() (which honours DS_KERNELS). */
void ds_ops_init_cpu(ds_ops *ops);

/* Fill *ops with the CUDA table for device `device` (0-based, below both
 * the device count and DS_CUDA_MAX_DEVICES of kernels/cuda/device.h).
 * Returns 0, or -ENODEV when CUDA is not built in, no driver answers or no
 * such device exists (a normal state: the caller falls back to the CPU),
 * with the reason in why[0..why_len). Every table filled must be released
 * with ds_ops_fini(). */
int ds_ops_init_cuda(ds_ops *ops, int device, char *why, size_t why_len);

/* The backends one can ask for, in the order the config and the help list
 * them: X(enumerator, value, name). auto is CUDA when a device answers,
 * else the CPU. This list is the only place a backend choice is named: it
 * generates enum ds_ops_backend and the names ds_ops_backend_name() and
 * ds_ops_init() use, and conf/keys.h takes train.backend's choices from it.
 * (enum ds_backend_kind above is what a filled table is, never auto.) */
#define DS_OPS_BACKENDS(X) \
    X(DS_OPS_AUTO, 0, "auto") \
    X(DS_OPS_CPU, 1, "cpu") \
    X(DS_OPS_CUDA, 2, "cuda")

#define DS_OPS_ENUMERATOR_(e, v, name) e = v,
enum ds_ops_backend { DS_OPS_BACKENDS(DS_OPS_ENUMERATOR_) };
#undef DS_OPS_ENUMERATOR_

/* The name of b in DS_OPS_BACKENDS (static string), or "?" for a value
 * not in the list (which ds_ops_init refuses). */
const char *ds_ops_backend_name(enum ds_ops_backend b);

/* The backend named s (exactly, lower case), or -EINVAL (also for NULL). */
int ds_ops_backend_parse(const char *s);

/* Fill *ops with the backend b asks for; cuda (and auto, when it takes
 * CUDA) on CUDA device `device` (train.device). Returns 0, -ENODEV when
 * cuda was asked for and is not available (that device included), -EINVAL
 * for a value not in DS_OPS_BACKENDS; `why` receives a one-line note for
 * the log either way (e.g. why auto chose the CPU). */
int ds_ops_init_backend(ds_ops *ops, enum ds_ops_backend b, int device, char *why,
                        size_t why_len);

/* ds_ops_init_backend() for the backend named `backend` ("auto", "cpu" or
 * "cuda"), on CUDA device `device`; an unknown name is -EINVAL with the
 * choices in `why`. */
int ds_ops_init(ds_ops *ops, const char *backend, int device, char *why, size_t why_len);

/* CUDA devices this process sees (0: no CUDA in this build, no driver,
 * or none), and train.device = auto's choice for a node of local rank
 * `rank` on this host: rank modulo that count (0 without a device). */
int ds_ops_cuda_devices(void);
int ds_ops_device_auto(int rank);

/* Threads OpenBLAS may use for the CPU GEMM (1 = the caller's thread). */
void ds_blas_set_threads(int n);

/* The kernels OpenBLAS loaded ("SkylakeX", "Haswell", "Prescott", ...), and
 * the OPENBLAS_CORETYPE this CPU deserves when they are weaker (else NULL). */
const char *ds_blas_corename(void);
const char *ds_blas_wanted_coretype(void);

/* Call first thing in main(): when OpenBLAS loaded kernels weaker than the
 * CPU supports (it falls back to SSE3 on CPUs it does not recognise, as on
 * many VMs) and OPENBLAS_CORETYPE is unset, re-execute the program once with
 * it set. Returns only when no re-exec was needed or possible.
 * DS_BLAS_KEEP=1 turns this off. */
void ds_blas_reexec_if_needed(char **argv);

/* Release what the table holds: for a CUDA table, its reference on the
 * device's stream, cuBLAS handle and scratch (the last table of a device
 * waits for its work and frees them), and the table is emptied so a second
 * call does nothing. NULL and CPU tables are fine. */
void ds_ops_fini(ds_ops *ops);

#endif
