//! `proxy-operator provider`: one configured provider, outside the operator: one call
//! through the sandbox, or one instance's whole life.

mod call;
mod lifecycle;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Make one provider call with the operator's sandbox and limits, and print the answer
    /// as JSON (errors: class, code and message, and a non-zero exit).
    Call(call::Args),
    /// Create one instance through the provider, create it again (same ID), wait until it
    /// runs, find it in the listing, delete it twice, wait until it is gone, and report
    /// anything left behind. Works against whatever endpoint the config names: a real
    /// cloud account (where it costs a few minutes of one instance), moto, or an emulator.
    /// Whatever step fails, the instance is deleted before it exits.
    Lifecycle(lifecycle::Args),
}

pub async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Call(args) => call::run(args).await,
        Command::Lifecycle(args) => lifecycle::run(args).await,
    }
}
