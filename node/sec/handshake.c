/*
 * node/sec/handshake.c: the three-frame handshake (see handshake.h for the
 * protocol and docs/security.md for the threat model).
 *
 * Choices worth knowing when changing this file:
 *
 * - Every read is all-or-nothing. A frame is checked completely
 *   (structure, policy, admission, signature, cluster-key MAC, key
 *   exchange) into locals before any field of the handshake is written
 *   (the "Accepted: commit" blocks), so a forged or corrupted frame leaves
 *   the handshake exactly as it was and the genuine frame can still
 *   complete it.
 * - Checks run cheapest first, but the signature comes before the cluster
 *   key MAC: a corrupted frame then reports bad_signature, and bad_mac is
 *   left to what it means (the peer holds another cluster key).
 * - The session keys come from crypto_kx and are then hashed with the
 *   whole transcript, so a session is bound to the names, identities and
 *   cipher choice it was negotiated for, not only to the ephemeral keys.
 * - The frames are laid out by node/wire (hello.h pins the payloads); this
 *   file signs and hashes them at those offsets, header included.
 */
#include "config.h"

#include "node/sec/handshake.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "node/sec/internal.h"

#define COMP "crypto"

/* Offsets inside the frames (header included). */
#define HS_BODY_END (DS_WIRE_HDR_SIZE + DS_WIRE_HELLO_BODY)
#define HELLO_SIG (DS_WIRE_HDR_SIZE + DS_WHELLO_SIG)
#define HELLO_MAC (DS_WIRE_HDR_SIZE + DS_WHELLO_MAC)
#define ACK_SIG (DS_WIRE_HDR_SIZE + DS_WACK_SIG)
#define ACK_MAC (DS_WIRE_HDR_SIZE + DS_WACK_MAC)
#define FIN_SIG (DS_WIRE_HDR_SIZE + DS_WFIN_SIG)
#define FIN_MAC (DS_WIRE_HDR_SIZE + DS_WFIN_MAC)
#define HELLO_LEN (DS_WIRE_HDR_SIZE + DS_WIRE_HELLO_SIZE)
#define ACK_LEN (DS_WIRE_HDR_SIZE + DS_WIRE_HELLO_ACK_SIZE)
#define FIN_LEN (DS_WIRE_HDR_SIZE + DS_WIRE_HELLO_FIN_SIZE)
/* What is signed ends where the proofs begin: the HELLO's at its body's
 * end, the HELLO_ACK's after its echo, the HELLO_FIN's after its echo. */
static_assert(HELLO_SIG == HS_BODY_END, "hello proofs follow the body");
static_assert(ACK_SIG == HS_BODY_END + 32, "ack proofs follow the echo");
static_assert(FIN_SIG == DS_WIRE_HDR_SIZE + 32, "fin proofs follow the echo");
static_assert(HELLO_MAC + 32 == HELLO_LEN, "hello tail");
static_assert(ACK_MAC + 32 == ACK_LEN, "ack tail");
static_assert(FIN_MAC + 32 == FIN_LEN, "fin tail");

/* H(label || a || b || c), BLAKE2b-256; b, c may be NULL. */
static void th(uint8_t out[32], const char *label, const uint8_t *a, size_t al, const uint8_t *b,
               size_t bl, const uint8_t *c, size_t cl)
{
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, 32);
    crypto_generichash_update(&st, (const uint8_t *)label, strlen(label));
    crypto_generichash_update(&st, a, al);
    if (b)
        crypto_generichash_update(&st, b, bl);
    if (c)
        crypto_generichash_update(&st, c, cl);
    crypto_generichash_final(&st, out, 32);
    sodium_memzero(&st, sizeof(st));
}

static unsigned admission_of(const ds_hs_config *c)
{
    return (c->cluster_key ? DS_ADMIT_CLUSTER_KEY : 0u) | (c->allow ? DS_ADMIT_ALLOWLIST : 0u);
}

