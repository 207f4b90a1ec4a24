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
 * memset and no scattered stores. */
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
            for (int ox = 0; ox < ow; ox++) {
                const float a = r0[2 * ox], b = r0[2 * ox + 1], c = r1[2 * ox],
                            d = r1[2 * ox + 1];
                float m = a;
                int k = 0;
                k = b > m ? 1 : k;
                m = b > m ? b : m;
                k = c > m ? 2 : k;
                m = c > m ? c : m;
                k = d > m ? 3 : k;
                const float v = g[ox];
                d0[2 * ox] = k == 0 ? v : 0.0f;
                d0[2 * ox + 1] = k == 1 ? v : 0.0f;
                d1[2 * ox] = k == 2 ? v : 0.0f;
                d1[2 * ox + 1] = k == 3 ? v : 0.0f;
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

#undef FN
#undef CAT
#undef CAT_
