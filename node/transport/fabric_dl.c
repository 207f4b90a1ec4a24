/*
 * node/transport/fabric_dl.c: libfabric, opened at run time.
 *
 * Why not linked: loading libfabric loads what Debian built its providers
 * against, and two of those (libpsm_infinipath and libpsm2, for the psm
 * and psm2 providers) calibrate a clock in their constructors with a few
 * hundred short sleeps: about 0.2 s before main() in every process linked
 * to libfabric, with or without the hardware, and whatever provider is
 * asked for. Opened here instead, on ds_transport_warm's thread, those
 * sleeps overlap the dataset load. The backend calls the five functions
 * libfabric exports through tp_fi; everything else in libfabric's API is
 * inline calls through the objects' ops tables.
 *
 * Any thread; tp_fi_load is idempotent and thread-safe (pthread_once).
 */
#include "config.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "node/transport/internal.h"

/* The soname of the major version the headers describe. */
#define STR_(x) #x
#define STR(x) STR_(x)
#define TP_FI_SONAME "libfabric.so." STR(FI_MAJOR_VERSION)

struct tp_fi tp_fi;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_ret;
static char load_why[256];

static void load(void)
{
    void *lib = dlopen(TP_FI_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(load_why, sizeof(load_why), "cannot load %s: %s", TP_FI_SONAME,
                 e ? e : "dlopen failed");
        load_ret = -ELIBACC;
        return;
    }
    struct tp_fi f;
    /* POSIX lets a void * from dlsym convert to a function pointer. */
    *(void **)&f.getinfo = dlsym(lib, "fi_getinfo");
    *(void **)&f.freeinfo = dlsym(lib, "fi_freeinfo");
    *(void **)&f.dupinfo = dlsym(lib, "fi_dupinfo");
    *(void **)&f.fabric = dlsym(lib, "fi_fabric");
    *(void **)&f.strerror = dlsym(lib, "fi_strerror");
    if (!f.getinfo || !f.freeinfo || !f.dupinfo || !f.fabric || !f.strerror) {
        snprintf(load_why, sizeof(load_why), "%s lacks fi_getinfo, fi_freeinfo, fi_dupinfo, "
                 "fi_fabric or fi_strerror", TP_FI_SONAME);
        load_ret = -ELIBBAD;
        dlclose(lib);
        return;
    }
    tp_fi = f; /* published by pthread_once's barrier; the library stays open */
}

int tp_fi_load(char *why, size_t why_len)
{
    pthread_once(&load_once, load);
    if (load_ret && why && why_len)
        snprintf(why, why_len, "%s", load_why);
    return load_ret;
}
