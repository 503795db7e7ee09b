//! rubick-fit against the authors' reference data (skipped with a message when
//! ../shared is absent), and the fit -> predict pipeline on a profile table.

use std::path::Path;

use rubick_tests::{external, reference, repo, run_in};

/// `rubick-fit ARGS` in `dir`: (exit code, stdout, stderr).
fn fit_tool(dir: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let run = run_in(dir, "rubick-fit", args);
    (run.code, run.stdout, run.stderr)
}

/// Runs `evaluate` twice (the first time with `extra` outputs too) and returns the
/// summary, checked byte-identical across the two runs.
fn evaluate_twice(dir: &Path, args: &[&str], extra: &[&str]) -> String {
    let mut a = args.to_vec();
    a.extend(["--summary", "a.yaml"]);
    a.extend(extra);
    let (code, _, err) = fit_tool(dir, &a);
    assert_eq!(code, Some(0), "{err}");
    let mut b = args.to_vec();
    b.extend(["--summary", "b.yaml"]);
    assert_eq!(fit_tool(dir, &b).0, Some(0));
    let text = std::fs::read_to_string(dir.join("a.yaml")).unwrap();
    assert_eq!(text, std::fs::read_to_string(dir.join("b.yaml")).unwrap(), "byte-identical summaries");
    text
}

fn cluster() -> String {
    repo().join("data/cluster-a800-8x8.yaml").display().to_string()
}

fn num(v: &serde_yaml_ng::Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} missing in {v:?}"))
}

/// The evaluation of the foundation's model on all seven models with K = 8. The
/// thresholds are the figures measured when this model form landed (pooled 15.2 %,
/// median 9.0 %), kept as a regression guard; see the rubick-fit closing note.
#[test]
fn evaluate_all_models_with_eight_rows_each() {
    let Some(reference) = reference() else { return };
    let dir = tempfile::tempdir().unwrap();
    let reference = reference.display().to_string();
    let args = ["evaluate", "--reference", &reference, "--model", "all", "--cluster", &cluster(), "--samples", "8"];
    let text = evaluate_twice(dir.path(), &args, &["--rows", "rows.csv", "--plot", "fit.svg"]);
    assert!(std::fs::read_to_string(dir.path().join("fit.svg")).unwrap().contains("<svg"));
    assert!(std::fs::read_to_string(dir.path().join("rows.csv")).unwrap().lines().count() == 513);

    let summary: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let overall = &summary["overall"];
    for key in [
        "rows",
        "fitted_rows",
        "mean_rel_error",
        "median_rel_error",
        "max_rel_error",
        "plan_choice_accuracy",
        "plan_regret_mean",
    ] {
        assert!(!overall[key].is_null(), "overall.{key}");
    }
    assert_eq!(num(overall, "rows"), 512.0);
    assert_eq!(num(overall, "fitted_rows"), 56.0);
    // 15.2 % when the form landed, 14.7-14.8 % before the micro-batch term, 15.6 % with
    // the micro-batch as a selection coordinate, 14.8 % with accumulation as the only new
    // one (see rubick_model::select).
    assert!(num(overall, "mean_rel_error") <= 0.15, "{overall:?}");
    assert!(num(overall, "median_rel_error") <= 0.10, "{overall:?}");
    let models = summary["models"].as_mapping().unwrap();
    assert_eq!(models.len(), 7);
    let mut regrets = Vec::new();
    for (name, m) in models {
        let name = name.as_str().unwrap();
        let mean = num(m, "mean_rel_error");
        if name == "vit" {
            assert!(mean <= 0.40, "vit {mean}");
            assert!(!m["flagged_rows"].as_sequence().unwrap().is_empty(), "ViT's inconsistent rows are listed");
        } else {
            assert!(mean <= 0.15, "{name} {mean}");
            let regret = num(m, "plan_regret_mean");
            assert!(regret <= 0.05, "{name} regret {regret}");
            regrets.push(regret);
        }
    }
    let mean_regret = regrets.iter().sum::<f64>() / regrets.len() as f64;
    assert!(mean_regret <= 0.03, "mean plan regret over the models other than ViT: {mean_regret}");
}

