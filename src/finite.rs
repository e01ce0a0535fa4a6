//! Non-finite checks: a NaN or infinity anywhere in a run (latents, images, rewards,
//! gradients, adapters, loaded state) stops it with an error naming what and where, and so
//! does a quantity derived from finite values that overflows f64 (a sum, difference or square
//! of rewards near 1e308).

use burn::prelude::*;

use crate::error::{Error, Result};

/// `Ok` when every value of `t` is finite; else [`Error::NonFinite`] naming `what`.
pub(crate) fn ensure_finite<B: Backend, const D: usize>(
    t: &Tensor<B, D>,
    what: &str,
) -> Result<()> {
    let bad = t.clone().is_finite().bool_not().int().sum().into_scalar().elem::<i64>() as usize;
    match bad {
        0 => Ok(()),
        count => {
            Err(Error::NonFinite { what: what.to_string(), count, total: t.shape().num_elements() })
        }
    }
}

/// `Ok` when every value is finite; else [`Error::NonFinite`] naming `what`.
pub(crate) fn ensure_finite_values(values: &[f32], what: &str) -> Result<()> {
    match values.iter().filter(|v| !v.is_finite()).count() {
        0 => Ok(()),
        count => Err(Error::NonFinite { what: what.to_string(), count, total: values.len() }),
    }
}

/// `value` when finite; else an error naming the setting or input `field` and `what` was
/// computed (from finite inputs too large for f64 arithmetic: sums, differences, squares).
pub(crate) fn no_overflow(value: f64, field: &str, what: impl FnOnce() -> String) -> Result<f64> {
    if value.is_finite() {
        return Ok(value);
    }
    Err(Error::config(
        field,
        format!(
            "{} overflows f64 ({value}): its inputs are finite but too large to combine \
             (rewards must stay well below 1e308 in magnitude)",
            what()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend as B;

    #[test]
    fn names_what_went_non_finite_and_counts_it() {
        let device = Default::default();
        let t = Tensor::<B, 2>::from_floats([[1.0, f32::NAN], [f32::INFINITY, -2.0]], &device);
        let e = ensure_finite(&t, "latent after step 3").unwrap_err().to_string();
        assert!(e.starts_with("latent after step 3: 2 of 4 values"), "{e}");
        ensure_finite(&Tensor::<B, 1>::from_floats([0.0, -1e30], &device), "x").unwrap();
        let e = ensure_finite_values(&[0.5, f32::NEG_INFINITY], "image 2").unwrap_err();
        assert!(e.to_string().starts_with("image 2: 1 of 2 values"), "{e}");
        assert_eq!(no_overflow(-1e308, "batch", || unreachable!()).unwrap(), -1e308);
        let e = no_overflow(1e308 * 2.0, "batch", || "row 1, d_0".into()).unwrap_err();
        assert!(e.to_string().contains("row 1, d_0 overflows f64 (inf)"), "{e}");
    }
}
