/*
 * node/wire/wire.h: the dsnode wire format, pinned.
 *
 * Every message between two nodes is one frame: a fixed 64-byte
 * little-endian header, then `payload_len` payload bytes, then (when the
 * session authenticates) a 16-byte tag. This module turns frames into typed
 * messages and back. It is pure: bytes in, bytes out, no sockets, no
 * threads, no allocation. The security layer (node/sec/crypto.h) seals and
 * opens frames in place; the transport moves them.
 *
 * This header is the module's API; the byte layouts are pinned in their own
 * headers, which it includes:
 *
 *   node/wire/header.h   the 64-byte header, flags, string-field widths
 *   node/wire/member.h   the 272-byte member record (membership)
 *   node/wire/hello.h    the handshake payloads (HELLO ... HELLO_REJECT)
 *
 * and the code is split the same way: header.c (header checks, the length
 * rule per type), encode.c and decode.c (message codecs), index.c (sparse
 * index sets), member.c and hello.c (the two record layouts), drop.c (drop
 * reasons and their counters), wire.c (type names, limits, identifiers).
 * docs/protocol.md draws every payload.
 *
 * Identifiers: both are the first 8 bytes, read little-endian, of a
 * 16-byte BLAKE2b (libsodium crypto_generichash) of a label and the input:
 * cluster id = H("dsnode cluster id v1" || cluster name bytes), node id =
 * H("dsnode node id v1" || 32-byte public key). A node id names a key, not
 * a name: a peer cannot claim another's id without its secret key. The
 * value 0 is reserved for "unknown" and mapped to 1.
 *
 * Errors: every decode failure is one enum ds_drop_reason. The function
 * that returns the reason has already counted it (ds_drop_counters, when
 * given) and written one rate-limited log line, so callers only act on it.
 *
 * Threads: every function is pure or works on caller-owned memory, and may
 * run on any thread; ds_drop_counters are atomic.
 *
 * Run the tests: meson test -C build wire; bench: see docs/bench/crypto.md.
 */
#ifndef DS_NODE_WIRE_H
#define DS_NODE_WIRE_H

#include <assert.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/le.h"
#include "base/log.h"
#include "node/wire/header.h"
#include "node/wire/hello.h"
#include "node/wire/member.h"

#ifndef DS_WUR
#define DS_WUR __attribute__((warn_unused_result))
#endif

/* ---- message types ---------------------------------------------------------- */

/* Message types. Handshake types are never sealed. */
#define DS_MSG_LIST(X) \
    X(HELLO, 1) X(HELLO_ACK, 2) X(HELLO_FIN, 3) X(HELLO_REJECT, 4) \
    X(GOSSIP_REQ, 16) X(GOSSIP_RESP, 17) X(GOSSIP_STALE, 18) X(GOSSIP_PUSH, 19) \
    X(PING, 32) X(ACK, 33) X(PING_REQ, 34) X(NACK, 35) X(JOIN, 36) X(MEMBERS, 37) X(LEAVE, 38) \
    X(STATE_REQ, 48) X(STATE_CHUNK, 49) \
    X(GROUP_REDUCE, 64) X(GROUP_BCAST, 65) X(ALLREDUCE, 66)
enum ds_msg_type {
#define DS_MSG_ENUM_(name, val) DS_MSG_##name = val,
    DS_MSG_LIST(DS_MSG_ENUM_)
#undef DS_MSG_ENUM_
};
/* "GOSSIP_REQ", ...; "?" for an unknown type. Static storage. */
const char *ds_msg_type_name(unsigned type);

/* Payload sizes of the fixed parts (bytes; docs/protocol.md draws them).
 * The handshake payloads are in node/wire/hello.h, the member record in
 * node/wire/member.h. */
#define DS_WIRE_SPARSE_PREFIX 16u  /* seg_len, idx_bytes, aux, reserved */
#define DS_WIRE_CHUNK_PREFIX 48u   /* STATE_CHUNK: total, offset, digest */
#define DS_WIRE_MAX_HS_FRAME (DS_WIRE_HDR_SIZE + DS_WIRE_HELLO_ACK_SIZE)

/* ---- drop reasons ----------------------------------------------------------- */