static int hs_init(ds_hs *hs, const ds_hs_config *cfg)
{
    if (!cfg || !cfg->identity || !ds_sec_name_ok(cfg->name, 1, DS_WIRE_NAME_MAX + 1) ||
        (cfg->address && cfg->address[0] &&
         !ds_sec_name_ok(cfg->address, 0, DS_WIRE_ADDR_MAX + 1)) ||
        cfg->mode > DS_SEC_ENCRYPT || admission_of(cfg) == 0)
        return -EINVAL;
    unsigned aeads = 0;
    if (cfg->mode != DS_SEC_NONE) {
        aeads = (cfg->aeads ? cfg->aeads : DS_AEAD_ALL) & ds_aead_available();
        if (!aeads)
            return -EINVAL;
    }
    memset(hs, 0, sizeof(*hs));
    hs->cfg = *cfg;
    if (!hs->cfg.address)
        hs->cfg.address = "";
    hs->my_aeads = aeads;
    return 0;
}

int ds_hs_init_initiator(ds_hs *hs, const ds_hs_config *cfg, uint64_t expect_peer)
{
    int rc = hs_init(hs, cfg);
    if (rc)
        return rc;
    hs->initiator = 1;
    hs->expect_peer = expect_peer;
    crypto_kx_keypair(hs->eph_pk, hs->eph_sk);
    hs->state = DS_HS_SEND_HELLO;
    return 0;
}

int ds_hs_init_responder(ds_hs *hs, const ds_hs_config *cfg)
{
    int rc = hs_init(hs, cfg);
    if (rc)
        return rc;
    hs->state = DS_HS_WAIT_HELLO;
    return 0;
}

int ds_hs_want_write(const ds_hs *hs)
{
    return hs->state == DS_HS_SEND_HELLO || hs->state == DS_HS_SEND_ACK ||
           hs->state == DS_HS_SEND_FIN;
}

int ds_hs_done(const ds_hs *hs)
{
    return hs->state == DS_HS_DONE;
}

void ds_hs_set_allowlist(ds_hs *hs, const ds_allowlist *al)
{
    if (hs && hs->cfg.allow && al)
        hs->cfg.allow = al;
}

const ds_peer_info *ds_hs_peer(const ds_hs *hs)
{
    return hs->state == DS_HS_DONE ? &hs->peer : NULL;
}

void ds_hs_wipe(ds_hs *hs)
{
    if (hs)
        sodium_memzero(hs, sizeof(*hs));
}

static void hs_hdr(const ds_hs *hs, ds_wire_msg *m, uint8_t type, uint64_t receiver)
{
    memset(m, 0, sizeof(*m));
    m->h.type = type;
    m->h.cluster = hs->cfg.cluster_id;
    m->h.sender = hs->cfg.identity->id;
    m->h.receiver = receiver;
}

static void hs_body(const ds_hs *hs, ds_wire_hello *b, unsigned aeads)
{
    b->mode = (uint8_t)hs->cfg.mode;
    b->aeads = (uint8_t)aeads;
    b->admission = (uint8_t)admission_of(&hs->cfg);
    memcpy(b->pk, hs->cfg.identity->pk, DS_PK_BYTES);
    memcpy(b->eph, hs->eph_pk, sizeof(hs->eph_pk));
    snprintf(b->name, sizeof(b->name), "%s", hs->cfg.name);
    snprintf(b->addr, sizeof(b->addr), "%s", hs->cfg.address);
}

/* Sign h and, with a cluster key, MAC it; both into the frame. */
static void hs_prove(const ds_hs *hs, const uint8_t h[32], uint8_t *sig, uint8_t *mac)
{
    crypto_sign_detached(sig, NULL, h, 32, hs->cfg.identity->sk);
    if (hs->cfg.cluster_key)
        crypto_auth(mac, h, 32, hs->cfg.cluster_key->k);
    else
        memset(mac, 0, 32);
}

/* Verify a peer's proof; the reason or NONE. */
static enum ds_drop_reason hs_verify(const ds_hs *hs, const uint8_t h[32], const uint8_t *sig,
                                     const uint8_t *mac, const uint8_t *peer_pk)
{
    if (crypto_sign_verify_detached(sig, h, 32, peer_pk) != 0)
        return DS_DROP_BAD_SIGNATURE;
    if (hs->cfg.cluster_key) {
        if (crypto_auth_verify(mac, h, 32, hs->cfg.cluster_key->k) != 0)
            return DS_DROP_BAD_MAC;
    } else if (!sodium_is_zero(mac, 32)) {
        return DS_DROP_BAD_FIELD;
    }
    return DS_DROP_NONE;
}

