//! Reads the Rubick authors' reference data as it is on disk:
//! `models.yaml`, `placements/<model>.csv`, `workloads/<trace>.csv` and
//! `profiles/<model>/{config,data}.csv`.

use std::path::{Path, PathBuf};

use rubick_model::reference::{MeasuredRow, ModelFacts, ProfileRun, ReferenceModels, TraceJob};

use crate::files::{IoError, read_text};
use crate::table::{f64_column, number_column, read_table, required, str_column};

/// Environment variable that points at the reference directory.
pub const REFERENCE_ENV: &str = "RUBICK_REFERENCE";

/// What a command says when the reference data is not where it looks: what the data is,
/// where it comes from, and how to point the tools at it.
pub const WHERE_IT_IS: &str = "the reference data (the Rubick authors' measurements, AlibabaPAI/\
reconfigurable-dl-scheduler at 80e8524, Apache-2.0; public traces; others' tables; README: \"Reference data\") is \
read from ../shared/reference/ beside the clone: link it there (ln -s /path/to/shared ../shared), or set \
RUBICK_REFERENCE to its rubick-artifact directory (RUBICK_EXTERNAL to its external one), or pass --reference DIR";

/// The reference directory: `$RUBICK_REFERENCE`, else the first
/// `shared/reference/rubick-artifact` found in `start` or one of its ancestors (the
/// project keeps `shared/` beside its checkout).
pub fn locate(start: &Path) -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(REFERENCE_ENV) {
        let dir = PathBuf::from(dir);
        return dir.join("models.yaml").is_file().then_some(dir);
    }
    start.ancestors().map(|a| a.join("shared/reference/rubick-artifact")).find(|d| d.join("models.yaml").is_file())
}

/// The reference data set, opened from its directory.
#[derive(Debug, Clone)]
pub struct ReferenceData {
    pub dir: PathBuf,
    pub models: ReferenceModels,
}

impl ReferenceData {
    /// The data set in `dir`; a directory without `models.yaml` is an error saying what
    /// the data is and how to point the tools at it ([`WHERE_IT_IS`]).
    pub fn open(dir: &Path) -> Result<Self, IoError> {
        let path = dir.join("models.yaml");
        if !path.exists() {
            let what = if dir.is_dir() { "no models.yaml here" } else { "no such directory" };
            return Err(IoError::table(dir, format!("{what}: not the authors' reference data; {WHERE_IT_IS}")));
        }
        let text = read_text(&path)?;
        let models = ReferenceModels::parse(&text).map_err(|message| IoError::table(&path, message))?;
        Ok(ReferenceData { dir: dir.to_path_buf(), models })
    }

    /// Model names of `models.yaml`, sorted.
    pub fn model_names(&self) -> Vec<&str> {
        self.models.models.keys().map(String::as_str).collect()
    }

    pub fn facts(&self, model: &str) -> Option<&ModelFacts> {
        self.models.models.get(model)
    }

    /// A model of `models.yaml` as a [`ModelSpec`], its 3-D memory limits holding at the
    /// degrees of its measured rows; `None` when the model is not listed.
    pub fn model_spec(&self, model: &str) -> Result<Option<rubick_core::ModelSpec>, IoError> {
        let Some(facts) = self.facts(model) else { return Ok(None) };
        Ok(Some(facts.model_spec(model, &self.measured_rows(model)?)))
    }

    /// The measured rows of `placements/<model>.csv`.
    pub fn measured_rows(&self, model: &str) -> Result<Vec<MeasuredRow>, IoError> {
        read_measured_rows(&self.dir.join("placements").join(format!("{model}.csv")))
    }

    /// A trace of `workloads/` by name (`workload-base`) or any trace file in that format.
    pub fn trace(&self, name: &str) -> Result<Vec<TraceJob>, IoError> {
        read_trace(&self.dir.join("workloads").join(format!("{name}.csv")))
    }

    /// The profiling runs of a model (`profiles/<model>` or `profiles/<model>b`).
    pub fn profiles(&self, model: &str) -> Result<Vec<ProfileRun>, IoError> {
        let base = self.dir.join("profiles");
        let dir = [model.to_owned(), format!("{model}b")]
            .into_iter()
            .map(|d| base.join(d))
            .find(|d| d.is_dir())
            .ok_or_else(|| IoError::table(&base, format!("no profile directory for model `{model}`")))?;
        read_profiles(&dir.join("config.csv"), &dir.join("data.csv"))
    }
}

/// Reads a `placements/<model>.csv` table of measured iteration times.
pub fn read_measured_rows(path: &Path) -> Result<Vec<MeasuredRow>, IoError> {
    let df = read_table(path, None, &["exec_plan", "placement"])?;
    let codes = str_column(path, &df, "exec_plan")?;
    let placements = str_column(path, &df, "placement")?;
    let iter = f64_column(path, &df, "iter_time")?;
    let phase = |name| if df.column(name).is_ok() { f64_column(path, &df, name).map(Some) } else { Ok(None) };
    let (forward, sync, optimize) = (phase("forward")?, phase("overlap_sync")?, phase("optimize")?);
    let mut rows = Vec::with_capacity(df.height());
    for i in 0..df.height() {
        let line = i + 2;
        let code = codes[i].ok_or_else(|| IoError::table(path, format!("line {line}: exec_plan is empty")))?;
        let placement =
            placements[i].ok_or_else(|| IoError::table(path, format!("line {line}: placement is empty")))?;
        let iter_time = required(path, "iter_time", i, iter[i])?;
        let phases = match (&forward, &sync, &optimize) {
            (Some(f), Some(s), Some(o)) => match (f[i], s[i], o[i]) {
                (Some(f), Some(s), Some(o)) => Some([f, s, o]),
                _ => None,
            },
            _ => None,
        };
        let row = MeasuredRow::from_fields(code, placement, iter_time, phases)
            .map_err(|e| IoError::table(path, format!("line {line}: {e}")))?;
        rows.push(row);
    }
    Ok(rows)
}

