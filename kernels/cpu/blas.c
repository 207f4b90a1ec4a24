/*
 * kernels/cpu/blas.c: GEMM through CBLAS (OpenBLAS), row-major, and the
 * choice of OpenBLAS's kernels.
 *
 * OpenBLAS (Debian builds it with DYNAMIC_ARCH) picks its kernels once, when
 * the library is loaded, from CPUID. On virtual CPUs that report a generic
 * model ("Intel Xeon Processor") it does not recognise the core and falls
 * back to its oldest x86-64 kernels (Prescott, SSE3): measured here, the
 * MLP step is 4x slower than with its AVX-512 (SkylakeX) kernels. The only
 * supported override is OPENBLAS_CORETYPE in the environment at load time,
 * so programs call ds_blas_reexec_if_needed() first thing in main(): when
 * the loaded kernels are weaker than what ds_cpu_detect() finds and the user
 * has not set OPENBLAS_CORETYPE, the program runs itself again, once, with
 * it set. DS_BLAS_KEEP=1 disables this.
 */
#include "config.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "kernels/cpu.h"
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

const char *ds_blas_corename(void)
{
    const char *c = openblas_get_corename();
    return c ? c : "unknown";
}

/* OpenBLAS core names whose SGEMM uses AVX-512, and AVX2 (or better). */
static int name_in(const char *name, const char *const *list)
{
    for (; *list; list++)
        if (!strcasecmp(name, *list))
            return 1;
    return 0;
}

const char *ds_blas_wanted_coretype(void)
{
    static const char *const avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids", NULL};
    static const char *const avx2[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake",
                                       "SapphireRapids", NULL};
    const unsigned have = ds_cpu_detect();
    const char *core = ds_blas_corename();
    if ((have & DS_CPU_AVX512) && !name_in(core, avx512))
        return "SkylakeX";
    if ((have & DS_CPU_AVX2) && !name_in(core, avx2))
        return "Haswell";
    return NULL;
}

/* A program started through /proc/self/exe is named "exe" by the kernel
 * (ps, top, /proc/PID/comm, and every thread it creates): give it back the
 * name it was started under. */
static void restore_comm(char **argv)
{
    if (!argv || !argv[0] || !*argv[0])
        return;
    const char *base = strrchr(argv[0], '/');
    base = base ? base + 1 : argv[0];
    if (*base)
        prctl(PR_SET_NAME, base, 0, 0, 0);
}

void ds_blas_reexec_if_needed(char **argv)
{
    const char *keep = getenv("DS_BLAS_KEEP");
    if (getenv("OPENBLAS_CORETYPE") || (keep && *keep && strcmp(keep, "0"))) {
        restore_comm(argv);
        return;
    }
    const char *want = ds_blas_wanted_coretype();
    if (!want)
        return;
    /* Set both so a second pass can never loop, whatever OpenBLAS does. */
    setenv("OPENBLAS_CORETYPE", want, 1);
    setenv("DS_BLAS_KEEP", "1", 1);
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with the kernels we have (slower, still right). */
    fprintf(stderr, "dsnode: note: could not re-exec with OPENBLAS_CORETYPE=%s; "
                    "OpenBLAS runs its %s kernels\n", want, ds_blas_corename());
}
