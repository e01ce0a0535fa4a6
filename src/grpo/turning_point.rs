//! Turning points: trained steps whose reward change turns toward the trajectory's overall trend.

/// `sign(x)` with `sign(0) = 0` (NaN counts as 0: it never passes a strict test).
pub(crate) fn sign(x: f64) -> i8 {
    if x > 0.0 {
        1
    } else if x < 0.0 {
        -1
    } else {
        0
    }
}

/// Flags the turning points of one trajectory with rewards `seq = [R_ode, R_1, .., R_sde]`
/// (`n + 1` values for `n` trained steps).
///
/// With `d_k = seq[k+1] - seq[k]`, `Delta = R_sde - R_ode`, `s_k = sign(d_k) sign(Delta)` and
/// `after_k = sign(d_k) sign(R_sde - seq[k+1])`, step `k >= 1` is a turning point when
/// `s_{k-1} < 0`, `s_k > 0` and (if `consistency`) `after_k > 0`. Step 0, when `first_step`,
/// is one when `after_0 > 0` (with consistency) or `s_0 > 0` (without). All tests are strict,
/// so an exact zero anywhere blocks a turning point.
pub fn turning_points(seq: &[f64], consistency: bool, first_step: bool) -> Vec<bool> {
    let n = seq.len().saturating_sub(1);
    let r_sde = seq[n];
    let delta = sign(r_sde - seq[0]);
    let d = |k: usize| sign(seq[k + 1] - seq[k]);
    let s = |k: usize| d(k) * delta;
    let after = |k: usize| d(k) * sign(r_sde - seq[k + 1]);
    (0..n)
        .map(|k| {
            if k == 0 {
                first_step && if consistency { after(0) > 0 } else { s(0) > 0 }
            } else {
                s(k - 1) < 0 && s(k) > 0 && (!consistency || after(k) > 0)
            }
        })
        .collect()
}
