/*
 * kernels/cpu/select_tmpl.c: the streaming selection kernels written once
 * for any vector width (see kernels/select.h for what each computes).
 * select_avx2.c and select_avx512.c define the vector macros and the suffix
 * SFX, then include this file; gather and scatter-add differ too much
 * between the two instruction sets and live in those files.
 *
 * The hot loop of count / compact / filter is branch-free per lane: load W
 * floats, clear the sign bits to get the magnitude keys, compare them as
 * integers, and turn the compare into a lane mask. Compaction packs the
 * kept lanes of the index and value vectors to the front (one AVX-512
 * vcompress, or an AVX2 permutation looked up by mask), stores the whole
 * vectors at the output cursor and advances it by popcount(mask). The
 * stores write W lanes even when fewer are kept; that is safe while
 * cursor + W <= cap, and the one branch per vector that checks it is always
 * taken in the common case. Close to cap the lanes are written one by one.
 *
 * Lanes are selected with one unsigned compare: t <= key < Inf exactly
 * when key - t < Inf - t (unsigned), which also keeps NaN and Inf out.
 * Counts other than the kept one accumulate per lane in a vector and are
 * summed once at the end.
 *
 * Required from the includer:
 *   W, SFX, vf, vi, msk (an unsigned lane mask), vm (the ISA's compare
 *   result: a k-mask, or a vector of all-ones lanes),
 *   vload(p), vloadi(p), vset1i(x), vaddi(a, b), viota(), vsrli20(k)
 *   vkey(x)        sign-cleared bits of a float vector, as vi
 *   vge(a, b)      lanes with a >= b as msk (signed; every key is < 2^31)
 *   vm_inrange(k, lo, span)  lanes with k - lo < span (unsigned), as vm
 *   vm_nonfinite(k)          lanes with k >= the key of +Inf, as vm
 *   vm_bits(m)     vm -> msk
 *   vcount(c, m)   c + 1 in the lanes of m
 *   vi_hsum(c)     sum of the lanes of c, as size_t
 *   mpop(m)        number of set lanes
 *   vstorei(p, a)  store an int vector
 *   compress_store(pidx, pval, m, vidx, vval): pack the lanes of m to the
 *                  front of both vectors and store W lanes at pidx / pval
 *   vd, vd_zero(), vd_fma(a, b, c), vd_hsum(a), vd_lo(x), vd_hi(x),
 *   vfinite(x)     x with its NaN / Inf lanes set to 0
 */
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, CAT(_, SFX))

DS_DECL_SEL_COUNT(FN(ds_sel_count))
{
    if (t > DS_SEL_KEY_INF)
        t = DS_SEL_KEY_INF;
    const vi lo = vset1i((int32_t)t), span = vset1i((int32_t)(DS_SEL_KEY_INF - t));
    vi cnt = vset1i(0), bad = vset1i(0);
    size_t i = 0;
    for (; i + W <= n; i += W) {
        const vi k = vkey(vload(v + i));
        cnt = vcount(cnt, vm_inrange(k, lo, span));
        bad = vcount(bad, vm_nonfinite(k));
    }
    size_t counted = vi_hsum(cnt), nonfinite = vi_hsum(bad);
    for (; i < n; i++) {
        const uint32_t k = ds_sel_key(v[i]);
        nonfinite += k >= DS_SEL_KEY_INF;
        counted += k < DS_SEL_KEY_INF && k >= t;
    }
    out->kept = 0;
    out->counted = counted;
    out->nonfinite = nonfinite;
}

/* The compaction loop over whole vectors, with or without the second
 * threshold's count (a constant at each call site, so the compiler drops
 * the unused compare). Returns how far it got. */
static inline __attribute__((always_inline)) size_t FN(compact_body)(
    const float *v, size_t n, uint32_t t_keep, uint32_t t_count, int with_count, uint32_t base,
    uint32_t *idx, float *val, size_t cap, size_t *kept_io, size_t *counted, size_t *nonfinite)
{
    const vi lo_k = vset1i((int32_t)t_keep), span_k = vset1i((int32_t)(DS_SEL_KEY_INF - t_keep));
    const vi lo_c = vset1i((int32_t)t_count), span_c = vset1i((int32_t)(DS_SEL_KEY_INF - t_count));
    const vi step = vset1i(W);
    vi pos = vaddi(vset1i((int32_t)base), viota());
    vi cnt = vset1i(0), bad = vset1i(0);
    size_t kept = 0, i = 0;
    for (; i + W <= n; i += W) {
        const vf x = vload(v + i);
        const vi k = vkey(x);
        const msk keep = vm_bits(vm_inrange(k, lo_k, span_k));
        if (with_count)
            cnt = vcount(cnt, vm_inrange(k, lo_c, span_c));
        bad = vcount(bad, vm_nonfinite(k));
        if (kept + W <= cap) {
            compress_store(idx + kept, val + kept, keep, pos, x);
        } else {
            size_t j = kept;
            for (unsigned l = 0; l < W; l++) {
                if (!((keep >> l) & 1u))
                    continue;
                if (j < cap) {
                    idx[j] = base + (uint32_t)(i + l);
                    val[j] = v[i + l];
                }
                j++;
            }
        }
        kept += mpop(keep);
        pos = vaddi(pos, step);
    }
    *kept_io = kept;
    *counted = with_count ? vi_hsum(cnt) : kept;
    *nonfinite = vi_hsum(bad);
    return i;
}

