/*
 * node/sec/keys.c: the node identity and the cluster key, and their files
 * (see keys.h; formats in docs/security.md).
 *
 * A key file is one line "<tag> <hex>", '#' comments and blank lines
 * around it. The tag names the kind of key, so an identity given where a
 * cluster key belongs (or the reverse) is refused with a message that says
 * which file was expected, instead of being used as the wrong key. The
 * loader checks that an identity's stored public half is the one its seed
 * derives: a damaged file fails at load, not as a handshake no peer
 * accepts.
 */
#include "config.h"

#include "node/sec/keys.h"

#include <errno.h>
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "node/sec/internal.h"

#define ID_TAG "dsnode-identity-v1"
#define CK_TAG "dsnode-cluster-key-v1"
#define KEY_FILE_MAX 4096

/* ---- hex ---------------------------------------------------------------------- */

static int is_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

void ds_pk_to_hex(const uint8_t pk[DS_PK_BYTES], char out[2 * DS_PK_BYTES + 1])
{
    sodium_bin2hex(out, 2 * DS_PK_BYTES + 1, pk, DS_PK_BYTES);
}

/* Exactly 2*n hex digits into n bytes. */
static int hex_exact(uint8_t *out, size_t n, const char *hex, size_t len)
{
    if (len != 2 * n)
        return -EINVAL;
    for (size_t i = 0; i < len; i++)
        if (!is_hex(hex[i]))
            return -EINVAL;
    size_t got = 0;
    if (sodium_hex2bin(out, n, hex, len, NULL, &got, NULL) != 0 || got != n)
        return -EINVAL;
    return 0;
}

int ds_pk_from_hex(uint8_t pk[DS_PK_BYTES], const char *hex, size_t len)
{
    return hex_exact(pk, DS_PK_BYTES, hex, len);
}

/* ---- key files ------------------------------------------------------------------ */

/* Parse "<tag> <hex of n bytes>" from a key file: '#' comments and blank
 * lines allowed around it, nothing else. */
static int parse_key_text(const char *text, size_t len, const char *tag, uint8_t *out, size_t n,
                          const char *what, char *err, size_t errlen)
{
    const char *p = text, *end = text + len;
    int line = 0, found = 0;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol)
            eol = end;
        line++;
        const char *ls = p, *a = p, *b = eol;
        p = eol + (eol < end);
        while (a < b && (*a == ' ' || *a == '\t' || *a == '\r'))
            a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t' || b[-1] == '\r'))
            b--;
        if (a == b || *a == '#')
            continue;
        if (found) {
            ds_sec_seterr(err, errlen, "%s:%d: unexpected text after the key", what, line);
            return -EINVAL;
        }
        const char *sp = a;
        while (sp < b && *sp != ' ' && *sp != '\t')
            sp++;
        if ((size_t)(sp - a) != strlen(tag) || memcmp(a, tag, strlen(tag)) != 0) {
            ds_sec_seterr(err, errlen,
                          "%s:%d: not a %s file (expected '%s <hex>', found '%.*s')", what, line,
                          strcmp(tag, ID_TAG) ? "dsnode cluster key" : "dsnode identity", tag,
                          (int)((sp - a) > 40 ? 40 : (sp - a)), a);
            return -EINVAL;
        }
        while (sp < b && (*sp == ' ' || *sp == '\t'))
            sp++;
        const char *hex = sp;
        while (sp < b && *sp != ' ' && *sp != '\t')
            sp++;
        const size_t hl = (size_t)(sp - hex);
        for (size_t i = 0; i < hl; i++)
            if (!is_hex(hex[i])) {
                ds_sec_seterr(err, errlen, "%s:%d: bad character in the key at column %zu", what,
                              line, (size_t)(hex - ls) + i + 1);
                return -EINVAL;
            }
        if (hl != 2 * n) {
            ds_sec_seterr(err, errlen, "%s:%d: %s key: %zu hex digits, expected %zu", what, line,
                          hl < 2 * n ? "truncated" : "overlong", hl, 2 * n);
            return -EINVAL;
        }
        if (sp != b) {
            ds_sec_seterr(err, errlen, "%s:%d: unexpected text after the key", what, line);
            return -EINVAL;
        }
        if (hex_exact(out, n, hex, hl) != 0) {
            ds_sec_seterr(err, errlen, "%s:%d: bad key", what, line);
            return -EINVAL;
        }
        found = 1;
    }
    if (!found) {
        ds_sec_seterr(err, errlen, "%s: no key in file (expected a line '%s <hex>')", what, tag);
        return -EINVAL;
    }
    return 0;
}

/* ---- identity ---------------------------------------------------------------- */

int ds_identity_generate(ds_identity *out)
{
    if (crypto_sign_keypair(out->pk, out->sk) != 0)
        return -EIO;
    out->id = ds_wire_node_id(out->pk);
    return 0;
}

void ds_identity_wipe(ds_identity *id)
{
    if (id)
        sodium_memzero(id, sizeof(*id));
}

