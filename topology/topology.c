/*
 * topology/topology.c: the gossip schedule of one round (spec in topology.h).
 *
 * Crossover-SGD balances load by pairing participants through a derangement:
 * each node sends exactly one segment copy and receives exactly one, so no
 * node becomes a hot spot and no one talks to itself. We draw the derangement
 * uniformly by rejection: a Fisher-Yates shuffle that is thrown away as soon
 * as it fixes a point. The fraction of permutations of G items that are
 * derangements tends to 1/e quickly (it is exactly 1/2 for G = 2, 1/3 for
 * G = 3, 3/8 for G = 4), so the expected number of attempts is at most 3.
 * Abandoning an attempt at the first fixed point it makes (rather than
 * checking the finished permutation) keeps the result uniform on
 * derangements, because the whole attempt would have been rejected anyway
 * and every attempt starts afresh; it brings the expected work from e (G - 1)
 * draws to about 1.75 G (measured, docs/topology.md). We prefer it to the
 * exact derangement samplers that avoid rejection (Martinez, Panholzer,
 * Prodinger 2008): those need about 2 G draws too and are much harder to
 * specify for a second implementation.
 *
 * The descending Fisher-Yates fixes position i with the swap of step i and
 * never touches it again, which is what makes the early check valid: the
 * value at i after step i is final.
 *
 * Ring and exponential are closed forms and cost O(1) per node. The random
 * ablation draws every participant's choice from one stream in index order,
 * so one node learning who initiates to it still costs O(G) draws, but no
 * memory.
 */
#include "config.h"

#include <errno.h>
#include <string.h>

#include "topology/topology.h"

#define KIND_NAME_(e, v, name) [e] = name,
static const char *const kind_names[DS_TOPO_KIND_COUNT] = {DS_TOPO_KINDS(KIND_NAME_)};
#undef KIND_NAME_
/* kind_names and kind_valid need each kind's value to be its position in
 * DS_TOPO_KINDS. */
