/*
 * node/wire/hello.c: the four handshake payloads (node/wire/hello.h) in and
 * out.
 *
 * Only the layout lives here: the values (modes, AEAD sets, admission bits)
 * are range-checked so a malformed frame is a wire-level drop, but whether
 * they are acceptable, and whether sig, mac and echo verify, is the
 * handshake's business (node/sec/handshake.c), which signs and hashes the
 * frames exactly as these functions lay them out.
 */
#include "config.h"

#include "node/wire/codec.h"

int ds_wire_hello_write(uint8_t *p, const ds_wire_hello *h, int ack)
{
    int nl = ds_wire_str_len_ok(h->name, DS_WIRE_NAME_MAX + 1, 1);
    int al = ds_wire_str_len_ok(h->addr, DS_WIRE_ADDR_MAX + 1, 0);
    if (nl < 0 || al < 0 || h->mode > 2 || h->aeads > 3 || h->admission > 3)
        return -EINVAL;
    p[DS_WHB_MODE] = h->mode;
    p[DS_WHB_AEADS] = h->aeads;
    p[DS_WHB_ADMISSION] = h->admission;
    p[DS_WHB_NAME_LEN] = (uint8_t)nl;
    p[DS_WHB_ADDR_LEN] = (uint8_t)al;
    memset(p + DS_WHB_ZERO, 0, DS_WHB_ZERO_SIZE);
    memcpy(p + DS_WHB_PK, h->pk, DS_WHB_PK_SIZE);
    memcpy(p + DS_WHB_EPH, h->eph, DS_WHB_EPH_SIZE);
    ds_wire_str_write(p + DS_WHB_NAME, h->name, (unsigned)nl, DS_WHB_NAME_SIZE);
    ds_wire_str_write(p + DS_WHB_ADDR, h->addr, (unsigned)al, DS_WHB_ADDR_SIZE);
    if (ack) {
        memcpy(p + DS_WACK_ECHO, h->echo, DS_WHS_ECHO_SIZE);
        memcpy(p + DS_WACK_SIG, h->sig, DS_WHS_SIG_SIZE);
        memcpy(p + DS_WACK_MAC, h->mac, DS_WHS_MAC_SIZE);
    } else {
        memcpy(p + DS_WHELLO_SIG, h->sig, DS_WHS_SIG_SIZE);
        memcpy(p + DS_WHELLO_MAC, h->mac, DS_WHS_MAC_SIZE);
    }
    return 0;
}

enum ds_drop_reason ds_wire_hello_read(const uint8_t *p, ds_wire_hello *h, int ack)
{
    if (p[DS_WHB_MODE] > 2 || p[DS_WHB_AEADS] > 3 || p[DS_WHB_ADMISSION] > 3 ||
        p[DS_WHB_ZERO] || p[DS_WHB_ZERO + 1] || p[DS_WHB_ZERO + 2] ||
        ds_wire_str_read(p + DS_WHB_NAME, p[DS_WHB_NAME_LEN], DS_WHB_NAME_SIZE, 1, h->name) ||
        ds_wire_str_read(p + DS_WHB_ADDR, p[DS_WHB_ADDR_LEN], DS_WHB_ADDR_SIZE, 0, h->addr))
        return DS_DROP_BAD_FIELD;
    h->mode = p[DS_WHB_MODE];
    h->aeads = p[DS_WHB_AEADS];
    h->admission = p[DS_WHB_ADMISSION];
    memcpy(h->pk, p + DS_WHB_PK, DS_WHB_PK_SIZE);
    memcpy(h->eph, p + DS_WHB_EPH, DS_WHB_EPH_SIZE);
    if (ack) {
        memcpy(h->echo, p + DS_WACK_ECHO, DS_WHS_ECHO_SIZE);
        memcpy(h->sig, p + DS_WACK_SIG, DS_WHS_SIG_SIZE);
        memcpy(h->mac, p + DS_WACK_MAC, DS_WHS_MAC_SIZE);
    } else {
        memset(h->echo, 0, DS_WHS_ECHO_SIZE);
        memcpy(h->sig, p + DS_WHELLO_SIG, DS_WHS_SIG_SIZE);
        memcpy(h->mac, p + DS_WHELLO_MAC, DS_WHS_MAC_SIZE);
    }
    return DS_DROP_NONE;
}

void ds_wire_fin_write(uint8_t *p, const ds_wire_fin *f)
{
    memcpy(p + DS_WFIN_ECHO, f->echo, DS_WHS_ECHO_SIZE);
    memcpy(p + DS_WFIN_SIG, f->sig, DS_WHS_SIG_SIZE);
    memcpy(p + DS_WFIN_MAC, f->mac, DS_WHS_MAC_SIZE);
}

void ds_wire_fin_read(const uint8_t *p, ds_wire_fin *f)
{
    memcpy(f->echo, p + DS_WFIN_ECHO, DS_WHS_ECHO_SIZE);
    memcpy(f->sig, p + DS_WFIN_SIG, DS_WHS_SIG_SIZE);
    memcpy(f->mac, p + DS_WFIN_MAC, DS_WHS_MAC_SIZE);
}

void ds_wire_reject_write(uint8_t *p, const ds_wire_reject *r)
{
    memcpy(p + DS_WREJ_ECHO, r->echo, DS_WHS_ECHO_SIZE);
    p[DS_WREJ_REASON] = r->reason;
    memset(p + DS_WREJ_ZERO, 0, DS_WREJ_ZERO_SIZE);
}

enum ds_drop_reason ds_wire_reject_read(const uint8_t *p, ds_wire_reject *r)
{
    for (int i = DS_WREJ_ZERO; i < DS_WREJ_ZERO + DS_WREJ_ZERO_SIZE; i++)
        if (p[i])
            return DS_DROP_BAD_FIELD;
    if (p[DS_WREJ_REASON] == DS_DROP_NONE || p[DS_WREJ_REASON] >= DS_DROP__COUNT)
        return DS_DROP_BAD_FIELD;
    memcpy(r->echo, p + DS_WREJ_ECHO, DS_WHS_ECHO_SIZE);
    r->reason = p[DS_WREJ_REASON];
    return DS_DROP_NONE;
}
