/*
 * node/transport/backend.h: the seam between the transport's public API
 * (transport.c) and its two implementations. Private to node/transport.
 *
 * ds_transport_open picks a backend by provider name: "inproc" opens an
 * in-process endpoint (inproc.c: messages between endpoints of this
 * process, with injectable faults, for unit tests), every other name a
 * libfabric endpoint (fabric.c and its neighbours). Each backend allocates
 * its own state with a struct ds_transport as its first member, so the
 * public handle converts to the backend's struct and back (C11 6.7.2.1:
 * a pointer to a struct points to its first member).
 *
 * What the front does for both: check the options and the send arguments
 * (so both backends refuse the same things with the same errno), the
 * buffer cache (ds_transport_buf_get/put), ds_transport_msg_take,
 * ds_transport_send_wait (built on send), ds_transport_addr, and freeing
 * the cache and the struct after the backend's close.
 */
#ifndef DS_NODE_TRANSPORT_BACKEND_H
#define DS_NODE_TRANSPORT_BACKEND_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "node/transport/transport.h"

#define TP_CACHE_SLOTS 64     /* large buffers kept for reuse */
#define TP_CACHE_MIN (64u << 10)
#define TP_CACHE_BYTES ((size_t)256 << 20)
#define TP_MIN_CHUNK 4096u
#define TP_MAX_CHUNK (64u << 20)

struct tp_ops {
    const char *name;
    /* Stop the backend's thread (pending sends fail with -ECANCELED, their
     * done and release callbacks run) and free everything it owns except
     * the struct ds_transport head and its allocation, which the front
     * frees. */
    void (*close)(ds_transport *t);
    int (*peer_add)(ds_transport *t, const char *hostport, ds_transport_peer *out);
    int (*peer_remove)(ds_transport *t, ds_transport_peer p);
    int (*peer_addr)(ds_transport *t, ds_transport_peer p, char *buf, size_t n);
    /* The arguments are checked and the deadline is in the future. */
    int (*send)(ds_transport *t, ds_transport_peer p, const ds_transport_send_args *a);
    int (*reset)(ds_transport *t);
    void (*stats_get)(ds_transport *t, ds_transport_stats *st);
};

/* What every backend's struct starts with. */
struct ds_transport {
    const struct tp_ops *ops;
    /* This endpoint's advertised address, set by the backend's open. */
    char addr_text[DS_TRANSPORT_ADDR_MAX];
    /* Freed large buffers kept for reuse: a fresh 1-64 MiB allocation is
     * mapped anew by malloc and faults in page by page, which measured
     * about as costly as copying it. Any thread (own lock). */
    pthread_mutex_t cache_lock;
    void *cache_buf[TP_CACHE_SLOTS];
    size_t cache_cap[TP_CACHE_SLOTS];
    unsigned cache_n;
    size_t cache_bytes;
};

/* Set up the head's cache and ops; the backend calls it first. */
void tp_head_init(ds_transport *t, const struct tp_ops *ops);

/* Free the head's cache and the allocation that starts with t. The
 * backends call it on a failed open; ds_transport_close after ops->close. */
void tp_head_free(ds_transport *t);

/* host:port (base/hostport.h) as separate host and port texts. 0 or
 * -EINVAL (malformed, or does not fit). */
int tp_split_hostport(const char *s, char *host, size_t hn, char *port, size_t pn);

/* A random non-zero 64-bit value (stream ids, grant ids). */
uint64_t tp_random_u64(void);

/* The backends' open functions: options already checked by the front. */
int tp_fabric_open(const ds_transport_opts *o, ds_transport **out);
/* ds_transport_warm's thread (fabric.c): start it (once per process), and
 * join it (the first open after it). o->listen may be NULL: then it only
 * initialises libfabric. */
void fab_warm(const ds_transport_opts *o);
/* libfabric's settings dsnode chooses unless the environment has them
 * (fabric_dl.c); provider NULL means tcp; before libfabric initialises,
 * on the opener's thread. */
void tp_fi_env(const char *provider);
void fab_warm_join(void);
int tp_inproc_open(const ds_transport_opts *o, ds_transport **out);

#endif
