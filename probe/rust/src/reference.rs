//! CPU references for the ops level: a float64-accumulating GEMM and direct convolution,
//! a deterministic input generator, and the error measures the checks bound.

/// SplitMix64: deterministic inputs without a dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform()).collect()
    }
}

fn threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(64)
}

/// Row-major C (m x n) = A (m x k) * B (k x n), accumulated in f64, rows split across threads.
pub fn gemm_f64(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f64> {
    assert_eq!(a.len(), m * k);
    assert_eq!(b.len(), k * n);
    let mut c = vec![0.0f64; m * n];
    if m == 0 || n == 0 {
        return c;
    }
    let b64: Vec<f64> = b.iter().map(|&v| v as f64).collect();
    let rows_per = m.div_ceil(threads());
    std::thread::scope(|scope| {
        for (chunk_index, chunk) in c.chunks_mut(rows_per * n).enumerate() {
            let b64 = &b64;
            scope.spawn(move || {
                for (r, row) in chunk.chunks_mut(n).enumerate() {
                    let i = chunk_index * rows_per + r;
                    for p in 0..k {
                        let aip = a[i * k + p] as f64;
                        let brow = &b64[p * n..(p + 1) * n];
                        for (out, &bv) in row.iter_mut().zip(brow) {
                            *out += aip * bv;
                        }
                    }
                }
            });
        }
    });
    c
}

/// A 2-D convolution's shape: NCHW input, KCRS filter, zero padding, stride 1, no dilation
/// (cross-correlation, what cuDNN's CUDNN_CROSS_CORRELATION and every framework compute).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvShape {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub k: usize,
    pub r: usize,
    pub s: usize,
    pub pad: usize,
}

impl ConvShape {
    pub fn out_h(&self) -> usize {
        self.h + 2 * self.pad + 1 - self.r
    }
    pub fn out_w(&self) -> usize {
        self.w + 2 * self.pad + 1 - self.s
    }
    pub fn input_len(&self) -> usize {
        self.n * self.c * self.h * self.w
    }
    pub fn filter_len(&self) -> usize {
        self.k * self.c * self.r * self.s
    }
    pub fn output_len(&self) -> usize {
        self.n * self.k * self.out_h() * self.out_w()
    }
}

/// Direct convolution in f64, split over the batch and output channels.
pub fn conv2d_f64(shape: ConvShape, x: &[f32], w: &[f32]) -> Vec<f64> {
    let ConvShape {
        n: _,
        c,
        h,
        w: width,
        k,
        r,
        s,
        pad,
    } = shape;
    assert_eq!(x.len(), shape.input_len());
    assert_eq!(w.len(), shape.filter_len());
    let (oh, ow) = (shape.out_h(), shape.out_w());
    let mut y = vec![0.0f64; shape.output_len()];
    let plane = oh * ow;
    std::thread::scope(|scope| {
        // One task per (image, output channel) plane, handed out round-robin.
        let workers = threads();
        let mut planes: Vec<Vec<(usize, &mut [f64])>> = (0..workers).map(|_| Vec::new()).collect();
        for (index, out) in y.chunks_mut(plane).enumerate() {
            planes[index % workers].push((index, out));
        }
        for work in planes {
            scope.spawn(move || {
                for (index, out) in work {
                    let (img, oc) = (index / k, index % k);
                    for ic in 0..c {
                        let xin = &x[(img * c + ic) * h * width..(img * c + ic + 1) * h * width];
                        let wk = &w[(oc * c + ic) * r * s..(oc * c + ic + 1) * r * s];
                        for fr in 0..r {
                            for fs in 0..s {
                                let weight = wk[fr * s + fs] as f64;
                                for oy in 0..oh {
                                    let iy = oy + fr;
                                    if iy < pad || iy - pad >= h {
                                        continue;
                                    }
                                    let row = &xin[(iy - pad) * width..(iy - pad + 1) * width];
                                    let orow = &mut out[oy * ow..(oy + 1) * ow];
                                    for (ox, o) in orow.iter_mut().enumerate() {
                                        let ix = ox + fs;
                                        if ix < pad || ix - pad >= width {
                                            continue;
                                        }
                                        *o += weight * row[ix - pad] as f64;
                                    }
                                }
                            }
                        }
                    }
                }
            });
        }
    });
    y
}

/// ||got - want||_F / ||want||_F (what probe.py's ops.matmul bounds).
pub fn relative_frobenius(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        let d = g as f64 - w;
        diff += d * d;
        norm += w * w;
    }
    if norm == 0.0 {
        return if diff == 0.0 { 0.0 } else { f64::INFINITY };
    }
    (diff / norm).sqrt()
}