DS_DECL_SEL_COMPACT(FN(ds_sel_compact))
{
    if (t_keep > DS_SEL_KEY_INF)
        t_keep = DS_SEL_KEY_INF;
    if (t_count > DS_SEL_KEY_INF)
        t_count = DS_SEL_KEY_INF;
    size_t kept, counted, nonfinite, i;
    /* Only SAGE counts at a second threshold; the others save a compare. */
    if (t_count == t_keep)
        i = FN(compact_body)(v, n, t_keep, t_count, 0, base, idx, val, cap, &kept, &counted, &nonfinite);
    else
        i = FN(compact_body)(v, n, t_keep, t_count, 1, base, idx, val, cap, &kept, &counted, &nonfinite);
    for (; i < n; i++) {
        const uint32_t k = ds_sel_key(v[i]);
        if (k >= DS_SEL_KEY_INF) {
            nonfinite++;
            continue;
        }
        counted += k >= t_count;
        if (k >= t_keep) {
            if (kept < cap) {
                idx[kept] = base + (uint32_t)i;
                val[kept] = v[i];
            }
            kept++;
        }
    }
    out->kept = kept;
    out->counted = counted;
    out->nonfinite = nonfinite;
}

DS_DECL_SEL_FILTER(FN(ds_sel_filter))
{
    /* In place: the store cursor j never passes the load cursor i, and the
     * W lanes stored at j lie below i + W, which were loaded already. */
    const vi tv = vset1i((int32_t)t);
    size_t j = 0, i = 0;
    for (; i + W <= count; i += W) {
        const vf x = vload(val + i);
        const vi ix = vloadi(idx + i);
        const msk keep = vge(vkey(x), tv);
        compress_store(idx + j, val + j, keep, ix, x);
        j += mpop(keep);
    }
    for (; i < count; i++) {
        if (ds_sel_key(val[i]) >= t) {
            idx[j] = idx[i];
            val[j] = val[i];
            j++;
        }
    }
    return j;
}

DS_DECL_SEL_HIST(FN(ds_sel_hist))
{
    /* Gradients crowd into a few buckets, so consecutive increments of one
     * counter would wait on each other's store. Four sub-histograms, lane l
     * counting into sub-histogram l % 4, break that chain; they are summed
     * into hist at the end. 4 x 8 KiB stays in L1. */
    uint32_t sub[4][DS_SEL_HIST_BUCKETS];
    memset(sub, 0, sizeof(sub));
    size_t i = 0;
    uint32_t b[W];
    for (; i + W <= n; i += W) {
        vstorei((int32_t *)b, vsrli20(vkey(vload(v + i))));
        for (unsigned l = 0; l < W; l += 4) {
            sub[0][b[l]]++;
            sub[1][b[l + 1]]++;
            sub[2][b[l + 2]]++;
            sub[3][b[l + 3]]++;
        }
    }
    for (; i < n; i++)
        sub[0][ds_sel_key(v[i]) >> DS_SEL_HIST_SHIFT]++;
    for (unsigned h = 0; h < DS_SEL_HIST_BUCKETS; h++)
        hist[h] += sub[0][h] + sub[1][h] + sub[2][h] + sub[3][h];
}

DS_DECL_SEL_NORMS(FN(ds_sel_norms))
{
    for (size_t u = 0; u < n_units; u++) {
        const float *p = v + unit_off[u];
        const size_t len = unit_off[u + 1] - unit_off[u];
        vd a0 = vd_zero(), a1 = vd_zero();
        size_t i = 0;
        for (; i + W <= len; i += W) {
            const vf x = vload(p + i);
            const vf f = vfinite(x);
            const vd lo = vd_lo(f), hi = vd_hi(f);
            a0 = vd_fma(lo, lo, a0);
            a1 = vd_fma(hi, hi, a1);
        }
        double s = vd_hsum(a0) + vd_hsum(a1);
        for (; i < len; i++)
            if (ds_sel_key(p[i]) < DS_SEL_KEY_INF)
                s += (double)p[i] * (double)p[i];
        norms[u] = sqrt(s);
    }
}

#undef FN
#undef CAT
#undef CAT_
