//! Every artifact kind round-trips through YAML (property tests), and the committed
//! JSON Schemas match the types.

use std::collections::BTreeMap;

use proptest::prelude::*;
use rubick_core::artifact::{Artifact, parse_yaml, to_yaml};
use rubick_core::cluster::NodeGroup;
use rubick_core::job::{CurrentAllocation, JobRequest, Resharding};
use rubick_core::model::{MeasuredLimits, StateBytes, TpPp};
use rubick_core::schedule::{
    Assignment, Change, ExactStatus, GuaranteeStatus, NodeShare, Schedule, SolverStats, SolverStatus, Totals,
};
use rubick_core::*;
use rubick_model::perf::{FitDiagnostics, FitSource, FittedParameter, PerfModel, RowFit};

fn pow2(max_exp: u32) -> impl Strategy<Value = u32> {
    (0..=max_exp).prop_map(|e| 1u32 << e)
}

/// Positive finite floats.
fn num() -> impl Strategy<Value = f64> {
    (0u32..1_000_000, 0u32..4).prop_map(|(m, e)| f64::from(m) / 10f64.powi(e as i32) + 0.5)
}

fn name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9-]{0,10}"
}

fn node_group() -> impl Strategy<Value = NodeGroup> {
    ((name(), 1u32..64, pow2(4), num(), 1u32..256), (num(), num(), num(), num(), "[A-Z][A-Za-z0-9-]{1,12}")).prop_map(
        |((name, count, gpus_per_node, mem, cpu_cores), (host, nvlink, inter, pcie, gpu_type))| NodeGroup {
            name,
            count,
            gpu_type,
            gpus_per_node,
            gpu_memory_gib: mem,
            cpu_cores,
            host_memory_gib: host,
            nvlink_gbps: nvlink,
            inter_node_gbps: inter,
            pcie_gbps: pcie,
            compute_speed: 1.0,
            hosts: Vec::new(),
        },
    )
}

fn cluster() -> impl Strategy<Value = Cluster> {
    (name(), prop::collection::vec(node_group(), 1..4)).prop_map(|(name, mut groups)| {
        for (i, g) in groups.iter_mut().enumerate() {
            g.name = format!("{}-{i}", g.name);
        }
        let mut c = Cluster::example();
        c.name = name;
        c.node_groups = groups;
        c
    })
}

fn model_spec() -> impl Strategy<Value = ModelSpec> {
    (
        (name(), prop::option::of(1u64..100_000_000_000), pow2(6), pow2(13), pow2(6), pow2(12)),
        (
            pow2(9),
            any::<bool>(),
            prop::option::of(num()),
            prop::option::of((num(), 0u32..64)),
            prop::option::of(1u32..200_000),
        ),
    )
        .prop_map(|((name, parameters, layers, hidden, heads, seq_len), (batch, flash, fwd, limits, vocab))| {
            ModelSpec {
                api_version: None,
                kind: None,
                name,
                parameters,
                layers,
                hidden: hidden.max(heads),
                heads,
                seq_len,
                vocab,
                global_batch: u64::from(batch),
                state_bytes: StateBytes { param: 2.0, grad: 4.0, optimizer: 12.0 },
                activation_factor: 34.0,
                flash_attention: flash,
                forward_1gpu_ms: fwd,
                measured_limits: limits.map(|(gib, mb)| MeasuredLimits {
                    gpu_memory_gib: gib,
                    max_micro_batch: BTreeMap::from([(PlanFamily::ZeroDp, mb), (PlanFamily::TpPp, mb / 2)]),
                    tp_pp_degrees: if mb % 2 == 0 { vec![TpPp { tp: 2, pp: 4 }] } else { Vec::new() },
                }),
            }
        })
}

