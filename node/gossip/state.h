/*
 * node/gossip/state.h: model state transfer to a node that joins a running
 * cluster (design §6: "receives ... the model state (chunked transfer with
 * a checksum)").
 *
 * The state is one byte string: a 64-byte header
 *
 *    0  "DSSTATE1"        8  u64 n_params     16  u64 step
 *   24  u64 round0       32  u64 round        40  u64 milli-rounds/s
 *   48  u64 lag rounds   56  8 bytes zero
 *
 * (little-endian) followed by the n_params float32 parameters. It travels
 * as STATE_CHUNK frames of at most chunk_bytes, each carrying the total
 * length, its offset and the BLAKE2b-256 digest of the whole string; the
 * joiner asks with STATE_REQ(offset 0, length 0 = all).
 *
 * Server side: the net worker queues requests (ds_state_on_req); the
 * training thread, which owns theta, serves them between steps
 * (ds_state_serve): one snapshot, digest, then every chunk to every waiting
 * requester, queued in the transport. The chunks are lent, not copied
 * (ds_net_send_msg_ref): a snapshot is refcounted and lives until the
 * transport has released its last chunk, which may be long after the serve
 * when a peer died mid-transfer (docs/decisions.md).
 *
 * Client side: ds_state_request, then the net worker feeds chunks
 * (ds_state_on_chunk) into a buffer of exactly the size this node's own
 * model needs (a peer cannot make us allocate anything else), in order; the
 * training thread waits (ds_state_wait), which checks the digest and the
 * header. A chunk of another snapshot (a new digest) restarts the transfer.
 */
#ifndef DS_NODE_STATE_H
#define DS_NODE_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "node/net/net.h"

#define DS_STATE_HDR_BYTES 64

typedef struct ds_state ds_state;

typedef struct ds_state_info {
    uint64_t step, round0, round;
    double rounds_per_s; /* the server's pace when it took the snapshot */
    uint64_t lag_rounds; /* the server's membership lag then (lag.h); 0: unknown */
    uint64_t from;       /* node id that served it */
    size_t bytes;
} ds_state_info;

/* net borrowed for the object's life; n_params: this node's model size. */
int ds_state_create(ds_state **out, ds_net *net, size_t n_params, uint32_t chunk_bytes)
    __attribute__((warn_unused_result));
void ds_state_destroy(ds_state **s);

/* ---- server ---- */

/* Net worker: a STATE_REQ arrived; remember who asked. */
void ds_state_on_req(ds_state *s, const ds_net_rx *rx);
/* Training thread: 1 when someone waits for a snapshot. */
int ds_state_pending(ds_state *s);
/* Training thread: snapshot theta (host memory, n_params) with its step,
 * round0 and round, and send it to every waiting requester. Returns the
 * number served, or a negative errno. */
int ds_state_serve(ds_state *s, const float *theta, uint64_t step, uint64_t round0,
                   uint64_t round, double rounds_per_s, uint64_t lag_rounds,
                   uint64_t deadline_ms);

/* ---- client ---- */

/* Ask node `peer` (reachable at addr, may be NULL when known) for its
 * state; any transfer in progress is dropped. */
int ds_state_request(ds_state *s, uint64_t peer, const char *addr, uint64_t deadline_ms)
    __attribute__((warn_unused_result));
/* Net worker: one STATE_CHUNK arrived. */
void ds_state_on_chunk(ds_state *s, const ds_net_rx *rx);
/* Training thread: wait until the requested state is complete and verified
 * (theta receives n_params floats) or deadline_ms. Returns 0, -ETIMEDOUT,
 * or -EBADMSG (digest or header mismatch: ask again). */
int ds_state_wait(ds_state *s, uint64_t deadline_ms, float *theta, ds_state_info *info);

/* Serialise / parse the state string (exposed for tests). buf holds
 * DS_STATE_HDR_BYTES + 4 n floats. */
void ds_state_pack(uint8_t *buf, const float *theta, size_t n, uint64_t step, uint64_t round0,
                   uint64_t round, double rounds_per_s, uint64_t lag_rounds);
int ds_state_unpack(const uint8_t *buf, size_t len, size_t n, float *theta, ds_state_info *info);

#endif
