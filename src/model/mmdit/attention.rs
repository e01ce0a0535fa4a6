//! Joint attention over image and text tokens, and the self-attention of SD3.5's
//! dual-attention blocks and FLUX's single-stream blocks, with optional per-head RMS
//! query/key normalisation and rotary positions (FLUX).

use crate::model::attention::{attend, merge_heads, split_heads, Scores};
use crate::model::lora_linear::{LoraLinear, LoraLinearConfig, Named};
use crate::model::rope::Rope;
use burn::nn::{RmsNorm, RmsNormConfig};
use burn::prelude::*;

/// Epsilon of the per-head RMSNorm on queries and keys.
pub(crate) const QK_NORM_EPS: f64 = 1e-6;

/// Projects `x` to heads, then applies the optional per-head RMSNorm and rotation.
fn project<B: Backend>(
    x: Tensor<B, 3>,
    proj: &LoraLinear<B>,
    norm: &Option<RmsNorm<B>>,
    heads: usize,
    rope: Option<&Rope<B>>,
) -> Tensor<B, 4> {
    let h = split_heads(proj.forward(x), heads);
    let h = match norm {
        Some(norm) => norm.forward(h),
        None => h,
    };
    match rope {
        Some(rope) => rope.apply(h),
        None => h,
    }
}

fn qk_norm<B: Backend>(enabled: bool, head_dim: usize, device: &B::Device) -> Option<RmsNorm<B>> {
    enabled.then(|| RmsNormConfig::new(head_dim).with_epsilon(QK_NORM_EPS).init(device))
}

/// The joint attention of an MMDiT block (diffusers `Attention` with `JointAttnProcessor2_0`).
#[derive(Module, Debug)]
pub(crate) struct JointAttention<B: Backend> {
    /// Image queries.
    pub(crate) to_q: LoraLinear<B>,
    /// Image keys.
    pub(crate) to_k: LoraLinear<B>,
    /// Image values.
    pub(crate) to_v: LoraLinear<B>,
    /// Text queries.
    pub(crate) add_q_proj: LoraLinear<B>,
    /// Text keys.
    pub(crate) add_k_proj: LoraLinear<B>,
    /// Text values.
    pub(crate) add_v_proj: LoraLinear<B>,
    /// Image output projection (checkpoint key `to_out.0`).
    pub(crate) to_out: LoraLinear<B>,
    /// Text output projection; absent in the context-pre-only last block.
    pub(crate) to_add_out: Option<LoraLinear<B>>,
    /// Per-head RMSNorm of image queries (SD3.5).
    pub(crate) norm_q: Option<RmsNorm<B>>,
    /// Per-head RMSNorm of image keys (SD3.5).
    pub(crate) norm_k: Option<RmsNorm<B>>,
    /// Per-head RMSNorm of text queries (SD3.5).
    pub(crate) norm_added_q: Option<RmsNorm<B>>,
    /// Per-head RMSNorm of text keys (SD3.5).
    pub(crate) norm_added_k: Option<RmsNorm<B>>,
    /// Number of heads.
    pub heads: usize,
}

/// Settings of a [`JointAttention`].
#[derive(Config, Debug)]
pub(crate) struct JointAttentionConfig {
    /// Width of both streams.
    dim: usize,
    /// Attention heads.
    heads: usize,
    /// Per-head RMSNorm of queries and keys.
    #[config(default = false)]
    qk_norm: bool,
    /// No `to_add_out`: the text stream ends here (the last block).
    #[config(default = false)]
    context_pre_only: bool,
}

impl JointAttentionConfig {
    /// Joint attention of width `dim` with `heads` heads.
    pub(crate) fn init<B: Backend>(&self, device: &B::Device) -> JointAttention<B> {
        let (dim, heads, qk) = (self.dim, self.heads, self.qk_norm);
        let linear = || LoraLinearConfig::new(dim, dim).init(device);
        let head_dim = dim / heads;
        JointAttention {
            to_q: linear(),
            to_k: linear(),
            to_v: linear(),
            add_q_proj: linear(),
            add_k_proj: linear(),
            add_v_proj: linear(),
            to_out: linear(),
            to_add_out: (!self.context_pre_only).then(linear),
            norm_q: qk_norm(qk, head_dim, device),
            norm_k: qk_norm(qk, head_dim, device),
            norm_added_q: qk_norm(qk, head_dim, device),
            norm_added_k: qk_norm(qk, head_dim, device),
            heads,
        }
    }
}