/// The evaluated model of one job, written as a PerfModel, validates and predicts.
#[test]
fn fit_from_a_profile_table_then_predict() {
    let Some(reference) = reference() else { return };
    let dir = tempfile::tempdir().unwrap();
    let reference = reference.display().to_string();
    let (code, _, err) = fit_tool(
        dir.path(),
        &[
            "evaluate",
            "--reference",
            &reference,
            "--model",
            "bert",
            "--cluster",
            &cluster(),
            "--summary",
            "s.yaml",
            "--model-out",
            "bert.yaml",
            "--rows",
            "rows.csv",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(fit_tool(dir.path(), &["check", "bert.yaml"]).0, Some(0));

    // A profile table from the rows the evaluation fitted, and a job for it.
    let rows = std::fs::read_to_string(dir.path().join("rows.csv")).unwrap();
    let mut profile = String::from("job,model,plan,placement,iter_time_s\n");
    for line in rows.lines().skip(1).filter(|l| l.contains(",true,")) {
        let f: Vec<&str> = line.split(',').collect();
        profile.push_str(&format!("bert-0,bert,{},{},{}\n", f[3], f[4], f[5]));
    }
    std::fs::write(dir.path().join("profile.csv"), profile).unwrap();
    std::fs::write(
        dir.path().join("job.yaml"),
        "apiVersion: rubick/v1\nkind: Job\nname: bert-0\nmodel: { name: bert, parameters: 336297858, layers: 24, hidden: 1536, heads: 16, seqLen: 1024, globalBatch: 32, forward1gpuMs: 225 }\niterations: 100\nrequest: { gpus: 8 }\n",
    )
    .unwrap();
    let (code, _, err) =
        fit_tool(dir.path(), &["fit", "profile.csv", "--job", "job.yaml", "--cluster", &cluster(), "-o", "model.yaml"]);
    assert_eq!(code, Some(0), "{err}");
    let (code, out, err) = fit_tool(
        dir.path(),
        &["predict", "model.yaml", "--cluster", &cluster(), "--plan", "dp8-mb4-ga1", "--placement", "8"],
    );
    assert_eq!(code, Some(0), "{err}");
    let t: f64 = out.lines().nth(1).unwrap().split(',').nth(2).unwrap().parse().unwrap();
    assert!((t / 0.158 - 1.0).abs() < 0.2, "bert on 8 GPUs measured 0.158 s, predicted {t}");
}

/// Degenerate profile tables exit 2 with the reason, never panic, write nothing.
#[test]
fn degenerate_profiles_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("job.yaml"),
        "apiVersion: rubick/v1\nkind: Job\nname: j\nmodel: { name: m, layers: 4, hidden: 256, heads: 4, seqLen: 128, globalBatch: 8 }\niterations: 10\nrequest: { gpus: 2 }\n",
    )
    .unwrap();
    let header = "job,model,plan,placement,iter_time_s\n";
    let cases = [
        ("one-row.csv", format!("{header}j,m,dp2-mb4,2,0.5\n"), "distinct configuration"),
        (
            "all-equal.csv",
            format!("{header}j,m,dp2-mb4,2,0.5\nj,m,dp2-mb4,2,0.5\nj,m,dp2-mb4,2,0.5\n"),
            "distinct configuration",
        ),
        ("zero.csv", format!("{header}j,m,dp2-mb4,2,0.5\nj,m,dp1-mb8,1,0\n"), "positive, finite"),
        ("nan.csv", format!("{header}j,m,dp2-mb4,2,NaN\nj,m,dp1-mb8,1,0.9\n"), "positive, finite"),
        ("empty.csv", header.to_owned(), "no measured rows"),
        ("bad-plan.csv", format!("{header}j,m,dp3-mb4,3,0.5\nj,m,dp1-mb8,1,0.9\n"), "line 2"),
        ("missing-column.csv", "job,model,plan,placement\nj,m,dp2-mb4,2\n".to_owned(), "iter_time_s"),
    ];
    for (name, text, expected) in cases {
        std::fs::write(dir.path().join(name), text).unwrap();
        let (code, _, err) =
            fit_tool(dir.path(), &["fit", name, "--job", "job.yaml", "--cluster", &cluster(), "-o", "out.yaml"]);
        assert_eq!(code, Some(2), "{name}: {err}");
        assert!(err.contains(expected) && err.contains(name), "{name}: {err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
        assert!(!dir.path().join("out.yaml").exists(), "{name}: wrote output");
    }
}

/// Leave-one-out error on the K = 8 profiled rows only (no held-out row is read): how
/// prior choices are compared without tuning on held-out data. Run by hand:
/// `cargo test -p rubick-tests --test it -- --ignored --nocapture profiled_rows_loo`.
#[test]
#[ignore = "a model-development aid, run by hand"]
fn profiled_rows_loo() {
    let Some(dir) = reference() else { return };
    let data = rubick_io::reference::ReferenceData::open(&dir).unwrap();
    let cluster: rubick_core::Cluster = rubick_io::load_artifact(&repo().join("data/cluster-a800-8x8.yaml")).unwrap();
    let links = rubick_model::perfmodel::Links::from(&cluster.node_groups[0]);
    let estimator = rubick_model::MemoryEstimator::default();
    let mut errors = Vec::new();
    for model in data.model_names() {
        let spec = data.model_spec(model).unwrap().unwrap();
        let measured = data.measured_rows(model).unwrap();
        let resolved = rubick_model::reference::resolve_rows(&measured, &spec, &estimator);
        let (_, obs) = rubick_model::reference::profiled_rows(&resolved, 8, links);
        for i in 0..obs.len() {
            let mut train = obs.clone();
            let test = train.remove(i);
            let Ok(fit) = rubick_model::fit::fit(&spec, &train, &rubick_model::fit::FitOptions::default()) else {
                continue;
            };
            let pred =
                rubick_model::perfmodel::predict(&spec, &test.plan, &test.placement, &test.links, &fit.params).total;
            errors.push((pred - test.iter_time_s).abs() / test.iter_time_s);
        }
    }
    let mean = errors.iter().sum::<f64>() / errors.len() as f64;
    println!("LOO over profiled rows: {} rows, mean relative error {:.4}", errors.len(), mean);
}

/// Others' measurements (vTrain, Sailor, Calculon), K = 8 rows of each job chosen by the
/// project's own selection: the held-out error and the plan-choice regret the issue
/// asks for (pooled <= 12 %, single-node vTrain <= 15 %, regret <= 5 %), byte-identical
/// twice.
#[test]
fn evaluate_external_sets_with_eight_rows_each() {
    let Some(dir) = external() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let files: Vec<String> =
        rubick_io::external::SETS.iter().map(|s| dir.join(format!("{s}.csv")).display().to_string()).collect();
    let mut args = vec!["evaluate", "--samples", "8", "--external"];
    args.extend(files.iter().map(String::as_str));
    let text = evaluate_twice(tmp.path(), &args, &[]);
    let summary: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let overall = &summary["overall"];
    assert!(num(overall, "mean_rel_error") <= 0.12, "pooled {overall:?}");
    assert!(num(overall, "plan_regret_mean") <= 0.05, "regret {overall:?}");
    assert!(num(overall, "rows") - num(overall, "fitted_rows") >= 500.0, "{overall:?}");

    let single = dir.join("vtrain_single.csv").display().to_string();
    let (code, out, err) = fit_tool(tmp.path(), &["evaluate", "--external", &single, "--samples", "8", "--all"]);
    assert_eq!(code, Some(0), "{err}");
    let summary: serde_yaml_ng::Value = serde_yaml_ng::from_str(&out).unwrap();
    assert!(num(&summary["overall"], "mean_rel_error") <= 0.15, "{:?}", summary["overall"]);
}

/// Calculon's Table 5 (Korthikanti et al.'s 22B to 1T models, each measured with full
/// recompute and with sequence parallelism + selective recompute): each model's
/// full-recompute row alone fitted, the other predicted. What judges the new terms is
/// the ratio of the two times, within 10 points on average, every model's below 1 (the
/// newer plan is the faster), and no row set aside.
#[test]
fn calculon_sequence_parallel_selective_rows_are_predicted_from_full_recompute_alone() {
    let Some(dir) = external() else { return };
    let (_, data) = rubick_io::external::read(&dir.join("calculon_tab5.csv")).unwrap();
    assert!(data.set_aside.is_empty(), "{:?}", data.set_aside);
    let checks: Vec<_> =
        data.jobs.iter().filter_map(|job| rubick_fit::evaluate::sp_selective_ratio(job).unwrap()).collect();
    assert_eq!(checks.len(), 4, "{checks:?}");
    for c in &checks {
        println!("{}: {} -> {}: measured {:.3} predicted {:.3}", c.model, c.from, c.to, c.measured, c.predicted);
        assert!(c.predicted < 1.0, "{c:?}");
    }
    let mean = checks.iter().map(rubick_fit::evaluate::RatioCheck::error_points).sum::<f64>() / 4.0;
    assert!(mean <= 10.0, "mean error {mean:.1} points: {checks:?}");
}

/// `select` chooses from the job's plan space (or a given list, reading only `plan` and
/// `placement`), covers the smallest and the largest micro-batch, and is deterministic.
#[test]
fn select_covers_the_micro_batch_and_reads_only_plans() {
    let tmp = tempfile::tempdir().unwrap();
    let job = repo().join("examples/pytorch/job.yaml").display().to_string();
    let cluster = tmp.path().join("cpu.yaml");
    std::fs::write(
        &cluster,
        "apiVersion: rubick/v1\nkind: Cluster\nname: cpu\nnodeGroups:\n- { name: cpu, count: 1, gpuType: cpu, gpusPerNode: 2, gpuMemoryGib: 8, cpuCores: 2, hostMemoryGib: 16, nvlinkGBps: 5, interNodeGBps: 1, pcieGBps: 5 }\n",
    )
    .unwrap();
    let cluster = cluster.display().to_string();
    let (code, out, err) = fit_tool(tmp.path(), &["select", "--job", &job, "--cluster", &cluster, "--budget", "8"]);
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "plan,placement");
    assert_eq!(lines.len(), 9, "{out}");
    let mbs: Vec<u32> = lines[1..]
        .iter()
        .map(|l| l.split(',').next().unwrap().parse::<rubick_core::Plan>().unwrap().micro_batch)
        .collect();
    assert!(mbs.contains(&1) && mbs.contains(&16), "smallest and largest micro-batch: {mbs:?}");
    assert_eq!(fit_tool(tmp.path(), &["select", "--job", &job, "--cluster", &cluster, "--budget", "8"]).1, out);
    // --from: other columns (times included) are never read; a bad plan names its line.
    std::fs::write(
        tmp.path().join("cands.csv"),
        "plan,placement,iter_time_s\ndp1-mb16,1,x\ndp2-mb8,2,\ndp1-mb1-ga16,1,1\ndp2-mb1-ga8,2,0\n",
    )
    .unwrap();
    let (code, out, err) =
        fit_tool(tmp.path(), &["select", "--job", &job, "--cluster", &cluster, "--budget", "2", "--from", "cands.csv"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.lines().count(), 3, "{out}");
    std::fs::write(tmp.path().join("bad.csv"), "plan,placement\ndp1-mb16,1\ndp1-mb3,1\n").unwrap();
    let (code, _, err) =
        fit_tool(tmp.path(), &["select", "--job", &job, "--cluster", &cluster, "--budget", "2", "--from", "bad.csv"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("bad.csv: line 3"), "{err}");
    // The output never replaces an input.
    let (code, _, err) = fit_tool(
        tmp.path(),
        &["select", "--job", &job, "--cluster", &cluster, "--budget", "2", "--from", "cands.csv", "-o", "cands.csv"],
    );
    assert_eq!(code, Some(2));
    assert!(err.contains("also an input"), "{err}");
}

/// The project's own GPU measurement (`data/profiles/gpt-98m-h200.csv`: the PyTorch
/// workload at 98 M parameters on one H200, micro-batch 1..64 with and without
/// checkpointing): fitted on 4 rows chosen by the selection, the 6 held out are
/// predicted within the figures measured when it landed (mean 16.7 %, max 35 %), and
/// the best plan is the one chosen. A regression guard for what the planner varies on a
/// real GPU: micro-batch efficiency (21x from micro-batch 1 to 64).
#[test]
fn a_real_h200_profile_is_predicted_from_four_of_its_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let data = repo().join("data/profiles");
    let path = |f: &str| data.join(f).display().to_string();
    let (table, job, cluster) = (path("gpt-98m-h200.csv"), path("gpt-98m.job.yaml"), path("cluster-h200.yaml"));
    let args = ["evaluate", "--table", &table, "--job", &job, "--cluster", &cluster, "--samples", "4"];
    let text = evaluate_twice(tmp.path(), &args, &[]);
    let summary: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let overall = &summary["overall"];
    assert_eq!((num(overall, "rows"), num(overall, "fitted_rows")), (10.0, 4.0), "{overall:?}");
    assert!(num(overall, "mean_rel_error") <= 0.20, "{overall:?}");
    assert!(num(overall, "max_rel_error") <= 0.40, "{overall:?}");
    assert!(num(overall, "plan_choice_accuracy") >= 1.0, "{overall:?}");
}

/// The Quick start's evaluation (a 2-core machine's profile of the PyTorch workload, 2
/// rows profiled): one screen on stdout, at most 25 lines, not 150 lines of YAML; the
/// full YAML with `--all` or `--summary FILE`. With every model of the authors' data
/// (when it is here), the screen stays one.
#[test]
fn evaluate_prints_one_screen_unless_all() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    std::fs::write(
        d.join("local.yaml"),
        "apiVersion: rubick/v1\nkind: Cluster\nname: vm\nnodeGroups:\n  - { name: local, count: 1, gpuType: cpu, \
         gpusPerNode: 2, gpuMemoryGib: 11, cpuCores: 2, hostMemoryGib: 21, nvlinkGBps: 10.4, interNodeGBps: 1.25, \
         pcieGBps: 10.4 }\n",
    )
    .unwrap();
    let (table, job) = (
        repo().join("data/profiles/pytorch-cpu-2core.csv").display().to_string(),
        repo().join("examples/pytorch/job.yaml").display().to_string(),
    );
    let args = ["evaluate", "--table", &table, "--job", &job, "--cluster", "local.yaml", "--samples", "2"];
    let (code, out, err) = fit_tool(d, &args);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.lines().count() <= 25, "{} lines:\n{out}", out.lines().count());
    assert!(out.contains("held-out error: mean") && out.contains("--all"), "{out}");
    assert!(
        serde_yaml_ng::from_str::<serde_yaml_ng::Value>(&out).map_or(true, |v| v.get("overall").is_none()),
        "{out}"
    );
    let mut all = args.to_vec();
    all.push("--all");
    let (code, yaml, err) = fit_tool(d, &all);
    assert_eq!(code, Some(0), "{err}");
    let summary: serde_yaml_ng::Value = serde_yaml_ng::from_str(&yaml).unwrap();
    assert!(summary["overall"]["rows"].as_u64().is_some() && yaml.lines().count() > 25, "{yaml}");
    let mut file = args.to_vec();
    file.extend(["--summary", "s.yaml"]);
    let (code, out2, _) = fit_tool(d, &file);
    assert_eq!((code, out2.as_str()), (Some(0), out.as_str()), "the same screen, and the YAML in the file");
    assert_eq!(std::fs::read_to_string(d.join("s.yaml")).unwrap(), yaml);
    let mut both = all.clone();
    both.extend(["--model-out", "-"]);
    assert_eq!(fit_tool(d, &both).0, Some(2), "two outputs on stdout are refused");
    if let Some(reference) = rubick_tests::reference() {
        let reference = reference.display().to_string();
        let args = ["evaluate", "--reference", &reference, "--model", "all", "--cluster", &cluster(), "--samples", "8"];
        let (code, out, err) = fit_tool(d, &args);
        assert_eq!(code, Some(0), "{err}");
        assert!(out.lines().count() <= 25, "{} lines:\n{out}", out.lines().count());
    }
}
