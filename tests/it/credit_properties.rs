//! Invariants of TP-GRPO credit assignment on random reward sequences (proptest). Values are
//! drawn from a coarse grid half of the time so exact zeros and ties occur.

use proptest::prelude::*;
use tpgrpo::grpo::{
    credit_batch, tp_grpo_advantages, turning_points, BalanceKey, ObjectiveConfig, StdScope,
};

fn reward() -> impl Strategy<Value = f64> {
    prop_oneof![(0..5i32).prop_map(|v| v as f64 * 0.25), 0.0..1.0f64]
}

/// A batch of `rows` sequences of `len` values each.
fn batch() -> impl Strategy<Value = Vec<Vec<f64>>> {
    (1usize..9, 2usize..11).prop_flat_map(|(rows, len)| {
        prop::collection::vec(prop::collection::vec(reward(), len), rows)
    })
}

fn config(consistency: bool, first_step: bool, key: BalanceKey) -> ObjectiveConfig {
    ObjectiveConfig::new()
        .with_consistency(consistency)
        .with_first_step(first_step)
        .with_balance_key(key)
}

proptest! {
    #[test]
    fn turning_points_agree_with_the_trend_and_grow_the_reward(seq in prop::collection::vec(reward(), 2..12), first in any::<bool>()) {
        let n = seq.len() - 1;
        let delta = seq[n] - seq[0];
        for (k, &is_tp) in turning_points(&seq, true, first).iter().enumerate() {
            if is_tp {
                let (d, agg) = (seq[k + 1] - seq[k], seq[n] - seq[k]);
                prop_assert!(sign(agg) == sign(d) && sign(d) == sign(delta) && sign(d) != 0, "k={k} {seq:?}");
                prop_assert!(agg.abs() > d.abs(), "k={k} {seq:?}");
            }
        }
    }

    #[test]
    fn monotone_sequences_have_at_most_the_initial_turning_point(
        mut seq in prop::collection::vec(reward(), 2..12), up in any::<bool>(), consistency in any::<bool>()
    ) {
        seq.sort_by(|a, b| a.partial_cmp(b).unwrap());
        if !up { seq.reverse(); }
        let tp = turning_points(&seq, consistency, true);
        prop_assert!(tp.iter().skip(1).all(|&t| !t), "{seq:?} -> {tp:?}");
    }

    #[test]
    fn balancing_leaves_equal_counts_of_each_sign(
        batch in batch(), consistency in any::<bool>(), first in any::<bool>(), agg_key in any::<bool>()
    ) {
        let key = if agg_key { BalanceKey::Agg } else { BalanceKey::Delta };
        let credits = credit_batch(&batch, &config(consistency, first, key)).unwrap();
        // Counts of positive and negative keys, before and after balancing (zero keys are
        // neither and are left alone).
        let (mut before, mut after) = ([0usize; 2], [0usize; 2]);
        for (c, seq) in credits.iter().zip(&batch) {
            let n = seq.len() - 1;
            for k in 0..n {
                let key_value = match key { BalanceKey::Delta => seq[n] - seq[0], BalanceKey::Agg => seq[n] - seq[k] };
                if key_value == 0.0 { continue; }
                let side = usize::from(key_value < 0.0);
                if c.turning_points[k] { after[side] += 1; }
                if c.candidate_turning_points[k] { before[side] += 1; }
            }
        }
        if before[0] > 0 && before[1] > 0 {
            prop_assert_eq!(after[0], after[1]);
            prop_assert_eq!(after[0], before[0].min(before[1]));
        } else {
            prop_assert_eq!(after, before);
        }
    }

    /// With group-scoped normalisation a group's advantages are those of the group scored
    /// alone: neither the other groups' rewards nor the interleaving of samples leak in (a
    /// batch-wide mean or std, or a mis-indexed group, would break this).
    #[test]
    fn group_advantages_do_not_depend_on_other_groups(batch in batch(), groups in 1usize..4) {
        let prompts: Vec<usize> = (0..batch.len()).map(|i| i % groups).collect();
        let credits = credit_batch(&batch, &ObjectiveConfig::new()).unwrap();
        let credited: Vec<Vec<f64>> = credits.iter().map(|c| c.credited_rewards.clone()).collect();
        let adv = tp_grpo_advantages(&credited, &prompts, StdScope::Group, 1e-4).unwrap();
        for g in 0..groups {
            let members: Vec<usize> = (0..batch.len()).filter(|&i| prompts[i] == g).collect();
            let alone: Vec<Vec<f64>> = members.iter().map(|&i| credited[i].clone()).collect();
            let alone = tp_grpo_advantages(&alone, &vec![g; members.len()], StdScope::Group, 1e-4).unwrap();
            for (row, &i) in alone.iter().zip(&members) {
                prop_assert_eq!(row, &adv[i], "group {}, sample {}", g, i);
            }
        }
    }
}

/// The sign of `x` as -1, 0 or 1 (0 for zero and NaN).
fn sign(x: f64) -> i8 {
    if x > 0.0 {
        1
    } else if x < 0.0 {
        -1
    } else {
        0
    }
}
