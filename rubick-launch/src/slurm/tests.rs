//! The Slurm backend's tests: batch scripts and parsing here; jobs against a real Slurm
//! (`scripts/slurm-up.sh`) where one answers, else skipped (a failure under
//! CI=true or `RUBICK_REQUIRE_SLURM=1`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::batch::{SlurmResources, batch_script, sanitise_name, time_limit_minutes};
use super::executor::{Slurm, end_note, run};
use super::query::{JobInfo, NodeInfo, available, completion_log, parse_job_id, parse_sinfo};
use super::state::JobState;
use crate::contract::{Prepared, append};
use crate::end::{Exit, RunStatus, collect};
use crate::error::LaunchError;
use crate::executor::{Executor, Handle};
use crate::testing::{launch, request};

/// Whether a Slurm is here to test against; without one the test is skipped, or
/// fails where Slurm is required (CI).
fn slurm_here() -> bool {
    let found = available();
    if let Err(reason) = &found {
        rubick_testkit::missing(rubick_testkit::Need::Slurm, &format!("{reason} (run scripts/slurm-up.sh)"));
    }
    found.is_ok()
}

/// A directory whose path holds what `#SBATCH` lines and `--output` patterns
/// must escape: a space, `#` and `%`.
fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("rubick slurm #%j ").tempdir().unwrap()
}

fn one_cpu(gpus: u32) -> SlurmResources {
    SlurmResources { gpus_per_node: gpus, ..SlurmResources::default() }
}

fn log_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("log.txt")).unwrap_or_default()
}

#[test]
fn a_job_reports_its_metric_lines_and_sees_its_resources() {
    if !slurm_here() {
        return;
    }
    let t = Instant::now();
    let dir = tempdir();
    // Braces of the script itself are doubled: single ones are placeholders.
    let script = r#"test "$1" = 2 || exit 3
for i in 1 2 3 4; do echo "{{\"rubick\":1,\"iter\":$i,\"iter_time_s\":0.$i}}" >> "$RUBICK_METRICS"; done
echo "not a metric" >> "$RUBICK_METRICS"
echo "cpus=$SLURM_CPUS_PER_TASK gpus=$CUDA_VISIBLE_DEVICES plan=$RUBICK_PLAN job=$SLURM_JOB_NAME""#;
    let l = launch(script, 30.0);
    let out = run(&request(dir.path(), &l), &one_cpu(1)).unwrap();
    let log = log_of(dir.path());
    assert_eq!((out.status, out.exit_code), (RunStatus::Ok, Some(0)), "{log}");
    assert_eq!(out.metrics.len(), 4);
    assert_eq!(out.ignored_lines, 1);
    let times =
        rubick_core::launch::iteration_times(rubick_core::launch::measured_iterations(&out.metrics, 1, Some(3)));
    assert_eq!(times, [0.2, 0.3, 0.4]);
    let line = log.lines().find(|l| l.starts_with("cpus=")).unwrap_or_else(|| panic!("{log}"));
    let fields: BTreeMap<&str, &str> = line.split(' ').filter_map(|kv| kv.split_once('=')).collect();
    assert_eq!(fields["cpus"], "1", "{line}");
    // One of the four fake GPUs, chosen by Slurm.
    assert!(fields["gpus"].parse::<u32>().is_ok_and(|g| g < 4), "{line}");
    assert_eq!(fields["plan"], "dp2-tp1-pp1-mb2-ga2", "{line}");
    assert_eq!(fields["job"], "__touch_pwned_", "{line}");
    let ds: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("ds.json")).unwrap()).unwrap();
    assert_eq!(ds["train_batch_size"], 8);
    assert!(dir.path().join("log.txt.sbatch").is_file());
    eprintln!("a_job_reports_its_metric_lines: {:.1} s", t.elapsed().as_secs_f64());
}

