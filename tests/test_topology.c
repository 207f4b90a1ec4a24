/*
 * tests/test_topology.c: the gossip schedule (topology/topology.h).
 *
 * What must hold: crossover is a derangement for every (round, segment) and
 * is uniform over derangements; every node computes the same schedule from
 * (seed, epoch, round, segment) alone, in any process and any call order;
 * ring and exponential follow their closed forms; random never picks itself
 * and is uniform; allreduce and G = 1 schedule nothing; bad inputs give
 * -EINVAL and touch nothing.
 *
 * Golden values: the SplitMix64 outputs for state 1234567 are the published
 * reference sequence (Rosetta Code, "Pseudo-random numbers/Splitmix64").
 * The schedule vectors and digests below were produced by an independent
 * Python implementation written from the specification in topology.h alone
 * and agree with this C code; they pin the documented PRNG, the stream
 * derivation and the shuffle, so any change to them (which would make old
 * and new nodes disagree on who talks to whom) fails here.
 *
 * Statistical tests use a fixed seed, so they are deterministic. Each
 * chi-square threshold is the 1 - 1e-6 quantile of its distribution: for a
 * correct implementation and a seed chosen at random, each such test would
 * fail with probability 1e-6 (about 1e-5 for the whole file).
 *
 * Run: meson test -C build topology --verbose
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "topology/topology.h"

/* chi-square 1 - 1e-6 quantiles by degrees of freedom (computed with the
 * regularized incomplete gamma function; df 1: 4.8916^2 = 23.928). */
#define CHI2_DF1 23.928
#define CHI2_DF2 27.631
#define CHI2_DF3 30.665
#define CHI2_DF5 35.888
#define CHI2_DF8 42.701
#define CHI2_DF62 129.949

static double chi2(const uint64_t *count, size_t cells, double expected)
{
    double x = 0;
    for (size_t i = 0; i < cells; i++) {
        double d = (double)count[i] - expected;
        x += d * d / expected;
    }
    return x;
}

static ds_topo_key key4(uint64_t seed, uint64_t epoch, uint64_t round, uint32_t segment)
{
    return (ds_topo_key){.seed = seed, .epoch = epoch, .round = round, .segment = segment};
}

static uint32_t *ubuf(size_t n)
{
    uint32_t *p = calloc(n ? n : 1, sizeof(uint32_t));
    cr_assert_not_null(p);
    return p;
}

/* 1 when perm[0..G) is a permutation with no fixed point; else logs why. */
static int is_derangement(const uint32_t *perm, uint32_t G, uint8_t *seen, const char *what)
{
    memset(seen, 0, G);
    for (uint32_t a = 0; a < G; a++) {
        if (perm[a] >= G || perm[a] == a || seen[perm[a]]) {
            cr_log_error("%s G=%u: perm[%u] = %u (%s)", what, G, a, perm[a],
                         perm[a] >= G ? "out of range" : perm[a] == a ? "fixed point"
                                                                      : "answered twice");
            return 0;
        }
        seen[perm[a]] = 1;
    }
    return 1;
}

/* ---- SplitMix64 -------------------------------------------------------------- */

Test(topology, splitmix64_reference_sequence)
{
    static const uint64_t want[] = {6457827717110365317ull, 3203168211198807973ull,
                                    9817491932198370423ull, 4593380528125082431ull,
                                    16408922859458223821ull};
    ds_splitmix64 g;
    ds_splitmix64_seed(&g, 1234567);
    for (int i = 0; i < 5; i++) {
        uint64_t got = ds_splitmix64_next(&g);
        cr_expect_eq(got, want[i], "output %d: got %llu want %llu", i, (unsigned long long)got,
                     (unsigned long long)want[i]);
    }
}

Test(topology, stream_derivation_pinned)
{
    /* h = mix(mix(mix(mix(DOMAIN ^ 1) ^ 0) ^ 0) ^ 0), by the Python reference. */
    ds_splitmix64 g;
    ds_topo_key k = key4(1, 0, 0, 0);
    ds_topo_stream(&g, &k);
    cr_expect_eq(g.state, 0x9e3c2d7d7fc110ecull, "state %#llx", (unsigned long long)g.state);
    const uint64_t w[4] = {1, 0, 0, 0};
    cr_expect_eq(ds_splitmix64_derive(DS_RNG_DOMAIN_TOPO, w, 4), g.state);
    cr_expect_eq(ds_splitmix64_derive(77, w, 0), 77u);
    /* The domain separates users of the same words. */
    cr_expect_neq(ds_splitmix64_derive(DS_RNG_DOMAIN_TOPO + 1, w, 4), g.state);
}

Test(topology, below_edges)
{
    ds_splitmix64 g;
    ds_splitmix64_seed(&g, 5);
    uint64_t before = g.state;
    cr_expect_eq(ds_splitmix64_below(&g, 0), 0u);
    cr_expect_eq(g.state, before, "n = 0 must draw nothing");
    for (int i = 0; i < 1000; i++) {
        cr_assert_eq(ds_splitmix64_below(&g, 1), 0u);
        cr_assert_lt(ds_splitmix64_below(&g, 7), 7u);
        cr_assert_lt(ds_splitmix64_below(&g, UINT32_MAX), UINT32_MAX);
    }
}

