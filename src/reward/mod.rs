//! Rewards: a batched scorer of images given their prompts, and weighted sums of scorers.

pub(crate) mod aesthetic;
pub(crate) mod clip;
pub(crate) mod pickle;
pub(crate) mod server;
pub(crate) mod spec;

pub use aesthetic::Aesthetic;
pub use clip::{ClipSimilarity, CLIPSCORE_DIVISOR, PICKSCORE_DIVISOR};
pub use pickle::{check_pickle, MAX_PICKLE_DEPTH, MAX_PICKLE_VALUES};
pub use server::{Protocol, RewardServer, ServerConfig};
pub use spec::{load_rewards, RewardSpec};

use crate::image::Image;
use crate::prompts::Prompt;

use crate::error::{Error, Result};
use crate::finite::no_overflow;

/// A batched reward: one finite score per image.
pub trait Reward {
    /// A short name for logs and metrics.
    fn name(&self) -> &str;

    /// Checks what this reward reads of a prompt (its metadata) before any training: an error
    /// says what is wrong with it. Called for every prompt when a trainer is built, and by
    /// [`PromptSet::check`](crate::prompts::PromptSet::check) to name its `file:line`. The
    /// default accepts every prompt.
    fn check_prompt(&self, prompt: &Prompt) -> Result<()> {
        let _ = prompt;
        Ok(())
    }

    /// What identifies this reward's scores (kind, model source, weights), recorded in
    /// checkpoints: resuming a run with a reward of another identity is refused. The default
    /// is [`Reward::name`].
    fn identity(&self) -> String {
        self.name().to_string()
    }

    /// Scores `images[i]` against `prompts[i]`.
    fn score(&self, images: &[Image], prompts: &[Prompt]) -> Result<Vec<f64>>;

    /// The weighted terms this reward sums, each with its own scores (a single reward is one
    /// term of weight 1); what metrics log per reward.
    fn terms(&self, images: &[Image], prompts: &[Prompt]) -> Result<Vec<Term>> {
        let scores = self.score(images, prompts)?;
        Ok(vec![Term { name: self.name().to_string(), weight: 1.0, scores }])
    }
}

/// One reward's scores inside a weighted sum.
#[derive(Debug, Clone, PartialEq)]
pub struct Term {
    /// The reward's name.
    pub name: String,
    /// Its weight in the sum.
    pub weight: f64,
    /// Its score of each image.
    pub scores: Vec<f64>,
}

/// Measurements made at evaluation beside the reward (GenEval-style pass rates, a second
/// scorer): a batch's tallies `(name, passed, made)`, summed over the evaluation and reported
/// as `passed / made`.
pub trait Report {
    /// The tallies of `images[i]` against `prompts[i]`.
    fn tally(&self, images: &[Image], prompts: &[Prompt]) -> Result<Vec<(String, f64, f64)>>;
}

/// Scores `images` with `reward`: `sum_j w_j r_j` of its [`Reward::terms`], checking the batch
/// size and that every score is finite (see [`score_terms`]).
pub fn score_checked(
    reward: &dyn Reward,
    images: &[Image],
    prompts: &[Prompt],
) -> Result<Vec<f64>> {
    Ok(score_terms(reward, images, prompts)?.0)
}

/// The weighted total of each image and every term's scores. Each term must return one score
/// per image, all finite: a NaN or infinite score is an error naming the reward, the image
/// and its prompt, so nothing trains on a missing score.
pub fn score_terms(
    reward: &dyn Reward,
    images: &[Image],
    prompts: &[Prompt],
) -> Result<(Vec<f64>, Vec<Term>)> {
    if images.len() != prompts.len() {
        let expected = format!("one prompt per image ({})", images.len());
        return Err(Error::shape("prompts", expected, &[prompts.len()]));
    }
    let terms = reward.terms(images, prompts)?;
    let mut total = vec![0.0; images.len()];
    for term in &terms {
        if term.scores.len() != images.len() {
            return Err(Error::Reward {
                name: term.name.clone(),
                message: format!("{} scores for {} images", term.scores.len(), images.len()),
            });
        }
        if let Some((i, s)) = term.scores.iter().enumerate().find(|(_, s)| !s.is_finite()) {
            return Err(Error::Reward {
                name: term.name.clone(),
                message: format!("scored image {i} (prompt {:?}) as {s}", prompts[i].text),
            });
        }
        for (t, s) in total.iter_mut().zip(&term.scores) {
            *t += term.weight * s;
        }
    }
    for (i, t) in total.iter().enumerate() {
        no_overflow(*t, "reward", || format!("the weighted total of image {i}'s scores"))?;
    }
    Ok((total, terms))
}