int ds_identity_load(ds_identity *out, const char *path, char *err, size_t errlen)
{
    char buf[KEY_FILE_MAX];
    size_t len = 0;
    uint8_t seed[crypto_sign_SEEDBYTES], pk[DS_PK_BYTES], sk[DS_SK_BYTES];
    int rc = ds_sec_read_file(path, buf, sizeof(buf), &len, 1, err, errlen);
    if (rc)
        goto out_wipe;
    rc = parse_key_text(buf, len, ID_TAG, out->sk, DS_SK_BYTES, path, err, errlen);
    if (rc)
        goto out_wipe;
    /* The stored public half must be the one the seed derives. */
    crypto_sign_ed25519_sk_to_seed(seed, out->sk);
    if (crypto_sign_seed_keypair(pk, sk, seed) != 0 ||
        sodium_memcmp(pk, out->sk + crypto_sign_SEEDBYTES, DS_PK_BYTES) != 0) {
        ds_sec_seterr(err, errlen, "%s: damaged key: public half does not match the secret", path);
        rc = -EINVAL;
        goto out_wipe;
    }
    memcpy(out->pk, pk, DS_PK_BYTES);
    out->id = ds_wire_node_id(out->pk);
out_wipe:
    sodium_memzero(buf, sizeof(buf));
    sodium_memzero(seed, sizeof(seed));
    sodium_memzero(sk, sizeof(sk));
    if (rc)
        sodium_memzero(out, sizeof(*out));
    return rc;
}

int ds_identity_save(const ds_identity *id, const char *path, const char *name, int force,
                     char *err, size_t errlen)
{
    char pubpath[PATH_MAX];
    char text[256];
    char pubtext[256];
    char hex[2 * DS_SK_BYTES + 1];
    char pkhex[2 * DS_PK_BYTES + 1];
    int rc;
    if (name && !ds_sec_name_ok(name, 1, DS_WIRE_NAME_MAX + 1)) {
        ds_sec_seterr(err, errlen, "name '%s': 1..%d printable characters, no spaces", name,
                      DS_WIRE_NAME_MAX);
        return -EINVAL;
    }
    if (snprintf(pubpath, sizeof(pubpath), "%s.pub", path) >= (int)sizeof(pubpath)) {
        ds_sec_seterr(err, errlen, "%s: path too long", path);
        return -ENAMETOOLONG;
    }
    /* Refuse before writing anything, so a refusal leaves no half pair. */
    if (!force && (access(path, F_OK) == 0 || access(pubpath, F_OK) == 0)) {
        ds_sec_seterr(err, errlen, "%s exists; use --force to overwrite it",
                      access(path, F_OK) == 0 ? path : pubpath);
        return -EEXIST;
    }
    sodium_bin2hex(hex, sizeof(hex), id->sk, DS_SK_BYTES);
    ds_pk_to_hex(id->pk, pkhex);
    snprintf(text, sizeof(text),
             "# dsnode identity secret key (Ed25519: seed || public key). Keep it private.\n"
             "%s %s\n",
             ID_TAG, hex);
    snprintf(pubtext, sizeof(pubtext),
             "# dsnode identity public key (Ed25519); append to cluster.allowed_keys\n%s%s%s\n",
             pkhex, name ? " " : "", name ? name : "");
    rc = ds_sec_write_file(path, text, strlen(text), 0600, force, err, errlen);
    if (rc == 0) {
        rc = ds_sec_write_file(pubpath, pubtext, strlen(pubtext), 0644, force, err, errlen);
        if (rc)
            unlink(path); /* no secret without its public half */
    }
    sodium_memzero(text, sizeof(text));
    sodium_memzero(hex, sizeof(hex));
    return rc;
}

/* ---- cluster key -------------------------------------------------------------- */

int ds_cluster_key_generate(ds_cluster_key *out)
{
    randombytes_buf(out->k, sizeof(out->k));
    return 0;
}

void ds_cluster_key_wipe(ds_cluster_key *k)
{
    if (k)
        sodium_memzero(k, sizeof(*k));
}

int ds_cluster_key_load(ds_cluster_key *out, const char *path, char *err, size_t errlen)
{
    char buf[KEY_FILE_MAX];
    size_t len = 0;
    int rc = ds_sec_read_file(path, buf, sizeof(buf), &len, 1, err, errlen);
    if (rc == 0)
        rc = parse_key_text(buf, len, CK_TAG, out->k, DS_CLUSTER_KEY_BYTES, path, err, errlen);
    sodium_memzero(buf, sizeof(buf));
    if (rc)
        sodium_memzero(out, sizeof(*out));
    return rc;
}

int ds_cluster_key_save(const ds_cluster_key *k, const char *path, int force, char *err,
                        size_t errlen)
{
    char hex[2 * DS_CLUSTER_KEY_BYTES + 1];
    char text[256];
    sodium_bin2hex(hex, sizeof(hex), k->k, sizeof(k->k));
    snprintf(text, sizeof(text),
             "# dsnode cluster key. Every holder is a fully trusted member. Keep it private.\n"
             "%s %s\n",
             CK_TAG, hex);
    int rc = ds_sec_write_file(path, text, strlen(text), 0600, force, err, errlen);
    sodium_memzero(text, sizeof(text));
    sodium_memzero(hex, sizeof(hex));
    return rc;
}
