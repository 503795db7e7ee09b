//! The Kubernetes backend's tests: names, the manifests parsed back and validated
//! against the CRDs (read from `shared/reference/engines/kubeflow/`, skipped when
//! absent), directory mode end to end.

mod schema;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rubick_core::launch::{LaunchContext, StopSignal};
use rubick_core::schedule::NodeShare;
use rubick_core::{Job, Plan};
use serde_yaml_ng::Value;

use super::executor::{APPLY, MANIFESTS};
use super::manifests::{map, put, s, seq};
use super::names::label_value;
use super::*;
use crate::end::Exit;
use crate::executor::{Executor, Handle, RunState, Submission};
use crate::proc::RunSignal;
use schema::{is_quantity, metadata_errors, validate_resource};

// ---- Fixtures ----

fn job(name: &str, stop_signal: &str) -> Job {
    serde_yaml_ng::from_str(&format!(
        "apiVersion: rubick/v1
kind: Job
name: {name}
model: {{ name: tiny, parameters: 1000000, layers: 4, hidden: 128, heads: 4, seqLen: 64, globalBatch: 16 }}
iterations: 100
request: {{ gpus: 1, plan: ga }}
launch:
  version: 1
  command: [python, train.py, --deepspeed, '{{deepspeed_config}}', --master, '{{master_addr}}:{{master_port}}']
  env: {{ OMP_NUM_THREADS: '{{cpus_per_process}}' }}
  stopSignal: {stop_signal}
  stopTimeoutS: 90
"
    ))
    .unwrap()
}

/// A plan on `nodes` nodes of `gpus` GPUs each (8 cores and 64 GiB per GPU).
fn allocation(plan: &str, nodes: u32, gpus: u32) -> (Plan, Vec<NodeShare>) {
    let shares = (0..nodes)
        .map(|i| NodeShare {
            node: format!("node-{i}"),
            gpus: (0..gpus).collect(),
            cpus: 8 * gpus,
            host_memory_gib: 64.0 * f64::from(gpus),
        })
        .collect();
    (plan.parse::<Plan>().unwrap(), shares)
}

fn backend(kind: TrainingKind, pvc: Option<&str>, manifest_dir: Option<PathBuf>) -> Kubernetes {
    Kubernetes {
        mode: Mode::Directory,
        image: DEFAULT_IMAGE.to_owned(),
        checkpoint_pvc: pvc.map(str::to_owned),
        manifest_dir,
        kind,
        context: None,
        namespace: None,
        runs: None,
        watches: Default::default(),
    }
}

/// Starts a run in directory mode; `(handle, manifests.yaml's documents)`.
fn start(k: &Kubernetes, root: &Path, job: &Job, (plan, nodes): &(Plan, Vec<NodeShare>)) -> (String, Vec<Value>) {
    let dir = root.join("jobs").join(&job.name).join("attempt-3");
    let checkpoints = root.join("jobs").join(&job.name).join("checkpoints");
    std::fs::create_dir_all(&dir).unwrap();
    let path = |name: &str| dir.join(name).display().to_string();
    let run = Submission {
        request: crate::contract::RunRequest {
            launch: job.launch.as_ref().unwrap(),
            context: LaunchContext {
                job: job.name.clone(),
                plan: *plan,
                nodes: nodes.len() as u32,
                node_rank: 0,
                gpus_per_node: nodes.iter().map(|n| n.gpus.len() as u32).max().unwrap_or(0),
                cpus: nodes.iter().map(|n| n.cpus).sum(),
                master_addr: "127.0.0.1".into(),
                master_port: 29500,
                deepspeed_config: path("deepspeed.json"),
                checkpoint_dir: checkpoints.display().to_string(),
                metrics: path("metrics.jsonl"),
                visible_devices: Vec::new(),
            },
            log: dir.join("log.txt"),
            clear_env: false,
            stop_after_iterations: None,
            wrapper: None,
        },
        dir: dir.clone(),
        nodes: nodes.clone(),
        cores: Vec::new(),
        name: None,
        detached: true,
        partition: None,
    };
    let handle = k.submit(&run).unwrap();
    let docs = parse_documents(&std::fs::read_to_string(dir.join(MANIFESTS)).unwrap()).unwrap();
    (handle.to_string(), docs)
}

fn crd(file: &str) -> Option<Value> {
    // The manifest directory as `cargo test` runs this binary (not as it was built: a
    // target directory shared by clones at other paths may hold another's build).
    let crate_dir = std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    let path = Path::new(&crate_dir).join("../../shared/reference/engines/kubeflow").join(file);
    let Ok(text) = std::fs::read_to_string(&path) else {
        rubick_testkit::missing(rubick_testkit::Need::Crds, &format!("{} is absent", path.display()));
        return None;
    };
    Some(serde_yaml_ng::from_str(&text).unwrap())
}