/* Final keys: each crypto_kx key hashed with the whole transcript. */
static void hs_finish(ds_hs *hs, const uint8_t h3[32])
{
    static const char label[] = "dsnode hs v1 session";
    uint8_t msg[sizeof(label) - 1 + 32];
    memcpy(msg, label, sizeof(label) - 1);
    memcpy(msg + sizeof(label) - 1, h3, 32);
    ds_session_params *o = &hs->out;
    o->mode = hs->cfg.mode;
    o->aead = hs->aead;
    crypto_generichash(o->tx_key, 32, msg, sizeof(msg), hs->kx_tx, sizeof(hs->kx_tx));
    crypto_generichash(o->rx_key, 32, msg, sizeof(msg), hs->kx_rx, sizeof(hs->kx_rx));
    o->cluster_id = hs->cfg.cluster_id;
    o->self_id = hs->cfg.identity->id;
    o->peer_id = hs->peer.id;
    hs->have_out = 1;
    hs->peer.mode = hs->cfg.mode;
    hs->peer.aead = hs->aead;
    sodium_memzero(hs->kx_tx, sizeof(hs->kx_tx));
    sodium_memzero(hs->kx_rx, sizeof(hs->kx_rx));
    sodium_memzero(hs->eph_sk, sizeof(hs->eph_sk));
    hs->state = DS_HS_DONE;
}

int ds_hs_write(ds_hs *hs, uint8_t *out, size_t cap, size_t *len)
{
    ds_wire_msg m;
    size_t n = 0;
    int rc;
    switch (hs->state) {
    case DS_HS_SEND_HELLO:
        if (cap < HELLO_LEN)
            return -ENOSPC;
        hs_hdr(hs, &m, DS_MSG_HELLO, hs->expect_peer);
        hs_body(hs, &m.u.hello, hs->my_aeads);
        rc = ds_wire_encode(hs->hello, sizeof(hs->hello), &m, &n);
        if (rc)
            return rc;
        th(hs->h1, "dsnode hs v1 hello", hs->hello, HS_BODY_END, NULL, 0, NULL, 0);
        hs_prove(hs, hs->h1, hs->hello + HELLO_SIG, hs->hello + HELLO_MAC);
        memcpy(out, hs->hello, HELLO_LEN);
        *len = HELLO_LEN;
        hs->state = DS_HS_WAIT_ACK;
        return 0;
    case DS_HS_SEND_ACK:
        if (cap < ACK_LEN)
            return -ENOSPC;
        hs_hdr(hs, &m, DS_MSG_HELLO_ACK, hs->peer.id);
        hs_body(hs, &m.u.hello, hs->aead);
        memcpy(m.u.hello.echo, hs->h1, 32);
        rc = ds_wire_encode(hs->ack, sizeof(hs->ack), &m, &n);
        if (rc)
            return rc;
        th(hs->h2, "dsnode hs v1 ack", hs->hello, HELLO_LEN, hs->ack, ACK_SIG, NULL, 0);
        hs_prove(hs, hs->h2, hs->ack + ACK_SIG, hs->ack + ACK_MAC);
        memcpy(out, hs->ack, ACK_LEN);
        *len = ACK_LEN;
        hs->state = DS_HS_WAIT_FIN;
        return 0;
    case DS_HS_SEND_FIN: {
        uint8_t fin[FIN_LEN], h3[32];
        if (cap < FIN_LEN)
            return -ENOSPC;
        hs_hdr(hs, &m, DS_MSG_HELLO_FIN, hs->peer.id);
        memcpy(m.u.fin.echo, hs->h2, 32);
        rc = ds_wire_encode(fin, sizeof(fin), &m, &n);
        if (rc)
            return rc;
        th(h3, "dsnode hs v1 fin", hs->hello, HELLO_LEN, hs->ack, ACK_LEN, fin, FIN_SIG);
        hs_prove(hs, h3, fin + FIN_SIG, fin + FIN_MAC);
        memcpy(out, fin, FIN_LEN);
        *len = FIN_LEN;
        hs_finish(hs, h3);
        return 0;
    }
    default:
        return -EAGAIN;
    }
}