/* One list: enum, short metric name, human text. */
#define DS_DROP_LIST(X) \
    X(NONE, "none", "accepted") \
    X(SHORT, "short", "frame shorter than the header") \
    X(BAD_MAGIC, "bad_magic", "bad magic") \
    X(BAD_VERSION, "bad_version", "unsupported protocol version") \
    X(UNKNOWN_TYPE, "unknown_type", "unknown message type") \
    X(BAD_FLAGS, "bad_flags", "flags not valid for this type") \
    X(LENGTH_MISMATCH, "length_mismatch", "length does not match the header and the type") \
    X(COUNT_LIMIT, "count_limit", "count over the configured limit") \
    X(SIZE_LIMIT, "size_limit", "size over the configured limit") \
    X(BAD_ENCODING, "bad_encoding", "malformed index block") \
    X(INDEX_ORDER, "index_order", "indices not strictly increasing") \
    X(INDEX_RANGE, "index_range", "index outside the segment") \
    X(NON_FINITE, "non_finite", "non-finite value") \
    X(BAD_FIELD, "bad_field", "malformed field") \
    X(WRONG_CLUSTER, "wrong_cluster", "message from another cluster") \
    X(UNKNOWN_SENDER, "unknown_sender", "no session with this sender") \
    X(WRONG_SENDER, "wrong_sender", "sender field does not match the authenticated peer") \
    X(WRONG_RECEIVER, "wrong_receiver", "message addressed to another node") \
    X(BAD_TAG, "bad_tag", "authentication tag does not verify") \
    X(REPLAY, "replay", "sequence number seen before") \
    X(TOO_OLD, "too_old", "sequence number behind the replay window") \
    X(BAD_SIGNATURE, "bad_signature", "handshake signature does not verify") \
    X(BAD_MAC, "bad_mac", "cluster key proof does not verify (wrong cluster key)") \
    X(NOT_ALLOWED, "not_allowed", "peer key not admitted") \
    X(STALE_HANDSHAKE, "stale_handshake", "handshake message from another handshake (replay)") \
    X(UNEXPECTED, "unexpected", "message not valid in this state") \
    X(POLICY_MISMATCH, "policy_mismatch", "security mode, cipher or admission differ") \
    X(SEGMENT_MISMATCH, "segment_mismatch", "unknown segment or segment length") \
    X(OVERLOAD, "overload", "receiver over capacity")

enum ds_drop_reason {
#define DS_DROP_ENUM_(e, name, text) DS_DROP_##e,
    DS_DROP_LIST(DS_DROP_ENUM_)
#undef DS_DROP_ENUM_
    DS_DROP__COUNT
};

/* "bad_tag" (a Prometheus label value / JSON key) and "authentication tag
 * does not verify". Static storage; "?" when out of range. */
const char *ds_drop_name(enum ds_drop_reason r);
const char *ds_drop_str(enum ds_drop_reason r);

/* One atomic counter per reason. Zero-initialise (static or = {0}); safe to
 * bump from any thread. */
typedef struct ds_drop_counters {
    _Atomic uint64_t n[DS_DROP__COUNT];
} ds_drop_counters;

/* c may be NULL (then nothing is counted). */
void ds_drop_inc(ds_drop_counters *c, enum ds_drop_reason r);
uint64_t ds_drop_get(const ds_drop_counters *c, enum ds_drop_reason r);
/* Sum over all reasons except NONE. */
uint64_t ds_drop_total(const ds_drop_counters *c);

/* The one text form for log lines and benchmark rows (the status page's
 * JSON and Prometheus forms come from the metric lists, node/status). */
enum ds_drop_fmt {
    DS_DROP_FMT_KV, /* "bad_tag=3 replay=1" (non-zero only; "none" if all zero) */
};
/* Writes a NUL-terminated text into buf[0..cap). Returns its length, or
 * -ENOSPC when cap is too small (buf then holds a truncated prefix), or
 * -EINVAL for an unknown fmt. */
int ds_drop_format(const ds_drop_counters *c, enum ds_drop_fmt fmt, char *buf, size_t cap);

/* Count the drop and write one rate-limited log line at this call site.
 * `fmt` adds key=value context; a call site gets its own rate limit. */
