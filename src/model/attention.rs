//! Multi-head attention shared by the MMDiT, CLIP, T5 and the VAE: splitting and merging
//! heads, and Burn's scaled dot-product attention (one fused kernel where the backend has one).

use burn::prelude::*;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;

/// Splits `[B, N, H*Dh]` into heads `[B, H, N, Dh]`.
pub(crate) fn split_heads<B: Backend>(x: Tensor<B, 3>, heads: usize) -> Tensor<B, 4> {
    let [b, n, d] = x.dims();
    x.reshape([b, n, heads, d / heads]).swap_dims(1, 2)
}

/// Merges heads `[B, H, N, Dh]` back into `[B, N, H*Dh]`.
pub(crate) fn merge_heads<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 3> {
    let [b, h, n, dh] = x.dims();
    x.swap_dims(1, 2).reshape([b, n, h * dh])
}

/// How attention scores are formed besides `q k^T`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Scores {
    /// The factor on `q k^T`; `None`: `1 / sqrt(Dh)`.
    pub scale: Option<f64>,
    /// Mask every key after its query (CLIP's text encoder).
    pub causal: bool,
}

/// `softmax(scale q k^T + bias [+ causal mask]) v` over heads: `q [B, H, Nq, Dh]`,
/// `k, v [B, H, Nk, Dh]`, `bias` broadcastable to `[B, H, Nq, Nk]` (T5's relative positions).
pub(crate) fn attend<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    bias: Option<Tensor<B, 4>>,
    scores: Scores,
) -> Tensor<B, 4> {
    let [b, h, nq, _] = q.dims();
    let nk = k.dims()[2];
    let bias = bias.map(|t| t.expand([b, h, nq, nk]));
    let options =
        AttentionModuleOptions { scale: scores.scale, softcap: None, is_causal: scores.causal };
    attention(q, k, v, None, bias, options)
}

/// Self-attention of tokens `[B, N, H*Dh]` from their projections: split into `heads`,
/// [`attend`], merged back.
pub(crate) fn self_attention<B: Backend>(
    q: Tensor<B, 3>,
    k: Tensor<B, 3>,
    v: Tensor<B, 3>,
    heads: usize,
    scores: Scores,
) -> Tensor<B, 3> {
    let split = |x| split_heads(x, heads);
    merge_heads(attend(split(q), split(k), split(v), None, scores))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend as B;

    /// Two queries, two keys, one head of width 1, worked by hand: `q = [1, 2]`,
    /// `k = [0, 1]`, `v = [10, 20]`, scale 1.
    /// Unmasked: weights `softmax([0, q])`, so `out = 10 + 10 sigmoid(q)`.
    /// Causal: query 0 sees key 0 only (10); query 1 sees both (`10 + 10 sigmoid(2)`).
    /// A bias of `+inf`-like size on key 0 pins every query to 10.
    #[test]
    fn hand_worked_scores_mask_and_bias() {
        let dev = Default::default();
        let t = |v: [f32; 2]| Tensor::<B, 1>::from_floats(v, &dev).reshape([1, 1, 2, 1]);
        let (q, k, v) = (t([1.0, 2.0]), t([0.0, 1.0]), t([10.0, 20.0]));
        let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
        let run = |scores: Scores, bias: Option<Tensor<B, 4>>| -> Vec<f64> {
            let out = attend(q.clone(), k.clone(), v.clone(), bias, scores);
            out.into_data().convert::<f64>().to_vec().unwrap()
        };
        let scale = Scores { scale: Some(1.0), causal: false };
        let close = |a: Vec<f64>, b: [f64; 2]| {
            assert!(a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5), "{a:?} vs {b:?}")
        };
        close(run(scale, None), [10.0 + 10.0 * sig(1.0), 10.0 + 10.0 * sig(2.0)]);
        close(run(Scores { causal: true, ..scale }, None), [10.0, 10.0 + 10.0 * sig(2.0)]);
        let bias = Tensor::<B, 1>::from_floats([1e3, 0.0], &dev).reshape([1, 1, 1, 2]);
        close(run(scale, Some(bias)), [10.0, 10.0]);
        // Default scale 1/sqrt(Dh) with Dh = 1 is 1 as well.
        close(run(Scores::default(), None), [10.0 + 10.0 * sig(1.0), 10.0 + 10.0 * sig(2.0)]);
    }
}
