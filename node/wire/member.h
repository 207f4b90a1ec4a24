/*
 * node/wire/member.h: the 272-byte member record, pinned (design §6).
 *
 * One entry of a membership table as it travels: piggybacked on PING, ACK
 * and PING_REQ, alone in a JOIN, and in slices in MEMBERS. The codec
 * (node/wire/member.c) reads and writes it field by field at these offsets;
 * the packed mirror struct below exists only so static_assert can pin them,
 * as node/wire/header.h does for the header.
 *
 * Record (integers little-endian; offsets in bytes):
 *
 *    0                               32      36 37 38 39 40              48
 *    +-------------------------------+-------+--+--+--+--+---------------+
 *    |            pk[32]             |  inc  |st|nl|al|gl|effective_round|
 *    +-------------------------------+-------+--+--+--+--+---------------+
 *   48              112                              240             272
 *    +---------------+--------------------------------+---------------+
 *    |   name[64]    |           addr[128]            |   group[32]   |
 *    +---------------+--------------------------------+---------------+
 *
 *    pk        32  Ed25519 public key; the member's id is derived from it
 *    inc       u32 incarnation
 *    st        u8  state: 0 alive, 1 suspect, 2 dead, 3 left
 *    nl        u8  name length, 1..63
 *    al        u8  addr length, 1..127
 *    gl        u8  group length, 0..31 (0: a group of one)
 *    effective_round u64  join or removal round (node/membership gives a
 *                  SUSPECT record's a second meaning; docs/membership.md)
 *    name, addr, group    strings, zero-padded to their field
 *
 * Only constants and static_asserts; the decoded form is ds_wire_member in
 * node/wire/wire.h.
 */
#ifndef DS_NODE_WIRE_MEMBER_H
#define DS_NODE_WIRE_MEMBER_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "node/wire/header.h"

#define DS_WIRE_MEMBER_SIZE 272u /* one member record */

/* Field offsets and sizes in a member record. */
enum {
    DS_WM_PK = 0, DS_WM_PK_SIZE = 32,
    DS_WM_INC = 32, DS_WM_INC_SIZE = 4,
    DS_WM_STATE = 36, DS_WM_STATE_SIZE = 1,
    DS_WM_NAME_LEN = 37, DS_WM_NAME_LEN_SIZE = 1,
    DS_WM_ADDR_LEN = 38, DS_WM_ADDR_LEN_SIZE = 1,
    DS_WM_GROUP_LEN = 39, DS_WM_GROUP_LEN_SIZE = 1,
    DS_WM_ROUND = 40, DS_WM_ROUND_SIZE = 8,
    DS_WM_NAME = 48, DS_WM_NAME_SIZE = DS_WIRE_NAME_MAX + 1,
    DS_WM_ADDR = 112, DS_WM_ADDR_SIZE = DS_WIRE_ADDR_MAX + 1,
    DS_WM_GROUP = 240, DS_WM_GROUP_SIZE = DS_WIRE_GROUP_MAX + 1,
};

/* A mirror of the layout for static_assert only: never cast wire bytes to it. */
struct __attribute__((packed)) ds_wire_member_layout {
    uint8_t pk[32];
    uint32_t inc;
    uint8_t state, name_len, addr_len, group_len;
    uint64_t round;
    char name[DS_WIRE_NAME_MAX + 1];
    char addr[DS_WIRE_ADDR_MAX + 1];
    char group[DS_WIRE_GROUP_MAX + 1];
};
#define DS_WM_PIN(field, OFF) \
    static_assert(offsetof(struct ds_wire_member_layout, field) == OFF, #field " offset"); \
    static_assert(sizeof(((struct ds_wire_member_layout *)0)->field) == OFF##_SIZE, \
                  #field " size")
DS_WM_PIN(pk, DS_WM_PK);
DS_WM_PIN(inc, DS_WM_INC);
DS_WM_PIN(state, DS_WM_STATE);
DS_WM_PIN(name_len, DS_WM_NAME_LEN);
DS_WM_PIN(addr_len, DS_WM_ADDR_LEN);
DS_WM_PIN(group_len, DS_WM_GROUP_LEN);
DS_WM_PIN(round, DS_WM_ROUND);
DS_WM_PIN(name, DS_WM_NAME);
DS_WM_PIN(addr, DS_WM_ADDR);
DS_WM_PIN(group, DS_WM_GROUP);
static_assert(sizeof(struct ds_wire_member_layout) == DS_WIRE_MEMBER_SIZE, "member record size");
static_assert(DS_WM_GROUP + DS_WM_GROUP_SIZE == DS_WIRE_MEMBER_SIZE, "record has no tail gap");

#endif
