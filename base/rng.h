/*
 * base/rng.h: the node's seeded generator for data shuffling and parameter
 * initialisation: xoshiro256** (Blackman and Vigna) with its state filled
 * from SplitMix64, so one 64-bit seed gives a well-mixed stream. Not for
 * anything every node must agree on bit for bit across versions: the gossip
 * schedule uses base/splitmix.h's documented streams instead.
 */
#ifndef DS_BASE_RNG_H
#define DS_BASE_RNG_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/splitmix.h"

typedef struct ds_rng {
    uint64_t s[4];
} ds_rng;

static inline void ds_rng_seed(ds_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = ds_splitmix64_step(&seed);
}

/* FNV-1a of a string, to fold a node name into a seed. */
static inline uint64_t ds_rng_hash_str(uint64_t h, const char *s)
{
    h ^= 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

static inline uint64_t ds_rng_next(ds_rng *r)
{
    uint64_t *s = r->s;
    const uint64_t x = s[1] * 5;
    const uint64_t result = ((x << 7) | (x >> 57)) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return result;
}

/* Uniform integer in [0, n), n > 0, without modulo bias (Lemire). */
static inline uint32_t ds_rng_below(ds_rng *r, uint32_t n)
{
    uint64_t m = (uint64_t)(uint32_t)(ds_rng_next(r) >> 32) * n;
    uint32_t lo = (uint32_t)m;
    if (lo < n) {
        const uint32_t t = (uint32_t)(-n) % n;
        while (lo < t) {
            m = (uint64_t)(uint32_t)(ds_rng_next(r) >> 32) * n;
            lo = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

/* Uniform double in [0, 1). */
static inline double ds_rng_unit(ds_rng *r)
{
    return (double)(ds_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

#endif
