/*
 * kernels/cpu/simd_tmpl.c: the elementwise and reduction kernels written
 * once for any vector width. avx2.c and avx512.c define the vector macros
 * (W lanes, vload, vfma, ...) and the suffix SFX, then include this file;
 * tails shorter than one vector fall back to scalar code with the same
 * formula. Reductions widen to double like the reference does.
 */
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, CAT(_, SFX))

DS_DECL_BIAS_ADD(FN(ds_bias_add))
{
    for (int r = 0; r < rows; r++) {
        float *yr = y + (size_t)r * cols;
        int c = 0;
        for (; c + W <= cols; c += W)
            vstore(yr + c, vadd(vload(yr + c), vload(bias + c)));
        for (; c < cols; c++)
            yr[c] += bias[c];
    }
}

DS_DECL_BIAS_GRAD(FN(ds_bias_grad))
{
    /* Column sums in double, one vector of columns at a time, so the result
     * matches the reference's accumulation order up to double rounding. */
    int c = 0;
    for (; c + W <= cols; c += W) {
        vd lo = vd_zero(), hi = vd_zero();
        for (int r = 0; r < rows; r++) {
            const vf v = vload(dy + (size_t)r * cols + c);
            lo = vd_add(lo, vd_lo(v));
            hi = vd_add(hi, vd_hi(v));
        }
        double tmp[W];
        vd_store(tmp, lo);
        vd_store(tmp + W / 2, hi);
        for (int j = 0; j < W; j++)
            db[c + j] = (float)tmp[j];
    }
    for (; c < cols; c++) {
        double s = 0;
        for (int r = 0; r < rows; r++)
            s += dy[(size_t)r * cols + c];
        db[c] = (float)s;
    }
}