/*
 * n = 3 * 2^30 is where the naive maps are most biased: x mod n gives
 * [0, 2^30) twice the weight of the rest (P = 1/2 instead of 1/3), and the
 * multiply without rejection gives values divisible by 3 two preimages
 * (P = 1/2 instead of 1/3). Here 2^32 mod n = 2^30, so a quarter of the raw
 * draws are rejected (4/3 draws per result): the rejection loop runs often.
 */
Test(topology, below_is_unbiased_where_naive_methods_are_not)
{
    const uint32_t n = 3u << 30;
    const int N = 30000;
    uint64_t low[2] = {0, 0}, mod3[3] = {0, 0, 0};
    ds_splitmix64 g;
    ds_splitmix64_seed(&g, 0xb1a5);
    uint64_t s0 = g.state;
    for (int i = 0; i < N; i++) {
        uint32_t v = ds_splitmix64_below(&g, n);
        cr_assert_lt(v, n);
        low[v < (1u << 30) ? 0 : 1]++;
        mod3[v % 3]++;
    }
    /* The state advances by GAMMA per draw (mod 2^64); GAMMA is odd, so
     * multiplying by its inverse (Newton: 3 -> 6 -> ... -> 96 correct bits)
     * counts the draws. */
    uint64_t inv = DS_SPLITMIX64_GAMMA;
    for (int i = 0; i < 5; i++)
        inv *= 2 - DS_SPLITMIX64_GAMMA * inv;
    uint64_t draws = (g.state - s0) * inv;
    cr_expect_gt(draws, (uint64_t)N * 6 / 5, "rejection loop barely ran: %llu draws",
                 (unsigned long long)draws);
    /* low: expected N/3 and 2N/3 */
    double x1 = ((double)low[0] - N / 3.0) * ((double)low[0] - N / 3.0) / (N / 3.0) +
                ((double)low[1] - 2 * N / 3.0) * ((double)low[1] - 2 * N / 3.0) / (2 * N / 3.0);
    cr_expect_lt(x1, CHI2_DF1, "x mod n style bias: %llu of %d below 2^30 (chi2 %.2f)",
                 (unsigned long long)low[0], N, x1);
    double x2 = chi2(mod3, 3, N / 3.0);
    cr_expect_lt(x2, CHI2_DF2, "multiply-without-reject style bias: mod3 %llu %llu %llu (chi2 %.2f)",
                 (unsigned long long)mod3[0], (unsigned long long)mod3[1],
                 (unsigned long long)mod3[2], x2);
}

/* ---- names ------------------------------------------------------------------- */

Test(topology, names_round_trip)
{
    const char *names[] = {"crossover", "ring", "exponential", "random", "allreduce"};
    for (int i = 0; i < DS_TOPO_KIND_COUNT; i++) {
        enum ds_topo_kind k = DS_TOPO_RING;
        cr_expect_eq(ds_topo_parse(names[i], &k), 0, "%s", names[i]);
        cr_expect_eq((int)k, i);
        cr_expect_str_eq(ds_topo_name(k), names[i]);
    }
    cr_expect_eq(DS_TOPO_DEFAULT, DS_TOPO_CROSSOVER);
    cr_expect(ds_topo_gossips(DS_TOPO_CROSSOVER));
    cr_expect(ds_topo_gossips(DS_TOPO_RANDOM));
    cr_expect_not(ds_topo_gossips(DS_TOPO_ALLREDUCE));
    cr_expect_not(ds_topo_gossips((enum ds_topo_kind)99));
    cr_expect_str_eq(ds_topo_name((enum ds_topo_kind)99), "unknown");
    cr_expect_str_eq(ds_topo_name((enum ds_topo_kind)-1), "unknown");
}

Test(topology, parse_rejects_unknown)
{
    const char *bad[] = {"", "Crossover", "crossover ", "rin", "ringg", "all-reduce", "gossip"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        enum ds_topo_kind k = DS_TOPO_EXPONENTIAL;
        cr_expect_eq(ds_topo_parse(bad[i], &k), -EINVAL, "'%s'", bad[i]);
        cr_expect_eq(k, DS_TOPO_EXPONENTIAL, "'%s' changed the output", bad[i]);
    }
    enum ds_topo_kind k;
    cr_expect_eq(ds_topo_parse(NULL, &k), -EINVAL);
    cr_expect_eq(ds_topo_parse("ring", NULL), -EINVAL);
}

/* ---- crossover --------------------------------------------------------------- */

