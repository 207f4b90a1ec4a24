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
 * Loading it changes no signal's disposition (below).
 *
 * Any thread; tp_fi_load is idempotent and thread-safe (pthread_once).
 */
#include "config.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
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

/* Every signal's disposition, to put back what loading libfabric changed:
 * libinfinipath's constructor installs its own handlers for SIGINT,
 * SIGTERM, SIGSEGV and more (its SIGTERM handler exits with status 1).
 * Linked, it ran before main and the program's own handlers replaced it;
 * loaded later it would replace theirs: dsnode's, or the Python
 * interpreter's around libdsnode. */
static struct sigaction saved[NSIG];

static void save_signals(void)
{
    for (int s = 1; s < NSIG; s++)
        if (s != SIGKILL && s != SIGSTOP && sigaction(s, NULL, &saved[s]) != 0)
            saved[s].sa_handler = SIG_ERR; /* not a signal: left alone */
}

static void restore_signals(void)
{
    for (int s = 1; s < NSIG; s++) {
        if (s == SIGKILL || s == SIGSTOP || saved[s].sa_handler == SIG_ERR)
            continue;
        struct sigaction now;
        if (sigaction(s, NULL, &now) == 0 &&
            (now.sa_handler != saved[s].sa_handler || now.sa_flags != saved[s].sa_flags))
            sigaction(s, &saved[s], NULL);
    }
}

/* Held from the save of the dispositions to their restore: a program
 * that installs handlers while a load runs on another thread (the
 * warm-up) would see them put back to what was saved, so it installs
 * them under this lock too (ds_transport_signals_lock): before the save,
 * or after the restore. */
static pthread_mutex_t sig_mu = PTHREAD_MUTEX_INITIALIZER;

static void load(void)
{
    pthread_mutex_lock(&sig_mu);
    save_signals();
    void *lib = dlopen(TP_FI_SONAME, RTLD_NOW | RTLD_LOCAL);
    restore_signals();
    pthread_mutex_unlock(&sig_mu);
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

/*
 * ofi_rxm posts FI_OFI_RXM_MSG_RX_SIZE bounce buffers of 16 KiB to the
 * tcp endpoints' shared receive context, 4096 by default over tcp: 64 MiB
 * zeroed when the endpoint opens, most of a node's start-up CPU after the
 * dataset (page faults on these VMs), and nearly a second of a joiner's
 * time to the view on a host as busy as 9 nodes on 2 cores
 * (docs/benchmarks.md, "Start-up: ofi_rxm's receive pool"). They hold
 * eager messages (16 KiB and under) until a receive matches; ours post 64
 * for small frames and take large ones by rendezvous. 256 gave the same
 * goodput in dsbench transport. When the pool is used up the tcp provider
 * stops reading the sockets (TCP's own backpressure), nothing is lost.
 * The user's own setting wins. Call before libfabric initialises (the
 * variable is read once, then), on a thread that can set the environment.
 */
void tp_fi_env(const char *provider)
{
    if (!provider || !strcmp(provider, "tcp") || strstr(provider, "ofi_rxm"))
        setenv("FI_OFI_RXM_MSG_RX_SIZE", "256", 0);
}

void ds_transport_signals_lock(void)
{
    pthread_mutex_lock(&sig_mu);
}

void ds_transport_signals_unlock(void)
{
    pthread_mutex_unlock(&sig_mu);
}

int tp_fi_load(char *why, size_t why_len)
{
    pthread_once(&load_once, load);
    if (load_ret && why && why_len)
        snprintf(why, why_len, "%s", load_why);
    return load_ret;
}
