/*
 * node/sec/session.c: sealing and opening frames in place (see session.h
 * for the construction).
 *
 * Choices worth knowing when changing this file:
 *
 * - The replay window moves only after the tag verified. Otherwise a forged
 *   frame with a huge seq would push every genuine frame out as too_old.
 * - Open checks cheapest first (header, mode, addressing, replay window)
 *   and the AEAD last, so garbage costs no crypto.
 * - AES-256-GCM keys are expanded once per session (the afternm calls), not
 *   per frame; XChaCha20-Poly1305 has no such step.
 * - seq and the byte budget are each taken with one atomic add, so
 *   concurrent sealers never share a nonce and need no lock.
 * - Two libraries run the same AEADs (ds_aead_lib): OpenSSL's EVP, the
 *   default, and libsodium, the plain reference. OpenSSL has no XChaCha20:
 *   it is built as libsodium builds it, HChaCha20 (libsodium's core) of the
 *   key and the nonce's first 16 bytes as the key of RFC 8439's
 *   ChaCha20-Poly1305 (OpenSSL's), with 4 zero bytes || the nonce's last 8
 *   as its nonce. tests/test_crypto.c opens each library's frames with the
 *   other.
 */
#include "config.h"

#include "node/sec/session.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include <openssl/evp.h>

#include "base/log.h"

#define COMP "crypto"

/* ---- OpenSSL's EVP ------------------------------------------------------- */

/* A context for the session's AEAD, sealing (enc 1) or opening (0); the
 * AES-256-GCM key is set here once, XChaCha20's subkey per frame. */
static EVP_CIPHER_CTX *evp_new(unsigned aead, const uint8_t key[DS_SESSION_KEY_BYTES], int enc)
{
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    if (!c)
        return NULL;
    const int aes = aead == DS_AEAD_AES256GCM;
    if (EVP_CipherInit_ex(c, aes ? EVP_aes_256_gcm() : EVP_chacha20_poly1305(), NULL,
                          aes ? key : NULL, NULL, enc) != 1) {
        EVP_CIPHER_CTX_free(c);
        return NULL;
    }
    return c;
}

/* EVP's lengths are ints: feed [p, p + len) in pieces. out NULL feeds
 * associated data. */
static int evp_update(EVP_CIPHER_CTX *c, uint8_t *out, const uint8_t *in, size_t len)
{
    for (size_t o = 0; o < len;) {
        const int step = len - o > (1u << 30) ? 1 << 30 : (int)(len - o);
        int n;
        if (EVP_CipherUpdate(c, out ? out + o : NULL, &n, in + o, step) != 1 ||
            (out && n != step))
            return -1;
        o += (size_t)step;
    }
    return 0;
}

/* A piece of an AEAD's message: in[0..len) -> out (may be in). */
typedef struct evp_piece {
    const uint8_t *in;
    uint8_t *out;
    size_t len;
} evp_piece;

/* One AEAD call: associated data ad[0..adlen), the message in pieces
 * (their concatenation is the message); sealing writes tag, opening checks
 * it. 0, or -1 for a tag that does not verify (or an OpenSSL failure). */