fn job() -> impl Strategy<Value = Job> {
    (
        model_spec(),
        name(),
        1u64..1_000_000,
        0u32..10,
        0u8..4,
        any::<bool>(),
        prop::option::of(0.0..rubick_core::launch::MAX_SECONDS),
        any::<bool>(),
    )
        .prop_map(|(model, name, iterations, gpu_exp, plan_kind, guaranteed, restart, running)| {
            let gpus = 1u32 << gpu_exp.min(model.global_batch.trailing_zeros());
            let per_replica = (model.global_batch / u64::from(gpus)) as u32;
            let exact = Plan::data_parallel(gpus, per_replica);
            let plan = match plan_kind {
                0 => None,
                1 => Some(PlanRequest::Code(PlanCode::Ga)),
                2 => Some(PlanRequest::Code(PlanCode::ZeroOffload)),
                _ => Some(PlanRequest::Exact(exact)),
            };
            Job {
                api_version: None,
                kind: None,
                name,
                model,
                perf_model: None,
                submit_time_s: f64::from(gpu_exp) * 10.0,
                iterations,
                request: JobRequest { gpus, cpus: Some(gpus * 8), host_memory_gib: None, plan, gpu_type: None },
                guaranteed,
                resharding: if guaranteed { Resharding::Full } else { Resharding::DataParallel },
                restart_cost_s: restart,
                current: running.then(|| CurrentAllocation {
                    plan: exact,
                    placement: Placement::packed(gpus, 8).unwrap(),
                    nodes: Vec::new(),
                    cpus: Some(gpus * 4),
                    rounds_since_change: 3,
                    restarts: 0,
                    restoring: false,
                }),
                launch: (plan_kind == 1).then(|| rubick_core::launch::Launch {
                    version: 1,
                    command: vec!["torchrun".into(), "--nproc-per-node={gpus_per_node}".into(), "train.py".into()],
                    env: [("OMP_NUM_THREADS".to_owned(), "{cpus}".to_owned())].into_iter().collect(),
                    workdir: None,
                    checkpoint_dir: Some("/ckpt".into()),
                    stop_signal: rubick_core::launch::StopSignal::Usr1,
                    stop_timeout_s: 60.0,
                    warmup_iterations: 2,
                    measured_iterations: 5,
                    timeout_s: 600.0,
                    supports: Some(rubick_core::launch::PlanSupport {
                        max_tp: Some(8),
                        zero: Some(vec![0, 1, 2, 3]),
                        offload: Some(vec!["none".into(), "optimizer".into()]),
                        ..Default::default()
                    }),
                }),
                unsupported_plans: if plan_kind == 1 { vec![exact] } else { Vec::new() },
                slow_plans: Vec::new(),
                requires: (plan_kind == 1).then(|| rubick_core::job::Requirements {
                    gpu: Some(rubick_core::job::GpuNeed::Nvidia),
                    files: vec!["assets/tokenizer".into()],
                    setup: Some("python assets.py assets".into()),
                }),
            }
        })
}

fn job_batch() -> impl Strategy<Value = JobBatch> {
    prop::collection::vec(job(), 0..5).prop_map(|mut jobs| {
        for (i, j) in jobs.iter_mut().enumerate() {
            j.name = format!("{}-{i}", j.name);
        }
        JobBatch { api_version: None, kind: None, jobs, now_s: None }
    })
}

fn perf_model() -> impl Strategy<Value = PerfModel> {
    (
        name(),
        prop::collection::btree_map(
            prop::sample::select(rubick_model::perfmodel::PARAMS.iter().map(|p| p.name.to_owned()).collect::<Vec<_>>()),
            (num(), prop::option::of(num())),
            0..6,
        ),
        1u32..64,
        any::<bool>(),
    )
        .prop_map(|(model, params, rows, diag)| PerfModel {
            api_version: None,
            kind: None,
            model,
            model_spec: None,
            form: rubick_model::perfmodel::FORM.into(),
            parameters: params
                .into_iter()
                .map(|(k, (v, se))| {
                    (k, FittedParameter { value: v, std_error: se, lower: Some(0.0), upper: Some(v + 1.0) })
                })
                .collect(),
            fitted_from: FitSource { source: "profile.parquet".into(), rows },
            diagnostics: diag.then(|| FitDiagnostics {
                mean_rel_error: 0.125,
                log_covariance: (0..rubick_model::perfmodel::PARAMS.len())
                    .map(|i| {
                        (0..rubick_model::perfmodel::PARAMS.len()).map(|j| if i == j { 0.01 } else { 0.0 }).collect()
                    })
                    .collect(),
                cv_mean_rel_error: Some(0.25),
                rows: vec![RowFit {
                    plan: "dp8-mb1-z2".parse().unwrap(),
                    placement: "8".parse().unwrap(),
                    measured_s: 1.5,
                    predicted_s: 1.25,
                }],
                inconsistent_rows: Vec::new(),
            }),
        })
}