Test(topology, crossover_is_a_derangement, .timeout = 60)
{
    static const uint32_t Gs[] = {2, 3, 4, 5, 7, 64, 1000};
    uint32_t *perm = ubuf(1000), *scratch = ubuf(1000);
    uint8_t *seen = calloc(1000, 1);
    cr_assert_not_null(seen);
    for (size_t gi = 0; gi < sizeof(Gs) / sizeof(Gs[0]); gi++) {
        uint32_t G = Gs[gi];
        uint32_t rounds = G >= 1000 ? 60 : 300;
        for (uint64_t r = 0; r < rounds; r++) {
            for (uint32_t s = 0; s < 5; s++) {
                ds_topo_key k = key4(0xc0ffee, 2, r, s);
                cr_assert_eq(ds_topo_targets(DS_TOPO_CROSSOVER, &k, G, perm), 0);
                cr_assert(is_derangement(perm, G, seen, "crossover"), "round %llu seg %u",
                          (unsigned long long)r, s);
                /* A few nodes' own view agrees with the whole permutation. */
                for (uint32_t me = 0; me < G; me += (G > 8 ? G / 7 : 1)) {
                    uint32_t to = UINT32_MAX, from = UINT32_MAX, n = 99;
                    cr_assert_eq(ds_topo_peers(DS_TOPO_CROSSOVER, &k, G, me, &to, &from, &n, 1,
                                               scratch), 0);
                    cr_assert_eq(to, perm[me]);
                    cr_assert_eq(n, 1u);
                    cr_assert_eq(perm[from], me, "G=%u me=%u answers %u, whose target is %u", G,
                                 me, from, perm[from]);
                }
            }
        }
    }
    free(perm);
    free(scratch);
    free(seen);
}

Test(topology, crossover_large_view)
{
    const uint32_t G = 100000;
    uint32_t *perm = ubuf(G), *scratch = ubuf(G);
    uint8_t *seen = calloc(G, 1);
    cr_assert_not_null(seen);
    for (uint64_t r = 0; r < 3; r++) {
        ds_topo_key k = key4(99, 1, r, 17);
        cr_assert_eq(ds_topo_targets(DS_TOPO_CROSSOVER, &k, G, perm), 0);
        cr_assert(is_derangement(perm, G, seen, "crossover"));
        uint32_t to, from, n;
        cr_assert_eq(ds_topo_peers(DS_TOPO_CROSSOVER, &k, G, G - 1, &to, &from, &n, 1, scratch), 0);
        cr_expect_eq(to, perm[G - 1]);
        cr_expect_eq(perm[from], G - 1);
    }
    free(perm);
    free(scratch);
    free(seen);
}

Test(topology, crossover_pinned_vectors)
{
    /* From the Python reference of the spec (see the file comment). */
    static const struct {
        uint64_t seed, epoch, round;
        uint32_t seg, G;
        uint32_t perm[10];
    } v[] = {
        {1, 0, 0, 0, 2, {1, 0}},
        {1, 0, 0, 0, 3, {1, 2, 0}},
        {1, 0, 0, 0, 4, {3, 2, 1, 0}},
        {1, 0, 0, 0, 8, {3, 0, 4, 2, 5, 1, 7, 6}},
        {1, 0, 0, 0, 10, {4, 9, 1, 5, 3, 7, 0, 8, 6, 2}},
        {42, 7, 1000, 3, 10, {1, 4, 5, 6, 9, 0, 2, 8, 7, 3}},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        uint32_t perm[10];
        ds_topo_key k = key4(v[i].seed, v[i].epoch, v[i].round, v[i].seg);
        cr_assert_eq(ds_topo_targets(DS_TOPO_CROSSOVER, &k, v[i].G, perm), 0);
        for (uint32_t a = 0; a < v[i].G; a++)
            cr_expect_eq(perm[a], v[i].perm[a], "vector %zu G=%u: perm[%u] = %u, want %u", i,
                         v[i].G, a, perm[a], v[i].perm[a]);
    }
}

/* ---- same schedule everywhere ---------------------------------------------- */

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * FNV_PRIME;
    return h;
}

/* FNV-1a of the perm entries as little-endian uint32 bytes. */
static uint64_t perm_hash(const uint32_t *perm, uint32_t G)
{
    uint64_t h = FNV_OFFSET;
    for (uint32_t a = 0; a < G; a++) {
        unsigned char b[4] = {(unsigned char)perm[a], (unsigned char)(perm[a] >> 8),
                              (unsigned char)(perm[a] >> 16), (unsigned char)(perm[a] >> 24)};
        h = fnv(h, b, 4);
    }
    return h;
}

#define DIG_ROUNDS 1000
#define DIG_SEGS 4
#define DIG_SEED 0x5eedull
#define DIG_EPOCH 3

/*
 * Digest of DIG_ROUNDS x DIG_SEGS schedules: FNV-1a over the little-endian
 * 64-bit perm hashes in (round, segment) order. `reverse` computes the
 * schedules backwards (last round first) and `noise` draws unrelated
 * schedules in between, so equal digests show the result depends on the key
 * alone, not on call order or anything left over from earlier calls.
 */
