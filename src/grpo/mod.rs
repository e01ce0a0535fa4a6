//! The GRPO objectives: TP-GRPO credit assignment (step rewards, turning points, balancing),
//! group-normalised advantages (TP-GRPO per step, Flow-GRPO on the outcome), and the clipped
//! policy loss with a KL penalty to the reference policy.

pub(crate) mod advantage;
pub(crate) mod config;
pub(crate) mod credit;
pub(crate) mod epoch;
pub(crate) mod inspect;
pub(crate) mod loss;
pub(crate) mod turning_point;

pub use advantage::{
    clip_advantages, flow_grpo_advantages, informative_samples, tp_grpo_advantages, StdScope,
};
pub use config::{BalanceKey, Objective, ObjectiveConfig};
pub use credit::{credit_batch, mean_abs_step_rewards, step_rewards, TrajectoryCredit};
pub use epoch::CreditStats;
pub(crate) use epoch::{assign_credit, EpochCredit, RewardRows};
pub use inspect::{inspect, parse_credit_input, CreditInput, CreditReport, TrajectoryReport};
pub use loss::{kl_penalty, policy_loss, LossStats};
pub use turning_point::turning_points;