fn schedule() -> impl Strategy<Value = Schedule> {
    (prop::collection::vec((name(), pow2(3), num(), any::<bool>()), 0..5), num()).prop_map(|(jobs, objective)| {
        let assignments = jobs
            .into_iter()
            .enumerate()
            .map(|(i, (name, gpus, tput, guaranteed))| Assignment {
                job: format!("{name}-{i}"),
                plan: Some(Plan::data_parallel(gpus, 2)),
                nodes: vec![NodeShare {
                    node: format!("a800-{i}"),
                    gpus: (0..gpus).collect(),
                    cpus: gpus * 8,
                    host_memory_gib: 64.0,
                }],
                predicted_throughput: tput,
                guarantee: guaranteed.then(|| GuaranteeStatus { required_throughput: tput / 2.0, holds: true }),
                change: Change::Started,
                rounds_since_change: 0,
                reason: "new job".into(),
            })
            .collect();
        Schedule {
            api_version: None,
            kind: None,
            cluster: "a800-8x8".into(),
            round: 7,
            policy: "rubick".into(),
            assignments,
            totals: Totals {
                gpus_used: 8,
                gpus_total: 64,
                cpus_used: 64,
                host_memory_gib_used: 128.0,
                normalized_throughput: 1.5,
            },
            objective,
            solver: SolverStats {
                method: "heuristic".into(),
                gap: None,
                wall_s: Some(0.001),
                status: SolverStatus::Exact(ExactStatus::Optimal),
            },
        }
    })
}

fn round_trips<T: Artifact + Clone + PartialEq + std::fmt::Debug>(value: T) -> Result<(), TestCaseError> {
    let mut stamped = value.clone();
    stamped.stamp();
    let text = to_yaml(&value);
    prop_assert!(text.starts_with("apiVersion: rubick/v1\nkind: "), "{}", text);
    let back: T = parse_yaml(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
    prop_assert_eq!(back, stamped);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn cluster_round_trips(value in cluster()) { round_trips(value)?; }

    #[test]
    fn model_spec_round_trips(value in model_spec()) { round_trips(value)?; }

    #[test]
    fn job_round_trips(value in job()) { round_trips(value)?; }

    #[test]
    fn job_batch_round_trips(value in job_batch()) { round_trips(value)?; }

    #[test]
    fn perf_model_round_trips(value in perf_model()) { round_trips(value)?; }

    #[test]
    fn schedule_round_trips(value in schedule()) { round_trips(value)?; }

    #[test]
    fn plans_round_trip_through_text(dp in 1u32..64, tp in pow2(3), pp in 1u32..8, mb in 1u32..32, ga in 1u32..16, z in 0u8..4, r in 0usize..3, off in 0usize..3, sp in any::<bool>(), vp in 1u32..4) {
        let zero = ZeroStage::from_level(z).unwrap();
        let plan = Plan { dp, tp, pp, zero, offload: Offload::ALL[off], ga, recompute: Recompute::ALL[r], micro_batch: mb, sp, vp };
        if plan.check_shape().is_ok() {
            prop_assert_eq!(plan.to_string().parse::<Plan>().unwrap(), plan);
        }
    }

    #[test]
    fn placements_are_equal_up_to_node_order(mut nodes in prop::collection::vec(1u32..17, 1..10), seed in any::<u64>()) {
        let a = Placement::new(nodes.clone()).unwrap();
        let n = nodes.len();
        nodes.rotate_left((seed as usize) % n);
        let b = Placement::new(nodes).unwrap();
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(a.to_string().parse::<Placement>().unwrap(), b);
    }
}

/// The committed JSON Schemas in `schemas/` are what the types generate. To update them
/// after changing a type: `make schemas`.
#[test]
fn committed_schemas_match_the_types() {
    let dir = rubick_tests::repo().join("schemas");
    let update = std::env::var_os("RUBICK_UPDATE_SCHEMAS").is_some();
    let mut drifted = Vec::new();
    for (name, text) in rubick_model::schema::all_schemas() {
        let path = dir.join(&name);
        if update {
            std::fs::write(&path, &text).unwrap();
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
            drifted.push(name);
        }
    }
    assert!(
        drifted.is_empty(),
        "schemas drifted from the types: {drifted:?}; run `make schemas` and commit the result"
    );
}

/// Every example's Job (examples/*/job.yaml) reads and validates (its requested plan
/// inside its own `launch.supports` included): also the ones no test runs here
/// (torchtitan needs a GPU).
#[test]
fn every_example_job_reads_and_allows_its_own_plan() {
    let dir = rubick_tests::repo().join("examples");
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path().join("job.yaml");
        if !path.exists() {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let job: Job = parse_yaml(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        job.validate().unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        seen.push(path.parent().unwrap().file_name().unwrap().to_string_lossy().into_owned());
    }
    seen.sort();
    assert!(seen.contains(&"torchtitan".to_string()) && seen.len() >= 6, "{seen:?}");
}
