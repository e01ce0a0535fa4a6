//! Flow-matching sampling: the shifted schedule, the Euler, SDE (noise scale alpha) and CPS
//! steps with their log-probabilities, and classifier-free guidance over a velocity model.

pub mod guidance;
pub mod noise;
pub mod rollout;
pub mod schedule;
pub mod step;

pub use guidance::{guided_velocity, Conditioning, Guidance, VelocityModel};
pub use rollout::{ode_completions, rollout, seeded_noise, Rollout, RolloutConfig, SamplerKind};
pub use schedule::FlowSchedule;
pub use step::{cps_step, euler_step, sde_step, GaussianStep, StepKind};