#define KIND_POS_(e, v, name) POS_##e,
enum { DS_TOPO_KINDS(KIND_POS_) };
#undef KIND_POS_
#define KIND_AT_POS_(e, v, name) \
    _Static_assert((int)e == (int)POS_##e, #e " is not at its position");
DS_TOPO_KINDS(KIND_AT_POS_)
#undef KIND_AT_POS_

static int kind_valid(enum ds_topo_kind k)
{
    return (unsigned)k < DS_TOPO_KIND_COUNT;
}

int ds_topo_parse(const char *name, enum ds_topo_kind *out)
{
    if (!name || !out)
        return -EINVAL;
    for (int i = 0; i < DS_TOPO_KIND_COUNT; i++) {
        if (!strcmp(name, kind_names[i])) {
            *out = (enum ds_topo_kind)i;
            return 0;
        }
    }
    return -EINVAL;
}

const char *ds_topo_name(enum ds_topo_kind k)
{
    return kind_valid(k) ? kind_names[k] : "unknown";
}

int ds_topo_gossips(enum ds_topo_kind k)
{
    return kind_valid(k) && k != DS_TOPO_ALLREDUCE;
}

int ds_topo_peers_need_scratch(enum ds_topo_kind k)
{
    return k == DS_TOPO_CROSSOVER;
}

void ds_topo_stream(ds_splitmix64 *g, const ds_topo_key *key)
{
    const uint64_t words[4] = {key->seed, key->epoch, key->round, (uint64_t)key->segment};
    ds_splitmix64_seed(g, ds_splitmix64_derive(DS_RNG_DOMAIN_TOPO, words, 4));
}

/* ceil(log2 G) for G >= 2: the number of distinct exponential offsets. */
static uint32_t ceil_log2(uint32_t G)
{
    uint32_t k = 0;
    while (k < 32 && (UINT64_C(1) << k) < G)
        k++;
    return k;
}

/* The exponential graph's offset this round; G >= 2. 2^(k-1) < G, so the
 * offset is never a multiple of G: nobody is sent to itself. */
static uint32_t exp_offset(uint64_t round, uint32_t G)
{
    return UINT32_C(1) << (uint32_t)(round % ceil_log2(G));
}

/* (a + off) mod G for a, off < G, without a division (a division per
 * participant made the ring cost as much as a shuffle) and without
 * overflowing 32 bits. */
static uint32_t add_mod(uint32_t a, uint32_t off, uint32_t G)
{
    return a >= G - off ? a - (G - off) : a + off;
}

static void identity(uint32_t G, uint32_t *perm)
{
    for (uint32_t a = 0; a < G; a++)
        perm[a] = a;
}

static void derangement(ds_splitmix64 *g, uint32_t G, uint32_t *perm)
{
attempt:
    identity(G, perm);
    for (uint32_t i = G - 1; i >= 1; i--) {
        uint32_t j = ds_splitmix64_below(g, i + 1);
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
        if (perm[i] == i)
            goto attempt;
    }
    if (perm[0] == 0)
        goto attempt;
}

/* Draw of participant a in the random topology; G >= 2. */
static uint32_t random_other(ds_splitmix64 *g, uint32_t a, uint32_t G)
{
    uint32_t j = ds_splitmix64_below(g, G - 1);
    return j + (j >= a);
}

int ds_topo_targets(enum ds_topo_kind k, const ds_topo_key *key, uint32_t G, uint32_t *perm)
{
    if (!kind_valid(k) || !key || !perm || G == 0)
        return -EINVAL;
    if (G == 1 || k == DS_TOPO_ALLREDUCE) {
        identity(G, perm);
        return 0;
    }
    ds_splitmix64 g;
    switch (k) {
    case DS_TOPO_CROSSOVER:
        ds_topo_stream(&g, key);
        derangement(&g, G, perm);
        break;
    case DS_TOPO_RING:
        for (uint32_t a = 0; a < G; a++)
            perm[a] = add_mod(a, 1, G);
        break;
    case DS_TOPO_EXPONENTIAL: {
        uint32_t off = exp_offset(key->round, G);
        for (uint32_t a = 0; a < G; a++)
            perm[a] = add_mod(a, off, G);
        break;
    }
    case DS_TOPO_RANDOM:
        ds_topo_stream(&g, key);
        for (uint32_t a = 0; a < G; a++)
            perm[a] = random_other(&g, a, G);
        break;
    case DS_TOPO_ALLREDUCE:
        break; /* handled above */
    }
    return 0;
}

/* Record that `from` initiates to us: count it always, store it if room. */
static void add_answer(uint32_t from, uint32_t *answer_from, uint32_t max_answer, uint32_t *n)
{
    if (*n < max_answer)
        answer_from[*n] = from;
    (*n)++;
}

int ds_topo_peers(enum ds_topo_kind k, const ds_topo_key *key, uint32_t G, uint32_t me,
                  uint32_t *initiate_to, uint32_t *answer_from, uint32_t *n_answer,
                  uint32_t max_answer, uint32_t *scratch)
{
    if (!kind_valid(k) || !key || !initiate_to || !n_answer || G == 0 || me >= G)
        return -EINVAL;
    if (max_answer > 0 && !answer_from)
        return -EINVAL;
    if (ds_topo_peers_need_scratch(k) && !scratch)
        return -EINVAL;

    uint32_t to = me, n = 0;
    if (G == 1 || k == DS_TOPO_ALLREDUCE)
        goto out;

    ds_splitmix64 g;
    switch (k) {
    case DS_TOPO_CROSSOVER:
        ds_topo_stream(&g, key);
        derangement(&g, G, scratch);
        to = scratch[me];
        /* A derangement has exactly one preimage of me; the scan is the same
         * O(G) as drawing it, and cheaper than inverting into a second buffer. */
        for (uint32_t a = 0; a < G; a++) {
            if (scratch[a] == me) {
                add_answer(a, answer_from, max_answer, &n);
                break;
            }
        }
        break;
    case DS_TOPO_RING:
        to = add_mod(me, 1, G);
        add_answer(add_mod(me, G - 1, G), answer_from, max_answer, &n);
        break;
    case DS_TOPO_EXPONENTIAL: {
        uint32_t off = exp_offset(key->round, G);
        to = add_mod(me, off, G);
        add_answer(add_mod(me, G - off, G), answer_from, max_answer, &n);
        break;
    }
    case DS_TOPO_RANDOM:
        ds_topo_stream(&g, key);
        for (uint32_t a = 0; a < G; a++) {
            uint32_t t = random_other(&g, a, G);
            if (a == me)
                to = t;
            if (t == me)
                add_answer(a, answer_from, max_answer, &n);
        }
        break;
    case DS_TOPO_ALLREDUCE:
        break; /* handled above */
    }
out:
    *initiate_to = to;
    *n_answer = n;
    return n > max_answer ? -ENOBUFS : 0;
}

int ds_topo_hier_owner(uint32_t segment, uint32_t group_size, uint32_t *member)
{
    if (group_size == 0 || !member)
        return -EINVAL;
    *member = segment % group_size;
    return 0;
}

int ds_topo_hier_route(uint32_t segment, uint32_t my_size, uint32_t peer_size,
                       uint32_t *my_member, uint32_t *peer_member)
{
    if (my_size == 0 || peer_size == 0 || !my_member || !peer_member)
        return -EINVAL;
    *my_member = segment % my_size;
    *peer_member = segment % peer_size;
    return 0;
}

int ds_topo_pair_initiator(const ds_topo_key *key)
{
    if (!key)
        return -EINVAL;
    return (int)((key->round + key->segment) & 1u);
}