static int evp_aead(EVP_CIPHER_CTX *c, unsigned aead, const uint8_t key[DS_SESSION_KEY_BYTES],
                    const uint8_t npub[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES], int enc,
                    const uint8_t *ad, size_t adlen, const evp_piece *pc, int npc,
                    uint8_t tag[DS_WIRE_TAG_SIZE])
{
    uint8_t sub[crypto_core_hchacha20_OUTPUTBYTES], iv[12];
    const uint8_t *k = NULL;
    if (aead == DS_AEAD_AES256GCM) {
        memcpy(iv, npub, sizeof(iv));
    } else {
        crypto_core_hchacha20(sub, npub, key, NULL);
        memset(iv, 0, 4);
        memcpy(iv + 4, npub + crypto_core_hchacha20_INPUTBYTES, 8);
        k = sub;
    }
    int ok = EVP_CipherInit_ex(c, NULL, NULL, k, iv, enc) == 1;
    if (k)
        sodium_memzero(sub, sizeof(sub));
    int n;
    uint8_t fin[16];
    ok = ok && !evp_update(c, NULL, ad, adlen);
    for (int i = 0; i < npc; i++)
        ok = ok && !evp_update(c, pc[i].out, pc[i].in, pc[i].len);
    if (ok && !enc)
        ok = EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, DS_WIRE_TAG_SIZE, tag) == 1;
    ok = ok && EVP_CipherFinal_ex(c, fin, &n) == 1;
    if (ok && enc)
        ok = EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, DS_WIRE_TAG_SIZE, tag) == 1;
    return ok ? 0 : -1;
}

/* A sealing context: a free one of the session's, or a temporary one
 * (*slot -1) when concurrent sealers hold them all. */
static EVP_CIPHER_CTX *tx_take(ds_session *s, int *slot)
{
    for (int i = 0; i < DS_SESSION_TX_CTXS; i++)
        if (!atomic_flag_test_and_set_explicit(&s->tx_busy[i], memory_order_acquire)) {
            *slot = i;
            return s->tx_ctx[i];
        }
    *slot = -1;
    return evp_new(s->aead, s->tx_key, 1);
}

static void tx_give(ds_session *s, EVP_CIPHER_CTX *c, int slot)
{
    if (slot < 0)
        EVP_CIPHER_CTX_free(c);
    else
        atomic_flag_clear_explicit(&s->tx_busy[slot], memory_order_release);
}

static void evp_free(ds_session *s)
{
    for (int i = 0; i < DS_SESSION_TX_CTXS; i++) {
        EVP_CIPHER_CTX_free(s->tx_ctx[i]); /* cleanses the key schedule */
        s->tx_ctx[i] = NULL;
    }
    EVP_CIPHER_CTX_free(s->rx_ctx);
    s->rx_ctx = NULL;
}

/* ---- sessions ------------------------------------------------------------ */

int ds_session_init(ds_session *s, const ds_session_params *p, const ds_wire_limits *lim,
                    ds_drop_counters *drops)
{
    if (p->mode > DS_SEC_ENCRYPT)
        return -EINVAL;
    if (p->mode != DS_SEC_NONE) {
        if (p->aead != DS_AEAD_AES256GCM && p->aead != DS_AEAD_XCHACHA20)
            return -EINVAL;
        if (p->aead == DS_AEAD_AES256GCM && !crypto_aead_aes256gcm_is_available())
            return -EINVAL;
    }
    memset(s, 0, sizeof(*s));
    s->mode = p->mode;
    s->aead = p->mode == DS_SEC_NONE ? 0 : p->aead;
    memcpy(s->tx_key, p->tx_key, sizeof(s->tx_key));
    memcpy(s->rx_key, p->rx_key, sizeof(s->rx_key));
    s->cluster_id = p->cluster_id;
    s->self_id = p->self_id;
    s->peer_id = p->peer_id;
    atomic_init(&s->tx_seq, 0);
    atomic_init(&s->tx_bytes, 0);
    if (lim)
        s->lim = *lim;
    else
        ds_wire_limits_default(&s->lim);
    s->drops = drops;
    s->lib = ds_aead_lib_get();
    for (int i = 0; i < DS_SESSION_TX_CTXS; i++)
        atomic_flag_clear(&s->tx_busy[i]);
    if (s->aead && s->lib == DS_AEAD_LIB_OPENSSL) {
        int ok = 1;
        for (int i = 0; i < DS_SESSION_TX_CTXS; i++)
            ok = ok && (s->tx_ctx[i] = evp_new(s->aead, s->tx_key, 1)) != NULL;
        ok = ok && (s->rx_ctx = evp_new(s->aead, s->rx_key, 0)) != NULL;
        if (!ok) {
            ds_session_wipe(s);
            return -ENOMEM;
        }
    } else if (s->aead == DS_AEAD_AES256GCM) {
        crypto_aead_aes256gcm_beforenm(&s->tx_aes, s->tx_key);
        crypto_aead_aes256gcm_beforenm(&s->rx_aes, s->rx_key);
    }
    return 0;
}

