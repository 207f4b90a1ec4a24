/*
 * tests/fuzz/fuzz_decode.c: libFuzzer harness for ds_wire_decode.
 *
 * Any input must decode to a reason without a crash or an out-of-bounds
 * access (ASan, UBSan). And the codec must be canonical: a frame that
 * decodes (unsealed, seq 0) re-encodes to exactly the same bytes, so no two
 * byte strings mean the same message. Run through tests/fuzz/run.sh.
 */
#include "config.h"

#include <stdio.h>

#include "fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint32_t idx[FZ_CAP];
static float val[FZ_CAP];
static ds_wire_member mem[64];
static uint8_t out[(1u << 20) + 4096];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    ds_log_setup("fuzz", DS_LOG_ERROR, NULL);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ds_wire_limits lim;
    fz_limits(&lim);
    ds_wire_bufs bufs = {idx, FZ_CAP, val, FZ_CAP, mem, 64};
    ds_wire_msg m;
    /* An exact-size heap copy: ASan sees a read one byte past the end. */
    uint8_t *f = malloc(size ? size : 1);
    if (!f)
        return 0;
    memcpy(f, data, size);
    enum ds_drop_reason r = ds_wire_decode(f, size, &lim, &bufs, &m, NULL);
    if ((unsigned)r >= DS_DROP__COUNT)
        abort();
    if (r == DS_DROP_NONE && ds_wire_prot(&m.h) == DS_PROT_NONE && m.h.seq == 0) {
        size_t len = 0;
        int rc = ds_wire_encode(out, sizeof(out), &m, &len);
        if (rc != 0 || len != size || memcmp(out, f, size) != 0) {
            fprintf(stderr, "not canonical: type %s rc %d len %zu size %zu\n",
                    ds_msg_type_name(m.h.type), rc, len, size);
            abort();
        }
    }
    free(f);
    return 0;
}
