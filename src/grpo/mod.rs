//! The GRPO objectives: TP-GRPO credit assignment (step rewards, turning points, balancing),
//! group-normalised advantages (TP-GRPO per step, Flow-GRPO on the outcome), and the clipped
//! policy loss with a KL penalty to the reference policy.

pub mod advantage;
pub mod config;
pub mod credit;
pub mod epoch;
pub mod inspect;
pub mod loss;
pub mod turning_point;

pub use advantage::{
    clip_advantages, flow_grpo_advantages, informative_samples, tp_grpo_advantages, StdScope,
};
pub use config::{BalanceKey, Objective, ObjectiveConfig};
pub use credit::{credit_batch, mean_abs_step_rewards, step_rewards, TrajectoryCredit};
pub use epoch::{assign_credit, CreditStats, EpochCredit, RewardRows};
pub use loss::{kl_penalty, policy_loss, LossStats};
pub use turning_point::turning_points;
