/*
 * node/wire/member.c: the member record (node/wire/member.h) in and out.
 *
 * A record is read only at an offset the caller has proven to lie inside
 * the frame, so its checks are about content: the state in range and each
 * string printable and zero-padded. The id is never taken from the wire:
 * it is derived from the key the record carries, so a record cannot name
 * one node and carry another's key.
 */
#include "config.h"

#include "node/wire/codec.h"

int ds_wire_member_write(uint8_t *p, const ds_wire_member *m)
{
    int nl = ds_wire_str_len_ok(m->name, DS_WIRE_NAME_MAX + 1, 1);
    int al = ds_wire_str_len_ok(m->addr, DS_WIRE_ADDR_MAX + 1, 1);
    int gl = ds_wire_str_len_ok(m->group, DS_WIRE_GROUP_MAX + 1, 0);
    if (nl < 0 || al < 0 || gl < 0 || m->state > DS_MEMBER_LEFT)
        return -EINVAL;
    memcpy(p + DS_WM_PK, m->pk, DS_WM_PK_SIZE);
    ds_put32(p + DS_WM_INC, m->incarnation);
    p[DS_WM_STATE] = m->state;
    p[DS_WM_NAME_LEN] = (uint8_t)nl;
    p[DS_WM_ADDR_LEN] = (uint8_t)al;
    p[DS_WM_GROUP_LEN] = (uint8_t)gl;
    ds_put64(p + DS_WM_ROUND, m->effective_round);
    ds_wire_str_write(p + DS_WM_NAME, m->name, (unsigned)nl, DS_WM_NAME_SIZE);
    ds_wire_str_write(p + DS_WM_ADDR, m->addr, (unsigned)al, DS_WM_ADDR_SIZE);
    ds_wire_str_write(p + DS_WM_GROUP, m->group, (unsigned)gl, DS_WM_GROUP_SIZE);
    return 0;
}

enum ds_drop_reason ds_wire_member_read(const uint8_t *p, ds_wire_member *m)
{
    if (p[DS_WM_STATE] > DS_MEMBER_LEFT ||
        ds_wire_str_read(p + DS_WM_NAME, p[DS_WM_NAME_LEN], DS_WM_NAME_SIZE, 1, m->name) ||
        ds_wire_str_read(p + DS_WM_ADDR, p[DS_WM_ADDR_LEN], DS_WM_ADDR_SIZE, 1, m->addr) ||
        ds_wire_str_read(p + DS_WM_GROUP, p[DS_WM_GROUP_LEN], DS_WM_GROUP_SIZE, 0, m->group))
        return DS_DROP_BAD_FIELD;
    memcpy(m->pk, p + DS_WM_PK, DS_WM_PK_SIZE);
    m->id = ds_wire_node_id(m->pk);
    m->incarnation = ds_le32(p + DS_WM_INC);
    m->state = p[DS_WM_STATE];
    m->effective_round = ds_le64(p + DS_WM_ROUND);
    return DS_DROP_NONE;
}
