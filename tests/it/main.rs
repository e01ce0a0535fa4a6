//! The integration tests, as one test binary (one module per concern).
//!
//! One binary, not one per file: every test file instantiates the library's generic models
//! and trainer for the test backend, and a release build compiled and linked that code once
//! per file (about a minute each on two cores); here it is compiled once.

mod cli_compare;
mod cli_credit;
mod cli_sample;
mod cli_score;
mod cli_train;
mod common;
mod credit_properties;
mod data_parallel;
mod doctor;
mod flux_parity;
mod flux_pipeline;
mod grpo_loss;
mod lora;
mod lora_interop;
mod mmdit_load;
mod mmdit_parity;
mod package;
mod pipeline_parity;
mod precision;
mod reliability;
mod reward_parity;
mod reward_server;
mod rollout;
mod sampler_analytic;
mod sampler_gaussian;
mod sampler_reference;
mod tp_credit_reference;
mod train_flux;
mod train_rewards;
mod train_sd3_pipeline;
mod train_toy;
