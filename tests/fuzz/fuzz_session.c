/*
 * tests/fuzz/fuzz_session.c: libFuzzer harness for ds_session_open (and
 * seal). The first byte picks a session variant (auth/encrypt x AES-GCM /
 * XChaCha20 x OpenSSL / libsodium), the rest is a frame.
 *
 * 1. Open the frame as received by B from A: any reason, no crash. The
 *    committed seeds are genuinely sealed frames, so mutations of them
 *    reach the tag check and the decoder behind it.
 * 2. Seal the frame as A (when it is a well-formed unsealed data frame) and
 *    open it as B: sealing must be transparent, i.e. open succeeds and the
 *    decoder gives the same verdict on the opened frame as on the plain one.
 */
#include "config.h"

#include <stdio.h>

#include "fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static ds_session tx[8], rx[8];
static uint32_t idx[FZ_CAP];
static float val[FZ_CAP];
static ds_wire_member mem[64];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    ds_log_setup("fuzz", DS_LOG_ERROR, NULL);
    if (ds_crypto_init() != 0)
        abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const unsigned v = data[0] & 7;
    data++;
    size--;
    ds_wire_limits lim;
    fz_limits(&lim);
    ds_wire_bufs bufs = {idx, FZ_CAP, val, FZ_CAP, mem, 64};
    ds_wire_msg m;

    /* Fresh sessions per input, so runs are reproducible. */
    fz_session(&tx[v], v, 1);
    fz_session(&rx[v], v, 0);

    uint8_t *f = malloc(size + DS_WIRE_TAG_SIZE + 1);
    if (!f)
        return 0;
    memcpy(f, data, size);
    enum ds_drop_reason r = ds_session_open(&rx[v], f, size);
    if ((unsigned)r >= DS_DROP__COUNT)
        abort();
    if (r == DS_DROP_NONE)
        (void)ds_wire_decode(f, size, &lim, &bufs, &m, NULL);

    ds_wire_hdr h;
    memcpy(f, data, size);
    if (ds_wire_hdr_check(f, size, &lim, &h) == DS_DROP_NONE && !ds_wire_is_handshake(h.type) &&
        ds_wire_prot(&h) == DS_PROT_NONE) {
        const enum ds_drop_reason plain = ds_wire_decode(f, size, &lim, &bufs, &m, NULL);
        size_t sealed = 0;
        fz_session(&rx[v], v, 0);
        if (ds_session_seal(&tx[v], f, size, size + DS_WIRE_TAG_SIZE, &sealed) != 0)
            abort();
        r = ds_session_open(&rx[v], f, sealed);
        if (r != DS_DROP_NONE) {
            fprintf(stderr, "sealed frame did not open: %s\n", ds_drop_name(r));
            abort();
        }
        const enum ds_drop_reason opened = ds_wire_decode(f, sealed, &lim, &bufs, &m, NULL);
        if (opened != plain) {
            fprintf(stderr, "decode differs after seal/open: %s vs %s\n", ds_drop_name(opened),
                    ds_drop_name(plain));
            abort();
        }
    }
    free(f);
    return 0;
}
