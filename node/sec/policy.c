/*
 * node/sec/policy.c: security modes, AEADs, and libsodium's start (see
 * policy.h).
 *
 * AES-256-GCM is offered only where the CPU runs it in hardware (AES-NI
 * and PCLMUL, as libsodium reports): libsodium has no portable fallback for
 * it, and XChaCha20-Poly1305, which runs everywhere, is the answer there.
 */
#include "config.h"

#include "node/sec/policy.h"

#include <errno.h>
#include <sodium.h>
#include <string.h>

int ds_crypto_init(void)
{
    return sodium_init() < 0 ? -EIO : 0;
}

int ds_sec_mode_parse(const char *s)
{
    if (!s)
        return -EINVAL;
    if (!strcmp(s, "none"))
        return DS_SEC_NONE;
    if (!strcmp(s, "auth"))
        return DS_SEC_AUTH;
    if (!strcmp(s, "encrypt"))
        return DS_SEC_ENCRYPT;
    return -EINVAL;
}

const char *ds_sec_mode_name(enum ds_sec_mode m)
{
    switch (m) {
    case DS_SEC_NONE: return "none";
    case DS_SEC_AUTH: return "auth";
    case DS_SEC_ENCRYPT: return "encrypt";
    }
    return "?";
}

const char *ds_aead_name(unsigned aead)
{
    switch (aead) {
    case 0: return "-";
    case DS_AEAD_AES256GCM: return "aes256gcm";
    case DS_AEAD_XCHACHA20: return "xchacha20poly1305";
    default: return "?";
    }
}

unsigned ds_aead_available(void)
{
    return DS_AEAD_XCHACHA20 | (crypto_aead_aes256gcm_is_available() ? DS_AEAD_AES256GCM : 0);
}
