/*
 * topology/topology.h: who exchanges with whom, each gossip round (design §5).
 *
 * Every node must compute the same schedule for the same round without
 * asking anyone, so the schedule is a pure function of (topology, cluster
 * seed, view epoch, round, segment, G) and a fixed, fully specified PRNG.
 * This comment is the specification: another implementation that follows it
 * reproduces every schedule bit for bit (docs/topology.md has test vectors).
 * The module uses libc only, allocates nothing, logs nothing and keeps no
 * state; callers pass every buffer.
 *
 * The view
 *   G participants, numbered 0..G-1 in the view's sorted order. The caller
 *   maps an index to a node or group (a node alone is a group of one).
 *
 * SplitMix64 (Steele, Lea, Flood 2014), all arithmetic modulo 2^64:
 *   GAMMA = 0x9e3779b97f4a7c15, M1 = 0xbf58476d1ce4e5b9, M2 = 0x94d049bb133111eb
 *   mix(z):  z = (z ^ (z >> 30)) * M1;  z = (z ^ (z >> 27)) * M2;  return z ^ (z >> 31)
 *   next():  state += GAMMA;  return mix(state)
 *   State 1234567 yields 6457827717110365317, 3203168211198807973, ...
 *
 * Bounded draw below(n), 1 <= n < 2^32, uniform on [0, n) with no bias
 * (Lemire's multiply-and-reject, in 32 bits so it needs no 128-bit type):
 *   x = next() >> 32;  m = x * n  (64-bit product);
 *   if (m mod 2^32) < n:
 *       t = (2^32 - n) mod n
 *       while (m mod 2^32) < t:  x = next() >> 32;  m = x * n
 *   return m >> 32
 *
 * Stream derivation: a stream's starting state from a 64-bit domain tag and
 * words w_0..w_{k-1}:
 *   h = domain;  for i in 0..k-1:  h = mix(h ^ w_i);  state = h
 * The topology streams use domain DS_RNG_DOMAIN_TOPO = 0x64732d746f706f31
 * (the ASCII bytes "ds-topo1" read big-endian) and the four words
 *   (cluster seed, view epoch, round, segment widened to 64 bits)
 * in that order. Other modules reuse the derivation with their own domain
 * tag, so their draws never coincide with the schedule's.
 *
 * Topologies: perm[a] is the participant a initiates an exchange to;
 * perm[a] == a means a initiates nothing this round.
 *   crossover    (default) a uniform random derangement per (round, segment).
 *                Starting from the stream of the key:
 *                  attempt: perm[a] = a for all a
 *                           for i = G-1 down to 1:
 *                               j = below(i + 1); swap perm[i], perm[j]
 *                               if perm[i] == i: start a new attempt
 *                           if perm[0] == 0: start a new attempt
 *                New attempts keep drawing from the same stream. Position i
 *                is final once swapped, so abandoning the attempt there is
 *                the same rejection as checking the whole permutation at the
 *                end, only cheaper; expected attempts are about e. Every
 *                participant initiates exactly one exchange (to perm[a]) and
 *                answers exactly one (from perm^-1[a]) per segment.
 *   ring         perm[a] = (a + 1) mod G, for every segment and round.
 *   exponential  SGP's one-peer exponential graph: with k = ceil(log2 G),
 *                perm[a] = (a + 2^(round mod k)) mod G, for every segment.
 *   random       unbalanced ablation. From the stream of the key, for
 *                a = 0..G-1 in order: j = below(G - 1); perm[a] = j + (j >= a).
 *                Each initiates to a uniform other participant; a participant
 *                may answer 0..G-1 exchanges.
 *   allreduce    no gossip pairs: nodes do a dense ring all-reduce of
 *                gradients instead. perm is the identity; ds_topo_gossips()
 *                says 0.
 *   G == 1       every topology gives the identity: nobody exchanges.
 *   G == 2       crossover, ring and exponential all give the swap, so both
 *                0 -> 1 and 1 -> 0 happen in the same round (two exchanges
 *                between the same pair).
 *
 * Errors: functions return 0 or a negative errno. Bad arguments return
 * -EINVAL in every build type (they never abort: a view of size 0 can come
 * from a peer-driven membership state, and the caller must log and carry on).
 */
#ifndef DS_TOPOLOGY_TOPOLOGY_H
#define DS_TOPOLOGY_TOPOLOGY_H

#include <stddef.h>
#include <stdint.h>

#include "base/splitmix.h"

/* Domain tag of the topology streams: "ds-topo1" in ASCII, big-endian. */
#define DS_RNG_DOMAIN_TOPO UINT64_C(0x64732d746f706f31)

/* ---- topologies ------------------------------------------------------------ */

/* The topologies, in the order the config and the help list them:
 * X(enumerator, value, name). This list is the only place a topology is
 * named: it generates the enum below and the name table in topology.c, and
 * conf/keys.h takes gossip.topology's choices from it. */
#define DS_TOPO_KINDS(X) \
    X(DS_TOPO_CROSSOVER, 0, "crossover") \
    X(DS_TOPO_RING, 1, "ring") \
    X(DS_TOPO_EXPONENTIAL, 2, "exponential") \
    X(DS_TOPO_RANDOM, 3, "random") \
    X(DS_TOPO_ALLREDUCE, 4, "allreduce")