static uint64_t digest(enum ds_topo_kind kind, uint32_t G, int reverse, int noise)
{
    static uint64_t h[DIG_ROUNDS][DIG_SEGS];
    uint32_t perm[64], junk[97];
    for (int i = 0; i < DIG_ROUNDS * DIG_SEGS; i++) {
        int idx = reverse ? DIG_ROUNDS * DIG_SEGS - 1 - i : i;
        uint64_t r = (uint64_t)(idx / DIG_SEGS);
        uint32_t s = (uint32_t)(idx % DIG_SEGS);
        ds_topo_key k = key4(DIG_SEED, DIG_EPOCH, r, s);
        if (ds_topo_targets(kind, &k, G, perm) != 0)
            return 0;
        h[r][s] = perm_hash(perm, G);
        if (noise) {
            ds_topo_key o = key4((uint64_t)i * 31, 9, r ^ 5, s + 1);
            if (ds_topo_targets(DS_TOPO_CROSSOVER, &o, 97, junk) != 0)
                return 0;
        }
    }
    uint64_t d = FNV_OFFSET;
    for (int r = 0; r < DIG_ROUNDS; r++)
        for (int s = 0; s < DIG_SEGS; s++) {
            unsigned char b[8];
            for (int i = 0; i < 8; i++)
                b[i] = (unsigned char)(h[r][s] >> (8 * i));
            d = fnv(d, b, 8);
        }
    return d;
}

Test(topology, golden_digests)
{
    uint64_t c5 = digest(DS_TOPO_CROSSOVER, 5, 0, 0);
    uint64_t c64 = digest(DS_TOPO_CROSSOVER, 64, 0, 0);
    uint64_t r64 = digest(DS_TOPO_RANDOM, 64, 0, 0);
    cr_expect_eq(c5, 0xb510a5d3dc5354f3ull, "crossover G=5: %#llx", (unsigned long long)c5);
    cr_expect_eq(c64, 0xe5f2927fc8a4136aull, "crossover G=64: %#llx", (unsigned long long)c64);
    cr_expect_eq(r64, 0xff2ae988fbafe78aull, "random G=64: %#llx", (unsigned long long)r64);
}

/* Start a child that writes digest(...) to a pipe; returns its pid. */
static pid_t spawn_digest(int reverse, int noise, int *rfd)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        uint64_t d = digest(DS_TOPO_CROSSOVER, 64, reverse, noise);
        ssize_t w = write(fds[1], &d, sizeof(d));
        _exit(w == (ssize_t)sizeof(d) ? 0 : 1);
    }
    close(fds[1]);
    *rfd = fds[0];
    return pid;
}

/* Read one digest within the deadline; 0 on success. */
static int read_digest(int fd, uint64_t *d, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, timeout_ms) != 1)
        return -1;
    return read(fd, d, sizeof(*d)) == (ssize_t)sizeof(*d) ? 0 : -1;
}

Test(topology, same_schedule_in_separate_processes, .timeout = 60)
{
    int fa = -1, fb = -1;
    pid_t a = spawn_digest(0, 1, &fa);
    pid_t b = spawn_digest(1, 0, &fb);
    uint64_t da = 0, db = 0;
    int ra = read_digest(fa, &da, 20000);
    int rb = read_digest(fb, &db, 20000);
    /* Reap both children whatever happened, killing any still running. */
    kill(a, SIGKILL);
    kill(b, SIGKILL);
    waitpid(a, NULL, 0);
    waitpid(b, NULL, 0);
    close(fa);
    close(fb);
    cr_assert_eq(ra, 0, "child A gave no digest in time");
    cr_assert_eq(rb, 0, "child B gave no digest in time");
    uint64_t mine = digest(DS_TOPO_CROSSOVER, 64, 0, 0);
    cr_expect_eq(da, db, "forward+noise %#llx vs reverse %#llx", (unsigned long long)da,
                 (unsigned long long)db);
    cr_expect_eq(da, mine);
    cr_expect_eq(mine, 0xe5f2927fc8a4136aull);
}

Test(topology, key_fields_each_matter)
{
    const uint32_t G = 64;
    uint32_t base[64], other[64];
    ds_topo_key k0 = key4(0x1234, 5, 77, 3);
    cr_assert_eq(ds_topo_targets(DS_TOPO_CROSSOVER, &k0, G, base), 0);
    /* Determinism: the same key again. */
    cr_assert_eq(ds_topo_targets(DS_TOPO_CROSSOVER, &k0, G, other), 0);
    cr_expect_arr_eq(base, other, sizeof(base));

    /* Each field changed by one, and by its top bit. 64 items have about
     * 2.4e88 derangements, so a chance match is out of the question. */
    ds_topo_key v[8];
    for (int i = 0; i < 8; i++)
        v[i] = k0;
    v[0].seed += 1;
    v[1].seed ^= 1ull << 63;
    v[2].epoch += 1;
    v[3].epoch ^= 1ull << 63;
    v[4].round += 1;
    v[5].round ^= 1ull << 63;
    v[6].segment += 1;
    v[7].segment ^= 1u << 31;
    for (int i = 0; i < 8; i++) {
        cr_assert_eq(ds_topo_targets(DS_TOPO_CROSSOVER, &v[i], G, other), 0);
        cr_expect(memcmp(base, other, sizeof(base)) != 0, "variant %d gives the same schedule", i);
        cr_assert_eq(ds_topo_targets(DS_TOPO_RANDOM, &v[i], G, other), 0);
        uint32_t rbase[64];
        cr_assert_eq(ds_topo_targets(DS_TOPO_RANDOM, &k0, G, rbase), 0);
        cr_expect(memcmp(rbase, other, sizeof(rbase)) != 0, "random: variant %d is the same", i);
    }
}