size_t ds_session_overhead(const ds_session *s)
{
    return s->mode == DS_SEC_NONE ? 0 : DS_WIRE_TAG_SIZE;
}

int ds_session_rekey_due(const ds_session *s)
{
    if (s->aead == DS_AEAD_AES256GCM &&
        atomic_load((_Atomic uint64_t *)&s->tx_bytes) >= DS_SESSION_AESGCM_MAX_BYTES / 4 * 3)
        return 1;
    return atomic_load((_Atomic uint64_t *)&s->tx_seq) >= UINT64_MAX / 4 * 3;
}

void ds_session_wipe(ds_session *s)
{
    if (s) {
        evp_free(s);
        sodium_memzero(s, sizeof(*s));
    }
}

static void nonce_of(uint8_t n[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES], uint64_t seq)
{
    memset(n, 0, crypto_aead_xchacha20poly1305_ietf_NPUBBYTES);
    ds_put64(n, seq);
}

/* What every seal does first: charge the key's byte budget, take the next
 * seq, and write the header fields. frame holds the header; len counts the
 * whole unsealed frame. */
static int seal_begin(ds_session *s, uint8_t *frame, size_t len, const ds_wire_hdr *h,
                      uint64_t *seq_out)
{
    if (s->aead == DS_AEAD_AES256GCM) {
        uint64_t used = atomic_fetch_add(&s->tx_bytes, (uint64_t)len);
        if (used + len > DS_SESSION_AESGCM_MAX_BYTES)
            return -EKEYEXPIRED;
    }
    const uint64_t seq = atomic_fetch_add(&s->tx_seq, 1) + 1;
    if (seq == 0 || seq == UINT64_MAX)
        return -EOVERFLOW;

    ds_put64(frame + DS_WH_CLUSTER, s->cluster_id);
    ds_put64(frame + DS_WH_SENDER, s->self_id);
    ds_put64(frame + DS_WH_RECEIVER, s->peer_id);
    ds_put64(frame + DS_WH_SEQ, seq);
    ds_put16(frame + DS_WH_FLAGS, (uint16_t)((h->flags & ~DS_WF_PROT_MASK) |
                                             ((unsigned)s->mode << DS_WF_PROT_SHIFT)));
    *seq_out = seq;
    return 0;
}

int ds_session_seal(ds_session *s, uint8_t *frame, size_t len, size_t cap, size_t *out_len)
{
    ds_wire_hdr h;
    if (ds_wire_hdr_check(frame, len, &s->lim, &h) != DS_DROP_NONE ||
        ds_wire_is_handshake(h.type) || ds_wire_prot(&h) != DS_PROT_NONE)
        return -EINVAL;
    const size_t over = ds_session_overhead(s);
    if (cap < len || cap - len < over)
        return -ENOSPC;
    uint64_t seq;
    int r = seal_begin(s, frame, len, &h, &seq);
    if (r)
        return r;
    if (s->mode == DS_SEC_NONE) {
        *out_len = len;
        return 0;
    }
    uint8_t nonce[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES];
    nonce_of(nonce, seq);
    uint8_t *payload = frame + DS_WIRE_HDR_SIZE;
    const size_t plen = len - DS_WIRE_HDR_SIZE;
    uint8_t *tag = frame + len;
    const int enc = s->mode == DS_SEC_ENCRYPT;
    /* encrypt: AD = header, message = payload (in place).
     * auth:    AD = header || payload, empty message (libsodium wants a
     *          non-NULL message pointer even for length 0). */
    const uint8_t *ad = frame;
    const size_t adlen = enc ? DS_WIRE_HDR_SIZE : len;
    if (s->lib == DS_AEAD_LIB_OPENSSL) {
        int slot;
        EVP_CIPHER_CTX *c = tx_take(s, &slot);
        const evp_piece pc = {payload, payload, enc ? plen : 0};
        r = c ? evp_aead(c, s->aead, s->tx_key, nonce, 1, ad, adlen, &pc, 1, tag) : -1;
        if (c)
            tx_give(s, c, slot);
        if (r)
            return -ENOMEM; /* the frame's seq is spent: the receiver skips it */
    } else if (s->aead == DS_AEAD_AES256GCM)
        crypto_aead_aes256gcm_encrypt_detached_afternm(payload, tag, NULL, payload,
                                                       enc ? plen : 0, ad, adlen, NULL, nonce,
                                                       &s->tx_aes);
    else
        crypto_aead_xchacha20poly1305_ietf_encrypt_detached(payload, tag, NULL, payload,
                                                            enc ? plen : 0, ad, adlen, NULL,
                                                            nonce, s->tx_key);
    *out_len = len + DS_WIRE_TAG_SIZE;
    return 0;
}

