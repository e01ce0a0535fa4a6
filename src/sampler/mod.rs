//! Flow-matching sampling: the shifted schedule and the Euler, SDE (noise scale alpha) and CPS
//! steps with their log-probabilities.

pub mod schedule;
pub mod step;

pub use schedule::FlowSchedule;
pub use step::{cps_step, euler_step, sde_step, GaussianStep, StepKind};