/* ---- uniformity -------------------------------------------------------------- */

/* Partner of participant `a` over N keys (rounds, or segments when
 * by_segment), chi-square against uniform over the G - 1 others. */
static double partner_chi2(enum ds_topo_kind kind, uint32_t G, uint32_t a, uint64_t N,
                           int by_segment, uint64_t *count)
{
    uint32_t perm[64];
    memset(count, 0, G * sizeof(*count));
    for (uint64_t i = 0; i < N; i++) {
        ds_topo_key k = by_segment ? key4(0xfeed, 1, 12345, (uint32_t)i) : key4(0xfeed, 1, i, 2);
        cr_assert_eq(ds_topo_targets(kind, &k, G, perm), 0);
        cr_assert_neq(perm[a], a);
        count[perm[a]]++;
    }
    /* Move the (empty) self cell to the end and drop it. */
    count[a] = count[G - 1];
    return chi2(count, G - 1, (double)N / (G - 1));
}

Test(topology, crossover_partner_uniform)
{
    uint64_t count[64];
    double x = partner_chi2(DS_TOPO_CROSSOVER, 7, 0, 6 * 2000, 0, count);
    cr_expect_lt(x, CHI2_DF5, "G=7 a=0 over rounds: chi2 %.2f", x);
    x = partner_chi2(DS_TOPO_CROSSOVER, 7, 3, 6 * 2000, 1, count);
    cr_expect_lt(x, CHI2_DF5, "G=7 a=3 over segments: chi2 %.2f", x);
    x = partner_chi2(DS_TOPO_CROSSOVER, 64, 63, 63 * 300, 0, count);
    cr_expect_lt(x, CHI2_DF62, "G=64 a=63 over rounds: chi2 %.2f", x);
}

Test(topology, random_partner_uniform)
{
    uint64_t count[64];
    double x = partner_chi2(DS_TOPO_RANDOM, 7, 0, 6 * 2000, 0, count);
    cr_expect_lt(x, CHI2_DF5, "G=7 a=0: chi2 %.2f", x);
    x = partner_chi2(DS_TOPO_RANDOM, 64, 40, 63 * 300, 1, count);
    cr_expect_lt(x, CHI2_DF62, "G=64 a=40: chi2 %.2f", x);
}

/* Index of perm among the derangements of 4 (lexicographic), or -1. */
static int derangement4_index(const uint32_t *perm)
{
    int idx = 0;
    for (uint32_t p0 = 0; p0 < 4; p0++)
        for (uint32_t p1 = 0; p1 < 4; p1++)
            for (uint32_t p2 = 0; p2 < 4; p2++) {
                uint32_t p3 = 6 - p0 - p1 - p2;
                if (p0 == p1 || p0 == p2 || p1 == p2 || p3 > 3 || p3 == p0 || p3 == p1 ||
                    p3 == p2)
                    continue;
                if (p0 == 0 || p1 == 1 || p2 == 2 || p3 == 3)
                    continue;
                if (perm[0] == p0 && perm[1] == p1 && perm[2] == p2 && perm[3] == p3)
                    return idx;
                idx++;
            }
    return -1;
}

Test(topology, crossover_uniform_over_derangements)
{
    /* G = 4: 9 derangements (3 double swaps, 6 four-cycles), each 1/9. */
    const uint64_t N = 9 * 1500;
    uint64_t count[9] = {0};
    uint32_t perm[4];
    for (uint64_t r = 0; r < N; r++) {
        ds_topo_key k = key4(0xabc, 0, r, (uint32_t)(r % 3));
        cr_assert_eq(ds_topo_targets(DS_TOPO_CROSSOVER, &k, 4, perm), 0);
        int i = derangement4_index(perm);
        cr_assert_geq(i, 0, "round %llu: [%u %u %u %u] is not a derangement",
                      (unsigned long long)r, perm[0], perm[1], perm[2], perm[3]);
        count[i]++;
    }
    double x = chi2(count, 9, N / 9.0);
    cr_expect_lt(x, CHI2_DF8, "chi2 %.2f over 9 derangements", x);

    /* G = 3: the two 3-cycles, 1/2 each. */
    uint64_t c3[2] = {0, 0};
    for (uint64_t r = 0; r < 4000; r++) {
        ds_topo_key k = key4(0xabc, 0, r, 0);
        cr_assert_eq(ds_topo_targets(DS_TOPO_CROSSOVER, &k, 3, perm), 0);
        cr_assert(perm[0] == 1 || perm[0] == 2);
        c3[perm[0] == 1 ? 0 : 1]++;
    }
    x = chi2(c3, 2, 2000.0);
    cr_expect_lt(x, CHI2_DF1, "G=3: %llu vs %llu", (unsigned long long)c3[0],
                 (unsigned long long)c3[1]);
}

