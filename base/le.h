/*
 * base/le.h: little-endian loads and stores from byte pointers. Every wire
 * format of dsnode (node/wire, the transport's chunk header, node/sec's
 * handshake) is little-endian and read field by field through these, never
 * by casting a struct onto received bytes.
 */
#ifndef DS_BASE_LE_H
#define DS_BASE_LE_H

#include <stdint.h>

static inline uint16_t ds_le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (unsigned)p[1] << 8);
}
static inline uint32_t ds_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t ds_le64(const uint8_t *p)
{
    return (uint64_t)ds_le32(p) | (uint64_t)ds_le32(p + 4) << 32;
}
static inline void ds_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void ds_put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}
static inline void ds_put64(uint8_t *p, uint64_t v)
{
    ds_put32(p, (uint32_t)v);
    ds_put32(p + 4, (uint32_t)(v >> 32));
}

#endif
