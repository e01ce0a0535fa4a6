//! The velocity-model interface and classifier-free guidance.

use burn::prelude::*;

use super::schedule::TRAIN_TIMESTEPS;
use crate::error::Error;
use crate::model::flux::{pack_latents, unpack_latents};
use crate::model::{Denoiser, Flux, MMDiT};

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

    /// The rows `rows` of the batch, in that order (repeats allowed).
    pub fn select(&self, rows: &[usize]) -> Self {
        Conditioning {
            text: select_rows(&self.text, rows),
            pooled: select_rows(&self.pooled, rows),
        }
    }

    /// `[self; other]` along the batch.
    pub fn cat(self, other: Self) -> Self {
        Conditioning {
            text: Tensor::cat(vec![self.text, other.text], 0),
            pooled: Tensor::cat(vec![self.pooled, other.pooled], 0),
        }
    }
}

/// The rows `rows` of `t` along dimension 0, in that order (repeats allowed).
pub(crate) fn select_rows<B: Backend, const D: usize>(
    t: &Tensor<B, D>,
    rows: &[usize],
) -> Tensor<B, D> {
    let idx: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
    let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(idx, [rows.len()]), &t.device());
    t.clone().select(0, idx)
}

/// A velocity field `v(x, t, c)`: the MMDiT, FLUX, either as a [`Denoiser`], or an analytic
/// field in tests.
pub trait VelocityModel<B: Backend> {
    /// The velocity `[B, C, H, W]` of latents `[B, C, H, W]` at timesteps `[B]` (`sigma * 1000`).
    fn velocity(
        &self,
        latent: Tensor<B, 4>,
        timestep: Tensor<B, 1>,
        cond: &Conditioning<B>,
    ) -> crate::Result<Tensor<B, 4>>;

    /// Whether the model is sampled without classifier-free guidance, the guidance scale being
    /// one of its inputs instead ([`VelocityModel::embedded_velocity`]; FLUX.1).
    fn embeds_guidance(&self) -> bool {
        false
    }

    /// The velocity at guidance scale `guidance`, for models that embed it; others ignore it.
    fn embedded_velocity(
        &self,
        latent: Tensor<B, 4>,
        timestep: Tensor<B, 1>,
        cond: &Conditioning<B>,
        guidance: f64,
    ) -> crate::Result<Tensor<B, 4>> {
        let _ = guidance;
        self.velocity(latent, timestep, cond)
    }
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

/// FLUX's velocity of unpacked latents `[B, C, H, W]` (`H`, `W` even): packed 2x2 into tokens,
/// the rotary angles following the token grid and the text length, `guidance` embedded when
/// the model was distilled with it, the prediction unpacked.
fn flux_velocity<B: Backend>(
    model: &Flux<B>,
    latent: Tensor<B, 4>,
    timestep: Tensor<B, 1>,
    cond: &Conditioning<B>,
    guidance: Option<f64>,
) -> crate::Result<Tensor<B, 4>> {
    let [b, _, h, w] = latent.dims();
    let device = latent.device();
    let tokens = pack_latents(latent)?;
    let rope = model.rope(cond.text.dims()[1], h / 2, w / 2, &device)?;
    let guidance = match (model.config.guidance_embeds, guidance) {
        (true, Some(g)) => Some(Tensor::full([b], g, &device)),
        (true, None) => {
            return Err(Error::config(
                "guidance",
                "this FLUX model embeds the guidance scale: sample it through Guidance",
            ))
        }
        (false, _) => None,
    };
    let sigma = timestep / TRAIN_TIMESTEPS;
    let v =
        model.forward(tokens, sigma, guidance, cond.text.clone(), cond.pooled.clone(), &rope)?;
    unpack_latents(v, h, w)
}

/// FLUX.1 on unpacked latents; sampled without CFG (`embeds_guidance`), the scale embedded
/// when `guidance_embeds` is set (dev) and unused otherwise (schnell).
impl<B: Backend> VelocityModel<B> for Flux<B> {
    fn velocity(
        &self,
        latent: Tensor<B, 4>,
        timestep: Tensor<B, 1>,
        cond: &Conditioning<B>,
    ) -> crate::Result<Tensor<B, 4>> {
        flux_velocity(self, latent, timestep, cond, None)
    }

    fn embeds_guidance(&self) -> bool {
        true
    }