/* Checks shared by HELLO and HELLO_ACK bodies, before any crypto. */
static enum ds_drop_reason hs_check_body(const ds_hs *hs, const ds_wire_msg *m)
{
    const ds_wire_hello *b = &m->u.hello;
    if (m->h.sender != ds_wire_node_id(b->pk))
        return DS_DROP_WRONG_SENDER;
    if (b->mode != hs->cfg.mode || b->admission != admission_of(&hs->cfg))
        return DS_DROP_POLICY_MISMATCH;
    if (sodium_memcmp(b->pk, hs->cfg.identity->pk, DS_PK_BYTES) == 0)
        return DS_DROP_NOT_ALLOWED; /* ourselves, e.g. a reflected frame */
    if (hs->cfg.allow && ds_allowlist_check(hs->cfg.allow, b->pk, b->name) != 0)
        return DS_DROP_NOT_ALLOWED;
    return DS_DROP_NONE;
}

static unsigned pick_aead(unsigned common)
{
    return (common & DS_AEAD_AES256GCM) ? DS_AEAD_AES256GCM
                                        : (common & DS_AEAD_XCHACHA20 ? DS_AEAD_XCHACHA20 : 0);
}

static void peer_from(ds_peer_info *p, const ds_wire_hello *b)
{
    memcpy(p->pk, b->pk, DS_PK_BYTES);
    p->id = ds_wire_node_id(b->pk);
    snprintf(p->name, sizeof(p->name), "%s", b->name);
    snprintf(p->address, sizeof(p->address), "%s", b->addr);
}

/* WAIT_HELLO: a HELLO from an admitted key that shares an AEAD with us. */
static enum ds_drop_reason read_hello(ds_hs *hs, const uint8_t *frame, const ds_wire_msg *m)
{
    uint8_t h[32];
    enum ds_drop_reason r;
    const unsigned t = m->h.type;
    if (t != DS_MSG_HELLO)
        return t == DS_MSG_HELLO_FIN ? DS_DROP_STALE_HANDSHAKE : DS_DROP_UNEXPECTED;
    if (m->h.receiver != 0 && m->h.receiver != hs->cfg.identity->id)
        return DS_DROP_WRONG_RECEIVER;
    if ((r = hs_check_body(hs, m)) != DS_DROP_NONE)
        return r;
    const unsigned common = m->u.hello.aeads & hs->my_aeads;
    if (hs->cfg.mode != DS_SEC_NONE ? common == 0 : m->u.hello.aeads != 0)
        return DS_DROP_POLICY_MISMATCH;
    th(h, "dsnode hs v1 hello", frame, HS_BODY_END, NULL, 0, NULL, 0);
    if ((r = hs_verify(hs, h, frame + HELLO_SIG, frame + HELLO_MAC, m->u.hello.pk)) !=
        DS_DROP_NONE)
        return r;
    /* Accepted: commit. */
    memcpy(hs->hello, frame, HELLO_LEN);
    memcpy(hs->h1, h, 32);
    peer_from(&hs->peer, &m->u.hello);
    memcpy(hs->peer_eph, m->u.hello.eph, sizeof(hs->peer_eph));
    hs->aead = pick_aead(common);
    crypto_kx_keypair(hs->eph_pk, hs->eph_sk);
    hs->state = DS_HS_SEND_ACK;
    return DS_DROP_NONE;
}

/* WAIT_ACK: the answer to our HELLO, from the peer we dialled, with one
 * AEAD we offered. */