/// `sum_j w_j r_j(images)`: several rewards combined with weights.
pub struct WeightedSum {
    /// `(weight, reward)` pairs.
    pub terms: Vec<(f64, Box<dyn Reward>)>,
}

impl Reward for WeightedSum {
    fn name(&self) -> &str {
        "weighted_sum"
    }

    /// Every term's check.
    fn check_prompt(&self, prompt: &Prompt) -> Result<()> {
        self.terms.iter().try_for_each(|(_, r)| r.check_prompt(prompt))
    }

    /// `w1 x identity1 + w2 x identity2 ...`.
    fn identity(&self) -> String {
        let terms: Vec<String> =
            self.terms.iter().map(|(w, r)| format!("{w} x {}", r.identity())).collect();
        terms.join(" + ")
    }

    fn score(&self, images: &[Image], prompts: &[Prompt]) -> Result<Vec<f64>> {
        score_checked(self, images, prompts)
    }

    /// Every inner reward's terms, their weights multiplied by this sum's.
    fn terms(&self, images: &[Image], prompts: &[Prompt]) -> Result<Vec<Term>> {
        let mut out = Vec::new();
        for (w, reward) in &self.terms {
            for term in score_terms(reward.as_ref(), images, prompts)?.1 {
                out.push(Term { weight: w * term.weight, ..term });
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scores every image with the same values, in order.
    struct Fixed(&'static str, Vec<f64>);

    impl Reward for Fixed {
        fn name(&self) -> &str {
            self.0
        }

        fn score(&self, _: &[Image], _: &[Prompt]) -> Result<Vec<f64>> {
            Ok(self.1.clone())
        }
    }

    fn batch(n: usize) -> (Vec<Image>, Vec<Prompt>) {
        let image = Image { width: 1, height: 1, pixels: vec![0.0; 3] };
        let prompt = Prompt { text: "p".into(), metadata: serde_json::Value::Null };
        (vec![image; n], vec![prompt; n])
    }

    /// `0.5 [1, 2] - 2 [0.25, 1] = [0, -1]`, with each term's raw scores and weight kept.
    #[test]
    fn weighted_sum_by_hand() {
        let sum = WeightedSum {
            terms: vec![
                (0.5, Box::new(Fixed("a", vec![1.0, 2.0]))),
                (-2.0, Box::new(Fixed("b", vec![0.25, 1.0]))),
            ],
        };
        let (images, prompts) = batch(2);
        let (total, terms) = score_terms(&sum, &images, &prompts).unwrap();
        assert_eq!(total, vec![0.0, -1.0]);
        assert_eq!(terms[1], Term { name: "b".into(), weight: -2.0, scores: vec![0.25, 1.0] });
        assert_eq!(score_checked(&sum, &images, &prompts).unwrap(), total);
    }

    /// A NaN or a missing score in any term stops scoring, naming the term.
    #[test]
    fn bad_terms_are_named() {
        let (images, prompts) = batch(2);
        let nan = WeightedSum {
            terms: vec![
                (1.0, Box::new(Fixed("good", vec![1.0, 2.0]))),
                (1.0, Box::new(Fixed("nan", vec![1.0, f64::NAN]))),
            ],
        };
        let err = score_checked(&nan, &images, &prompts).unwrap_err();
        assert!(matches!(&err, Error::Reward { name, .. } if name == "nan"), "{err:?}");
        assert!(err.to_string().contains("reward `nan`: scored image 1"), "{err}");
        let short = Fixed("short", vec![1.0]);
        let err = score_checked(&short, &images, &prompts).unwrap_err().to_string();
        assert!(err.contains("reward `short`: 1 scores for 2 images"), "{err}");
    }
}
