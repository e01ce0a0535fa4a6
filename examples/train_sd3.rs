//! The main job: TP-GRPO fine-tuning of an SD3-family model.
//!
//! With no arguments it trains the embedded toy model (`models/toy/`, coloured shapes) on the
//! CPU with the dense prompt-alignment reward (`--reward toy-geneval`: the rule-based
//! GenEval-like scorer) and prints the held-out reward and the GenEval-style checks before and
//! after. `--model DIR` trains a diffusers SD3 / SD3.5 folder with the reference settings, on
//! a flow_grpo prompt folder (`--prompts DIR`) with real rewards (`--reward pickscore=DIR`,
//! `--reward aesthetic=DIR:0.5`, ...; several are summed with their weights), or on the toy
//! task's prompts and reward; `--features cuda` selects the GPU backend; `--objective
//! flow-grpo` the baseline.
//!
//! The same program as `tpgrpo train` (`src/cli/train.rs`).

#[macro_use]
#[path = "../src/cli/console.rs"]
mod console;
#[path = "../src/cli/train.rs"]
mod train;

fn main() {
    if let Err(e) = train::run(clap::Parser::parse()) {
        console::fail(e);
    }
}