static enum ds_drop_reason read_ack(ds_hs *hs, const uint8_t *frame, const ds_wire_msg *m)
{
    uint8_t h[32];
    enum ds_drop_reason r;
    if (m->h.type != DS_MSG_HELLO_ACK)
        return DS_DROP_UNEXPECTED;
    if (m->h.receiver != hs->cfg.identity->id)
        return DS_DROP_WRONG_RECEIVER;
    if (hs->expect_peer && m->h.sender != hs->expect_peer)
        return DS_DROP_WRONG_SENDER;
    if (sodium_memcmp(m->u.hello.echo, hs->h1, 32) != 0)
        return DS_DROP_STALE_HANDSHAKE;
    if ((r = hs_check_body(hs, m)) != DS_DROP_NONE)
        return r;
    const unsigned a = m->u.hello.aeads;
    if (hs->cfg.mode != DS_SEC_NONE ? (a != pick_aead(a) || !(a & hs->my_aeads)) : a != 0)
        return DS_DROP_POLICY_MISMATCH;
    th(h, "dsnode hs v1 ack", hs->hello, HELLO_LEN, frame, ACK_SIG, NULL, 0);
    if ((r = hs_verify(hs, h, frame + ACK_SIG, frame + ACK_MAC, m->u.hello.pk)) != DS_DROP_NONE)
        return r;
    uint8_t rx[crypto_kx_SESSIONKEYBYTES], tx[crypto_kx_SESSIONKEYBYTES];
    if (crypto_kx_client_session_keys(rx, tx, hs->eph_pk, hs->eph_sk, m->u.hello.eph) != 0)
        return DS_DROP_BAD_FIELD; /* a degenerate ephemeral key */
    /* Accepted: commit. */
    memcpy(hs->kx_rx, rx, sizeof(rx));
    memcpy(hs->kx_tx, tx, sizeof(tx));
    sodium_memzero(rx, sizeof(rx));
    sodium_memzero(tx, sizeof(tx));
    memcpy(hs->ack, frame, ACK_LEN);
    memcpy(hs->h2, h, 32);
    peer_from(&hs->peer, &m->u.hello);
    memcpy(hs->peer_eph, m->u.hello.eph, sizeof(hs->peer_eph));
    hs->aead = a;
    hs->state = DS_HS_SEND_FIN;
    return DS_DROP_NONE;
}

/* WAIT_FIN: the initiator's proof over the whole transcript. */
static enum ds_drop_reason read_fin(ds_hs *hs, const uint8_t *frame, const ds_wire_msg *m)
{
    uint8_t h[32];
    enum ds_drop_reason r;
    if (m->h.type != DS_MSG_HELLO_FIN)
        return DS_DROP_UNEXPECTED;
    if (m->h.sender != hs->peer.id)
        return DS_DROP_WRONG_SENDER;
    if (m->h.receiver != hs->cfg.identity->id)
        return DS_DROP_WRONG_RECEIVER;
    if (sodium_memcmp(m->u.fin.echo, hs->h2, 32) != 0)
        return DS_DROP_STALE_HANDSHAKE;
    th(h, "dsnode hs v1 fin", hs->hello, HELLO_LEN, hs->ack, ACK_LEN, frame, FIN_SIG);
    if ((r = hs_verify(hs, h, frame + FIN_SIG, frame + FIN_MAC, hs->peer.pk)) != DS_DROP_NONE)
        return r;
    uint8_t rx[crypto_kx_SESSIONKEYBYTES], tx[crypto_kx_SESSIONKEYBYTES];
    if (crypto_kx_server_session_keys(rx, tx, hs->eph_pk, hs->eph_sk, hs->peer_eph) != 0)
        return DS_DROP_BAD_FIELD;
    /* Accepted: commit. */
    memcpy(hs->kx_rx, rx, sizeof(rx));
    memcpy(hs->kx_tx, tx, sizeof(tx));
    sodium_memzero(rx, sizeof(rx));
    sodium_memzero(tx, sizeof(tx));
    hs_finish(hs, h);
    return DS_DROP_NONE;
}

/* The allow-list line that would admit the key a HELLO or HELLO_ACK
 * presented: "<64 hex> <name>", the name left out when the allow-list
 * could not carry it ('#' starts a comment there). */
static void allow_line(const ds_wire_hello *b, char *out, size_t cap)
{
    char hex[2 * DS_PK_BYTES + 1];
    ds_pk_to_hex(b->pk, hex);
    const int named = ds_sec_name_ok(b->name, 1, DS_WIRE_NAME_MAX + 1) && !strchr(b->name, '#');
    snprintf(out, cap, "%s%s%s", hex, named ? " " : "", named ? b->name : "");
}