fn config_map_errors(cm: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    if cm["apiVersion"].as_str() != Some("v1") || cm["kind"].as_str() != Some("ConfigMap") {
        errors.push("not a v1 ConfigMap".to_owned());
    }
    errors.extend(metadata_errors(cm));
    let data = cm["data"].as_mapping().cloned().unwrap_or_default();
    let mut size = 0;
    for (k, v) in &data {
        let key = k.as_str().unwrap_or_default();
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')) {
            errors.push(format!("data key `{key}` is invalid"));
        }
        match v.as_str() {
            Some(text) => size += key.len() + text.len(),
            None => errors.push(format!("data.{key}: not a string")),
        }
    }
    if size >= 1 << 20 {
        errors.push(format!("data: {size} bytes, not under 1 MiB"));
    }
    errors
}

fn at<'a>(value: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(value, |v, k| match k.parse::<usize>() {
        Ok(i) => &v[i],
        Err(_) => &v[*k],
    })
}

// ---- Tests ----

#[test]
fn names_are_dns_labels() {
    assert_eq!(resource_name("bert", "3"), "rubick-bert-3");
    for job in ["Bert_Large", "a..b", "--", "x".repeat(200).as_str(), "ünï", ""] {
        let name = resource_name(job, "12");
        assert!(is_dns_label(&name) && name.len() <= MAX_NAME, "{job:?} -> {name}");
        assert!(name.ends_with("-12"), "{name}");
    }
    assert_ne!(resource_name("A_b", "1"), resource_name("a-b", "1"));
    assert_eq!(label_value("-a b-"), "a-b");
    assert!(is_quantity("64Gi") && is_quantity("1.5") && is_quantity("100m") && is_quantity("1e3"));
    assert!(!is_quantity("64 Gi") && !is_quantity("Gi") && !is_quantity("1.2.3") && !is_quantity("1e"));
}