#define DS_TOPO_ENUMERATOR_(e, v, name) e = v,
enum ds_topo_kind { DS_TOPO_KINDS(DS_TOPO_ENUMERATOR_) };
#undef DS_TOPO_ENUMERATOR_
/* How many kinds; their values are 0..COUNT-1 (topology.c checks). */
#define DS_TOPO_ONE_(e, v, name) +1
#define DS_TOPO_KIND_COUNT (0 DS_TOPO_KINDS(DS_TOPO_ONE_))
#define DS_TOPO_DEFAULT DS_TOPO_CROSSOVER

/* Parse a config name (exact, lower case). Returns 0 and sets *out, or
 * -EINVAL for NULL or an unknown name (then *out is left as it was). */
int ds_topo_parse(const char *name, enum ds_topo_kind *out);

/* The config name of k (static string), or "unknown" for a bad value. */
const char *ds_topo_name(enum ds_topo_kind k);

/* 1 when k schedules gossip pairs, 0 for allreduce (and bad values): the
 * node then all-reduces gradients instead of calling the functions below. */
int ds_topo_gossips(enum ds_topo_kind k);

/* 1 when ds_topo_peers() needs a scratch buffer of G entries for k
 * (crossover: one node's partners come from the whole permutation). */
int ds_topo_peers_need_scratch(enum ds_topo_kind k);

/* What one schedule depends on besides the view size. */
typedef struct ds_topo_key {
    uint64_t seed;    /* cluster.seed */
    uint64_t epoch;   /* view epoch (changes only at effective rounds) */
    uint64_t round;   /* gossip round */
    uint32_t segment; /* segment index within theta */
} ds_topo_key;

/* The stream the randomised topologies draw from for key (see above). */
void ds_topo_stream(ds_splitmix64 *g, const ds_topo_key *key);

/* Fill perm[0..G) with each participant's target for key; perm[a] == a
 * means a initiates nothing. key is borrowed for the call; perm is the
 * caller's, G entries. O(G) time, about 1.75 G bounded draws for crossover.
 * Returns 0, or -EINVAL for an unknown k, G == 0 or a NULL pointer (perm
 * is then untouched). */
int ds_topo_targets(enum ds_topo_kind k, const ds_topo_key *key, uint32_t G, uint32_t *perm);

/* One node's view of the same schedule: *initiate_to receives the target of
 * `me` (== me when it initiates nothing); answer_from[0..) the participants
 * that initiate to `me`, ascending; *n_answer their number (0 or 1 for
 * crossover, ring and exponential; 0..G-1 for random; 0 for allreduce and
 * G == 1). Everything is caller-owned: answer_from holds max_answer entries
 * (may be NULL when max_answer is 0); scratch holds G entries and is needed
 * only when ds_topo_peers_need_scratch(k) (else it may be NULL); its
 * contents afterwards are unspecified. Ring and exponential cost O(1);
 * crossover and random O(G).
 * Returns 0; -ENOBUFS when more than max_answer participants initiate to
 * `me` (the first max_answer are written, *n_answer holds the full count,
 * *initiate_to is set); -EINVAL for an unknown k, G == 0, me >= G, a NULL
 * pointer that is needed (outputs untouched). */
int ds_topo_peers(enum ds_topo_kind k, const ds_topo_key *key, uint32_t G, uint32_t me,
                  uint32_t *initiate_to, uint32_t *answer_from, uint32_t *n_answer,
                  uint32_t max_answer, uint32_t *scratch);

/* ---- hierarchy (design §5, "Hierarchy") --------------------------------------
 * The view's participants are groups; members of a group are numbered
 * 0..size-1 in sorted order. Segment s of group g is handled by member
 * (s mod |g|), which initiates to member (s mod |h|) of h = perm_s[g] and
 * also answers the group that initiates to g for that segment: one member of
 * each group owns both directions of segment s, then broadcasts the deltas
 * of its segments to its group. */

/* *member = segment mod group_size. Returns 0, or -EINVAL when group_size is
 * 0 or member is NULL. */
int ds_topo_hier_owner(uint32_t segment, uint32_t group_size, uint32_t *member);

/* For segment s between my group (my_size members) and a peer group
 * (peer_size members): *my_member = s mod my_size handles it on my side,
 * *peer_member = s mod peer_size on the peer's. Returns 0, or -EINVAL for a
 * zero size or a NULL pointer. */
int ds_topo_hier_route(uint32_t segment, uint32_t my_size, uint32_t peer_size,
                       uint32_t *my_member, uint32_t *peer_member);

/* Two groups (the view's participants are 2 groups): every topology gives
 * the swap, so each segment would be exchanged twice between the same two
 * members each round, both ways, and every byte of it would cross between
 * hosts. Between two groups the pair exchanges once instead: segment s of
 * round r is initiated by group (r + s) mod 2 only, the other answers
 * (each group initiates half the segments, both take part in all).
 * Returns that group's index (0 or 1); -EINVAL for a NULL key. */
int ds_topo_pair_initiator(const ds_topo_key *key);

#endif