int ds_session_seal_ref(ds_session *s, uint8_t *head, size_t head_len, const uint8_t *body,
                        size_t body_len, uint8_t tag[DS_WIRE_TAG_SIZE], size_t *tag_len)
{
    ds_wire_hdr h;
    if (!head || head_len < DS_WIRE_HDR_SIZE || (body_len && !body) ||
        body_len > SIZE_MAX - head_len ||
        ds_wire_hdr_check(head, head_len + body_len, &s->lim, &h) != DS_DROP_NONE ||
        ds_wire_is_handshake(h.type) || ds_wire_prot(&h) != DS_PROT_NONE)
        return -EINVAL;
    /* Mode none only. auth would need the AEAD over header || payload in
     * two pieces, which libsodium 1.0.18 does not offer (its AES-GCM takes
     * the associated data whole); a GHASH correction of our own worked and
     * matched byte for byte, but gained nothing measurable (the receiver's
     * pass over the payload is the slower stage) and is crypto we would
     * have to own: not worth it (docs/decisions.md). */
    if (s->mode != DS_SEC_NONE)
        return -ENOTSUP;
    uint64_t seq;
    int r = seal_begin(s, head, head_len + body_len, &h, &seq);
    if (r)
        return r;
    (void)tag;
    *tag_len = 0;
    return 0;
}

int ds_session_seal_from(ds_session *s, uint8_t *frame, size_t head_len, const uint8_t *body,
                         size_t body_len, size_t cap, size_t *out_len)
{
    ds_wire_hdr h;
    if (!frame || head_len < DS_WIRE_HDR_SIZE || (body_len && !body) ||
        body_len > SIZE_MAX - head_len ||
        ds_wire_hdr_check(frame, head_len + body_len, &s->lim, &h) != DS_DROP_NONE ||
        ds_wire_is_handshake(h.type) || ds_wire_prot(&h) != DS_PROT_NONE)
        return -EINVAL;
    const size_t len = head_len + body_len;
    if (cap < len || cap - len < ds_session_overhead(s))
        return -ENOSPC;
    /* One pass (encrypt, AES-256-GCM on OpenSSL): the body is encrypted
     * from where it is into the frame. Otherwise copy, then seal in place:
     * OpenSSL's ChaCha20-Poly1305 ran slower out of place than a copy plus
     * in place (dsbench wire, copy_seal_us / seal_from_us; benchmarks.md). */
    if (s->mode != DS_SEC_ENCRYPT || s->lib != DS_AEAD_LIB_OPENSSL ||
        s->aead != DS_AEAD_AES256GCM) {
        if (body_len)
            memcpy(frame + head_len, body, body_len);
        return ds_session_seal(s, frame, len, cap, out_len);
    }
    uint64_t seq;
    int r = seal_begin(s, frame, len, &h, &seq);
    if (r)
        return r;
    uint8_t nonce[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES];
    nonce_of(nonce, seq);
    const evp_piece pc[2] = {
        {frame + DS_WIRE_HDR_SIZE, frame + DS_WIRE_HDR_SIZE, head_len - DS_WIRE_HDR_SIZE},
        {body, frame + head_len, body_len},
    };
    int slot;
    EVP_CIPHER_CTX *c = tx_take(s, &slot);
    r = c ? evp_aead(c, s->aead, s->tx_key, nonce, 1, frame, DS_WIRE_HDR_SIZE, pc, 2, frame + len)
          : -1;
    if (c)
        tx_give(s, c, slot);
    if (r)
        return -ENOMEM;
    *out_len = len + DS_WIRE_TAG_SIZE;
    return 0;
}

