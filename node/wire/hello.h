/*
 * node/wire/hello.h: the payloads of the four handshake frames, pinned
 * (design §7).
 *
 * HELLO and HELLO_ACK share one 264-byte body, the sender's claims; then
 * each frame carries the proofs over the transcript that node/sec's
 * handshake (node/sec/handshake.h) computes: an echo of the previous
 * frame's hash, the Ed25519 signature and the cluster-key MAC. The codec
 * (node/wire/hello.c) reads and writes these at the offsets below, and the
 * handshake signs and verifies frames up to them; the packed mirror
 * structs exist only so static_assert can pin them, as node/wire/header.h
 * does for the header.
 *
 * Hello body (offsets in bytes):
 *
 *    0  1  2  3  4  5        8                  40                 72
 *    +--+--+--+--+--+--------+------------------+------------------+
 *    |md|ae|ad|nl|al| zero   |      pk[32]      |     eph[32]      |
 *    +--+--+--+--+--+--------+------------------+------------------+
 *   72              136                              264
 *    +---------------+--------------------------------+
 *    |   name[64]    |           addr[128]            |
 *    +---------------+--------------------------------+
 *
 *    md    u8  security mode: 0 none, 1 auth, 2 encrypt
 *    ae    u8  AEADs: HELLO the offered set, HELLO_ACK the chosen one
 *              (bit 0 AES-256-GCM, bit 1 XChaCha20-Poly1305)
 *    ad    u8  admission: bit 0 cluster key, bit 1 allow-list
 *    nl    u8  name length, 1..63
 *    al    u8  addr length, 0..127 (the published listen address)
 *    zero  3   reserved, zero
 *    pk        Ed25519 identity public key
 *    eph       X25519 ephemeral public key (crypto_kx)
 *    name, addr  strings, zero-padded to their field
 *
 * The four payloads:
 *
 *    HELLO        (360)  body(264) | sig[64] @264 | mac[32] @328
 *    HELLO_ACK    (392)  body(264) | echo[32] @264 | sig[64] @296 | mac[32] @360
 *    HELLO_FIN    (128)  echo[32] @0 | sig[64] @32 | mac[32] @96
 *    HELLO_REJECT  (40)  echo[32] @0 | reason u8 @32 | zero[7] @33
 *
 * mac is all zeros without a cluster key. What sig, mac and echo cover is
 * in node/sec/handshake.h and docs/security.md.
 *
 * Only constants and static_asserts; the decoded forms are ds_wire_hello,
 * ds_wire_fin and ds_wire_reject in node/wire/wire.h.
 */
#ifndef DS_NODE_WIRE_HELLO_H
#define DS_NODE_WIRE_HELLO_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "node/wire/header.h"

/* Payload sizes (bytes). */
#define DS_WIRE_HELLO_BODY 264u    /* shared by HELLO and HELLO_ACK */
#define DS_WIRE_HELLO_SIZE 360u    /* body + sig(64) + mac(32) */
#define DS_WIRE_HELLO_ACK_SIZE 392u /* body + echo(32) + sig(64) + mac(32) */
#define DS_WIRE_HELLO_FIN_SIZE 128u /* echo(32) + sig(64) + mac(32) */
#define DS_WIRE_HELLO_REJECT_SIZE 40u /* echo(32) + reason(1) + zero(7) */

/* Field offsets and sizes in the hello body. */
enum {
    DS_WHB_MODE = 0, DS_WHB_MODE_SIZE = 1,
    DS_WHB_AEADS = 1, DS_WHB_AEADS_SIZE = 1,
    DS_WHB_ADMISSION = 2, DS_WHB_ADMISSION_SIZE = 1,
    DS_WHB_NAME_LEN = 3, DS_WHB_NAME_LEN_SIZE = 1,
    DS_WHB_ADDR_LEN = 4, DS_WHB_ADDR_LEN_SIZE = 1,
    DS_WHB_ZERO = 5, DS_WHB_ZERO_SIZE = 3,
    DS_WHB_PK = 8, DS_WHB_PK_SIZE = 32,
    DS_WHB_EPH = 40, DS_WHB_EPH_SIZE = 32,
    DS_WHB_NAME = 72, DS_WHB_NAME_SIZE = DS_WIRE_NAME_MAX + 1,
    DS_WHB_ADDR = 136, DS_WHB_ADDR_SIZE = DS_WIRE_ADDR_MAX + 1,
};

/* Offsets of the proofs in each payload; every proof field has the size
 * of its name: echo 32, sig 64, mac 32. */
enum {
    DS_WHELLO_SIG = 264, DS_WHELLO_MAC = 328,
    DS_WACK_ECHO = 264, DS_WACK_SIG = 296, DS_WACK_MAC = 360,
    DS_WFIN_ECHO = 0, DS_WFIN_SIG = 32, DS_WFIN_MAC = 96,
    DS_WREJ_ECHO = 0, DS_WREJ_REASON = 32, DS_WREJ_ZERO = 33,
    DS_WHS_ECHO_SIZE = 32, DS_WHS_SIG_SIZE = 64, DS_WHS_MAC_SIZE = 32,
    DS_WREJ_ZERO_SIZE = 7,
};

