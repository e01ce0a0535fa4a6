//! Limits checked before anything is built or allocated: sizes that a configuration implies,
//! computed in f64 so that no product of user-given numbers can wrap, and compared with the
//! most this crate builds and with the memory of the machine.
//!
//! A size is refused only when it certainly cannot work: the bounds are lower bounds of what
//! the allocation needs, compared with the whole memory, so a run that fails these checks
//! would have aborted on allocation (the CPU) or failed later (a GPU).

use crate::error::{Error, Result};

/// The most parameters a model configuration may imply (SD3.5-large has 8.1e9, T5-XXL's
/// encoder 4.8e9): larger sizes in a `config.json` are refused before anything is built.
pub(crate) const MAX_PARAMS: f64 = 2e11;

/// The most elements one tensor may have (2^40, 4 TiB in f32): beyond any device, and far
/// below `usize::MAX`, so element counts and their byte sizes are exact.
pub(crate) const MAX_ELEMENTS: f64 = (1u64 << 40) as f64;

/// `Ok` when a model whose sizes imply `params` parameters (computed in f64) is within
/// [`MAX_PARAMS`]; else an error naming `fields` (the configuration fields that imply them).
pub(crate) fn check_params(fields: &str, params: f64) -> Result<()> {
    if params.is_finite() && params <= MAX_PARAMS {
        return Ok(());
    }
    Err(Error::config(
        fields,
        format!(
            "imply about {params:.2e} parameters ({:.0} GB in f32), above the {MAX_PARAMS:.0e} \
             this crate builds (SD3.5-large has 8.1e9)",
            params * 4e-9
        ),
    ))
}

/// `Ok` when every `(field, size)` is at least 1; else an error naming the first that is 0.
pub(crate) fn check_positive(sizes: &[(&str, usize)]) -> Result<()> {
    match sizes.iter().find(|(_, size)| *size == 0) {
        Some((field, _)) => Err(Error::config(*field, "must be at least 1")),
        None => Ok(()),
    }
}

/// The product of `sizes` as a `usize`, when it is at most [`MAX_ELEMENTS`]; else an error
/// naming `fields` (the settings the sizes come from) and `what` (the tensor they shape).
pub(crate) fn elements(fields: &str, what: &str, sizes: &[usize]) -> Result<usize> {
    let product: f64 = sizes.iter().map(|&s| s as f64).product();
    if product <= MAX_ELEMENTS {
        return Ok(sizes.iter().product());
    }
    Err(Error::config(
        fields,
        format!(
            "make {what} {} = {product:.2e} elements, above the {MAX_ELEMENTS:.1e} of any device",
            sizes.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(" x ")
        ),
    ))
}

/// Bytes of memory this process may use on the host: the machine's RAM, or the container's
/// (cgroup) limit when that is smaller; `None` where the platform does not say.
pub(crate) fn host_memory() -> Option<u64> {
    use sysinfo::{MemoryRefreshKind, RefreshKind, System};
    let system = System::new_with_specifics(
        RefreshKind::nothing().with_memory(MemoryRefreshKind::everything()),
    );
    let total = system.total_memory();
    let limit = system.cgroup_limits().map(|c| c.total_memory).filter(|&l| l > 0);
    match (total, limit) {
        (0, None) => None,
        (0, Some(l)) => Some(l),
        (t, Some(l)) => Some(t.min(l)),
        (t, None) => Some(t),
    }
}

/// `Ok` when `bytes` (a lower bound of what `what` needs) fit in `memory` bytes (unknown
/// memory: always); else an error naming `fields` with both sizes in GiB.
pub(crate) fn check_memory(
    fields: &str,
    what: &str,
    bytes: f64,
    memory: Option<u64>,
) -> Result<()> {
    match memory {
        Some(m) if bytes > m as f64 => Err(Error::config(
            fields,
            format!(
                "need at least {:.1} GiB for {what}, more than the {:.1} GiB of memory here",
                bytes / GIB,
                m as f64 / GIB
            ),
        )),
        _ => Ok(()),
    }
}

const GIB: f64 = (1u64 << 30) as f64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_sizes_are_refused_naming_the_first() {
        assert!(check_positive(&[("a", 1), ("b", 7)]).is_ok());
        let e = check_positive(&[("a", 1), ("b", 0), ("c", 0)]).unwrap_err().to_string();
        assert!(e.contains("`b`") && !e.contains("`c`"), "{e}");
    }

    #[test]
    fn products_that_would_wrap_are_refused_naming_the_fields() {
        assert_eq!(elements("a/b", "x", &[3, 4, 5]).unwrap(), 60);
        // 2^32 x 2^32 wraps a u64 to 0; refused instead.
        let e = elements("group_size", "the states", &[1 << 32, 1 << 32]).unwrap_err().to_string();
        assert!(e.contains("group_size") && e.contains("4294967296 x 4294967296"), "{e}");
        assert!(elements("f", "x", &[1 << 20, 1 << 20]).is_ok());
        assert!(elements("f", "x", &[1 << 20, (1 << 20) + 1]).is_err());
    }

    #[test]
    fn parameters_and_memory_bounds() {
        check_params("num_layers", 8.1e9).unwrap();
        assert!(check_params("num_layers", 2.1e11).unwrap_err().to_string().contains("num_layers"));
        assert!(check_params("num_layers", f64::INFINITY).is_err());
        check_memory("f", "x", 1e9, None).unwrap();
        check_memory("f", "x", 1e9, Some(1 << 30)).unwrap();
        let e = check_memory("rollout_batch", "latents", 3.0 * GIB, Some(1 << 30)).unwrap_err();
        assert!(e.to_string().contains("at least 3.0 GiB for latents, more than the 1.0 GiB"));
    }

    #[test]
    fn this_machine_reports_its_memory() {
        // Linux, macOS and Windows report RAM; a machine with under 64 MiB does not run tests.
        let m = host_memory().expect("the test machines report their memory");
        assert!(m > 64 << 20, "{m}");
    }
}