/// The columns of a trace in the reference workload format.
const TRACE_COLUMNS: [&str; 10] = [
    "name",
    "submission_time",
    "duration",
    "application",
    "num_gpus",
    "num_cpus",
    "bandwidth",
    "exec_plan",
    "steps",
    "is_sla",
];

/// Reads a trace in the reference workload format. Every cell of a CSV is read as text
/// and its numbers parsed here, every row checked by [`TraceJob::check`] (what
/// `rubick-plan trace` checks the rows it writes with): an error names the file, the
/// line and the column.
pub fn read_trace(path: &Path) -> Result<Vec<TraceJob>, IoError> {
    let df = read_table(path, None, &TRACE_COLUMNS)?;
    let names = str_column(path, &df, "name")?;
    let apps = str_column(path, &df, "application")?;
    let plans = str_column(path, &df, "exec_plan")?;
    let num = |name| number_column(path, &df, name);
    let (submit, duration, gpus, cpus, bandwidth, steps, sla) = (
        num("submission_time")?,
        num("duration")?,
        num("num_gpus")?,
        num("num_cpus")?,
        num("bandwidth")?,
        num("steps")?,
        num("is_sla")?,
    );
    let mut jobs = Vec::with_capacity(df.height());
    let mut seen = std::collections::HashSet::with_capacity(df.height());
    for i in 0..df.height() {
        let line = i + 2;
        let text = |v: Option<&str>, col: &str| {
            v.map(str::to_owned).ok_or_else(|| IoError::table(path, format!("line {line}: {col} is empty")))
        };
        let count = |v: Option<f64>, col: &str| -> Result<u32, IoError> {
            let v = required(path, col, i, v)?;
            if v < 0.0 || v.fract() != 0.0 || v > f64::from(u32::MAX) {
                return Err(IoError::table(
                    path,
                    format!(
                        "line {line}: {col} must be a whole number from 0 to {}, got {}",
                        u32::MAX,
                        rubick_core::limits::shown(v)
                    ),
                ));
            }
            Ok(v as u32)
        };
        let exec_plan =
            text(plans[i], "exec_plan")?.parse().map_err(|e| IoError::table(path, format!("line {line}: {e}")))?;
        let job = TraceJob {
            name: text(names[i], "name")?,
            submission_time_s: required(path, "submission_time", i, submit[i])?,
            duration_s: duration[i].unwrap_or(0.0),
            application: text(apps[i], "application")?,
            num_gpus: count(gpus[i], "num_gpus")?,
            num_cpus: count(cpus[i], "num_cpus")?,
            bandwidth: bandwidth[i].unwrap_or(0.0),
            exec_plan,
            steps: u64::from(count(steps[i], "steps")?),
            is_sla: sla[i].unwrap_or(0.0) != 0.0,
        };
        job.check().map_err(|e| IoError::table(path, format!("line {line}: {} {}", e.field, e.message)))?;
        if !seen.insert(job.name.clone()) {
            return Err(IoError::table(path, format!("line {line}: name `{}` is used by an earlier job", job.name)));
        }
        jobs.push(job);
    }
    Ok(jobs)
}

/// Reads paired `config.csv` / `data.csv` profiling runs.
pub fn read_profiles(config: &Path, data: &Path) -> Result<Vec<ProfileRun>, IoError> {
    let cfg = read_table(config, None, &[])?;
    let dat = read_table(data, None, &["strategy"])?;
    if cfg.height() != dat.height() {
        return Err(IoError::table(
            data,
            format!("{} rows but {} has {}; the files pair row by row", dat.height(), config.display(), cfg.height()),
        ));
    }
    let c = |name| f64_column(config, &cfg, name);
    let d = |name| f64_column(data, &dat, name);
    let (nodes, gpus, params, batch, seq_hid, threads, zero, tp, pp) = (
        c("nodes")?,
        c("gpus")?,
        c("parameter_size")?,
        c("batch_size")?,
        c("seq_hid")?,
        c("num_cpu_threads")?,
        c("zero_type")?,
        c("is_tp")?,
        c("is_pp")?,
    );
    let (fwd, tcc, topt, iter) = (d("forward_time")?, d("Tcc")?, d("Topt")?, d("iter_time")?);
    let strategy = str_column(data, &dat, "strategy")?;
    let mut runs = Vec::with_capacity(cfg.height());
    for i in 0..cfg.height() {
        let cr = |col: &str, v: &[Option<f64>]| required(config, col, i, v[i]);
        let dr = |col: &str, v: &[Option<f64>]| required(data, col, i, v[i]);
        runs.push(ProfileRun {
            nodes: cr("nodes", &nodes)? as u32,
            gpus: cr("gpus", &gpus)? as u32,
            parameter_mib: cr("parameter_size", &params)?,
            micro_batch: cr("batch_size", &batch)? as u32,
            seq_hid: cr("seq_hid", &seq_hid)?,
            cpu_threads: cr("num_cpu_threads", &threads)? as u32,
            zero_type: cr("zero_type", &zero)? as u32,
            is_tp: cr("is_tp", &tp)? != 0.0,
            is_pp: cr("is_pp", &pp)? != 0.0,
            forward_ms: dr("forward_time", &fwd)?,
            backward_sync_ms: dr("Tcc", &tcc)?,
            optimizer_ms: dr("Topt", &topt)?,
            iter_ms: dr("iter_time", &iter)?,
            strategy: strategy[i].unwrap_or_default().to_owned(),
        });
    }
    Ok(runs)
}