/* Mirrors of the layouts for static_assert only: never cast wire bytes to them. */
struct __attribute__((packed)) ds_wire_hello_body_layout {
    uint8_t mode, aeads, admission, name_len, addr_len;
    uint8_t zero[3];
    uint8_t pk[32];
    uint8_t eph[32];
    char name[DS_WIRE_NAME_MAX + 1];
    char addr[DS_WIRE_ADDR_MAX + 1];
};
struct __attribute__((packed)) ds_wire_hello_layout {
    struct ds_wire_hello_body_layout body;
    uint8_t sig[64];
    uint8_t mac[32];
};
struct __attribute__((packed)) ds_wire_hello_ack_layout {
    struct ds_wire_hello_body_layout body;
    uint8_t echo[32];
    uint8_t sig[64];
    uint8_t mac[32];
};
struct __attribute__((packed)) ds_wire_hello_fin_layout {
    uint8_t echo[32];
    uint8_t sig[64];
    uint8_t mac[32];
};
struct __attribute__((packed)) ds_wire_hello_reject_layout {
    uint8_t echo[32];
    uint8_t reason;
    uint8_t zero[7];
};

#define DS_WHB_PIN(field, OFF) \
    static_assert(offsetof(struct ds_wire_hello_body_layout, field) == OFF, #field " offset"); \
    static_assert(sizeof(((struct ds_wire_hello_body_layout *)0)->field) == OFF##_SIZE, \
                  #field " size")
DS_WHB_PIN(mode, DS_WHB_MODE);
DS_WHB_PIN(aeads, DS_WHB_AEADS);
DS_WHB_PIN(admission, DS_WHB_ADMISSION);
DS_WHB_PIN(name_len, DS_WHB_NAME_LEN);
DS_WHB_PIN(addr_len, DS_WHB_ADDR_LEN);
DS_WHB_PIN(zero, DS_WHB_ZERO);
DS_WHB_PIN(pk, DS_WHB_PK);
DS_WHB_PIN(eph, DS_WHB_EPH);
DS_WHB_PIN(name, DS_WHB_NAME);
DS_WHB_PIN(addr, DS_WHB_ADDR);
static_assert(sizeof(struct ds_wire_hello_body_layout) == DS_WIRE_HELLO_BODY, "hello body size");

/* Each proof at its offset, with its size; each payload ends with its last field. */
#define DS_WHS_PIN(layout, field, OFF, SIZE) \
    static_assert(offsetof(struct layout, field) == OFF, #layout "." #field " offset"); \
    static_assert(sizeof(((struct layout *)0)->field) == SIZE, #layout "." #field " size")
DS_WHS_PIN(ds_wire_hello_layout, sig, DS_WHELLO_SIG, DS_WHS_SIG_SIZE);
DS_WHS_PIN(ds_wire_hello_layout, mac, DS_WHELLO_MAC, DS_WHS_MAC_SIZE);
DS_WHS_PIN(ds_wire_hello_ack_layout, echo, DS_WACK_ECHO, DS_WHS_ECHO_SIZE);
DS_WHS_PIN(ds_wire_hello_ack_layout, sig, DS_WACK_SIG, DS_WHS_SIG_SIZE);
DS_WHS_PIN(ds_wire_hello_ack_layout, mac, DS_WACK_MAC, DS_WHS_MAC_SIZE);
DS_WHS_PIN(ds_wire_hello_fin_layout, echo, DS_WFIN_ECHO, DS_WHS_ECHO_SIZE);
DS_WHS_PIN(ds_wire_hello_fin_layout, sig, DS_WFIN_SIG, DS_WHS_SIG_SIZE);
DS_WHS_PIN(ds_wire_hello_fin_layout, mac, DS_WFIN_MAC, DS_WHS_MAC_SIZE);
DS_WHS_PIN(ds_wire_hello_reject_layout, echo, DS_WREJ_ECHO, DS_WHS_ECHO_SIZE);
DS_WHS_PIN(ds_wire_hello_reject_layout, reason, DS_WREJ_REASON, 1);
DS_WHS_PIN(ds_wire_hello_reject_layout, zero, DS_WREJ_ZERO, DS_WREJ_ZERO_SIZE);
static_assert(sizeof(struct ds_wire_hello_layout) == DS_WIRE_HELLO_SIZE, "hello size");
static_assert(sizeof(struct ds_wire_hello_ack_layout) == DS_WIRE_HELLO_ACK_SIZE, "hello ack size");
static_assert(sizeof(struct ds_wire_hello_fin_layout) == DS_WIRE_HELLO_FIN_SIZE, "hello fin size");
static_assert(sizeof(struct ds_wire_hello_reject_layout) == DS_WIRE_HELLO_REJECT_SIZE,
              "hello reject size");

#endif
