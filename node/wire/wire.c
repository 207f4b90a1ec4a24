/*
 * node/wire/wire.c: the small shared pieces of the wire format: the name of
 * each message type, the default receive limits, and the two 64-bit
 * identifiers (cluster id, node id) that every header carries.
 *
 * The rest of the module is split by concern (see wire.h): the header and
 * the length rule per type in header.c, the message codecs in encode.c and
 * decode.c, sparse index sets in index.c, the member record and the
 * handshake payloads in member.c and hello.c, drop reasons in drop.c.
 *
 * Identifiers are hashes with a label per kind, so a cluster name and a
 * public key that happen to share bytes never share an id, and 0 stays
 * free to mean "unknown" (a hash that comes out 0 is mapped to 1).
 */
#include "config.h"

#include "node/wire/wire.h"

#include <sodium.h>
#include <string.h>

/* ---- names ------------------------------------------------------------------ */

const char *ds_msg_type_name(unsigned type)
{
    switch (type) {
#define DS_MSG_NAME_(name, val) \
    case val: \
        return #name;
        DS_MSG_LIST(DS_MSG_NAME_)
#undef DS_MSG_NAME_
    default:
        return "?";
    }
}

/* ---- limits and identifiers --------------------------------------------------- */

void ds_wire_limits_default(ds_wire_limits *lim)
{
    lim->max_payload = (64u << 20) + (64u << 10);
    lim->max_segment = 1u << 26;
    lim->max_count = 1u << 24;
    lim->max_members = 1024;
    lim->max_cluster = 65536;
    lim->max_state = 16ull << 30;
}

static uint64_t labelled_id(const char *label, const void *in, size_t inlen)
{
    crypto_generichash_state st;
    uint8_t out[16];
    crypto_generichash_init(&st, NULL, 0, sizeof(out));
    crypto_generichash_update(&st, (const uint8_t *)label, strlen(label));
    crypto_generichash_update(&st, in, inlen);
    crypto_generichash_final(&st, out, sizeof(out));
    uint64_t id = ds_le64(out);
    return id ? id : 1;
}

uint64_t ds_wire_cluster_id(const char *cluster_name)
{
    return labelled_id("dsnode cluster id v1", cluster_name, strlen(cluster_name));
}

uint64_t ds_wire_node_id(const uint8_t pk[32])
{
    return labelled_id("dsnode node id v1", pk, 32);
}
