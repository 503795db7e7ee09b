//! `rubick-run logs`: a run's log, followed until the run ends (`--follow`).

use std::time::Duration;

use anyhow::Context;
use rubick_io::cli::Outcome;

use crate::state::State;
use crate::{StateArgs, record};

pub(crate) fn logs(job: &str, attempt: Option<u32>, follow: bool, args: &StateArgs) -> anyhow::Result<Outcome> {
    use std::io::{Read, Write};
    // The lock only while the records are read: following a log must not hold rounds up.
    let (path, exit_file, state_file, attempt) = {
        let dir = locked!(args, false);
        let state = dir.load()?;
        let rec = record(&dir, &state, job)?;
        anyhow::ensure!(rec.attempts > 0, "`{job}` has not run yet");
        let attempt = attempt.unwrap_or(rec.attempts);
        anyhow::ensure!(
            (1..=rec.attempts).contains(&attempt),
            "--attempt {attempt}: `{job}` has runs 1 to {}",
            rec.attempts
        );
        let adir = dir.attempt_dir(job, attempt);
        (adir.join("log.txt"), adir.join("exit-code"), dir.state_path(), attempt)
    };
    // Whether the run still runs, as the state (rewritten atomically) or its exit code says.
    let running = || {
        !exit_file.exists()
            && std::fs::read_to_string(&state_file)
                .ok()
                .and_then(|t| serde_yaml_ng::from_str::<State>(&t).ok())
                .and_then(|s| s.jobs.get(job).and_then(|r| r.run.as_ref()).map(|r| r.attempt))
                == Some(attempt)
    };
    let mut file = std::fs::File::open(&path).with_context(|| format!("{}: no log", path.display()))?;
    let mut out = std::io::stdout().lock();
    let mut buf = Vec::new();
    loop {
        buf.clear();
        file.read_to_end(&mut buf).with_context(|| path.display().to_string())?;
        out.write_all(&buf)?;
        out.flush()?;
        if !follow || !running() {
            // One last read: what the run wrote before its exit code.
            buf.clear();
            file.read_to_end(&mut buf)?;
            out.write_all(&buf)?;
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    Ok(Outcome::Done)
}
