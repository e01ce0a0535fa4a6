//! Flow-matching sampling: the shifted schedules (SD3's fixed shift, FLUX's dynamic one), the Euler, SDE (noise scale alpha) and CPS
//! steps with their log-probabilities, classifier-free guidance over a velocity model,
//! rollouts with an SDE window and ODE completions, and the text-to-image interface around
//! the denoiser.

pub(crate) mod guidance;
pub(crate) mod noise;
pub(crate) mod rollout;
pub(crate) mod schedule;
pub(crate) mod step;
pub(crate) mod text_to_image;

pub use guidance::{guided_velocity, Conditioning, Guidance, VelocityModel};
pub use noise::seeded_noise;
pub use rollout::{ode_completions, ode_sample, rollout, Rollout, RolloutConfig};
pub use schedule::{DynamicShift, FlowSchedule};
pub use step::{cps_step, euler_step, sde_step, GaussianStep, SamplerKind};
pub use text_to_image::TextToImage;
