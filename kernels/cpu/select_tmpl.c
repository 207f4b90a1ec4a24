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
 * Required from the includer:
 *   W, SFX, vf, vi, msk (an unsigned lane mask),
 *   vload(p), vloadi(p), vset1i(x), vaddi(a, b), viota(), vsrli20(k)
 *   vkey(x)        sign-cleared bits of a float vector, as vi
 *   vge(a, b)      lanes with a >= b (signed; every key is < 2^31)
 *   vlt(a, b)      lanes with a < b
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
    const vi tv = vset1i((int32_t)t), inf = vset1i((int32_t)DS_SEL_KEY_INF);
    size_t counted = 0, finite = 0, i = 0;
    for (; i + W <= n; i += W) {
        const vi k = vkey(vload(v + i));
        const msk fin = vlt(k, inf);
        counted += mpop(vge(k, tv) & fin);
        finite += mpop(fin);
    }
    size_t nonfinite = i - finite;
    for (; i < n; i++) {
        const uint32_t k = ds_sel_key(v[i]);
        nonfinite += k >= DS_SEL_KEY_INF;
        counted += k < DS_SEL_KEY_INF && k >= t;
    }
    out->kept = 0;
    out->counted = counted;
    out->nonfinite = nonfinite;
}

DS_DECL_SEL_COMPACT(FN(ds_sel_compact))
{
    const vi tk = vset1i((int32_t)t_keep), tc = vset1i((int32_t)t_count);
    const vi inf = vset1i((int32_t)DS_SEL_KEY_INF), step = vset1i(W);
    vi pos = vaddi(vset1i((int32_t)base), viota());
    size_t kept = 0, counted = 0, finite = 0, i = 0;
    for (; i + W <= n; i += W) {
        const vf x = vload(v + i);
        const vi k = vkey(x);
        const msk fin = vlt(k, inf);
        const msk keep = vge(k, tk) & fin;
        counted += mpop(vge(k, tc) & fin);
        finite += mpop(fin);
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
    size_t nonfinite = i - finite;
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