enum ds_drop_reason ds_session_open(ds_session *s, uint8_t *frame, size_t len)
{
    ds_wire_hdr h;
    enum ds_drop_reason r = ds_wire_hdr_check(frame, len, &s->lim, &h);
    if (r != DS_DROP_NONE)
        goto drop;
    if (ds_wire_is_handshake(h.type)) {
        r = DS_DROP_UNEXPECTED;
        goto drop;
    }
    if (ds_wire_prot(&h) != (unsigned)s->mode) {
        r = DS_DROP_POLICY_MISMATCH;
        goto drop;
    }
    if (h.cluster != s->cluster_id) {
        r = DS_DROP_WRONG_CLUSTER;
        goto drop;
    }
    if (h.sender != s->peer_id) {
        r = DS_DROP_WRONG_SENDER;
        goto drop;
    }
    if (h.receiver != s->self_id) {
        r = DS_DROP_WRONG_RECEIVER;
        goto drop;
    }
    r = ds_replay_check(&s->rx, h.seq);
    if (r != DS_DROP_NONE)
        goto drop;
    if (s->mode != DS_SEC_NONE) {
        uint8_t nonce[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES];
        nonce_of(nonce, h.seq);
        const size_t plen = h.payload_len;
        uint8_t *payload = frame + DS_WIRE_HDR_SIZE;
        const uint8_t *tag = payload + plen;
        const int enc = s->mode == DS_SEC_ENCRYPT;
        const size_t adlen = enc ? DS_WIRE_HDR_SIZE : DS_WIRE_HDR_SIZE + plen;
        int bad;
        if (s->lib == DS_AEAD_LIB_OPENSSL)
            bad = evp_aead(s->rx_ctx, s->aead, s->rx_key, nonce, 0, frame, adlen,
                           &(evp_piece){payload, payload, enc ? plen : 0}, 1, (uint8_t *)tag);
        else if (s->aead == DS_AEAD_AES256GCM)
            bad = crypto_aead_aes256gcm_decrypt_detached_afternm(
                payload, NULL, payload, enc ? plen : 0, tag, frame, adlen, nonce, &s->rx_aes);
        else
            bad = crypto_aead_xchacha20poly1305_ietf_decrypt_detached(
                payload, NULL, payload, enc ? plen : 0, tag, frame, adlen, nonce, s->rx_key);
        if (bad) {
            r = DS_DROP_BAD_TAG;
            goto drop;
        }
    }
    ds_replay_mark(&s->rx, h.seq);
    return DS_DROP_NONE;
drop:
    ds_drop_note(s->drops, r, COMP, "peer=%016" PRIx64 " type=%s seq=%" PRIu64 " len=%zu",
                 s->peer_id, len >= DS_WIRE_HDR_SIZE ? ds_msg_type_name(frame[DS_WH_TYPE]) : "-",
                 len >= DS_WIRE_HDR_SIZE ? ds_le64(frame + DS_WH_SEQ) : 0, len);
    return r;
}