#[test]
fn a_job_name_and_values_are_never_shell_parsed() {
    if !slurm_here() {
        return;
    }
    let t = Instant::now();
    let dir = tempdir();
    let mut l = launch(r#"echo "job $RUBICK_JOB quote $QUOTE arg $0"; pwd"#, 30.0);
    l.env.insert("QUOTE".into(), "it's $(touch pwned2) `touch pwned3`".into());
    l.workdir = Some(dir.path().display().to_string().replace('{', "{{").replace('}', "}}"));
    l.command[3] = "a'b $(touch pwned4)".into();
    let out = run(&request(dir.path(), &l), &one_cpu(0)).unwrap();
    let log = log_of(dir.path());
    assert_eq!(out.status, RunStatus::Ok, "{log}");
    assert!(
        log.contains("job $(touch pwned) quote it's $(touch pwned2) `touch pwned3` arg a'b $(touch pwned4)"),
        "{log}"
    );
    assert!(log.contains(&dir.path().display().to_string()), "the job ran in its workdir: {log}");
    for name in ["pwned", "pwned2", "pwned3", "pwned4"] {
        assert!(!dir.path().join(name).exists() && !Path::new(name).exists(), "{name} was created");
    }
    eprintln!("a_job_name_and_values_are_never_shell_parsed: {:.1} s", t.elapsed().as_secs_f64());
}

#[test]
fn a_hanging_job_is_cancelled_at_its_timeout_with_every_process() {
    if !slurm_here() {
        return;
    }
    let t = Instant::now();
    let dir = tempdir();
    // A worker in the background that would outlive its job.
    let pidfile = dir.path().join("worker.pid");
    let script = format!("sleep 60 & echo $! > '{}'; wait", pidfile.display());
    let l = launch(&script.replace('{', "{{").replace('}', "}}"), 2.0);
    let out = run(&request(dir.path(), &l), &one_cpu(0)).unwrap();
    assert_eq!(out.status, RunStatus::Timeout, "{}", log_of(dir.path()));
    assert!(out.wall >= Duration::from_secs(2) && out.wall < Duration::from_secs(10), "{:?}", out.wall);
    let pid = std::fs::read_to_string(&pidfile).unwrap().trim().to_owned();
    // Gone, or a zombie waiting for init to reap it: not running either way.
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let running = state.rsplit(')').next().and_then(|s| s.split_whitespace().next()).is_some_and(|s| s != "Z");
    assert!(!running, "worker {pid} survived its job: {state}");
    eprintln!("a_hanging_job_is_cancelled_at_its_timeout: {:.1} s", t.elapsed().as_secs_f64());
}

/// Slow (Slurm's `KillWait`, 30 s by default): `cargo test -- --ignored`.
#[test]
#[ignore]
fn a_job_that_ignores_sigterm_is_killed_all_the_same() {
    if !slurm_here() {
        return;
    }
    let t = Instant::now();
    let dir = tempdir();
    let pidfile = dir.path().join("worker.pid");
    // SIGTERM ignored, by the job and (inherited) by its worker.
    let script = format!("trap '' TERM; sleep 300 & echo $! > '{}'; exec sleep 301", pidfile.display());
    let l = launch(&script.replace('{', "{{").replace('}', "}}"), 1.0);
    let out = run(&request(dir.path(), &l), &one_cpu(0)).unwrap();
    assert_eq!(out.status, RunStatus::Timeout, "{}", log_of(dir.path()));
    let pid = std::fs::read_to_string(&pidfile).unwrap().trim().to_owned();
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let running = state.rsplit(')').next().and_then(|s| s.split_whitespace().next()).is_some_and(|s| s != "Z");
    assert!(!running, "worker {pid} survived its job: {state}");
    eprintln!("a_job_that_ignores_sigterm_is_killed_all_the_same: {:.1} s", t.elapsed().as_secs_f64());
}

#[test]
fn an_exit_status_is_the_jobs() {
    if !slurm_here() {
        return;
    }
    let t = Instant::now();
    let dir = tempdir();
    let l = launch(r#"echo "job id $SLURM_JOB_ID"; exit 7"#, 30.0);
    let out = run(&request(dir.path(), &l), &one_cpu(0)).unwrap();
    let log = log_of(dir.path());
    assert_eq!((out.status, out.exit_code), (RunStatus::Failed, Some(7)), "{log}");
    // What a run reads once the controller has forgotten the job (MinJobAge): the job
    // completion log, where the cluster keeps one (scripts/slurm-up.sh does).
    let id = log.lines().find_map(|l| l.strip_prefix("job id ")).unwrap_or_else(|| panic!("{log}"));
    match completion_log(id).unwrap() {
        Some(info) => assert_eq!((info.state, info.exit_code()), (JobState::Failed, Some(7))),
        None => eprintln!("no job completion log here: the fallback is not checked"),
    }
    eprintln!("an_exit_status_is_the_jobs: {:.1} s", t.elapsed().as_secs_f64());
}

#[test]
fn out_of_memory_is_an_infeasible_configuration() {
    if !slurm_here() {
        return;
    }
    let t = Instant::now();
    let dir = tempdir();
    let l = launch(r#"echo '{{"rubick":1,"event":"oom"}}' >> "$RUBICK_METRICS"; exit 1"#, 30.0);
    let out = run(&request(dir.path(), &l), &one_cpu(0)).unwrap();
    assert_eq!(out.status, RunStatus::Oom, "{}", log_of(dir.path()));
    eprintln!("out_of_memory_is_an_infeasible_configuration: {:.1} s", t.elapsed().as_secs_f64());
}

#[test]
fn more_than_one_node_without_their_names_is_refused_before_anything_is_written() {
    let dir = tempdir();
    let l = launch("true", 30.0);
    for r in [
        SlurmResources { nodes: 2, ..SlurmResources::default() },
        SlurmResources { nodes: 2, nodelist: vec!["mn1".into()], ..SlurmResources::default() },
        SlurmResources { nodes: 1, nodelist: vec!["mn1".into(), "mn2".into()], ..SlurmResources::default() },
        SlurmResources { nodes: 1, nodelist: vec!["$(x)".into()], ..SlurmResources::default() },
    ] {
        let e = run(&request(dir.path(), &l), &r).unwrap_err();
        assert!(matches!(e, LaunchError::Contract(_)) && e.to_string().contains("nodelist"), "{e}");
        assert!(!dir.path().join("log.txt.sbatch").exists());
    }
}

#[test]
fn a_run_on_two_nodes_starts_one_launcher_per_node_with_its_rank() {
    let p0 = prepared(&[("A", "same"), ("RUBICK_NODE_RANK", "0")], &["python", "t.py", "--rank=0"], None);
    let p1 = prepared(&[("A", "same"), ("RUBICK_NODE_RANK", "1")], &["python", "t.py", "--rank=1"], None);
    let r = SlurmResources {
        nodes: 2,
        nodelist: vec!["mn2".into(), "mn1".into()],
        gpus_per_node: 1,
        cpus_per_task: 2,
        ..SlurmResources::default()
    };
    let l = launch("true", 61.0);
    let s = batch_script("j", &[p0, p1], &r, &l, Path::new("/l"), Path::new("/")).unwrap();
    assert!(s.contains("#SBATCH --nodes=\"2\"\n#SBATCH --nodelist=\"mn2,mn1\"\n"), "{s}");
    assert!(s.contains("export A='same'\n") && !s.contains("export RUBICK_NODE_RANK"), "{s}");
    assert!(
        s.contains("srun --nodes=1 --ntasks=1 --nodelist='mn2' --cpus-per-task=2 --gres=gpu:1 env 'RUBICK_NODE_RANK=0' 'python' 't.py' '--rank=0' &"),
        "{s}"
    );
    assert!(
        s.contains(
            "--nodelist='mn1' --cpus-per-task=2 --gres=gpu:1 env 'RUBICK_NODE_RANK=1' 'python' 't.py' '--rank=1' &"
        ),
        "{s}"
    );
    assert!(s.contains("trap : USR1\n") && !s.contains("exec "), "{s}");
}

#[test]
fn the_batch_of_several_nodes_waits_for_all_and_exits_as_the_first_failing() {
    // The generated shell itself, `srun` stood in by a function running the rest.
    let dir = tempfile::tempdir().unwrap();
    let node = |rank: &str, code: &str| {
        prepared(
            &[("RUBICK_NODE_RANK", rank)],
            &["sh", "-c", &format!("sleep 0.{rank}; echo $RUBICK_NODE_RANK >> ranks; exit {code}")],
            None,
        )
    };
    let r = SlurmResources { nodes: 2, nodelist: vec!["a".into(), "b".into()], ..SlurmResources::default() };
    for (codes, expect) in [(("0", "0"), 0), (("0", "5"), 5), (("3", "5"), 3)] {
        let s = batch_script(
            "n",
            &[node("1", codes.0), node("2", codes.1)],
            &r,
            &launch("true", 1.0),
            Path::new("/l"),
            Path::new("/"),
        )
        .unwrap();
        let s = s.replacen("\n\n", "\nsrun() { while [ \"${1#--}\" != \"$1\" ]; do shift; done; \"$@\"; }\n", 1);
        let _ = std::fs::remove_file(dir.path().join("ranks"));
        let out = Command::new("sh").arg("-c").arg(&s).current_dir(dir.path()).output().unwrap();
        assert_eq!(out.status.code(), Some(expect), "{s}\n{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(std::fs::read_to_string(dir.path().join("ranks")).unwrap(), "1\n2\n");
    }
}

fn prepared(env: &[(&str, &str)], argv: &[&str], workdir: Option<&str>) -> Prepared {
    Prepared {
        argv: argv.iter().map(|s| (*s).to_owned()).collect(),
        env: env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        workdir: workdir.map(PathBuf::from),
    }
}

#[test]
fn the_batch_script_quotes_everything_and_asks_for_the_resources() {
    let p = prepared(&[("RUBICK_JOB", "$(touch pwned) it's")], &["python", "a b", "'"], Some("work dir"));
    let r = SlurmResources {
        nodes: 1,
        ntasks_per_node: 2,
        gpus_per_node: 0,
        cpus_per_task: 3,
        mem_mb: Some(4096),
        partition: Some("gpu#1".into()),
        ..SlurmResources::default()
    };
    let mut l = launch("true", 61.0);
    l.stop_timeout_s = 0.5;
    let s = batch_script(
        "$(touch pwned)",
        std::slice::from_ref(&p),
        &r,
        &l,
        Path::new("/r/log %j #1.txt"),
        Path::new("/cwd"),
    )
    .unwrap();
    let expected = r#"#!/bin/sh
# generated by rubick (rubick-launch, Slurm backend)
#SBATCH --job-name="__touch_pwned_"
#SBATCH --nodes="1"
#SBATCH --ntasks-per-node="2"
#SBATCH --cpus-per-task="3"
#SBATCH --mem="4096"
#SBATCH --partition="gpu\#1"
#SBATCH --time="2"
#SBATCH --output="/r/log %%j \#1.txt"
#SBATCH --chdir="/cwd/work dir"

export RUBICK_JOB='$(touch pwned) it'\''s'
exec 'python' 'a b' ''\'''
"#;
    assert_eq!(s, expected);
    let with_gpu =
        batch_script("j", std::slice::from_ref(&p), &one_cpu(2), &l, Path::new("/l"), Path::new("/")).unwrap();
    assert!(with_gpu.contains("#SBATCH --gres=\"gpu:2\"\n") && with_gpu.contains("--time=\"2\""), "{with_gpu}");
    assert!(
        !batch_script("j", std::slice::from_ref(&p), &one_cpu(0), &l, Path::new("/l"), Path::new("/"))
            .unwrap()
            .contains("gres")
    );
    let bad = prepared(&[("A B", "x")], &["true"], None);
    assert!(batch_script("j", &[bad], &one_cpu(0), &l, Path::new("/l"), Path::new("/")).is_err());
    assert!(batch_script("j", std::slice::from_ref(&p), &one_cpu(0), &l, Path::new("/l\nx"), Path::new("/")).is_err());
    assert_eq!((time_limit_minutes(0.1), time_limit_minutes(60.0), time_limit_minutes(60.5)), (1, 1, 2));
}

#[test]
fn the_quoted_script_runs_in_a_shell_as_written() {
    // The quoting itself, through a real sh: every byte comes back as it was.
    let dir = tempfile::tempdir().unwrap();
    let nasty = "it's $(touch pwned) `x` \"q\" \\ \n$HOME *";
    let p = prepared(&[("V", nasty)], &["sh", "-c", r#"printf '%s|%s' "$V" "$1""#, "x", nasty], None);
    let s = batch_script("n", &[p], &one_cpu(0), &launch("true", 1.0), Path::new("/l"), Path::new("/")).unwrap();
    let out = Command::new("sh").arg("-c").arg(&s).current_dir(dir.path()).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{nasty}|{nasty}"));
    assert!(!dir.path().join("pwned").exists());
}

#[test]
fn every_launcher_runs_under_the_wrapper_when_one_is_given() {
    let wrapper = Some(vec!["/opt/rubick run".to_owned(), crate::wrap::SUBCOMMAND.to_owned()]);
    let under = format!("'/opt/rubick run' '{}' '--grace' '10' '--' 'python' 'train.py'", crate::wrap::SUBCOMMAND);
    let p = prepared(&[("RUBICK_NODE_RANK", "0")], &["python", "train.py"], None);
    let one = SlurmResources { wrapper: wrapper.clone(), ..one_cpu(0) };
    let s = batch_script("n", std::slice::from_ref(&p), &one, &launch("true", 1.0), Path::new("/l"), Path::new("/"))
        .unwrap();
    assert!(s.contains(&format!("exec {under}")), "{s}");
    let mut q = p.clone();
    q.env.insert("RUBICK_NODE_RANK".into(), "1".into());
    let two = SlurmResources { nodes: 2, nodelist: vec!["a".into(), "b".into()], wrapper, ..one_cpu(0) };
    let s = batch_script("n", &[p, q], &two, &launch("true", 1.0), Path::new("/l"), Path::new("/")).unwrap();
    assert_eq!(s.matches(&under).count(), 2, "{s}");
}

#[test]
fn sinfo_describes_each_node_once_with_its_gpus_and_state() {
    let text = "mn1|debug*|2|23000|gpu:2|idle\nmn1|long|2|23000|gpu:2|idle\n\
                mn2|debug*|2|23000|gpu:a100:4(S:0-1),mps:100|drained\nmn3|debug*|64+|512000|(null)|down*\nbad line\n";
    let nodes = parse_sinfo(text);
    assert_eq!(nodes.len(), 3);
    assert_eq!(nodes[0].partitions, ["debug", "long"]);
    assert!(nodes[0].in_default && nodes[0].usable());
    assert_eq!((nodes[0].cpus, nodes[0].memory_mb, nodes[0].gpus, nodes[0].gpu_type.as_deref()), (2, 23000, 2, None));
    assert_eq!((nodes[1].gpus, nodes[1].gpu_type.as_deref(), nodes[1].usable()), (4, Some("a100"), false));
    assert_eq!((nodes[2].cpus, nodes[2].gpus, nodes[2].usable()), (64, 0, false));
    // `allocated*`: not responding; `idle~`: powered down, started on demand.
    for (state, usable) in
        [("mixed", true), ("allocated*", false), ("draining", false), ("idle~", true), ("maint", false)]
    {
        let n = NodeInfo { state: state.into(), ..nodes[0].clone() };
        assert_eq!(n.usable(), usable, "{state}");
    }
}

#[test]
fn job_states_and_exit_codes_are_read_from_scontrol() {
    let line = "JobId=12 JobName=a_JobState=FAKE UserId=root(0) JobState=CANCELLED Reason=None \
                Dependency=(null) ExitCode=0:15 RunTime=00:00:03 WorkDir=/x JobState=EVIL";
    let info = JobInfo::parse(line).unwrap().unwrap();
    assert_eq!((info.state, info.exit, info.exit_code()), (JobState::Cancelled, Some((0, 15)), None));
    let info = JobInfo::parse("JobId=3 JobState=FAILED Reason=NonZeroExitCode ExitCode=7:0").unwrap().unwrap();
    assert_eq!((info.exit_code(), info.reason.as_str()), (Some(7), "NonZeroExitCode"));
    assert!(!info.waits_after_requeue());
    // As seen after a node of the job failed (its slurmd and processes killed).
    let requeued = "JobId=355 JobName=job.sh JobState=PENDING Reason=ReqNodeNotAvail,_UnavailableNodes:mn2 \
                    Requeue=1 Restarts=1 ReqNodeList=mn[1-2] NodeList=(null)";
    let info = JobInfo::parse(requeued).unwrap().unwrap();
    assert!(info.waits_after_requeue(), "{info:?}");
    assert_eq!(info.reason, "ReqNodeNotAvail,_UnavailableNodes:mn2");
    let first = JobInfo::parse("JobId=356 JobState=PENDING Reason=Resources Restarts=0").unwrap().unwrap();
    assert!(!first.waits_after_requeue(), "pending for the first time: {first:?}");
    assert_eq!(parse_job_id("42\n"), Some("42".into()));
    assert_eq!(parse_job_id("42;rubick\n"), Some("42".into()));
    assert_eq!(parse_job_id("Submitted batch job 42"), None);
    assert_eq!(sanitise_name("$(touch pwned)"), "__touch_pwned_");
    assert_eq!(sanitise_name("gpt-2.small_v1"), "gpt-2.small_v1");
    assert_eq!(sanitise_name(""), "rubick");
}

#[test]
fn slurms_out_of_memory_state_makes_the_run_an_oom() {
    let dir = tempfile::tempdir().unwrap();
    let (metrics, log) = (dir.path().join("m"), dir.path().join("log"));
    std::fs::write(&log, "Killed\n").unwrap();
    append(&log, &end_note("9", JobState::OutOfMemory).unwrap());
    let out = collect(&metrics, &log, &Exit::default(), Duration::ZERO);
    assert_eq!(out.status, RunStatus::Oom);
    assert_eq!(end_note("9", JobState::Completed), None);
    assert_eq!(end_note("9", JobState::NodeFail).as_deref(), Some("rubick: Slurm job 9 ended NODE_FAIL"));
}

/// Every state Slurm documents reads back as itself, the terminal and waiting ones as
/// before; a state it does not document is an error naming it, never a running job.
#[test]
fn every_documented_job_state_is_known_and_an_unknown_one_is_an_error() {
    let names = [
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "CONFIGURING",
        "COMPLETING",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PENDING",
        "PREEMPTED",
        "RUNNING",
        "RESV_DEL_HOLD",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "REQUEUED",
        "RESIZING",
        "REVOKED",
        "SIGNALING",
        "SPECIAL_EXIT",
        "STAGE_OUT",
        "STOPPED",
        "SUSPENDED",
        "TIMEOUT",
    ];
    for name in names {
        let state: JobState = name.parse().unwrap();
        assert_eq!(state.to_string(), name);
    }
    let terminal: Vec<&str> = names.iter().copied().filter(|n| n.parse::<JobState>().unwrap().is_terminal()).collect();
    assert_eq!(
        terminal,
        [
            "BOOT_FAIL",
            "CANCELLED",
            "COMPLETED",
            "DEADLINE",
            "FAILED",
            "NODE_FAIL",
            "OUT_OF_MEMORY",
            "PREEMPTED",
            "TIMEOUT"
        ]
    );
    let waiting: Vec<&str> = names.iter().copied().filter(|n| n.parse::<JobState>().unwrap().waits()).collect();
    assert_eq!(waiting, ["PENDING", "REQUEUE_FED", "REQUEUE_HOLD", "REQUEUED", "SUSPENDED"]);
    let e = JobInfo::parse("JobId=7 JobState=LAUNCH_LIMBO Reason=None").unwrap_err();
    assert!(e.to_string().contains("`LAUNCH_LIMBO`"), "{e}");
    assert_eq!(JobInfo::parse("JobId=7 Reason=None").unwrap(), None);
}

#[test]
fn slurm_handles_read_back_what_they_wrote() {
    let slurm = Handle::Slurm { job: "17".into() };
    assert_eq!(Slurm::new().handle(&slurm.to_string()), Some(slurm));
    assert_eq!(Slurm::new().handle("17; rm -rf"), None);
}
