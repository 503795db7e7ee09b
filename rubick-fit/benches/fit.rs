//! `make bench`, the performance model's part: held-out error and plan-choice regret on
//! others' published measurements (each external table) and on the authors' rows, at K =
//! 4 and 8 profiled rows chosen by the project's selection rule; the time of one fit.
//! Every figure as one line `bench: NAME VALUE UNIT`.

use std::path::PathBuf;
use std::time::Instant;

use rubick_fit::evaluate::{self, EvaluatedRow, Metrics};

fn pct(x: Option<f64>) -> String {
    x.map_or_else(|| "nan".to_owned(), |v| format!("{:.1}", v * 100.0))
}

fn print(name: &str, m: &Metrics) {
    println!("bench: {name}_err_pct {} %", pct(m.mean_rel_error));
    println!("bench: {name}_median_err_pct {} %", pct(m.median_rel_error));
    println!("bench: {name}_regret_pct {} %", pct(m.plan_regret_mean));
}

fn main() -> anyhow::Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    match rubick_io::external::locate(&root) {
        None => eprintln!("bench: skipping the external sets: ../shared/reference/external is absent"),
        Some(dir) => {
            for k in [4, 8] {
                let mut pooled: Vec<EvaluatedRow> = Vec::new();
                for set in rubick_io::external::SETS {
                    let evaluations = rubick_fit::evaluate_external(&[dir.join(format!("{set}.csv"))], k)?;
                    let rows: Vec<EvaluatedRow> = evaluations.into_iter().flat_map(|(_, e)| e.rows).collect();
                    let refs: Vec<&EvaluatedRow> = rows.iter().collect();
                    let m = evaluate::metrics(&refs);
                    print(&format!("fit_external_{set}_k{k}"), &m);
                    println!("bench: fit_external_{set}_k{k}_heldout_rows {} rows", m.rows - m.fitted_rows);
                    pooled.extend(rows);
                }
                let refs: Vec<&EvaluatedRow> = pooled.iter().collect();
                print(&format!("fit_external_pooled_k{k}"), &evaluate::metrics(&refs));
            }
            // Calculon's Table 5: each model's full-recompute row alone fitted, its
            // sequence-parallel + selective-recompute row predicted, as a ratio.
            let (_, calculon) = rubick_io::external::read(&dir.join("calculon_tab5.csv"))?;
            let mut errors = Vec::new();
            for job in &calculon.jobs {
                let Some(check) = evaluate::sp_selective_ratio(job)? else { continue };
                let name = job.name.replace(|c: char| !c.is_ascii_alphanumeric(), "_").to_ascii_lowercase();
                println!("bench: calculon_{name}_sp_selective_ratio_measured {:.3} ratio", check.measured);
                println!("bench: calculon_{name}_sp_selective_ratio_predicted {:.3} ratio", check.predicted);
                errors.push(check.error_points());
            }
            let mean = errors.iter().sum::<f64>() / errors.len().max(1) as f64;
            println!("bench: calculon_sp_selective_ratio_err_pct {mean:.1} points");
            // One fit's wall time: every vTrain single-node job, on the K = 8 rows the
            // selection chooses (as the evaluation above), median and max.
            let (_, data) = rubick_io::external::read(&dir.join("vtrain_single.csv"))?;
            let mut times = Vec::new();
            for job in &data.jobs {
                let links = rubick_model::perfmodel::Links::of_cluster(&job.cluster);
                let Some(k) = evaluate::samples_for(job.rows.len(), 8) else { continue };
                let configs =
                    evaluate::configs_of(job.rows.iter().map(|r| (r.plan, r.placement.clone(), r.iter_time_s)));
                let (_, obs) = evaluate::profiled(&configs, k, links);
                let start = Instant::now();
                rubick_model::fit::fit(&job.model, &obs, &rubick_model::fit::FitOptions::default())?;
                times.push(start.elapsed().as_secs_f64() * 1e3);
            }
            times.sort_by(f64::total_cmp);
            println!("bench: fit_one_job_ms {:.2} ms", times[times.len() / 2]);
            println!("bench: fit_one_job_max_ms {:.2} ms", times.last().copied().unwrap_or(f64::NAN));
            // A profile of a million rows (repeats of a job's 8 selected rows):
            // repeated configurations are fitted as one weighted row.
            if let Some(job) = data.jobs.iter().find(|j| j.rows.len() >= 9) {
                let links = rubick_model::perfmodel::Links::of_cluster(&job.cluster);
                let configs =
                    evaluate::configs_of(job.rows.iter().map(|r| (r.plan, r.placement.clone(), r.iter_time_s)));
                let (_, obs) = evaluate::profiled(&configs, 8, links);
                let many: Vec<_> = obs.iter().cycle().take(1_000_000).cloned().collect();
                let start = Instant::now();
                rubick_model::fit::fit(&job.model, &many, &rubick_model::fit::FitOptions::default())?;
                println!("bench: fit_1m_rows_s {:.3} s", start.elapsed().as_secs_f64());
            }
        }
    }
    match rubick_io::reference::locate(&root) {
        None => eprintln!("bench: skipping the authors' rows: ../shared/reference/rubick-artifact is absent"),
        Some(dir) => {
            let data = rubick_io::reference::ReferenceData::open(&dir)?;
            let cluster: rubick_core::Cluster = rubick_io::load_artifact(&root.join("data/cluster-a800-8x8.yaml"))?;
            let links = rubick_model::perfmodel::Links::of_cluster(&cluster);
            for k in [4, 8] {
                let mut pooled = Vec::new();
                for name in data.model_names() {
                    let model = data.model_spec(name)?.ok_or_else(|| anyhow::anyhow!("{name}: no spec"))?;
                    let measured = data.measured_rows(name)?;
                    let e = evaluate::evaluate_model(name, &model, &measured, links, k, None)?;
                    if k == 8 {
                        print(&format!("fit_reference_{name}_k{k}"), &e.report.metrics);
                    }
                    pooled.extend(e.rows);
                }
                let refs: Vec<&EvaluatedRow> = pooled.iter().collect();
                print(&format!("fit_reference_pooled_k{k}"), &evaluate::metrics(&refs));
            }
        }
    }
    Ok(())
}
