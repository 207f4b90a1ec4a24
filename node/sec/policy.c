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
#include <stdatomic.h>
#include <string.h>

int ds_crypto_init(void)
{
    return sodium_init() < 0 ? -EIO : 0;
}

#define SEC_MODE_ROW_(e, v, name) {e, name},
static const struct {
    enum ds_sec_mode mode;
    const char *name;
} sec_modes[] = {DS_SEC_MODES(SEC_MODE_ROW_)};
#undef SEC_MODE_ROW_

int ds_sec_mode_parse(const char *s)
{
    for (size_t i = 0; s && i < sizeof(sec_modes) / sizeof(sec_modes[0]); i++)
        if (!strcmp(s, sec_modes[i].name))
            return (int)sec_modes[i].mode;
    return -EINVAL;
}

const char *ds_sec_mode_name(enum ds_sec_mode m)
{
    for (size_t i = 0; i < sizeof(sec_modes) / sizeof(sec_modes[0]); i++)
        if (sec_modes[i].mode == m)
            return sec_modes[i].name;
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

static _Atomic int aead_lib = DS_AEAD_LIB_OPENSSL;

void ds_aead_lib_set(enum ds_aead_lib lib)
{
    atomic_store(&aead_lib, (int)lib);
}

enum ds_aead_lib ds_aead_lib_get(void)
{
    return (enum ds_aead_lib)atomic_load(&aead_lib);
}

const char *ds_aead_lib_name(enum ds_aead_lib lib)
{
    return lib == DS_AEAD_LIB_SODIUM ? "libsodium" : lib == DS_AEAD_LIB_OPENSSL ? "openssl" : "?";
}

int ds_aead_lib_parse(const char *s)
{
    if (s && !strcmp(s, "openssl"))
        return DS_AEAD_LIB_OPENSSL;
    if (s && !strcmp(s, "libsodium"))
        return DS_AEAD_LIB_SODIUM;
    return -EINVAL;
}
