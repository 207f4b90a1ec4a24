/*
 * base/splitmix.h: SplitMix64 (Steele, Lea, Flood 2014), the one generator
 * every node must agree on bit for bit: the gossip schedule (topology/),
 * the sparsifiers' samples (sparsify/), the seeding of base/rng.h, and the
 * tests' and benchmarks' seeded inputs. The specification, which another
 * implementation can follow to reproduce every draw, is in
 * topology/topology.h and docs/topology.md; tests/test_topology.c checks the
 * published reference sequence.
 *
 * Stream derivation chains the output function over the words: mix is a
 * bijection, so for a fixed prefix every change of the last word changes
 * the state, and every change of an earlier word changes it unless two
 * 64-bit values collide by chance (about 2^-64). The domain tag keeps the
 * streams of different users apart even when they feed the same words.
 * All streams share the one cycle of length 2^64; two overlap only when
 * their starting states fall within a stream's length of each other (for
 * crossover about 2 G draws: with 10^6 streams of G = 10^5 the chance that
 * any two overlap at all is below 2 %, and an overlap would only correlate
 * two schedules, not unbalance either).
 */
#ifndef DS_BASE_SPLITMIX_H
#define DS_BASE_SPLITMIX_H

#include <stddef.h>
#include <stdint.h>

#define DS_SPLITMIX64_GAMMA UINT64_C(0x9e3779b97f4a7c15)
#define DS_SPLITMIX64_M1 UINT64_C(0xbf58476d1ce4e5b9)
#define DS_SPLITMIX64_M2 UINT64_C(0x94d049bb133111eb)

/* One stream. Plain value: copy it to fork a stream, no cleanup. */
typedef struct ds_splitmix64 {
    uint64_t state;
} ds_splitmix64;

/* The SplitMix64 output function, a bijection on 64-bit words. */
static inline uint64_t ds_splitmix64_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * DS_SPLITMIX64_M1;
    z = (z ^ (z >> 27)) * DS_SPLITMIX64_M2;
    return z ^ (z >> 31);
}

static inline void ds_splitmix64_seed(ds_splitmix64 *g, uint64_t state)
{
    g->state = state;
}

static inline uint64_t ds_splitmix64_next(ds_splitmix64 *g)
{
    g->state += DS_SPLITMIX64_GAMMA;
    return ds_splitmix64_mix(g->state);
}

/* Uniform on [0, n) without modulo bias (the rule in topology/topology.h). n must be
 * >= 1; n == 0 returns 0 and draws nothing. */
static inline uint32_t ds_splitmix64_below(ds_splitmix64 *g, uint32_t n)
{
    if (n == 0)
        return 0;
    uint64_t m = (ds_splitmix64_next(g) >> 32) * (uint64_t)n;
    if ((uint32_t)m < n) {
        /* 2^32 mod n: the low words below it belong to the partial top
         * bucket; rejecting them leaves each result exactly
         * floor(2^32 / n) preimages. */
        uint32_t t = (uint32_t)(-n) % n;
        while ((uint32_t)m < t)
            m = (ds_splitmix64_next(g) >> 32) * (uint64_t)n;
    }
    return (uint32_t)(m >> 32);
}

/* Starting state for (domain, words[0..n)): h = domain; h = mix(h ^ w_i).
 * words is borrowed for the call; n may be 0 (the state is then domain). */
static inline uint64_t ds_splitmix64_derive(uint64_t domain, const uint64_t *words, size_t n)
{
    uint64_t h = domain;
    for (size_t i = 0; i < n; i++)
        h = ds_splitmix64_mix(h ^ words[i]);
    return h;
}

/* One step on a bare state word: the same as ds_splitmix64_next() on a
 * stream whose state is *state. */
static inline uint64_t ds_splitmix64_step(uint64_t *state)
{
    *state += DS_SPLITMIX64_GAMMA;
    return ds_splitmix64_mix(*state);
}

#endif