    fn embedded_velocity(
        &self,
        latent: Tensor<B, 4>,
        timestep: Tensor<B, 1>,
        cond: &Conditioning<B>,
        guidance: f64,
    ) -> crate::Result<Tensor<B, 4>> {
        flux_velocity(self, latent, timestep, cond, Some(guidance))
    }
}

impl<B: Backend> VelocityModel<B> for Denoiser<B> {
    fn velocity(
        &self,
        latent: Tensor<B, 4>,
        timestep: Tensor<B, 1>,
        cond: &Conditioning<B>,
    ) -> crate::Result<Tensor<B, 4>> {
        match self {
            Denoiser::Sd3(m) => m.velocity(latent, timestep, cond),
            Denoiser::Flux(m) => m.velocity(latent, timestep, cond),
        }
    }

    fn embeds_guidance(&self) -> bool {
        matches!(self, Denoiser::Flux(_))
    }

    fn embedded_velocity(
        &self,
        latent: Tensor<B, 4>,
        timestep: Tensor<B, 1>,
        cond: &Conditioning<B>,
        guidance: f64,
    ) -> crate::Result<Tensor<B, 4>> {
        match self {
            Denoiser::Sd3(m) => m.embedded_velocity(latent, timestep, cond, guidance),
            Denoiser::Flux(m) => m.embedded_velocity(latent, timestep, cond, guidance),
        }
    }
}

/// Guidance for a batch: classifier-free (the stacked conditioning `[uncond; cond]` built
/// once and the scale `g`), or embedded (the conditioning alone, `g` given to the model). As
/// in diffusers (`do_classifier_free_guidance = guidance_scale > 1`), a CFG scale of at most 1
/// means one conditional pass, the unconditional prompt unused.
#[derive(Debug, Clone)]
pub struct Guidance<B: Backend> {
    /// `[uncond; cond]`, batch `2B`; only `cond`, batch `B`, when embedded or `scale <= 1`.
    pub both: Conditioning<B>,
    /// The guidance scale `g`.
    pub scale: f64,
    /// Whether `g` is the model's input ([`VelocityModel::embeds_guidance`]) rather than a CFG
    /// scale.
    pub embedded: bool,
}

impl<B: Backend> Guidance<B> {
    /// Stacks `[uncond; cond]` for a batch of `batch` samples (`uncond` holds one row per
    /// sample: the empty prompt, repeated); each block repeated `reps` times, for `reps`
    /// latent batches stacked along the batch.
    pub fn new(
        cond: &Conditioning<B>,
        uncond: &Conditioning<B>,
        scale: f64,
        batch: usize,
        reps: usize,
    ) -> crate::Result<Self> {
        if !scale.is_finite() {
            return Err(Error::config(
                "guidance_scale",
                format!("must be a finite number, got {scale}"),
            ));
        }
        if cond.batch() != batch || uncond.batch() != batch {
            return Err(Error::shape(
                "conditioning",
                format!("batch {batch} for both the prompts and the negative prompts"),
                &[cond.batch(), uncond.batch()],
            ));
        }
        let repeat = |c: &Conditioning<B>| Conditioning {
            text: Tensor::cat(vec![c.text.clone(); reps], 0),
            pooled: Tensor::cat(vec![c.pooled.clone(); reps], 0),
        };
        let both = if scale > 1.0 { repeat(uncond).cat(repeat(cond)) } else { repeat(cond) };
        Ok(Guidance { both, scale, embedded: false })
    }

    /// The guidance `model` is sampled with at scale `scale`: embedded for models that take the
    /// scale as an input (one pass on `cond`, `uncond` unused), else classifier-free
    /// ([`Guidance::new`]).
    pub fn for_model<M: VelocityModel<B>>(
        model: &M,
        cond: &Conditioning<B>,
        uncond: &Conditioning<B>,
        scale: f64,
        batch: usize,
        reps: usize,
    ) -> crate::Result<Self> {
        if !model.embeds_guidance() {
            return Self::new(cond, uncond, scale, batch, reps);
        }
        let mut guidance = Self::new(cond, uncond, 1.0, batch, reps)?;
        (guidance.scale, guidance.embedded) = (scale, true);
        Ok(guidance)
    }

    /// Whether the unconditional branch is evaluated (classifier-free with `scale > 1`).
    pub fn is_guided(&self) -> bool {
        !self.embedded && self.scale > 1.0
    }

