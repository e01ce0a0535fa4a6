//! The `tpgrpo` command line.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use tpgrpo::grpo::inspect::{inspect, parse_input, render_table};
use tpgrpo::Error;

/// tpgrpo: TP-GRPO fine-tuning tools.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show TP-GRPO credit assignment for a batch of reward sequences: step rewards, turning
    /// points, credited rewards and advantages.
    Credit {
        /// JSON file: {"batch": [[R_ode, R_1, .., R_sde], ..], "prompt_ids": [..], "options": {..}}
        #[arg(long)]
        input: PathBuf,
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Credit { input, json } => credit(&input, json),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn credit(path: &PathBuf, json: bool) -> tpgrpo::Result<()> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let input = parse_input(&text).map_err(|e| match e {
        Error::Format { message, .. } => Error::format(path, message),
        other => other,
    })?;
    let report = inspect(&input)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report).expect("report serialises"));
    } else {
        print!("{}", render_table(&report));
    }
    Ok(())
}
