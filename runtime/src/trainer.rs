//! The trainer (placeholder until the runtime lands).

#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    #[arg(long, default_value_t = 4)]
    pub world_size: usize,
}

pub fn train_cli(_args: TrainArgs) -> anyhow::Result<()> {
    anyhow::bail!("train is not implemented yet")
}