    /// The guided velocity `v = u + g (c - u)`, the unconditional `u` and conditional `c` from
    /// ONE forward pass on `[latent; latent]`; `c` alone when the scale is at most 1.
    pub fn velocity<M: VelocityModel<B>>(
        &self,
        model: &M,
        latent: Tensor<B, 4>,
        timestep: Tensor<B, 1>,
    ) -> crate::Result<Tensor<B, 4>> {
        let b = latent.dims()[0];
        if !self.is_guided() {
            if b != self.both.batch() {
                return Err(Error::shape(
                    "latent",
                    format!("batch {} (the conditioning's)", self.both.batch()),
                    &latent.dims(),
                ));
            }
            if self.embedded {
                return model.embedded_velocity(latent, timestep, &self.both, self.scale);
            }
            return model.velocity(latent, timestep, &self.both);
        }
        if 2 * b != self.both.batch() {
            return Err(Error::shape(
                "latent",
                format!("batch {} (half the guided conditioning)", self.both.batch() / 2),
                &latent.dims(),
            ));
        }
        let v = model.velocity(
            Tensor::cat(vec![latent.clone(), latent], 0),
            Tensor::cat(vec![timestep.clone(), timestep], 0),
            &self.both,
        )?;
        let [u, c]: [Tensor<B, 4>; 2] = v.chunk(2, 0).try_into().expect("two halves");
        Ok(u.clone() + (c - u) * self.scale)
    }
}

/// One guided velocity (see [`Guidance`]); loops should build the [`Guidance`] once instead.
pub fn guided_velocity<B: Backend, M: VelocityModel<B>>(
    model: &M,
    latent: Tensor<B, 4>,
    timestep: Tensor<B, 1>,
    cond: &Conditioning<B>,
    uncond: &Conditioning<B>,
    guidance: f64,
) -> crate::Result<Tensor<B, 4>> {
    let b = latent.dims()[0];
    Guidance::for_model(model, cond, uncond, guidance, b, 1)?.velocity(model, latent, timestep)
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::backend::Backend as B;

    /// Records the batch and guidance of every call; the velocity is the latent times the
    /// pooled vector's first value (1 for the prompts, 0 for the negative prompt), plus the
    /// embedded scale.
    struct Recorder {
        embeds: bool,
        calls: RefCell<Vec<(usize, Option<f64>)>>,
    }

    impl VelocityModel<B> for Recorder {
        fn velocity(
            &self,
            latent: Tensor<B, 4>,
            _: Tensor<B, 1>,
            cond: &Conditioning<B>,
        ) -> crate::Result<Tensor<B, 4>> {
            self.calls.borrow_mut().push((latent.dims()[0], None));
            let [b, ..] = latent.dims();
            let c = cond.pooled.clone().slice([0..b, 0..1]).reshape([b, 1, 1, 1]);
            Ok(latent * c)
        }

        fn embeds_guidance(&self) -> bool {
            self.embeds
        }

        fn embedded_velocity(
            &self,
            latent: Tensor<B, 4>,
            _: Tensor<B, 1>,
            _: &Conditioning<B>,
            guidance: f64,
        ) -> crate::Result<Tensor<B, 4>> {
            self.calls.borrow_mut().push((latent.dims()[0], Some(guidance)));
            Ok(latent + guidance)
        }
    }

    /// A model that embeds guidance gets one pass of the batch with the scale as its input; a
    /// CFG model gets one pass of `[latent; latent]` and `u + g (c - u)`, or the conditional
    /// pass alone at a scale of at most 1 (diffusers' rule).
    #[test]
    fn embedded_guidance_is_one_pass_with_the_scale_as_input() {
        let dev = Default::default();
        let cond = |v: f32| Conditioning::<B> {
            text: Tensor::zeros([2, 3, 4], &dev),
            pooled: Tensor::full([2, 5], v, &dev),
        };
        let (c, u) = (cond(1.0), cond(0.0));
        let x = Tensor::<B, 4>::ones([2, 1, 2, 2], &dev);
        let t = Tensor::<B, 1>::full([2], 500.0, &dev);
        let value = |v: Tensor<B, 4>| v.into_data().convert::<f32>().to_vec::<f32>().unwrap()[0];
        for (embeds, g, calls, out) in [
            (true, 3.5, vec![(2, Some(3.5))], 4.5),
            (false, 3.5, vec![(4, None)], 3.5),
            (false, 1.0, vec![(2, None)], 1.0),
        ] {
            let model = Recorder { embeds, calls: RefCell::new(vec![]) };
            let guidance = Guidance::for_model(&model, &c, &u, g, 2, 1).unwrap();
            let v = guidance.velocity(&model, x.clone(), t.clone()).unwrap();
            assert_eq!(*model.calls.borrow(), calls, "embeds {embeds}, g {g}");
            assert_eq!(value(v), out, "embeds {embeds}, g {g}");
        }
    }
}
