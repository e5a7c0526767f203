//! What `record` and `top` follow: a command they start (held before its exec, so the
//! sampler knows its pid before its first instruction), or `--pid` processes, or the
//! whole host.

use anyhow::{bail, Context, Result};

use crate::config::Config;
use crate::os::watch::{Exits, Held};

/// The processes a recording follows and the watch that says when they are gone.
pub struct Target {
    /// The command after `--`, forked and held before its exec; dropped unreleased, it
    /// is killed.
    pub held: Option<Held>,
    /// Fires when every followed process has exited; `None` for the whole host.
    pub exits: Option<Exits>,
}

impl Target {
    /// Starts `command` held (its pid becomes `sampling.pids`, with its children), or
    /// watches `sampling.pids` (their children too with `subprocesses`). A pid that names
    /// no process is an error here, before anything loads.
    pub fn prepare(cfg: &mut Config, command: &[String], subprocesses: bool) -> Result<Self> {
        if !command.is_empty() && !cfg.sampling.pids.is_empty() {
            bail!("give a command after -- or --pid, not both");
        }
        if let Some(program) = command.first() {
            let h = Held::spawn(command).with_context(|| format!("cannot run {program}"))?;
            cfg.sampling.pids = vec![h.pid()];
            cfg.sampling.subprocesses = true;
            let exits = Exits::open(&[h.pid()])?;
            return Ok(Self {
                held: Some(h),
                exits: Some(exits),
            });
        }
        if cfg.sampling.pids.is_empty() {
            return Ok(Self {
                held: None,
                exits: None,
            });
        }
        cfg.sampling.subprocesses |= subprocesses;
        Ok(Self {
            held: None,
            exits: Some(Exits::open(&cfg.sampling.pids)?),
        })
    }

    /// Lets the held command run (once the sampler is attached).
    pub fn release(&mut self) -> Result<()> {
        if let Some(h) = &mut self.held {
            h.release().context("starting the command")?;
        }
        Ok(())
    }
}

/// Resolves when every process `exits` watches has exited; never for the whole host (or
/// when the watch fails, said once on standard error).
pub async fn ended(exits: Option<Exits>) {
    match exits {
        Some(e) => {
            if let Err(e) = e.all().await {
                eprintln!("ember: cannot watch the recorded processes: {e}");
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}
