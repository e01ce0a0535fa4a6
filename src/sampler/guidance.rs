//! The velocity-model interface and classifier-free guidance.

use burn::prelude::*;

use crate::error::Error;
use crate::model::MMDiT;

/// Prompt conditioning of a batch: text features `[B, L, J]` and pooled vectors `[B, P]`.
#[derive(Debug, Clone)]
pub struct Conditioning<B: Backend> {
    /// Per-token text features.
    pub text: Tensor<B, 3>,
    /// Pooled text vector.
    pub pooled: Tensor<B, 2>,
}

impl<B: Backend> Conditioning<B> {
    /// The batch size.
    pub fn batch(&self) -> usize {
        self.text.dims()[0]
    }

    /// `[self; other]` along the batch.
    pub fn cat(self, other: Self) -> Self {
        Conditioning {
            text: Tensor::cat(vec![self.text, other.text], 0),
            pooled: Tensor::cat(vec![self.pooled, other.pooled], 0),
        }
    }
}

/// A velocity field `v(x, t, c)`: the MMDiT, or an analytic field in tests.
pub trait VelocityModel<B: Backend> {
    /// The velocity `[B, C, H, W]` of latents `[B, C, H, W]` at timesteps `[B]` (`sigma * 1000`).
    fn velocity(
        &self,
        latent: Tensor<B, 4>,
        timestep: Tensor<B, 1>,
        cond: &Conditioning<B>,
    ) -> crate::Result<Tensor<B, 4>>;
}

impl<B: Backend> VelocityModel<B> for MMDiT<B> {
    fn velocity(
        &self,
        latent: Tensor<B, 4>,
        timestep: Tensor<B, 1>,
        cond: &Conditioning<B>,
    ) -> crate::Result<Tensor<B, 4>> {
        self.forward(latent, timestep, cond.text.clone(), cond.pooled.clone())
    }
}

/// The classifier-free-guided velocity `v = u + g (c - u)`, with the unconditional `u` and
/// conditional `c` velocities from ONE forward pass on the batch `[uncond; cond]`.
/// `uncond` holds one row per sample (the empty prompt, repeated).
pub fn guided_velocity<B: Backend, M: VelocityModel<B>>(
    model: &M,
    latent: Tensor<B, 4>,
    timestep: Tensor<B, 1>,
    cond: &Conditioning<B>,
    uncond: &Conditioning<B>,
    guidance: f64,
) -> crate::Result<Tensor<B, 4>> {
    let b = latent.dims()[0];
    if cond.batch() != b || uncond.batch() != b {
        return Err(Error::shape(
            "conditioning",
            format!("batch {b} for both the prompts and the negative prompts"),
            &[cond.batch(), uncond.batch()],
        ));
    }
    let both = uncond.clone().cat(cond.clone());
    let v = model.velocity(
        Tensor::cat(vec![latent.clone(), latent], 0),
        Tensor::cat(vec![timestep.clone(), timestep], 0),
        &both,
    )?;
    let [u, c]: [Tensor<B, 4>; 2] = v.chunk(2, 0).try_into().expect("two halves");
    Ok(u.clone() + (c - u) * guidance)
}
