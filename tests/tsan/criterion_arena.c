/* Linked into the Criterion test programs of a ThreadSanitizer build only
 * (tests/meson.build), so that Criterion can start under TSan.
 *
 * Criterion's BoxFort maps each of its shared arenas (the inheritable one,
 * and one per test for the test's context) at a random fixed address
 * 0x200000000000 + r * 16 MiB, r = rand_r(&seed) & 0x3fffff, and gives up
 * after 10 addresses that are already mapped. TSan maps or protects all of
 * 0x200000000000-0x550000000000 and 0x568000000000-0x600000000000 (shadow,
 * meta shadow and the gaps between them), so only about 2% of the candidates
 * are free: the arena fails ("Could not initialize inheritable arena"), or a
 * test's context arena fails, which Criterion 2.4 does not check, and the
 * runner crashes.
 *
 * This rand_r, called from libcriterion (where BoxFort is linked in), draws
 * r in TSan's free "mid application" range 0x550000000000-0x568000000000
 * instead; every other caller gets the C library's rand_r. BoxFort still
 * checks each page is free before it maps, as before. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BXF_BASE 0x200000000000ULL
#define BXF_STEP (1ULL << 24)
#define TSAN_MID_BEG 0x550000000000ULL
#define TSAN_MID_END 0x568000000000ULL

typedef int (*rand_r_fn)(unsigned *);

static int called_from_criterion(const void *ret)
{
    Dl_info info;
    if (!dladdr(ret, &info) || !info.dli_fname)
        return 0;
    return strstr(info.dli_fname, "libcriterion") != NULL;
}

int rand_r(unsigned *seed)
{
    static rand_r_fn libc_rand_r;
    rand_r_fn next = __atomic_load_n(&libc_rand_r, __ATOMIC_ACQUIRE);
    if (!next) {
        next = (rand_r_fn)dlsym(RTLD_NEXT, "rand_r");
        __atomic_store_n(&libc_rand_r, next, __ATOMIC_RELEASE);
    }
    int r = next(seed);
    if (!called_from_criterion(__builtin_return_address(0)))
        return r;
    const unsigned first = (unsigned)((TSAN_MID_BEG - BXF_BASE) / BXF_STEP);
    const unsigned count = (unsigned)((TSAN_MID_END - TSAN_MID_BEG) / BXF_STEP);
    return (int)(first + (unsigned)r % count);
}