#define ds_drop_note(ctr, reason, comp, fmt, ...) \
    do { \
        enum ds_drop_reason ds_dn_r_ = (reason); \
        ds_drop_inc((ctr), ds_dn_r_); \
        ds_log_rl(DS_LOG_WARN, comp, "drop reason=%s " fmt, ds_drop_name(ds_dn_r_), \
                  ##__VA_ARGS__); \
    } while (0)

/* ---- limits ---------------------------------------------------------------- */

/* Bounds a receiver enforces before it reads or stores anything. The
 * decoder writes variable parts only into caller buffers (ds_wire_bufs)
 * that must hold these many items. */
typedef struct ds_wire_limits {
    uint32_t max_payload; /* bytes of payload in one frame */
    uint32_t max_segment; /* seg_len of a sparse payload (elements) */
    uint32_t max_count;   /* indices / values in one message */
    uint32_t max_members; /* member records in one message */
    uint32_t max_cluster; /* MEMBERS total: members a table may claim */
    uint64_t max_state;   /* total bytes of a state transfer */
} ds_wire_limits;

/* Defaults: 64 MiB + 64 KiB payload, 2^26 segment, 2^24 count, 1024
 * members per message, 65536 in a table, 16 GiB state. */
void ds_wire_limits_default(ds_wire_limits *lim);

/* ---- identifiers ------------------------------------------------------------ */

/* 64-bit ids as described at the top. Never 0. */
uint64_t ds_wire_cluster_id(const char *cluster_name);
uint64_t ds_wire_node_id(const uint8_t pk[32]);

/* ---- decoded / to-be-encoded messages ----------------------------------------- */

/* Host-order header. */
typedef struct ds_wire_hdr {
    uint8_t version; /* encode: 0 means DS_WIRE_VERSION */
    uint8_t type;
    uint16_t flags;
    uint64_t cluster, sender, receiver, round;
    uint32_t epoch, segment, count, payload_len;
    uint64_t seq;
} ds_wire_hdr;

static inline unsigned ds_wire_prot(const ds_wire_hdr *h)
{
    return (h->flags & DS_WF_PROT_MASK) >> DS_WF_PROT_SHIFT;
}

/* Handshake payloads (filled and checked by node/sec/handshake.c). */
typedef struct ds_wire_hello {
    uint8_t mode;      /* enum ds_sec_mode of the sender */
    uint8_t aeads;     /* HELLO: offered mask; HELLO_ACK: the chosen one */
    uint8_t admission; /* DS_ADMIT_* bits of the sender */
    uint8_t pk[32];    /* Ed25519 identity public key */
    uint8_t eph[32];   /* X25519 ephemeral public key (crypto_kx) */
    char name[DS_WIRE_NAME_MAX + 1];
    char addr[DS_WIRE_ADDR_MAX + 1];
    uint8_t echo[32]; /* HELLO_ACK only: transcript hash of the HELLO */
    uint8_t sig[64];
    uint8_t mac[32]; /* all zero without a cluster key */
} ds_wire_hello;

/* HELLO_REJECT: a responder refused a HELLO for an admission reason (not
 * on the allow-list, wrong cluster key, policy). Not authenticated: the
 * responder cannot prove anything to a node it does not admit. echo is the
 * BLAKE2b-256 of the whole HELLO frame it refuses, so only who saw that
 * HELLO can forge a refusal of it; the initiator treats it as "this seed
 * will not admit me", never as a statement about the cluster. */
typedef struct ds_wire_reject {
    uint8_t echo[32];
    uint8_t reason; /* enum ds_drop_reason */
} ds_wire_reject;

typedef struct ds_wire_fin {
    uint8_t echo[32]; /* transcript hash up to the HELLO_ACK */
    uint8_t sig[64];
    uint8_t mac[32];
} ds_wire_fin;

/* GOSSIP_REQ, GOSSIP_PUSH, GROUP_REDUCE, GROUP_BCAST: indices relative to
 * the segment, strictly increasing, < seg_len; count (header) values. */
typedef struct ds_wire_sparse {
    uint32_t seg_len;
    uint32_t aux;       /* type-specific: group all-reduce step, else 0 */
    uint8_t enc;        /* enum ds_idx_enc; encode may pass DS_IDX_AUTO */
    /* Encode: NULL allowed when count == seg_len (dense). Decode: the
     * indices, in bufs->idx; for DS_IDX_DENSE they are 0..count-1 and are
     * written only if bufs->idx is non-NULL (else idx is NULL). */
    const uint32_t *idx;
    const float *val;
} ds_wire_sparse;

/* GOSSIP_RESP: how long the REQ waited, queued at its responder, while
 * the responder waited on other partners (microseconds), then count
 * values, in the order of the REQ's indices. */
typedef struct ds_wire_values {
    uint32_t held_us;
    const float *val;
} ds_wire_values;

typedef struct ds_wire_stale {
    uint64_t round_now; /* the responder's current round */
} ds_wire_stale;

enum ds_member_state {
    DS_MEMBER_ALIVE = 0,
    DS_MEMBER_SUSPECT = 1,
    DS_MEMBER_DEAD = 2,
    DS_MEMBER_LEFT = 3,
};

/* One member-table entry (design §6), as piggybacked and in MEMBERS. */
typedef struct ds_wire_member {
    uint64_t id; /* decode: ds_wire_node_id(pk); ignored by encode */
    uint8_t pk[32];
    uint32_t incarnation;
    uint8_t state; /* enum ds_member_state */
    uint64_t effective_round;
    char name[DS_WIRE_NAME_MAX + 1];
    char addr[DS_WIRE_ADDR_MAX + 1];
    char group[DS_WIRE_GROUP_MAX + 1]; /* "" = a group of one */
} ds_wire_member;

/* PING, ACK, PING_REQ, NACK: SWIM probes; count (header) piggybacked
 * updates (none for NACK). target: PING_REQ and NACK only. */
typedef struct ds_wire_probe {
    uint64_t probe_seq;
    uint64_t target;
    const ds_wire_member *updates;
} ds_wire_probe;

/* MEMBERS: a slice [first, first+count) of a table of `total` entries. */
typedef struct ds_wire_members {
    uint64_t round_now;
    uint32_t total;
    uint32_t first;
    const ds_wire_member *members;
} ds_wire_members;

typedef struct ds_wire_leave {
    uint64_t effective_round;
    uint32_t incarnation;
} ds_wire_leave;

typedef struct ds_wire_state_req {
    uint64_t offset; /* bytes into the serialized state */
    uint64_t length; /* 0 = to the end */
} ds_wire_state_req;

/* STATE_CHUNK: count data bytes at offset of a total-byte state whose
 * BLAKE2b-256 is digest. data borrows the frame (decode) or the caller's
 * buffer (encode). */
typedef struct ds_wire_state_chunk {
    uint64_t total;
    uint64_t offset;
    uint8_t digest[32];
    const uint8_t *data;
} ds_wire_state_chunk;

/* ALLREDUCE: a dense ring all-reduce chunk of count values at elem_offset. */
typedef struct ds_wire_allreduce {
    uint32_t phase; /* 0 reduce-scatter, 1 all-gather */
    uint32_t step;
    uint64_t elem_offset;
    const float *val;
} ds_wire_allreduce;

typedef struct ds_wire_msg {
    ds_wire_hdr h;
    union {
        ds_wire_hello hello; /* HELLO, HELLO_ACK */
        ds_wire_fin fin;
        ds_wire_reject reject;
        ds_wire_sparse sparse;
        ds_wire_values values;
        ds_wire_stale stale;
        ds_wire_probe probe;
        ds_wire_member join;
        ds_wire_members members;
        ds_wire_leave leave;
        ds_wire_state_req state_req;
        ds_wire_state_chunk chunk;
        ds_wire_allreduce ar;
    } u;
} ds_wire_msg;

/* Caller-owned destinations for the variable parts of a decoded message.
 * Size them from the limits: idx and val max_count items, members
 * max_members. A decoded count above a capacity is dropped as COUNT_LIMIT.
 * The decoded message's pointers point into these (or into the frame, for
 * chunk data): valid while both live. */
typedef struct ds_wire_bufs {
    uint32_t *idx;
    uint32_t idx_cap;
    float *val;
    uint32_t val_cap;
    ds_wire_member *members;
    uint32_t members_cap;
} ds_wire_bufs;

/* ---- encode ----------------------------------------------------------------- */

/* Exact frame length (header + payload, no tag) that ds_wire_encode will
 * produce for m, resolving DS_IDX_AUTO the same way. Returns 0 when m is
 * not encodable (unknown type, count over 2^32, bad strings...). */
size_t ds_wire_encoded_size(const ds_wire_msg *m);

/* Exact index-block sizes of one index set, per encoding (bytes, padded to
 * 4; SIZE_MAX where the encoding cannot express it), and the encoding
 * DS_IDX_AUTO picks: the smallest, ties to dense, raw, bitmap, varint (the
 * faster to decode). idx must be strictly increasing and < seg_len:
 * returns -EINVAL otherwise. */
int ds_wire_idx_sizes(uint32_t seg_len, const uint32_t *idx, uint32_t count,
                      size_t sizes[4], enum ds_idx_enc *best) DS_WUR;

/* Write m as one frame into out[0..cap). The caller sets m->h.type, the
 * addressing fields (cluster, sender, receiver, round, epoch, segment),
 * m->h.count where the type has one, and the type's union member; encode
 * fills version, payload_len, the index-encoding bits (m->u.sparse.enc is
 * set to the encoding used) and clears seq and the protection bits, which
 * ds_session_seal sets. Leave DS_WIRE_TAG_SIZE spare bytes in out for
 * sealing. Returns 0 and *len, -ENOSPC when cap is short, -EINVAL for a
 * message that does not follow its own rules (indices out of order or
 * range, counts over 2^32, bad strings), -EDOM for a non-finite value. */
int ds_wire_encode(uint8_t *out, size_t cap, ds_wire_msg *m, size_t *len) DS_WUR;

/* The same for a STATE_CHUNK, without its data: writes the header (whose
 * payload_len counts the data) and the 48-byte prefix, *len = 112; the
 * frame is out[0..*len) followed by the count bytes at m->u.chunk.data,
 * which the caller sends from where they are (node/net's zero-copy path).
 * cap >= DS_WIRE_HDR_SIZE + DS_WIRE_CHUNK_PREFIX. -EINVAL for another
 * type; otherwise the errors of ds_wire_encode. */
int ds_wire_encode_head(uint8_t *out, size_t cap, ds_wire_msg *m, size_t *len) DS_WUR;

/* Header only (for the security layer, which rewrites seq and flags). */
void ds_wire_hdr_encode(const ds_wire_hdr *h, uint8_t out[DS_WIRE_HDR_SIZE]);

/* ---- decode ----------------------------------------------------------------- */

/* Check a received frame's header: length >= header, magic, version, type,
 * flags, payload_len within the limit, frame length == header + payload_len
 * (+ tag when the protection bits say so), count within its limit, and the
 * payload length against the type's rule. Reads no payload byte. On
 * DS_DROP_NONE *h holds the header. Counts and logs drops. */
enum ds_drop_reason ds_wire_hdr_decode(const uint8_t *frame, size_t len,
                                       const ds_wire_limits *lim, ds_wire_hdr *h,
                                       ds_drop_counters *drops) DS_WUR;
/* The same checks without counting or logging (for a node's own frames). */
enum ds_drop_reason ds_wire_hdr_check(const uint8_t *frame, size_t len,
                                      const ds_wire_limits *lim, ds_wire_hdr *h) DS_WUR;
/* 1 for HELLO, HELLO_ACK, HELLO_FIN, HELLO_REJECT: frames that are never
 * sealed. */
int ds_wire_is_handshake(unsigned type);

/* Decode a whole frame whose payload is plaintext (as received in `none`
 * mode, or after ds_session_open). Validates everything listed at the top
 * and in docs/protocol.md: structure, index order and range, finiteness,
 * strings, bounds. Variable parts go to bufs (borrowed, see ds_wire_bufs).
 * On anything but DS_DROP_NONE, *out is unspecified. Counts and logs drops. */
enum ds_drop_reason ds_wire_decode(const uint8_t *frame, size_t len, const ds_wire_limits *lim,
                                   const ds_wire_bufs *bufs, ds_wire_msg *out,
                                   ds_drop_counters *drops) DS_WUR;

#endif
