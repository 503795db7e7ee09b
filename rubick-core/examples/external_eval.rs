//! Experiment: held-out error of the model on the external tables.
#![allow(clippy::unwrap_used)]
use rubick_core::external;
use rubick_core::fit::{FitOptions, Observation, fit};
use rubick_core::perfmodel::{Links, predict};
use rubick_core::select::{Candidate, select};
use std::collections::BTreeMap;

fn main() {
    let dir = std::env::args().nth(1).unwrap_or("../shared/reference/external".into());
    let k: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(8);
    let verbose = std::env::var("V").is_ok();
    let mut pooled = Vec::new();
    let mut pooled_regret = Vec::new();
    for set in ["vtrain_single", "vtrain_multi", "sailor", "calculon_tab5"] {
        let text = std::fs::read_to_string(format!("{dir}/{set}.csv")).unwrap();
        let data = external::parse(set, &text).unwrap();
        let mut errs = Vec::new();
        let mut regrets = Vec::new();
        let t0 = std::time::Instant::now();
        for job in &data.jobs {
            let n = job.rows.len();
            if n < 3 {
                continue;
            }
            let kk = k.min(n - 1);
            let links = Links::of_cluster(&job.cluster);
            let cands: Vec<Candidate> =
                job.rows.iter().map(|r| Candidate { plan: r.plan, placement: r.placement.clone() }).collect();
            let chosen = select(&cands, kk);
            let obs: Vec<Observation> = chosen
                .iter()
                .map(|&i| Observation {
                    plan: job.rows[i].plan,
                    placement: job.rows[i].placement.clone(),
                    links,
                    iter_time_s: job.rows[i].iter_time_s,
                })
                .collect();
            let f = match fit(&job.model, &obs, &FitOptions::default()) {
                Ok(f) => f,
                Err(e) => {
                    println!("{} {}: {e}", set, job.name);
                    continue;
                }
            };
            let mut by_gpus: BTreeMap<u32, Vec<(f64, f64)>> = BTreeMap::new();
            let mut jerr = Vec::new();
            for (i, r) in job.rows.iter().enumerate() {
                if chosen.contains(&i) {
                    continue;
                }
                let p = predict(&job.model, &r.plan, &r.placement, &links, &f.params).total;
                let e = (p - r.iter_time_s).abs() / r.iter_time_s;
                jerr.push(e);
                if verbose {
                    println!(
                        "   {} {} {} meas {:.4} pred {:.4} ratio {:.2}",
                        job.name,
                        r.plan,
                        r.placement,
                        r.iter_time_s,
                        p,
                        p / r.iter_time_s
                    );
                }
                by_gpus.entry(r.placement.gpus()).or_default().push((p, r.iter_time_s));
            }
            for g in by_gpus.values().filter(|g| g.len() >= 2) {
                let best = g.iter().map(|x| x.1).fold(f64::INFINITY, f64::min);
                let chosen = g.iter().min_by(|a, b| a.0.total_cmp(&b.0)).unwrap();
                regrets.push(chosen.1 / best - 1.0);
            }
            let m = jerr.iter().sum::<f64>() / jerr.len().max(1) as f64;
            if verbose || std::env::var("J").is_ok() {
                println!("  job {} rows {n} k {kk}: mean err {:.1}%", job.name, m * 100.0);
            }
            errs.extend(jerr);
        }
        let mean = errs.iter().sum::<f64>() / errs.len().max(1) as f64;
        let reg = regrets.iter().sum::<f64>() / regrets.len().max(1) as f64;
        println!(
            "{set:14} K={k}: held-out rows {:4} mean err {:5.1}%  regret {:5.1}% ({} groups)  {:.0} ms",
            errs.len(),
            mean * 100.0,
            reg * 100.0,
            regrets.len(),
            t0.elapsed().as_secs_f64() * 1e3
        );
        pooled.extend(errs);
        pooled_regret.extend(regrets);
    }
    println!(
        "pooled K={k}: {:.1}% regret {:.1}%",
        pooled.iter().sum::<f64>() / pooled.len() as f64 * 100.0,
        pooled_regret.iter().sum::<f64>() / pooled_regret.len() as f64 * 100.0
    );
}