/// max |got - want| / max |want| (what probe.py's ops.conv bounds). NaN in `got` gives NaN.
pub fn relative_max(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut diff, mut scale) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        let d = (g as f64 - w).abs();
        if d.is_nan() {
            return f64::NAN;
        }
        diff = diff.max(d);
        scale = scale.max(w.abs());
    }
    if scale == 0.0 {
        return if diff == 0.0 { 0.0 } else { f64::INFINITY };
    }
    diff / scale
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive_gemm(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k)
                    .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                    .sum();
            }
        }
        c
    }

    #[test]
    fn gemm_matches_a_hand_computed_product() {
        // [1 2; 3 4] * [5 6; 7 8] = [19 22; 43 50]
        let c = gemm_f64(2, 2, 2, &[1., 2., 3., 4.], &[5., 6., 7., 8.]);
        assert_eq!(c, vec![19., 22., 43., 50.]);
        // Non-square, more rows than threads, odd sizes.
        let (m, n, k) = (67, 13, 29);
        let mut rng = Rng::new(3);
        let (a, b) = (rng.vec(m * k), rng.vec(k * n));
        let fast = gemm_f64(m, n, k, &a, &b);
        let slow = naive_gemm(m, n, k, &a, &b);
        for (x, y) in fast.iter().zip(&slow) {
            assert!((x - y).abs() < 1e-12, "{x} vs {y}");
        }
    }

    fn naive_conv(shape: ConvShape, x: &[f32], w: &[f32]) -> Vec<f64> {
        let (oh, ow) = (shape.out_h(), shape.out_w());
        let mut y = vec![0.0; shape.output_len()];
        for img in 0..shape.n {
            for oc in 0..shape.k {
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut acc = 0.0f64;
                        for ic in 0..shape.c {
                            for fr in 0..shape.r {
                                for fs in 0..shape.s {
                                    let iy = oy as isize + fr as isize - shape.pad as isize;
                                    let ix = ox as isize + fs as isize - shape.pad as isize;
                                    if iy < 0
                                        || ix < 0
                                        || iy >= shape.h as isize
                                        || ix >= shape.w as isize
                                    {
                                        continue;
                                    }
                                    let xi = ((img * shape.c + ic) * shape.h + iy as usize)
                                        * shape.w
                                        + ix as usize;
                                    let wi = ((oc * shape.c + ic) * shape.r + fr) * shape.s + fs;
                                    acc += x[xi] as f64 * w[wi] as f64;
                                }
                            }
                        }
                        y[((img * shape.k + oc) * oh + oy) * ow + ox] = acc;
                    }
                }
            }
        }
        y
    }

    #[test]
    fn conv_matches_a_hand_computed_case() {
        // 1x1x3x3 input of ones, one 3x3 filter of ones, pad 1: corners see 4, edges 6, centre 9.
        let shape = ConvShape {
            n: 1,
            c: 1,
            h: 3,
            w: 3,
            k: 1,
            r: 3,
            s: 3,
            pad: 1,
        };
        let y = conv2d_f64(shape, &[1.0; 9], &[1.0; 9]);
        assert_eq!(y, vec![4., 6., 4., 6., 9., 6., 4., 6., 4.]);
        // No padding shrinks the output.
        let shape = ConvShape {
            n: 1,
            c: 1,
            h: 4,
            w: 5,
            k: 1,
            r: 3,
            s: 3,
            pad: 0,
        };
        assert_eq!((shape.out_h(), shape.out_w()), (2, 3));
        assert_eq!(conv2d_f64(shape, &[1.0; 20], &[1.0; 9]), vec![9.0; 6]);
    }

    #[test]
    fn conv_matches_the_naive_loop_on_random_data() {
        let shape = ConvShape {
            n: 3,
            c: 5,
            h: 7,
            w: 6,
            k: 4,
            r: 3,
            s: 3,
            pad: 1,
        };
        let mut rng = Rng::new(1);
        let (x, w) = (rng.vec(shape.input_len()), rng.vec(shape.filter_len()));
        let fast = conv2d_f64(shape, &x, &w);
        let slow = naive_conv(shape, &x, &w);
        assert_eq!(fast.len(), 3 * 4 * 7 * 6);
        for (a, b) in fast.iter().zip(&slow) {
            assert!((a - b).abs() < 1e-12, "{a} vs {b}");
        }
    }

    #[test]
    fn error_measures() {
        assert_eq!(relative_frobenius(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        let e = relative_frobenius(&[3.0, 4.0 + 0.05], &[3.0, 4.0]);
        assert!((e - 0.01).abs() < 1e-6, "{e}");
        assert_eq!(relative_max(&[1.0, -2.0], &[1.0, -2.5]), 0.5 / 2.5);
        assert!(relative_max(&[f32::NAN], &[1.0]).is_nan());
        assert!(!relative_frobenius(&[f32::NAN], &[1.0]).is_finite());
        assert_eq!(relative_max(&[1.0], &[0.0]), f64::INFINITY);
    }

    #[test]
    fn inputs_are_deterministic_and_bounded() {
        let (a, b) = (Rng::new(7).vec(1000), Rng::new(7).vec(1000));
        assert_eq!(a, b);
        assert!(a.iter().all(|v| (-1.0..1.0).contains(v)));
        assert_ne!(Rng::new(8).vec(10), a[..10]);
    }
}