/* ---- ring, exponential ------------------------------------------------------- */

Test(topology, ring_exact)
{
    uint32_t perm[5];
    for (uint64_t r = 0; r < 4; r++) {
        ds_topo_key k = key4(r * 7, r, r, (uint32_t)r);
        cr_assert_eq(ds_topo_targets(DS_TOPO_RING, &k, 5, perm), 0);
        const uint32_t want[5] = {1, 2, 3, 4, 0};
        cr_expect_arr_eq(perm, want, sizeof(want));
        cr_assert_eq(ds_topo_targets(DS_TOPO_RING, &k, 2, perm), 0);
        cr_expect(perm[0] == 1 && perm[1] == 0, "G=2 ring is the swap");
    }
    uint32_t to, from, n;
    ds_topo_key k = key4(1, 2, 3, 4);
    cr_assert_eq(ds_topo_peers(DS_TOPO_RING, &k, 5, 0, &to, &from, &n, 1, NULL), 0);
    cr_expect(to == 1 && from == 4 && n == 1);
    cr_assert_eq(ds_topo_peers(DS_TOPO_RING, &k, UINT32_MAX, UINT32_MAX - 1, &to, &from, &n, 1,
                               NULL), 0);
    cr_expect(to == 0 && from == UINT32_MAX - 2 && n == 1, "no overflow at the top: %u %u", to,
              from);
}

Test(topology, exponential_exact)
{
    /* (G, round) -> offset: k = ceil(log2 G), offset 2^(round mod k). */
    static const struct {
        uint32_t G;
        uint64_t round;
        uint32_t off;
    } v[] = {
        {2, 0, 1},  {2, 5, 1},  {3, 0, 1},  {3, 1, 2},   {3, 2, 1},  {4, 0, 1},
        {4, 1, 2},  {4, 2, 1},  {5, 0, 1},  {5, 1, 2},   {5, 2, 4},  {5, 3, 1},
        {8, 2, 4},  {8, 3, 1},  {9, 3, 8},  {9, 4, 1},   {16, 3, 8}, {17, 4, 16},
        {1000, 9, 512}, {1000, 10, 1}, {1000, 1000003, 8},
    };
    uint32_t perm[1000];
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        for (uint32_t s = 0; s < 3; s++) {
            ds_topo_key k = key4(i, 1, v[i].round, s);
            cr_assert_eq(ds_topo_targets(DS_TOPO_EXPONENTIAL, &k, v[i].G, perm), 0);
            for (uint32_t a = 0; a < v[i].G; a++)
                cr_assert_eq(perm[a], (a + v[i].off) % v[i].G, "G=%u round=%llu a=%u: %u",
                             v[i].G, (unsigned long long)v[i].round, a, perm[a]);
            uint32_t me = v[i].G / 2, to, from, n;
            cr_assert_eq(ds_topo_peers(DS_TOPO_EXPONENTIAL, &k, v[i].G, me, &to, &from, &n, 1,
                                       NULL), 0);
            cr_expect_eq(to, perm[me]);
            cr_expect_eq(n, 1u);
            cr_expect_eq(perm[from], me);
        }
    }
}

/* ---- random ------------------------------------------------------------------ */

Test(topology, random_never_self_and_unbalanced)
{
    const uint32_t G = 64;
    uint32_t perm[64], from[64];
    uint32_t max_answers = 0;
    for (uint64_t r = 0; r < 200; r++) {
        ds_topo_key k = key4(3, 0, r, 1);
        cr_assert_eq(ds_topo_targets(DS_TOPO_RANDOM, &k, G, perm), 0);
        uint32_t in[64] = {0};
        for (uint32_t a = 0; a < G; a++) {
            cr_assert_lt(perm[a], G);
            cr_assert_neq(perm[a], a);
            in[perm[a]]++;
        }
        for (uint32_t me = 0; me < G; me++) {
            uint32_t to, n;
            cr_assert_eq(ds_topo_peers(DS_TOPO_RANDOM, &k, G, me, &to, from, &n, G, NULL), 0);
            cr_assert_eq(to, perm[me]);
            cr_assert_eq(n, in[me]);
            for (uint32_t i = 0; i < n; i++) {
                cr_assert_eq(perm[from[i]], me);
                if (i)
                    cr_assert_gt(from[i], from[i - 1], "answer list must ascend");
            }
            if (n > max_answers)
                max_answers = n;
        }
    }
    /* The point of the ablation: some node answers several exchanges. */
    cr_expect_geq(max_answers, 3u);
}

