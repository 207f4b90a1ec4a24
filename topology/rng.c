/*
 * topology/rng.c: stream derivation for SplitMix64 (spec in topology.h).
 *
 * The generator itself is inline in the header so that the per-draw cost is
 * a handful of instructions. Deriving a stream chains the SplitMix64 output
 * function over the words: mix is a bijection, so for a fixed prefix every
 * change of the last word changes the state, and every change of an earlier
 * word changes the state unless two 64-bit values collide by chance (about
 * 2^-64). The domain tag keeps the streams of different users apart even
 * when they feed the same words (seed, epoch, round, ...).
 *
 * All streams share the one SplitMix64 cycle of length 2^64; two streams
 * overlap only when their starting states fall within a stream's length of
 * each other. For crossover that length is about 2 G draws, so with 10^6
 * (round, segment) streams of G = 10^5 the chance that any two overlap at
 * all is below 2 %, and an overlap would only correlate two schedules, not
 * unbalance either of them.
 */
#include "config.h"

#include "topology/topology.h"

uint64_t ds_splitmix64_derive(uint64_t domain, const uint64_t *words, size_t n)
{
    uint64_t h = domain;
    for (size_t i = 0; i < n; i++)
        h = ds_splitmix64_mix(h ^ words[i]);
    return h;
}
