//! A hit curve's points joined by a smooth, monotone curve instead of
//! straight lines, for the pool's split.
//!
//! The live hit curves ([`UtilityCurve`](crate::utility::UtilityCurve))
//! have points a quarter apart. Joined by straight lines, a curve gains the
//! same hits per block across a whole bucket, and the split (`sharing.rs`)
//! then hands the last blocks of the cache all to the one volume whose
//! bucket is a little steeper: when a newcomer needs space, all of it comes
//! out of whichever volume has the flattest bucket at that moment, and
//! which one that is turns on where the cache's size falls among the
//! buckets' edges. Real hit curves gain less with every block. A monotone
//! cubic through the same points (Fritsch and Carlson's PCHIP, with
//! Fritsch and Butland's weighted slopes for uneven spacing) keeps every
//! measured point and lets the gain per block fall within a bucket too, so
//! a change of space is shared among the volumes whose gains are close.
//!
//! Pure arithmetic on the points: no IO, no state.

/// `points` (increasing blocks from `(0, 0)`, non-decreasing hits) with
/// `per_bucket - 1` more points inside each bucket (fewer in a bucket
/// narrower than that), on a monotone cubic through them. Every input
/// point is kept; `per_bucket <= 1` returns the input as it is.
pub fn refine(points: &[(u64, f64)], per_bucket: u64) -> Vec<(u64, f64)> {
    let n = points.len();
    if per_bucket <= 1 || n < 2 {
        return points.to_vec();
    }
    let width = |i: usize| (points[i + 1].0 - points[i].0) as f64;
    let secant = |i: usize| (points[i + 1].1 - points[i].1) / width(i);
    // Tangents at the points (hits per block).
    let mut tangent = vec![0.0; n];
    tangent[0] = secant(0);
    tangent[n - 1] = secant(n - 2);
    for (i, t) in tangent.iter_mut().enumerate().take(n - 1).skip(1) {
        let (d0, d1) = (secant(i - 1), secant(i));
        if d0 <= 0.0 || d1 <= 0.0 {
            // Flat on either side: flat here, so the cubic never dips.
            *t = 0.0;
            continue;
        }
        let (h0, h1) = (width(i - 1), width(i));
        let (w0, w1) = (2.0 * h1 + h0, h1 + 2.0 * h0);
        *t = (w0 + w1) / (w0 / d0 + w1 / d1);
    }
    let mut out = Vec::with_capacity((n - 1) * per_bucket as usize + 1);
    out.push(points[0]);
    for i in 0..n - 1 {
        let ((x0, y0), (x1, y1)) = (points[i], points[i + 1]);
        let w = x1 - x0;
        let steps = per_bucket.min(w);
        for k in 1..steps {
            let x = x0 + w * k / steps;
            let t = (x - x0) as f64 / w as f64;
            let (t2, t3) = (t * t, t * t * t);
            let y = (2.0 * t3 - 3.0 * t2 + 1.0) * y0
                + (t3 - 2.0 * t2 + t) * width(i) * tangent[i]
                + (-2.0 * t3 + 3.0 * t2) * y1
                + (t3 - t2) * width(i) * tangent[i + 1];
            // Rounding must not make the curve fall or overshoot.
            let last = out.last().map_or(y0, |p| p.1);
            out.push((x, y.max(last).min(y1)));
        }
        out.push((x1, y1));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_points_stay_and_the_gain_falls_within_a_bucket() {
        // A concave curve: 100 hits in the first 10 blocks, 50 in the next
        // 10, 20 in the next 20.
        let pts = [(0, 0.0), (10, 100.0), (20, 150.0), (40, 170.0)];
        let r = refine(&pts, 4);
        for p in pts {
            assert!(r.contains(&p), "{p:?} kept");
        }
        assert_eq!(r.len(), 3 * 4 + 1);
        // Inside the middle bucket the gain per block falls step by step
        // (joined by a straight line it would be 5 per block throughout).
        let mid: Vec<f64> = r
            .windows(2)
            .filter(|w| w[0].0 >= 10 && w[1].0 <= 20)
            .map(|w| (w[1].1 - w[0].1) / (w[1].0 - w[0].0) as f64)
            .collect();
        assert_eq!(mid.len(), 4);
        assert!(mid.windows(2).all(|g| g[1] < g[0]), "{mid:?}");
    }

    #[test]
    fn one_point_per_bucket_is_the_input() {
        let pts = [(0, 0.0), (10, 100.0)];
        assert_eq!(refine(&pts, 1), pts.to_vec());
        assert_eq!(refine(&pts[..1], 4), pts[..1].to_vec());
        // A bucket one block wide gets no point inside.
        assert_eq!(refine(&[(0, 0.0), (1, 5.0)], 4), vec![(0, 0.0), (1, 5.0)]);
    }

    proptest! {
        /// Any non-decreasing curve stays non-decreasing and keeps its
        /// points, and the blocks increase.
        #[test]
        fn monotone_in_monotone_out(
            gains in proptest::collection::vec((1u64..500, 0.0f64..1000.0), 1..30),
            per in 1u64..8,
        ) {
            let mut pts = vec![(0u64, 0.0f64)];
            for (w, g) in gains {
                let (x, y) = *pts.last().unwrap();
                pts.push((x + w, y + g));
            }
            let r = refine(&pts, per);
            prop_assert!(r.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
            for p in &pts {
                prop_assert!(r.contains(p));
            }
        }
    }
}