Test(topology, random_choices_independent)
{
    /* G = 3: (perm[0], perm[1]) is uniform over all 4 pairs, where crossover
     * allows only the 2 pairs of the two 3-cycles. */
    uint64_t c[4] = {0};
    uint32_t perm[3];
    for (uint64_t r = 0; r < 8000; r++) {
        ds_topo_key k = key4(8, 8, r, 0);
        cr_assert_eq(ds_topo_targets(DS_TOPO_RANDOM, &k, 3, perm), 0);
        int i0 = perm[0] == 1 ? 0 : 1;
        int i1 = perm[1] == 0 ? 0 : 1;
        c[i0 * 2 + i1]++;
    }
    double x = chi2(c, 4, 2000.0);
    cr_expect_lt(x, CHI2_DF3, "pairs %llu %llu %llu %llu: chi2 %.2f", (unsigned long long)c[0],
                 (unsigned long long)c[1], (unsigned long long)c[2], (unsigned long long)c[3], x);
}

Test(topology, answer_list_too_small_reports_full_count)
{
    /* Find a node that answers at least 3 exchanges, then give it room for 1. */
    const uint32_t G = 64;
    uint32_t perm[64];
    for (uint64_t r = 0; r < 100; r++) {
        ds_topo_key k = key4(3, 0, r, 1);
        cr_assert_eq(ds_topo_targets(DS_TOPO_RANDOM, &k, G, perm), 0);
        uint32_t in[64] = {0};
        for (uint32_t a = 0; a < G; a++)
            in[perm[a]]++;
        for (uint32_t me = 0; me < G; me++) {
            if (in[me] < 3)
                continue;
            uint32_t to = 0, from[2] = {UINT32_MAX, 777}, n = 0;
            cr_assert_eq(ds_topo_peers(DS_TOPO_RANDOM, &k, G, me, &to, from, &n, 1, NULL),
                         -ENOBUFS);
            cr_expect_eq(n, in[me]);
            cr_expect_eq(to, perm[me]);
            cr_expect_eq(perm[from[0]], me);
            cr_expect_eq(from[1], 777u, "wrote past max_answer");
            /* Counting only. */
            cr_assert_eq(ds_topo_peers(DS_TOPO_RANDOM, &k, G, me, &to, NULL, &n, 0, NULL),
                         -ENOBUFS);
            cr_expect_eq(n, in[me]);
            return;
        }
    }
    cr_assert_fail("no node answered 3 exchanges in 100 rounds");
}

/* ---- nobody exchanges ------------------------------------------------------- */

Test(topology, allreduce_and_single_node_schedule_nothing, .timeout = 10)
{
    uint32_t perm[7], scratch[7], from[7];
    for (int kind = 0; kind < DS_TOPO_KIND_COUNT; kind++) {
        for (uint64_t r = 0; r < 50; r++) {
            ds_topo_key k = key4(r, r, r, (uint32_t)r);
            /* G = 1: every topology, every round. */
            perm[0] = 99;
            cr_assert_eq(ds_topo_targets(kind, &k, 1, perm), 0);
            cr_assert_eq(perm[0], 0u, "%s G=1", ds_topo_name(kind));
            uint32_t to = 99, n = 99;
            cr_assert_eq(ds_topo_peers(kind, &k, 1, 0, &to, from, &n, 7, scratch), 0);
            cr_assert(to == 0 && n == 0, "%s G=1: to %u n %u", ds_topo_name(kind), to, n);
        }
    }
    for (uint64_t r = 0; r < 20; r++) {
        ds_topo_key k = key4(1, 1, r, 0);
        cr_assert_eq(ds_topo_targets(DS_TOPO_ALLREDUCE, &k, 7, perm), 0);
        for (uint32_t a = 0; a < 7; a++)
            cr_assert_eq(perm[a], a);
        uint32_t to, n = 99;
        cr_assert_eq(ds_topo_peers(DS_TOPO_ALLREDUCE, &k, 7, 3, &to, NULL, &n, 0, NULL), 0);
        cr_assert(to == 3 && n == 0);
    }
}

Test(topology, two_nodes_swap_both_ways)
{
    for (uint64_t r = 0; r < 20; r++) {
        ds_topo_key k = key4(1, 1, r, (uint32_t)r);
        for (int kind = DS_TOPO_CROSSOVER; kind <= DS_TOPO_RANDOM; kind++) {
            uint32_t perm[2] = {7, 7};
            cr_assert_eq(ds_topo_targets(kind, &k, 2, perm), 0);
            cr_expect(perm[0] == 1 && perm[1] == 0, "%s round %llu", ds_topo_name(kind),
                      (unsigned long long)r);
        }
    }
}

/* ---- bad inputs -------------------------------------------------------------- */