/* A peer refused by the allow-list: count it, and log (rate-limited) one
 * line an operator can act on: the key exactly as an allow-list line, or
 * that the key is listed under another name. 0 when the refusal is of
 * another kind (our own key reflected back) and the caller logs it. */
static int note_not_allowed(const ds_hs *hs, const ds_wire_msg *m)
{
    const ds_wire_hello *b = &m->u.hello;
    if ((m->h.type != DS_MSG_HELLO && m->h.type != DS_MSG_HELLO_ACK) || !hs->cfg.allow ||
        sodium_memcmp(b->pk, hs->cfg.identity->pk, DS_PK_BYTES) == 0)
        return 0;
    char line[2 * DS_PK_BYTES + DS_WIRE_NAME_MAX + 2];
    allow_line(b, line, sizeof(line));
    if (ds_allowlist_check(hs->cfg.allow, b->pk, b->name) == -EPERM) {
        ds_drop_note(hs->cfg.drops, DS_DROP_NOT_ALLOWED, COMP,
                     "type=%s sender=%016" PRIx64 " addr=%s: key listed under another name "
                     "than the one presented; it presented: %s",
                     ds_msg_type_name(m->h.type), m->h.sender, b->addr, line);
        return 1;
    }
    ds_drop_note(hs->cfg.drops, DS_DROP_NOT_ALLOWED, COMP,
                 "type=%s sender=%016" PRIx64 " addr=%s: key not on the allow-list "
                 "(presented, signature not yet checked); to admit it, add this line: %s",
                 ds_msg_type_name(m->h.type), m->h.sender, b->addr, line);
    return 1;
}

enum ds_drop_reason ds_hs_read(ds_hs *hs, const uint8_t *frame, size_t len)
{
    ds_wire_limits lim;
    ds_wire_msg m;
    enum ds_drop_reason r;
    ds_wire_limits_default(&lim);
    /* Wire-level problems are counted and logged by the decoder. */
    r = ds_wire_decode(frame, len, &lim, NULL, &m, hs->cfg.drops);
    if (r != DS_DROP_NONE)
        return r;
    const unsigned t = m.h.type;
    if (!ds_wire_is_handshake(t)) {
        r = DS_DROP_UNEXPECTED;
    } else if (m.h.round || m.h.epoch || m.h.segment || m.h.seq) {
        r = DS_DROP_BAD_FIELD;
    } else if (m.h.cluster != hs->cfg.cluster_id) {
        r = DS_DROP_WRONG_CLUSTER;
    } else {
        switch (hs->state) {
        case DS_HS_WAIT_HELLO: r = read_hello(hs, frame, &m); break;
        case DS_HS_WAIT_ACK: r = read_ack(hs, frame, &m); break;
        case DS_HS_WAIT_FIN: r = read_fin(hs, frame, &m); break;
        default:
            /* Our turn to write, or finished: nothing from the peer fits. */
            r = hs->state == DS_HS_DONE || t == DS_MSG_HELLO_FIN ? DS_DROP_STALE_HANDSHAKE
                                                                  : DS_DROP_UNEXPECTED;
            break;
        }
    }
    if (r == DS_DROP_NONE)
        return r;
    if (r == DS_DROP_NOT_ALLOWED && note_not_allowed(hs, &m))
        return r;
    ds_drop_note(hs->cfg.drops, r, COMP, "handshake=%s state=%d type=%s sender=%016" PRIx64,
                 hs->initiator ? "initiator" : "responder", (int)hs->state,
                 ds_msg_type_name(t), m.h.sender);
    return r;
}

int ds_hs_session(ds_hs *hs, ds_session *s, const ds_wire_limits *lim)
{
    if (hs->state != DS_HS_DONE)
        return -EAGAIN;
    if (!hs->have_out)
        return -EALREADY;
    int rc = ds_session_init(s, &hs->out, lim, hs->cfg.drops);
    sodium_memzero(&hs->out, sizeof(hs->out));
    hs->have_out = 0;
    return rc;
}