/// A runs volume: the run's directory is on it (mounted at its root, where this
/// machine sees the same files), the checkpoints too (no volume of their own unless a
/// claim is named); still valid against both CRDs; a run elsewhere keeps its
/// `emptyDir`. Settings: both fields or neither, an absolute root.
#[test]
fn a_runs_volume_holds_the_runs_directories_where_this_machine_reads_them() {
    let root = tempfile::tempdir().unwrap();
    let runs = RunsVolume { claim: "rubick-runs".into(), root: root.path().to_path_buf() };
    let mut k = backend(TrainingKind::PyTorchJob, None, None);
    k.runs = Some(runs.clone());
    let job = job("bert", "SIGTERM");
    let (_, docs) = start(&k, root.path(), &job, &allocation("dp4-tp1-pp1-mb4-ga1", 2, 2));
    let dir = root.path().join("jobs/bert/attempt-3");
    assert!(k.shares(&dir) && !k.shares(Path::new("/elsewhere")));
    for (doc, pod) in [
        (&docs[1], &["spec", "pytorchReplicaSpecs", "Worker", "template", "spec"][..]),
        (&docs[2], &["spec", "podSpecOverrides", "0"][..]),
    ] {
        let pod = at(doc, pod);
        let volumes = pod["volumes"].as_sequence().unwrap();
        let names: Vec<&str> = volumes.iter().map(|v| v["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["run", "plan"], "the checkpoints are on the runs volume: {pod:?}");
        assert_eq!(volumes[0]["persistentVolumeClaim"]["claimName"].as_str(), Some("rubick-runs"));
    }
    let c = at(&docs[1], &["spec", "pytorchReplicaSpecs", "Master", "template", "spec", "containers", "0"]);
    let mounts: Vec<(&str, &str)> = c["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|m| (m["name"].as_str().unwrap(), m["mountPath"].as_str().unwrap()))
        .collect();
    let ds = dir.join("deepspeed.json").display().to_string();
    assert_eq!(mounts, [("run", root.path().to_str().unwrap()), ("plan", ds.as_str())]);
    if let (Some(pytorch_crd), Some(trainjob_crd)) =
        (crd("kubeflow.org_pytorchjobs.yaml"), crd("trainer.kubeflow.org_trainjobs.yaml"))
    {
        assert_eq!(validate_resource(&docs[1], &pytorch_crd), Vec::<String>::new());
        assert_eq!(validate_resource(&docs[2], &trainjob_crd), Vec::<String>::new());
    }
    // With a checkpoint claim, the checkpoints keep it.
    k.checkpoint_pvc = Some("ckpt".into());
    let (_, docs) = start(&k, root.path(), &job, &allocation("dp2-tp1-pp1-mb4-ga2", 1, 2));
    let pod = at(&docs[1], &["spec", "pytorchReplicaSpecs", "Master", "template", "spec"]);
    let names: Vec<&str> = pod["volumes"].as_sequence().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["checkpoints", "run", "plan"]);
    // A run outside the volume: its directory is an emptyDir, as without one.
    let elsewhere = tempfile::tempdir().unwrap();
    k.runs = Some(RunsVolume { claim: "rubick-runs".into(), root: elsewhere.path().to_path_buf() });
    let (_, docs) = start(&k, root.path(), &job, &allocation("dp2-tp1-pp1-mb4-ga2", 1, 2));
    let pod = at(&docs[1], &["spec", "pytorchReplicaSpecs", "Master", "template", "spec"]);
    assert!(pod["volumes"][1]["emptyDir"].is_mapping(), "{pod:?}");
    // Settings: the two fields together, the root absolute.
    let file = root.path().join("k8s.yaml");
    for (text, says) in [
        ("runsPvc: x\n", "go together"),
        ("runsRoot: /r\n", "go together"),
        ("runsPvc: x\nrunsRoot: rel/dir\n", "absolute"),
    ] {
        std::fs::write(&file, text).unwrap();
        let e = format!("{:#}", Settings::load(&file).unwrap_err());
        assert!(e.contains(says) && e.contains("k8s.yaml"), "{text}: {e}");
    }
    std::fs::write(&file, "runsPvc: x\nrunsRoot: /r\n").unwrap();
    let k = backend(TrainingKind::PyTorchJob, None, None).with(Settings::load(&file).unwrap());
    assert_eq!(k.runs, Some(RunsVolume { claim: "x".into(), root: "/r".into() }));
}

#[test]
fn manifests_are_valid_against_the_crds() {
    let (Some(pytorch_crd), Some(trainjob_crd)) =
        (crd("kubeflow.org_pytorchjobs.yaml"), crd("trainer.kubeflow.org_trainjobs.yaml"))
    else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let job = job("Bert_Large", "SIGTERM");
    let cases = [
        (backend(TrainingKind::PyTorchJob, None, None), allocation("dp2-tp1-pp1-mb4-ga2", 1, 2), 1u32, 2u32),
        (backend(TrainingKind::TrainJob, Some("ckpt"), None), allocation("dp8-tp1-pp1-mb4-ga2", 2, 4), 2, 4),
    ];
    for (k, a, nodes, gpus) in &cases {
        let (handle, docs) = start(k, root.path(), &job, a);
        assert_eq!(docs.len(), 3);
        let [cm, pj, tj] = [&docs[0], &docs[1], &docs[2]];
        let name = cm["metadata"]["name"].as_str().unwrap();
        assert!(handle.starts_with(&format!("{name}@")), "{handle}");
        assert!(name.starts_with("rubick-bert-large-") && name.ends_with("-3"), "{name}");
        assert_eq!(config_map_errors(cm), Vec::<String>::new());
        assert_eq!(validate_resource(pj, &pytorch_crd), Vec::<String>::new());
        assert_eq!(validate_resource(tj, &trainjob_crd), Vec::<String>::new());

        // The ConfigMap holds the plan.
        assert_eq!(cm["data"]["RUBICK_NODES"].as_str(), Some(nodes.to_string().as_str()));
        assert_eq!(cm["data"]["RUBICK_STOP_SIGNAL"].as_str(), Some("SIGTERM"));
        assert!(cm["data"]["deepspeed.json"].as_str().unwrap().contains("train_batch_size"));
        assert!(cm["data"].get("CUDA_VISIBLE_DEVICES").is_none());

        // The PyTorchJob.
        let specs = &pj["spec"]["pytorchReplicaSpecs"];
        assert_eq!(specs["Master"]["replicas"].as_u64(), Some(1));
        assert_eq!(specs.get("Worker").map(|w| w["replicas"].as_u64()), (*nodes > 1).then_some(Some(1)));
        assert_eq!(specs["Master"]["restartPolicy"].as_str(), Some("OnFailure"));
        assert_eq!(pj["spec"]["nprocPerNode"].as_str(), Some(gpus.to_string().as_str()));
        let c = at(specs, &["Master", "template", "spec", "containers", "0"]);
        assert_eq!(c["name"].as_str(), Some("pytorch"));
        assert_eq!(c["image"].as_str(), Some(DEFAULT_IMAGE));
        assert_eq!(c["command"][0].as_str(), Some("python"));
        assert_eq!(c["args"][4].as_str(), Some("$(MASTER_ADDR):23456"));
        assert_eq!(c["envFrom"][0]["configMapRef"]["name"].as_str(), Some(name));
        for side in ["limits", "requests"] {
            let r = &c["resources"][side];
            assert_eq!(r["nvidia.com/gpu"].as_str(), Some(gpus.to_string().as_str()));
            assert_eq!(r["cpu"].as_str(), Some((8 * gpus).to_string().as_str()));
            assert_eq!(r["memory"].as_str(), Some(format!("{}Gi", 64 * gpus).as_str()));
        }
        let pod = at(specs, &["Master", "template", "spec"]);
        assert_eq!(pod["terminationGracePeriodSeconds"].as_u64(), Some(90));
        let checkpoints = &pod["volumes"][0];
        match &k.checkpoint_pvc {
            Some(claim) => {
                assert_eq!(checkpoints["persistentVolumeClaim"]["claimName"].as_str(), Some(claim.as_str()))
            }
            None => assert!(checkpoints["emptyDir"].is_mapping()),
        }
        assert_eq!(
            c["volumeMounts"][0]["mountPath"].as_str(),
            cm["data"]["RUBICK_CHECKPOINT_DIR"].as_str(),
            "the checkpoint volume is mounted at the contract's checkpoint directory"
        );
        assert_eq!(
            c["volumeMounts"][2]["mountPath"].as_str(),
            cm["data"]["RUBICK_DEEPSPEED_CONFIG"].as_str(),
            "deepspeed.json is where the contract says"
        );

        // The TrainJob.
        let t = &tj["spec"]["trainer"];
        assert_eq!(tj["spec"]["runtimeRef"]["name"].as_str(), Some("torch-distributed"));
        assert_eq!(t["numNodes"].as_u64(), Some(u64::from(*nodes)));
        assert_eq!(t["numProcPerNode"].as_u64(), Some(u64::from(*gpus)));
        assert_eq!(t["args"][4].as_str(), Some("$(PET_MASTER_ADDR):29400"));
        let env: BTreeMap<&str, &str> = t["env"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|e| (e["name"].as_str().unwrap(), e["value"].as_str().unwrap()))
            .collect();
        assert_eq!(env["RUBICK_PLAN"], cm["data"]["RUBICK_PLAN"].as_str().unwrap());
        // Threads per worker: its node's cores over its workers (8 per GPU), in the
        // ConfigMap (PyTorchJob) and the TrainJob alike; `{cpus}` gave each all of the run's.
        assert_eq!(env["OMP_NUM_THREADS"], "8");
        assert_eq!(env["RUBICK_CPUS_PER_PROCESS"], "8");
        assert_eq!(env["RUBICK_CPUS"], (8 * nodes * gpus).to_string());
        assert_eq!(cm["data"]["OMP_NUM_THREADS"].as_str(), Some("8"));
        assert_eq!(cm["data"]["RUBICK_CPUS_PER_PROCESS"].as_str(), Some("8"));
        assert_eq!(t["resourcesPerNode"], c["resources"]);

        // Exactly one of the two is active.
        let pj_suspended = pj["spec"]["runPolicy"]["suspend"].as_bool() == Some(true);
        let tj_suspended = tj["spec"]["suspend"].as_bool() == Some(true);
        assert_eq!(pj_suspended, k.kind != TrainingKind::PyTorchJob);
        assert_eq!(tj_suspended, k.kind != TrainingKind::TrainJob);
    }
}

#[test]
fn broken_manifests_fail_the_validator() {
    let (Some(pytorch_crd), Some(trainjob_crd)) =
        (crd("kubeflow.org_pytorchjobs.yaml"), crd("trainer.kubeflow.org_trainjobs.yaml"))
    else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let k = backend(TrainingKind::PyTorchJob, None, None);
    let (_, docs) = start(&k, root.path(), &job("bert", "SIGTERM"), &allocation("dp8-tp1-pp1-mb4-ga2", 2, 4));
    let (pj, tj) = (&docs[1], &docs[2]);
    type Break = fn(&mut Value);
    let pytorch_breaks: [(&str, Break); 7] = [
        ("an unknown field in the container", |v| {
            put(
                &mut v["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0],
                "gpus",
                Value::from(4),
            )
        }),
        ("an unknown field in the spec", |v| put(&mut v["spec"], "replicas", Value::from(2))),
        ("replicas a string", |v| v["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = s("one")),
        ("nprocPerNode an integer", |v| v["spec"]["nprocPerNode"] = Value::from(4)),
        ("a bad quantity", |v| {
            v["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] =
                s("64 GiB")
        }),
        ("no pytorchReplicaSpecs", |v| {
            v["spec"].as_mapping_mut().unwrap().remove("pytorchReplicaSpecs");
        }),
        ("a container without a name", |v| {
            v["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
                .as_mapping_mut()
                .unwrap()
                .remove("name");
        }),
    ];
    for (what, break_it) in pytorch_breaks {
        let mut broken = pj.clone();
        break_it(&mut broken);
        let errors = validate_resource(&broken, &pytorch_crd);
        assert!(!errors.is_empty(), "{what}: the validator let it pass");
    }
    let trainjob_breaks: [(&str, Break); 5] = [
        ("envFrom in the trainer (not in the CRD)", |v| {
            put(&mut v["spec"]["trainer"], "envFrom", seq([map([("configMapRef", map([("name", s("x"))]))])]))
        }),
        ("numNodes a string", |v| v["spec"]["trainer"]["numNodes"] = s("2")),
        ("no runtimeRef", |v| {
            v["spec"].as_mapping_mut().unwrap().remove("runtimeRef");
        }),
        ("a duplicate env name", |v| {
            let env = v["spec"]["trainer"]["env"].as_sequence_mut().unwrap();
            let first = env[0].clone();
            env.push(first);
        }),
        ("numProcPerNode a list", |v| v["spec"]["trainer"]["numProcPerNode"] = seq([])),
    ];
    for (what, break_it) in trainjob_breaks {
        let mut broken = tj.clone();
        break_it(&mut broken);
        let errors = validate_resource(&broken, &trainjob_crd);
        assert!(!errors.is_empty(), "{what}: the validator let it pass");
    }
    // A wrong kind or group fails too, and so does a bad name.
    let mut wrong = pj.clone();
    wrong["apiVersion"] = s("kubeflow.org/v2");
    assert!(!validate_resource(&wrong, &pytorch_crd).is_empty());
    let mut wrong = pj.clone();
    wrong["metadata"]["name"] = s("Rubick_Bert");
    assert!(!validate_resource(&wrong, &pytorch_crd).is_empty());
    let mut cm = docs[0].clone();
    cm["data"]["RUBICK_NODES"] = Value::from(2);
    assert!(!config_map_errors(&cm).is_empty());
}

#[test]
fn directory_mode_end_to_end() {
    let root = tempfile::tempdir().unwrap();
    let gitops = root.path().join("gitops");
    let k = backend(TrainingKind::PyTorchJob, None, Some(gitops.clone()));
    let job = job("bert", "SIGUSR1"); // warns: the pods get SIGTERM
    let (handle, docs) = start(&k, root.path(), &job, &allocation("dp2-tp1-pp1-mb4-ga2", 1, 2));
    let dir = root.path().join("jobs/bert/attempt-3");
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["ConfigMap", "PyTorchJob", "TrainJob"]);
    assert_eq!(handle, format!("rubick-bert-3@{}", dir.display()));
    let copy = gitops.join("rubick-bert-3.yaml");
    assert_eq!(std::fs::read_to_string(&copy).unwrap(), std::fs::read_to_string(dir.join(MANIFESTS)).unwrap());
    assert!(!dir.join(APPLY).exists(), "directory mode applies nothing");
    let handle = k.handle(&handle).unwrap();
    assert_eq!(k.poll(&handle, &dir, &[]), RunState::Running);
    assert_eq!(k.recover(&dir, None), Some(handle.clone()));

    k.signal(&handle, RunSignal::Stop(Default::default()));
    assert_eq!(k.poll(&handle, &dir, &[]), RunState::Ended(Exit::default()), "ended, its code unknown");
    assert!(!copy.exists(), "the GitOps copy is removed");
    assert!(dir.join(MANIFESTS).exists(), "the record stays");
    assert_eq!(k.recover(&dir, None), Some(handle.clone()), "found again, ended");
    // Stopping a run through the trait's helper ends at once.
    let (_, clean) =
        crate::executor::stop(&k, &handle, &dir, StopSignal::Term, std::time::Duration::from_secs(1), || {});
    assert!(clean);

    // Nothing there: ended, nothing to recover, a malformed handle is refused.
    let gone = k.handle("rubick-x-1@/nonexistent/dir").unwrap();
    assert!(!k.poll(&gone, &dir, &[]).alive());
    assert_eq!(k.handle("garbage"), None);
    k.signal(&Handle::Slurm { job: "1".into() }, RunSignal::Term);
    assert_eq!(k.recover(&root.path().join("nowhere"), None), None);
}