Test(topology, bad_inputs_rejected_untouched)
{
    ds_topo_key k = key4(1, 2, 3, 4);
    uint32_t perm[4] = {9, 9, 9, 9}, scratch[4], from[4];
    uint32_t to = 55, n = 66;
    cr_expect_eq(ds_topo_targets(DS_TOPO_CROSSOVER, &k, 0, perm), -EINVAL);
    cr_expect_eq(ds_topo_targets(DS_TOPO_CROSSOVER, NULL, 4, perm), -EINVAL);
    cr_expect_eq(ds_topo_targets(DS_TOPO_CROSSOVER, &k, 4, NULL), -EINVAL);
    cr_expect_eq(ds_topo_targets((enum ds_topo_kind)5, &k, 4, perm), -EINVAL);
    cr_expect_eq(ds_topo_targets((enum ds_topo_kind)-1, &k, 4, perm), -EINVAL);
    for (int i = 0; i < 4; i++)
        cr_expect_eq(perm[i], 9u);

    for (int kind = 0; kind < DS_TOPO_KIND_COUNT; kind++) {
        cr_expect_eq(ds_topo_peers(kind, &k, 0, 0, &to, from, &n, 4, scratch), -EINVAL);
        cr_expect_eq(ds_topo_peers(kind, &k, 4, 4, &to, from, &n, 4, scratch), -EINVAL);
        cr_expect_eq(ds_topo_peers(kind, &k, 4, UINT32_MAX, &to, from, &n, 4, scratch), -EINVAL);
        cr_expect_eq(ds_topo_peers(kind, NULL, 4, 0, &to, from, &n, 4, scratch), -EINVAL);
        cr_expect_eq(ds_topo_peers(kind, &k, 4, 0, NULL, from, &n, 4, scratch), -EINVAL);
        cr_expect_eq(ds_topo_peers(kind, &k, 4, 0, &to, from, NULL, 4, scratch), -EINVAL);
        cr_expect_eq(ds_topo_peers(kind, &k, 4, 0, &to, NULL, &n, 4, scratch), -EINVAL);
    }
    cr_expect_eq(ds_topo_peers(DS_TOPO_CROSSOVER, &k, 4, 0, &to, from, &n, 4, NULL), -EINVAL);
    cr_expect_eq(ds_topo_peers((enum ds_topo_kind)7, &k, 4, 0, &to, from, &n, 4, scratch),
                 -EINVAL);
    cr_expect(to == 55 && n == 66, "outputs touched on error");
    cr_expect(ds_topo_peers_need_scratch(DS_TOPO_CROSSOVER));
    cr_expect_not(ds_topo_peers_need_scratch(DS_TOPO_RANDOM));
    cr_expect_not(ds_topo_peers_need_scratch(DS_TOPO_RING));
}

/* ---- hierarchy --------------------------------------------------------------- */

Test(topology, hierarchy_routes)
{
    uint32_t m = 99, p = 99;
    cr_expect_eq(ds_topo_hier_owner(7, 3, &m), 0);
    cr_expect_eq(m, 1u);
    cr_expect_eq(ds_topo_hier_owner(0, 1, &m), 0);
    cr_expect_eq(m, 0u);
    cr_expect_eq(ds_topo_hier_route(7, 3, 4, &m, &p), 0);
    cr_expect(m == 1 && p == 3);
    cr_expect_eq(ds_topo_hier_route(UINT32_MAX, 2, 5, &m, &p), 0);
    cr_expect(m == 1 && p == 0, "got %u %u", m, p);

    /* Every segment is owned by exactly one member, and each member of a
     * group of 3 owns every third segment. */
    uint32_t owned[3] = {0};
    for (uint32_t s = 0; s < 30; s++) {
        cr_assert_eq(ds_topo_hier_owner(s, 3, &m), 0);
        owned[m]++;
    }
    cr_expect(owned[0] == 10 && owned[1] == 10 && owned[2] == 10);

    m = p = 42;
    cr_expect_eq(ds_topo_hier_owner(1, 0, &m), -EINVAL);
    cr_expect_eq(ds_topo_hier_owner(1, 2, NULL), -EINVAL);
    cr_expect_eq(ds_topo_hier_route(1, 0, 2, &m, &p), -EINVAL);
    cr_expect_eq(ds_topo_hier_route(1, 2, 0, &m, &p), -EINVAL);
    cr_expect_eq(ds_topo_hier_route(1, 2, 2, NULL, &p), -EINVAL);
    cr_expect_eq(ds_topo_hier_route(1, 2, 2, &m, NULL), -EINVAL);
    cr_expect(m == 42 && p == 42);
}

/* Between two groups one exchange per segment: the initiator alternates
 * with the round and the segment, so each group initiates half the
 * segments of every round (with an even count) and every segment half
 * the rounds; it does not depend on the seed or the epoch. */
Test(topology, two_groups_alternate_the_initiator)
{
    cr_expect_eq(ds_topo_pair_initiator(NULL), -EINVAL);
    for (uint64_t r = 0; r < 8; r++) {
        int first = 0;
        for (uint32_t s = 0; s < 6; s++) {
            const ds_topo_key key = {.seed = 7 + r, .epoch = r * 3, .round = r, .segment = s};
            const int i = ds_topo_pair_initiator(&key);
            cr_assert(i == 0 || i == 1);
            first += i == 0;
            ds_topo_key next = key;
            next.round++;
            cr_expect_eq(ds_topo_pair_initiator(&next), 1 - i, "round %llu segment %u",
                         (unsigned long long)r, s);
        }
        cr_expect_eq(first, 3, "round %llu: group 0 initiates %d of 6", (unsigned long long)r,
                     first);
    }
}