DS_DECL_RELU_FWD(FN(ds_relu_fwd))
{
    const vf z = vzero();
    size_t i = 0;
    /* max(x, 0) returns its second operand for NaN, matching the reference's
     * "x > 0 ? x : 0". */
    for (; i + W <= n; i += W)
        vstore(y + i, vmax(vload(x + i), z));
    for (; i < n; i++)
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

DS_DECL_RELU_BWD(FN(ds_relu_bwd))
{
    size_t i = 0;
    for (; i + W <= n; i += W)
        vstore(dx + i, vsel_gt0(vload(y + i), vload(dy + i)));
    for (; i < n; i++)
        dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

DS_DECL_SGD(FN(ds_sgd))
{
    const float lr = p->lr, mu = p->momentum, wd = p->weight_decay;
    const vf vlr = vset1(lr), vmu = vset1(mu), vwd = vset1(wd);
    size_t i = 0;
    if (mu != 0.0f) {
        for (; i + W <= n; i += W) {
            const vf th = vload(theta + i);
            const vf g = vfma(vwd, th, vload(grad + i));
            const vf m = vfma(vmu, vload(mom + i), g);
            vstore(mom + i, m);
            const vf u = p->nesterov ? vfma(vmu, m, g) : m;
            vstore(theta + i, vfnma(vlr, u, th));
        }
    } else {
        for (; i + W <= n; i += W) {
            const vf th = vload(theta + i);
            const vf g = vfma(vwd, th, vload(grad + i));
            vstore(theta + i, vfnma(vlr, g, th));
        }
    }
    for (; i < n; i++) {
        float g = grad[i] + wd * theta[i];
        if (mu != 0.0f) {
            const float m = mu * mom[i] + g;
            mom[i] = m;
            g = p->nesterov ? g + mu * m : m;
        }
        theta[i] -= lr * g;
    }
}

DS_DECL_AXPY(FN(ds_axpy))
{
    const vf va = vset1(a);
    size_t i = 0;
    for (; i + W <= n; i += W)
        vstore(y + i, vfma(va, vload(x + i), vload(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}

DS_DECL_SCALE(FN(ds_scale))
{
    const vf va = vset1(a);
    size_t i = 0;
    for (; i + W <= n; i += W)
        vstore(x + i, vmul(va, vload(x + i)));
    for (; i < n; i++)
        x[i] *= a;
}

DS_DECL_DOT(FN(ds_dot))
{
    vd a0 = vd_zero(), a1 = vd_zero();
    size_t i = 0;
    for (; i + W <= n; i += W) {
        const vf u = vload(x + i), v = vload(y + i);
        a0 = vd_fma(vd_lo(u), vd_lo(v), a0);
        a1 = vd_fma(vd_hi(u), vd_hi(v), a1);
    }
    double s = vd_hsum(vd_add(a0, a1));
    for (; i < n; i++)
        s += (double)x[i] * (double)y[i];
    return s;
}

DS_DECL_NRM2(FN(ds_nrm2))
{
    vd a0 = vd_zero(), a1 = vd_zero();
    size_t i = 0;
    for (; i + W <= n; i += W) {
        const vf u = vload(x + i);
        const vd lo = vd_lo(u), hi = vd_hi(u);
        a0 = vd_fma(lo, lo, a0);
        a1 = vd_fma(hi, hi, a1);
    }
    double s = vd_hsum(vd_add(a0, a1));
    for (; i < n; i++)
        s += (double)x[i] * (double)x[i];
    return sqrt(s);
}

DS_DECL_SUM(FN(ds_sum))
{
    vd a0 = vd_zero(), a1 = vd_zero();
    size_t i = 0;
    for (; i + W <= n; i += W) {
        const vf u = vload(x + i);
        a0 = vd_add(a0, vd_lo(u));
        a1 = vd_add(a1, vd_hi(u));
    }
    double s = vd_hsum(vd_add(a0, a1));
    for (; i < n; i++)
        s += x[i];
    return s;
}


/* n lanes from p: a plain load for a full vector, a masked one for a tail. */
static inline vf load_n(const float *p, int n, vmask m)
{
    return n == W ? vload(p) : vload_m(p, m);
}

static inline void store_n(float *p, int n, vmask m, vf v)
{
    if (n == W)
        vstore(p, v);
    else
        vstore_m(p, m, v);
}

/* 2x2 max-pool, row pair by row pair. The window's maximum is chosen by
 * the reference's sequence of strict comparisons (first maximum in
 * row-major order; a NaN is never chosen over a number before it), written
 * as selects, without branches, so the compiler vectorizes the loop over
 * the windows of a row pair with this file's ISA. */
DS_DECL_MAXPOOL_FWD(FN(ds_maxpool_fwd))
{
    const int oh = h / 2, ow = w / 2;
    for (int p = 0; p < planes; p++) {
        const float *xp = x + (size_t)p * h * w;
        float *yp = y + (size_t)p * oh * ow;
        for (int oy = 0; oy < oh; oy++) {
            const float *r0 = xp + (size_t)(2 * oy) * w, *r1 = r0 + w;
            float *yr = yp + (size_t)oy * ow;
            for (int ox = 0; ox < ow; ox++) {
                float m = r0[2 * ox];
                const float b = r0[2 * ox + 1], c = r1[2 * ox], d = r1[2 * ox + 1];
                m = b > m ? b : m;
                m = c > m ? c : m;
                m = d > m ? d : m;
                yr[ox] = m;
            }
        }
    }
}

/* Every element of dx written once, in order: the window's chosen element
 * gets dy, the other three 0, and a dropped odd last row or column 0; no
 * memset and no scattered stores. The rows are worked on as loaded, pairs
 * interleaved: each window's four values and its dy are spread over the
 * window's two lanes (swap and blend within lane pairs), the reference's
 * three strict comparisons made as compare masks, and the two output rows
 * blended back; the last vector of a row is masked. */
DS_DECL_MAXPOOL_BWD(FN(ds_maxpool_bwd))
{
    const int oh = h / 2, ow = w / 2;
    for (int p = 0; p < planes; p++) {
        const float *xp = x + (size_t)p * h * w;
        const float *dyp = dy + (size_t)p * oh * ow;
        float *dxp = dx + (size_t)p * h * w;
        for (int oy = 0; oy < oh; oy++) {
            const float *r0 = xp + (size_t)(2 * oy) * w, *r1 = r0 + w;
            float *d0 = dxp + (size_t)(2 * oy) * w, *d1 = d0 + w;
            const float *g = dyp + (size_t)oy * ow;
            for (int ox = 0; ox < ow; ox += W / 2) {
                const int nw = ow - ox < W / 2 ? ow - ox : W / 2; /* windows */
                const int cnt = 2 * nw;
                const vmask m = vmask_n(cnt);
                const vf u0 = load_n(r0 + 2 * ox, cnt, m), u1 = load_n(r1 + 2 * ox, cnt, m);
                const vf s0 = vswap_pairs(u0), s1 = vswap_pairs(u1);
                const vf a = vblend_odd(u0, s0), b = vblend_odd(s0, u0);
                const vf c = vblend_odd(u1, s1), d = vblend_odd(s1, u1);
                const vcm sb = vcmpgt(b, a);
                const vf m1 = vblendm(sb, a, b);
                const vcm sc = vcmpgt(c, m1);
                const vf m2 = vblendm(sc, m1, c);
                const vcm sd = vcmpgt(d, m2);
                const vf v = vload_dup_n(g + ox, nw);
                const vf not_d = vandn_m(sd, v), not_cd = vandn_m(sc, not_d);
                store_n(d0 + 2 * ox, cnt, m, vblend_odd(vandn_m(sb, not_cd), vand_m(sb, not_cd)));
                store_n(d1 + 2 * ox, cnt, m, vblend_odd(vand_m(sc, not_d), vand_m(sd, v)));
            }
            if (w & 1) {
                d0[w - 1] = 0.0f;
                d1[w - 1] = 0.0f;
            }
        }
        if (h & 1)
            memset(dxp + (size_t)(h - 1) * w, 0, (size_t)w * sizeof(float));
    }
}

/* ---- direct convolution for few input channels --------------------------
 * With c_in = 1 and k = 3, im2col's GEMM has an inner size of 9, which
 * OpenBLAS runs far below its peak. These loops work on one zero-padded
 * image, c_in x (h + 2p) x (w + 2p), kept in `col` (it fits: (h + 2p) <=
 * k*h for h >= 1, the same for w), a vector of output columns at a time; the
 * last vector of a row is masked. Sums are in float, in a different order
 * from the reference's double sums (tests/test_kernels.c allows for it). */

static void pad_image(float *xp, const float *x, int c_in, int h, int w, int p)
{
    const int hp = h + 2 * p, wp = w + 2 * p;
    memset(xp, 0, (size_t)c_in * hp * wp * sizeof(float));
    for (int ci = 0; ci < c_in; ci++)
        for (int y = 0; y < h; y++)
            memcpy(xp + ((size_t)ci * hp + y + p) * wp + p, x + ((size_t)ci * h + y) * w,
                   (size_t)w * sizeof(float));
}

static inline float hsum_f(vf v)
{
    return (float)vd_hsum(vd_add(vd_lo(v), vd_hi(v)));
}

DS_DECL_CONV2D_FWD(FN(ds_conv2d_fwd_direct))
{
    const int c_in = s->c_in, c_out = s->c_out, h = s->h, wd = s->w, k = s->k, p = k / 2;
    const int wp = wd + 2 * p;
    const size_t plane = (size_t)h * wd, pplane = (size_t)(h + 2 * p) * wp;
    const int kk = k * k;
    for (int n = 0; n < s->batch; n++) {
        pad_image(col, x + (size_t)n * c_in * plane, c_in, h, wd, p);
        float *yn = y + (size_t)n * c_out * plane;
        for (int oy = 0; oy < h; oy++)
            for (int ox = 0; ox < wd; ox += W) {
                const int cnt = wd - ox < W ? wd - ox : W;
                const vmask m = vmask_n(cnt);
                const size_t yo = (size_t)oy * wd + ox;
                if (c_in == 1 && k == 3) {
                    /* The nine shifted input vectors once, then every
                     * output channel from registers. */
                    const float *r = col + (size_t)oy * wp + ox;
                    const vf x0 = load_n(r, cnt, m), x1 = load_n(r + 1, cnt, m),
                             x2 = load_n(r + 2, cnt, m), x3 = load_n(r + wp, cnt, m),
                             x4 = load_n(r + wp + 1, cnt, m), x5 = load_n(r + wp + 2, cnt, m),
                             x6 = load_n(r + 2 * wp, cnt, m),
                             x7 = load_n(r + 2 * wp + 1, cnt, m),
                             x8 = load_n(r + 2 * wp + 2, cnt, m);
                    for (int co = 0; co < c_out; co++) {
                        const float *wc = w + (size_t)co * 9;
                        vf a = vfma(vset1(wc[0]), x0, vset1(bias[co]));
                        a = vfma(vset1(wc[1]), x1, a);
                        a = vfma(vset1(wc[2]), x2, a);
                        a = vfma(vset1(wc[3]), x3, a);
                        a = vfma(vset1(wc[4]), x4, a);
                        a = vfma(vset1(wc[5]), x5, a);
                        a = vfma(vset1(wc[6]), x6, a);
                        a = vfma(vset1(wc[7]), x7, a);
                        a = vfma(vset1(wc[8]), x8, a);
                        store_n(yn + (size_t)co * plane + yo, cnt, m, a);
                    }
                    continue;
                }
                for (int co = 0; co < c_out; co++) {
                    vf a = vset1(bias[co]);
                    for (int ci = 0; ci < c_in; ci++) {
                        const float *wc = w + ((size_t)co * c_in + ci) * kk;
                        const float *xc = col + ci * pplane + (size_t)oy * wp + ox;
                        for (int ky = 0; ky < k; ky++)
                            for (int kx = 0; kx < k; kx++)
                                a = vfma(vset1(wc[ky * k + kx]),
                                         load_n(xc + (size_t)ky * wp + kx, cnt, m), a);
                    }
                    store_n(yn + (size_t)co * plane + yo, cnt, m, a);
                }
            }
    }
}

/* dw and db by direct sums over each image's output plane; the input
 * gradient, when asked for, by the im2col path (this variant is chosen for
 * a network's first layer, whose input gradient is never formed). */
DS_DECL_CONV2D_BWD(FN(ds_conv2d_bwd_direct))
{
    if (dx) {
        ds_conv2d_bwd_blas(dx, dw, db, dy, x, w, s, col);
        return;
    }
    const int c_in = s->c_in, c_out = s->c_out, h = s->h, wd = s->w, k = s->k, p = k / 2;
    const int wp = wd + 2 * p, kk = k * k;
    const size_t plane = (size_t)h * wd, pplane = (size_t)(h + 2 * p) * wp;
    memset(dw, 0, (size_t)c_out * c_in * kk * sizeof(float));
    memset(db, 0, (size_t)c_out * sizeof(float));
    for (int n = 0; n < s->batch; n++) {
        pad_image(col, x + (size_t)n * c_in * plane, c_in, h, wd, p);
        for (int co = 0; co < c_out; co++) {
            const float *g = dy + ((size_t)n * c_out + co) * plane;
            vf ab = vzero();
            for (int ci = 0; ci < c_in; ci++) {
                float *dwc = dw + ((size_t)co * c_in + ci) * kk;
                const float *xc = col + ci * pplane;
                if (k == 3) {
                    vf a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero(), a4 = vzero(),
                       a5 = vzero(), a6 = vzero(), a7 = vzero(), a8 = vzero();
                    for (int oy = 0; oy < h; oy++)
                        for (int ox = 0; ox < wd; ox += W) {
                            const int cnt = wd - ox < W ? wd - ox : W;
                            const vmask m = vmask_n(cnt);
                            const vf d = load_n(g + (size_t)oy * wd + ox, cnt, m);
                            const float *r = xc + (size_t)oy * wp + ox;
                            if (ci == 0)
                                ab = vadd(ab, d);
                            a0 = vfma(d, load_n(r, cnt, m), a0);
                            a1 = vfma(d, load_n(r + 1, cnt, m), a1);
                            a2 = vfma(d, load_n(r + 2, cnt, m), a2);
                            a3 = vfma(d, load_n(r + wp, cnt, m), a3);
                            a4 = vfma(d, load_n(r + wp + 1, cnt, m), a4);
                            a5 = vfma(d, load_n(r + wp + 2, cnt, m), a5);
                            a6 = vfma(d, load_n(r + 2 * wp, cnt, m), a6);
                            a7 = vfma(d, load_n(r + 2 * wp + 1, cnt, m), a7);
                            a8 = vfma(d, load_n(r + 2 * wp + 2, cnt, m), a8);
                        }
                    dwc[0] += hsum_f(a0);
                    dwc[1] += hsum_f(a1);
                    dwc[2] += hsum_f(a2);
                    dwc[3] += hsum_f(a3);
                    dwc[4] += hsum_f(a4);
                    dwc[5] += hsum_f(a5);
                    dwc[6] += hsum_f(a6);
                    dwc[7] += hsum_f(a7);
                    dwc[8] += hsum_f(a8);
                    continue;
                }
                for (int t = 0; t < kk; t++) {
                    const int ky = t / k, kx = t % k;
                    vf a = vzero();
                    for (int oy = 0; oy < h; oy++)
                        for (int ox = 0; ox < wd; ox += W) {
                            const int cnt = wd - ox < W ? wd - ox : W;
                            const vmask m = vmask_n(cnt);
                            const vf d = load_n(g + (size_t)oy * wd + ox, cnt, m);
                            if (ci == 0 && t == 0)
                                ab = vadd(ab, d);
                            a = vfma(d, load_n(xc + (size_t)(oy + ky) * wp + ox + kx, cnt, m), a);
                        }
                    dwc[t] += hsum_f(a);
                }
            }
            db[co] += hsum_f(ab);
        }
    }
}

/* The production conv ops of this ISA: direct loops for few input
 * channels, im2col + OpenBLAS otherwise. */
DS_DECL_CONV2D_FWD(FN(ds_conv2d_fwd))
{
    if (s->c_in <= DS_CONV_DIRECT_MAX_CIN)
        FN(ds_conv2d_fwd_direct)(y, x, w, bias, s, col);
    else
        ds_conv2d_fwd_blas(y, x, w, bias, s, col);
}

DS_DECL_CONV2D_BWD(FN(ds_conv2d_bwd))
{
    if (s->c_in <= DS_CONV_DIRECT_MAX_CIN && !dx)
        FN(ds_conv2d_bwd_direct)(dx, dw, db, dy, x, w, s, col);
    else
        ds_conv2d_bwd_blas(dx, dw, db, dy, x, w, s, col);
}

#undef FN
#undef CAT
#undef CAT_
