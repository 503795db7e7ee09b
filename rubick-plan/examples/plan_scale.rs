//! Times one heuristic round at the sizes given: `plan_scale GPUS:JOBS ...`
//! (release build; for profiling the planner, e.g. under `perf record`).

use std::time::{Duration, Instant};

use rubick_milp::Milp;
use rubick_planner::PlannerConfig;
use rubick_planner::round::{Solver, plan_round};
use rubick_planner::synth;

fn main() -> anyhow::Result<()> {
    rubick_io::cli::init_logging(&rubick_io::cli::LogArgs::default());
    let config = PlannerConfig { now_s: 3600.0, ..PlannerConfig::default() };
    for arg in std::env::args().skip(1) {
        let (g, j) = arg.split_once(':').ok_or_else(|| anyhow::anyhow!("expected GPUS:JOBS, got {arg}"))?;
        let (j, seed) = j.split_once(':').unwrap_or((j, "1"));
        let (gpus, jobs, seed): (u32, u32, u64) = (g.parse()?, j.parse()?, seed.parse()?);
        let start = Instant::now();
        let (cluster, inputs) = synth::instance(gpus, jobs, seed, &config)?;
        let built = start.elapsed();
        // PLAN_SCALE_REPEAT=N: the first round N times more (for a profiler).
        let repeat: usize = std::env::var("PLAN_SCALE_REPEAT").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
        let mut samples = Vec::new();
        for _ in 0..repeat {
            let start = Instant::now();
            plan_round(&cluster, &config, &inputs, Solver::Heuristic, &Milp::new(Duration::from_secs(10)), 0)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            samples.push(start.elapsed().as_secs_f64() * 1e3);
        }
        samples.sort_by(f64::total_cmp);
        if let Some(median) = samples.get(samples.len() / 2) {
            println!("{gpus} GPUs / {jobs} jobs / seed {seed}: median of {repeat} rounds {median:.2} ms");
        }
        let start = Instant::now();
        let r = plan_round(&cluster, &config, &inputs, Solver::Heuristic, &Milp::new(Duration::from_secs(10)), 0)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let wall = start.elapsed();
        let text = serde_yaml_ng::to_string(&r.outcome.schedule)?;
        let mut h = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(&text, &mut h);
        // A second round on the first's schedule (jobs kept, moved, locked).
        let batch = synth::jobs(&cluster, jobs, seed)?;
        let believed = rubick_plan::round::on_priors(batch.jobs);
        let path = std::path::Path::new("<synthetic>");
        let inputs2 =
            rubick_plan::round::job_inputs(path, believed, &cluster, &config, Some((path, &r.outcome.schedule)))?;
        let start2 = Instant::now();
        let r2 = plan_round(&cluster, &config, &inputs2, Solver::Heuristic, &Milp::new(Duration::from_secs(10)), 1)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let wall2 = start2.elapsed();
        std::hash::Hash::hash(&serde_yaml_ng::to_string(&r2.outcome.schedule)?, &mut h);
        println!(
            "{gpus} GPUs / {jobs} jobs / seed {seed}: round {:.1} ms, second {:.1} ms (instance {:.1} ms), objective {:.6}, schedules {:016x}",
            wall.as_secs_f64() * 1e3,
            wall2.as_secs_f64() * 1e3,
            built.as_secs_f64() * 1e3,
            r.outcome.schedule.objective,
            std::hash::Hasher::finish(&h)
        );
    }
    Ok(())
}