impl<B: Backend> JointAttention<B> {
    /// Attends over the concatenation of image tokens `x [B, N, D]` and text tokens
    /// `c [B, L, D]`; returns the projected image part and, unless the block is context-pre-only,
    /// the projected text part.
    ///
    /// `rope` (FLUX) holds the text tokens' rows, then the image tokens' (`L + N` rows); each
    /// stream's queries and keys are rotated by their own rows. Attention does not depend on the
    /// order of the keys, so concatenating image first (SD3) gives FLUX's text-first result.
    pub(crate) fn forward(
        &self,
        x: Tensor<B, 3>,
        c: Tensor<B, 3>,
        rope: Option<&Rope<B>>,
    ) -> (Tensor<B, 3>, Option<Tensor<B, 3>>) {
        let (n, l) = (x.dims()[1], c.dims()[1]);
        let h = self.heads;
        let (rope_x, rope_c) = match rope {
            Some(r) => (Some(r.rows(l..l + n)), Some(r.rows(0..l))),
            None => (None, None),
        };
        let (rx, rc) = (rope_x.as_ref(), rope_c.as_ref());
        let q = Tensor::cat(
            vec![
                project(x.clone(), &self.to_q, &self.norm_q, h, rx),
                project(c.clone(), &self.add_q_proj, &self.norm_added_q, h, rc),
            ],
            2,
        );
        let k = Tensor::cat(
            vec![
                project(x.clone(), &self.to_k, &self.norm_k, h, rx),
                project(c.clone(), &self.add_k_proj, &self.norm_added_k, h, rc),
            ],
            2,
        );
        let v = Tensor::cat(
            vec![
                project(x, &self.to_v, &None, h, None),
                project(c, &self.add_v_proj, &None, h, None),
            ],
            2,
        );
        let out = merge_heads(attend(q, k, v, None, Scores::default()));
        let [b, total, d] = out.dims();
        let image = self.to_out.forward(out.clone().slice([0..b, 0..n, 0..d]));
        let text =
            self.to_add_out.as_ref().map(|proj| proj.forward(out.slice([0..b, n..total, 0..d])));
        (image, text)
    }

    /// The adaptable projections with their diffusers module names.
    pub(crate) fn projections_mut(&mut self) -> Named<'_, B> {
        let mut out: Named<'_, B> = vec![
            ("to_q", &mut self.to_q),
            ("to_k", &mut self.to_k),
            ("to_v", &mut self.to_v),
            ("to_out.0", &mut self.to_out),
            ("add_q_proj", &mut self.add_q_proj),
            ("add_k_proj", &mut self.add_k_proj),
            ("add_v_proj", &mut self.add_v_proj),
        ];
        if let Some(p) = self.to_add_out.as_mut() {
            out.push(("to_add_out", p));
        }
        out
    }
}

/// Self-attention over one stream (`attn2` of SD3.5 dual-attention blocks, `attn` of FLUX's
/// single-stream blocks).
#[derive(Module, Debug)]
pub(crate) struct SelfAttention<B: Backend> {
    /// Queries.
    pub(crate) to_q: LoraLinear<B>,
    /// Keys.
    pub(crate) to_k: LoraLinear<B>,
    /// Values.
    pub(crate) to_v: LoraLinear<B>,
    /// Output projection (checkpoint key `to_out.0`); absent when `pre_only` (FLUX's single
    /// blocks project the attention together with their MLP).
    pub(crate) to_out: Option<LoraLinear<B>>,
    /// Per-head RMSNorm of queries.
    pub(crate) norm_q: Option<RmsNorm<B>>,
    /// Per-head RMSNorm of keys.
    pub(crate) norm_k: Option<RmsNorm<B>>,
    /// Number of heads.
    pub heads: usize,
}

/// Settings of a [`SelfAttention`].
#[derive(Config, Debug)]
pub(crate) struct SelfAttentionConfig {
    /// Width of the stream.
    dim: usize,
    /// Attention heads.
    heads: usize,
    /// Per-head RMSNorm of queries and keys.
    #[config(default = false)]
    qk_norm: bool,
    /// No output projection (diffusers' `pre_only`).
    #[config(default = false)]
    pre_only: bool,
}

impl SelfAttentionConfig {
    /// Self-attention of width `dim` with `heads` heads.
    pub(crate) fn init<B: Backend>(&self, device: &B::Device) -> SelfAttention<B> {
        let (dim, heads, qk) = (self.dim, self.heads, self.qk_norm);
        let linear = || LoraLinearConfig::new(dim, dim).init(device);
        SelfAttention {
            to_q: linear(),
            to_k: linear(),
            to_v: linear(),
            to_out: (!self.pre_only).then(linear),
            norm_q: qk_norm(qk, dim / heads, device),
            norm_k: qk_norm(qk, dim / heads, device),
            heads,
        }
    }
}

impl<B: Backend> SelfAttention<B> {
    /// `to_out(attention(x))` for tokens `x [B, N, D]` (without `to_out` when pre-only), the
    /// queries and keys rotated by `rope` (`N` rows) when given.
    pub(crate) fn forward(&self, x: Tensor<B, 3>, rope: Option<&Rope<B>>) -> Tensor<B, 3> {
        let h = self.heads;
        let q = project(x.clone(), &self.to_q, &self.norm_q, h, rope);
        let k = project(x.clone(), &self.to_k, &self.norm_k, h, rope);
        let v = project(x, &self.to_v, &None, h, None);
        let out = merge_heads(attend(q, k, v, None, Scores::default()));
        match &self.to_out {
            Some(proj) => proj.forward(out),
            None => out,
        }
    }

    /// The adaptable projections with their diffusers module names.
    pub(crate) fn projections_mut(&mut self) -> Named<'_, B> {
        let mut out: Named<'_, B> =
            vec![("to_q", &mut self.to_q), ("to_k", &mut self.to_k), ("to_v", &mut self.to_v)];
        if let Some(p) = self.to_out.as_mut() {
            out.push(("to_out.0", p));
        }
        out
    }
}
