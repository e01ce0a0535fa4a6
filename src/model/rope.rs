//! Rotary position embeddings over several position axes (FLUX's `FluxPosEmbed` and
//! `apply_rotary_emb` with interleaved pairs).

use burn::prelude::*;

use crate::error::{Error, Result};
use crate::model::precision::in_f32;

/// The rotation angles of a token sequence: `cos` and `sin` tables `[S, Dh / 2]`, one column
/// per rotated pair of a head's channels. Rows follow the token order the model concatenates
/// (FLUX: the text tokens, then the image tokens).
#[derive(Debug, Clone)]
pub struct Rope<B: Backend> {
    /// `cos(angle)`, `[S, Dh / 2]`, f32.
    pub(crate) cos: Tensor<B, 2>,
    /// `sin(angle)`, `[S, Dh / 2]`, f32.
    pub(crate) sin: Tensor<B, 2>,
}

impl<B: Backend> Rope<B> {
    /// The angles of tokens at positions `ids` (one row of `A` coordinates per token) with
    /// `axes_dims[a]` channels rotating with coordinate `a` (their sum is the head width).
    ///
    /// For axis `a` of width `d_a`, pair `j < d_a / 2` turns by `p_a * theta^(-2j / d_a)`
    /// (computed in f64, stored in f32); the axes' pairs follow each other in axis order.
    pub fn new<const A: usize>(
        ids: &[[f64; A]],
        axes_dims: &[usize; A],
        theta: f64,
        device: &B::Device,
    ) -> Result<Self> {
        if let Some(d) = axes_dims.iter().find(|d| *d % 2 != 0) {
            return Err(Error::config(
                "axes_dims_rope",
                format!("{d} is odd; every axis rotates pairs"),
            ));
        }
        let half: usize = axes_dims.iter().sum::<usize>() / 2;
        let (mut cos, mut sin) = (Vec::with_capacity(ids.len() * half), Vec::new());
        sin.reserve(ids.len() * half);
        for row in ids {
            for (p, &d) in row.iter().zip(axes_dims) {
                for j in 0..d / 2 {
                    let angle = p * theta.powf(-2.0 * j as f64 / d as f64);
                    cos.push(angle.cos() as f32);
                    sin.push(angle.sin() as f32);
                }
            }
        }
        let table = |v: Vec<f32>| Tensor::from_data(TensorData::new(v, [ids.len(), half]), device);
        Ok(Rope { cos: table(cos), sin: table(sin) })
    }

    /// Number of tokens `S`.
    pub fn len(&self) -> usize {
        self.cos.dims()[0]
    }

    /// Whether the table covers no token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The head width `Dh` the table rotates.
    pub fn head_dim(&self) -> usize {
        2 * self.cos.dims()[1]
    }

    /// The rows of tokens `range`.
    pub(crate) fn rows(&self, range: std::ops::Range<usize>) -> Self {
        let half = self.cos.dims()[1];
        let slice = |t: &Tensor<B, 2>| t.clone().slice([range.clone(), 0..half]);
        Rope { cos: slice(&self.cos), sin: slice(&self.sin) }
    }

    /// Rotates heads `x [B, H, S, Dh]` (in f32, returned in `x`'s dtype), channels `(2k, 2k+1)`
    /// as one pair turned by the angle in column `k`:
    /// `out[2k] = x[2k] cos - x[2k+1] sin`, `out[2k+1] = x[2k+1] cos + x[2k] sin`.
    pub(crate) fn apply(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let [b, h, s, dh] = x.dims();
        let half = dh / 2;
        let cos = self.cos.clone().reshape([1, 1, s, half, 1]);
        let sin = self.sin.clone().reshape([1, 1, s, half, 1]);
        in_f32(x, |x| {
            let pairs = x.reshape([b, h, s, half, 2]);
            let even = pairs.clone().slice([0..b, 0..h, 0..s, 0..half, 0..1]);
            let odd = pairs.slice([0..b, 0..h, 0..s, 0..half, 1..2]);
            let out_even = even.clone() * cos.clone() - odd.clone() * sin.clone();
            let out_odd = odd * cos + even * sin;
            Tensor::cat(vec![out_even, out_odd], 4).reshape([b, h, s, dh])
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend as B;

    /// Worked by hand: two axes of width 2 and 4, theta 100, token at (1, 2). Axis 0 turns its
    /// pair by 1 rad; axis 1 turns pair 0 by 2 rad and pair 1 by `2 * 100^(-1/2) = 0.2` rad.
    /// Rotating `(1, 0)` by `a` gives `(cos a, sin a)`; `(0, 1)` gives `(-sin a, cos a)`.
    #[test]
    fn hand_worked_angles_and_rotation() {
        let dev = Default::default();
        let rope = Rope::<B>::new(&[[1.0, 2.0]], &[2, 4], 100.0, &dev).unwrap();
        assert_eq!((rope.len(), rope.head_dim()), (1, 6));
        let x =
            Tensor::<B, 1>::from_floats([1.0, 0.0, 1.0, 0.0, 0.0, 1.0], &dev).reshape([1, 1, 1, 6]);
        let out = rope.apply(x).into_data().convert::<f64>().to_vec::<f64>().unwrap();
        let (a, b, c) = (1f64, 2f64, 0.2f64);
        let expected = [a.cos(), a.sin(), b.cos(), b.sin(), -c.sin(), c.cos()];
        for (o, e) in out.iter().zip(expected) {
            assert!((o - e).abs() < 1e-6, "{out:?} vs {expected:?}");
        }
        assert!(Rope::<B>::new(&[[0.0]], &[3], 10.0, &dev).is_err());
    }
}
