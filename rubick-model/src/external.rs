//! Other people's measurements as rubick jobs: the vTrain, Sailor and Calculon tables
//! of `shared/reference/external/` (measured iteration times of GPT-style training
//! across parallel plans), read as a job (a [`ModelSpec`] at one global batch), the
//! cluster it ran on, and one measured row per plan and placement.
//!
//! The reading follows the assumptions of that folder's README, not ours: vTrain rows
//! and Calculon's `full` rows were trained with full activation checkpointing (`-gc`),
//! Calculon's `seqsel` rows with sequence parallelism and selective recompute
//! (`-sp-sel`), each Calculon row with its pipeline interleaving (`-vpN`); Sailor's rows
//! are read without; accumulation is `global_batch / (dp * micro_batch)`; GPUs are
//! packed onto full nodes of `gpus_per_node`; parameter counts are Sailor's own, else a
//! GPT decoder's `12h² + 13h` per layer plus `(vocab + seq_len) h + 2h`. Rows rubick's
//! plans cannot express (Sailor's mixed-GPU `mit` cluster) are set aside with the
//! reason, never silently.
//!
//! Pure text in, values out: reading the files is the caller's (`rubick-io`).

use std::collections::BTreeMap;

use rubick_core::cluster::{Cluster, NodeGroup};
use rubick_core::model::{ModelSpec, StateBytes};
use rubick_core::placement::Placement;
use rubick_core::plan::{Plan, Recompute};

/// One measured row of an external table.
#[derive(Debug, Clone, PartialEq)]
pub struct ExternalRow {
    /// 1-based line of the CSV file (the header is line 1).
    pub line: usize,
    pub plan: Plan,
    pub placement: Placement,
    pub iter_time_s: f64,
}

/// A job of an external table: one model shape at one global batch on one cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct ExternalJob {
    /// The table's name (its file stem, e.g. `vtrain_single`).
    pub set: String,
    /// `model` or `model@global_batch` when the table holds several batches of a model.
    pub name: String,
    pub model: ModelSpec,
    pub cluster: Cluster,
    pub rows: Vec<ExternalRow>,
}

/// A row that could not be read as a rubick plan, with why.
#[derive(Debug, Clone, PartialEq)]
pub struct SetAside {
    pub line: usize,
    pub reason: String,
}

/// A whole table read.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ExternalSet {
    pub jobs: Vec<ExternalJob>,
    pub set_aside: Vec<SetAside>,
}

/// An error reading a table: the line (1-based) and what was wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ExternalError {
    pub line: usize,
    pub message: String,
}

fn err(line: usize, message: impl Into<String>) -> ExternalError {
    ExternalError { line, message: message.into() }
}

/// Splits CSV text into records (RFC 4180: quoted fields, doubled quotes, commas and
/// newlines inside quotes). Each record comes with its first line number.
pub fn csv_records(text: &str) -> Result<Vec<(usize, Vec<String>)>, ExternalError> {
    let mut records = Vec::new();
    let mut field = String::new();
    let mut record = Vec::new();
    let mut quoted = false;
    let mut line = 1;
    let mut start = 1;
    let mut chars = text.chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        any = true;
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => {
                if c == '\n' {
                    line += 1;
                }
                field.push(c);
            }
            (false, '"') if field.is_empty() => quoted = true,
            (false, ',') => record.push(std::mem::take(&mut field)),
            (false, '\r') => {}
            (false, '\n') => {
                record.push(std::mem::take(&mut field));
                records.push((start, std::mem::take(&mut record)));
                line += 1;
                start = line;
                any = false;
            }
            (false, c) => field.push(c),
        }
    }
    if quoted {
        return Err(err(start, "a quoted field is not closed"));
    }
    if any {
        record.push(field);
        records.push((start, record));
    }
    records.retain(|(_, r)| !(r.len() == 1 && r[0].trim().is_empty()));
    Ok(records)
}

/// A CSV table with named columns.
struct Table {
    header: Vec<String>,
    rows: Vec<(usize, Vec<String>)>,
}

impl Table {
    fn parse(text: &str) -> Result<Table, ExternalError> {
        let mut records = csv_records(text)?.into_iter();
        let (_, header) = records.next().ok_or_else(|| err(1, "the table is empty"))?;
        let header: Vec<String> = header.into_iter().map(|h| h.trim().to_owned()).collect();
        let rows: Vec<(usize, Vec<String>)> = records.collect();
        for (line, r) in &rows {
            if r.len() != header.len() {
                return Err(err(*line, format!("{} fields, the header has {}", r.len(), header.len())));
            }
        }
        Ok(Table { header, rows })
    }

    fn has(&self, column: &str) -> bool {
        self.header.iter().any(|h| h == column)
    }

    fn get<'a>(&self, row: &'a [String], line: usize, column: &str) -> Result<&'a str, ExternalError> {
        let i = self.header.iter().position(|h| h == column).ok_or_else(|| err(1, format!("no column `{column}`")))?;
        let v = row[i].trim();
        if v.is_empty() { Err(err(line, format!("`{column}` is empty"))) } else { Ok(v) }
    }

    fn num<T: std::str::FromStr>(&self, row: &[String], line: usize, column: &str) -> Result<T, ExternalError> {
        let v = self.get(row, line, column)?;
        v.parse().map_err(|_| err(line, format!("`{column}`: expected a number, got `{v}`")))
    }

    fn int(&self, row: &[String], line: usize, column: &str) -> Result<u32, ExternalError> {
        let v: u32 = self.num(row, line, column)?;
        if v == 0 {
            return Err(err(line, format!("`{column}` must be positive")));
        }
        Ok(v)
    }

    fn flag(&self, row: &[String], line: usize, column: &str) -> Result<bool, ExternalError> {
        match self.get(row, line, column)?.to_ascii_lowercase().as_str() {
            "true" | "1" => Ok(true),
            "false" | "0" => Ok(false),
            other => Err(err(line, format!("`{column}`: expected True or False, got `{other}`"))),
        }
    }
}

/// Which source a table comes from, by its columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    VTrain,
    Sailor,
    Calculon,
}

/// The hardware of a source, as the external README states it (GB/s one direction).
struct Hardware {
    gpu_memory_gib: f64,
    nvlink_gbps: f64,
    network_gbps: f64,
}

fn hardware(source: Source) -> Hardware {
    match source {
        // vTrain: A100 nodes of 8, NVLink 300 GB/s, 800 Gb/s between nodes; 80 GB assumed.
        Source::VTrain => Hardware { gpu_memory_gib: 80.0, nvlink_gbps: 300.0, network_gbps: 100.0 },
        // Clariden: GH200 (96 GB), NVLink4 150 GB/s per pair, 4 x 200 Gb/s per node.
        Source::Sailor => Hardware { gpu_memory_gib: 96.0, nvlink_gbps: 150.0, network_gbps: 100.0 },
        // Selene: DGX A100 80 GB, NVLink 300 GB/s, 8 x 200 Gb/s HDR per node.
        Source::Calculon => Hardware { gpu_memory_gib: 80.0, nvlink_gbps: 300.0, network_gbps: 200.0 },
    }
}

/// A GPT decoder's parameters: `12h² + 13h` per layer, embeddings and the final norm.
pub fn gpt_parameters(layers: u32, hidden: u32, vocab: u32, seq_len: u32) -> u64 {
    let h = u64::from(hidden);
    u64::from(layers) * (12 * h * h + 13 * h) + (u64::from(vocab) + u64::from(seq_len)) * h + 2 * h
}

/// Reads one external table. `set` names it (the file stem); the source is recognised
/// by its columns.
pub fn parse(set: &str, text: &str) -> Result<ExternalSet, ExternalError> {
    let table = Table::parse(text)?;
    for column in ["model", "gpus", "tp", "dp", "pp", "micro_batch", "global_batch", "hidden", "heads", "layers"] {
        if !table.has(column) {
            return Err(err(1, format!("no column `{column}`: not an external measurement table")));
        }
    }
    let source = if table.has("cluster") && table.has("layers_per_stage") {
        Source::Sailor
    } else if table.has("mode") && table.has("activation_recompute") {
        Source::Calculon
    } else {
        Source::VTrain
    };
    let hw = hardware(source);
    // Jobs keyed by (model, global batch), in order of first appearance.
    let mut jobs: Vec<ExternalJob> = Vec::new();
    let mut index: BTreeMap<(String, u64), usize> = BTreeMap::new();
    let mut set_aside = Vec::new();
    for (line, row) in &table.rows {
        let line = *line;
        let t = &table;
        if source == Source::Sailor {
            let cluster = t.get(row, line, "cluster")?;
            if cluster != "clariden" || t.flag(row, line, "heterogeneous")? {
                set_aside.push(SetAside {
                    line,
                    reason: format!("cluster `{cluster}` mixes GPU types in one plan; a rubick job runs on one type"),
                });
                continue;
            }
        }
        let model_name = t.get(row, line, "model")?.to_owned();
        let (gpus, tp, dp, pp) =
            (t.int(row, line, "gpus")?, t.int(row, line, "tp")?, t.int(row, line, "dp")?, t.int(row, line, "pp")?);
        let micro_batch = t.int(row, line, "micro_batch")?;
        let global_batch: u64 = t.num(row, line, "global_batch")?;
        if u64::from(tp) * u64::from(dp) * u64::from(pp) != u64::from(gpus) {
            return Err(err(line, format!("tp {tp} x dp {dp} x pp {pp} is not gpus {gpus}")));
        }
        let per_step = u64::from(dp) * u64::from(micro_batch);
        if global_batch == 0 || !global_batch.is_multiple_of(per_step) {
            return Err(err(line, format!("global_batch {global_batch} is not a multiple of dp x micro_batch")));
        }
        let ga = u32::try_from(global_batch / per_step).map_err(|_| err(line, "accumulation out of range"))?;
        let iter_time_s: f64 = t.num(row, line, "iter_time_s")?;
        if !(iter_time_s.is_finite() && iter_time_s > 0.0) {
            return Err(err(line, format!("iter_time_s must be a positive number of seconds, got {iter_time_s}")));
        }
        // vTrain's rows recompute every layer; Sailor's say nothing; Calculon's say
        // which (full or the attention core), with sequence parallelism and the
        // pipeline's interleaving.
        let (recompute, sp, vp) = match source {
            Source::VTrain => (Recompute::Full, false, 1),
            Source::Sailor => (Recompute::None, false, 1),
            Source::Calculon => {
                let recompute = match t.get(row, line, "activation_recompute")? {
                    "full" => Recompute::Full,
                    "attn_only" => Recompute::Selective,
                    "none" => Recompute::None,
                    other => {
                        return Err(err(
                            line,
                            format!("activation_recompute `{other}`: expected full, attn_only or none"),
                        ));
                    }
                };
                (recompute, t.flag(row, line, "sequence_parallel")?, t.int(row, line, "pipeline_interleaving")?)
            }
        };
        let plan = Plan { tp, pp, ga, recompute, sp, vp, ..Plan::data_parallel(dp, micro_batch) };
        plan.check_shape().map_err(|v| err(line, format!("not a valid plan: {v}")))?;
        let per_node = t.int(row, line, "gpus_per_node")?;
        let placement = Placement::packed(gpus, per_node).ok_or_else(|| err(line, "no placement"))?;
        let (hidden, heads, layers) =
            (t.int(row, line, "hidden")?, t.int(row, line, "heads")?, t.int(row, line, "layers")?);
        let seq_len = t.int(row, line, "seq_len")?;
        let (vocab, parameters) = match source {
            Source::Sailor => (t.int(row, line, "vocab")?, t.num::<u64>(row, line, "parameters")?),
            Source::VTrain => (50_257, gpt_parameters(layers, hidden, 50_257, seq_len)),
            Source::Calculon => (51_200, gpt_parameters(layers, hidden, 51_200, seq_len)),
        };
        let key = (model_name.clone(), global_batch);
        let job = match index.get(&key) {
            Some(&i) => &mut jobs[i],
            None => {
                let gpu_type = t.get(row, line, "gpu_type").unwrap_or("gpu").to_owned();
                let model = ModelSpec {
                    api_version: None,
                    kind: None,
                    name: model_name.clone(),
                    parameters: Some(parameters),
                    layers,
                    hidden,
                    heads,
                    seq_len,
                    vocab: Some(vocab),
                    global_batch,
                    state_bytes: StateBytes::default(),
                    activation_factor: 34.0,
                    flash_attention: true,
                    forward_1gpu_ms: None,
                    measured_limits: None,
                };
                let cluster = Cluster {
                    api_version: Some(rubick_core::ApiVersion::CURRENT),
                    kind: Some(rubick_core::Kind::Cluster),
                    name: format!("{set}-{}", gpu_type.to_ascii_lowercase()),
                    node_groups: vec![NodeGroup {
                        name: gpu_type.to_ascii_lowercase(),
                        count: 64,
                        gpu_type,
                        gpus_per_node: per_node,
                        gpu_memory_gib: hw.gpu_memory_gib,
                        cpu_cores: 16 * per_node,
                        host_memory_gib: 1024.0,
                        nvlink_gbps: hw.nvlink_gbps,
                        inter_node_gbps: hw.network_gbps,
                        pcie_gbps: 25.0,
                        compute_speed: 1.0,
                        hosts: Vec::new(),
                    }],
                };
                index.insert(key, jobs.len());
                jobs.push(ExternalJob {
                    set: set.to_owned(),
                    name: model_name.clone(),
                    model,
                    cluster,
                    rows: Vec::new(),
                });
                jobs.last_mut().ok_or_else(|| err(line, "internal: no job"))?
            }
        };
        if job.model.layers != layers || job.model.hidden != hidden || job.model.seq_len != seq_len {
            return Err(err(line, format!("model `{model_name}` has another shape than on its first row")));
        }
        let nodes_needed = placement.nodes();
        if let Some(group) = job.cluster.node_groups.first_mut() {
            group.count = group.count.max(nodes_needed);
        }
        job.rows.push(ExternalRow { line, plan, placement, iter_time_s });
    }
    // Name jobs by their global batch where a model has several.
    let mut per_model: BTreeMap<String, usize> = BTreeMap::new();
    for job in &jobs {
        *per_model.entry(job.name.clone()).or_default() += 1;
    }
    for job in &mut jobs {
        if per_model.get(&job.name).copied().unwrap_or(0) > 1 {
            job.name = format!("{}@{}", job.name, job.model.global_batch);
        }
    }
    Ok(ExternalSet { jobs, set_aside })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_commas_and_lines() {
        let r = csv_records("a,b,c\n1,\"x, \"\"y\"\"\",3\r\n\n4,\"two\nlines\",6").unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(r[1], (2, vec!["1".into(), "x, \"y\"".into(), "3".into()]));
        assert_eq!(r[2].0, 4);
        assert_eq!(r[2].1[1], "two\nlines");
        assert!(csv_records("a,\"b\n").is_err());
    }

    #[test]
    fn vtrain_rows_become_jobs_by_model_and_batch() {
        let text = "model,gpus,global_batch,micro_batch,hidden,heads,layers,seq_len,tp,dp,pp,iter_time_s,gpu_type,gpus_per_node\n\
                    gpt-a,4,16,4,1024,16,12,1024,1,2,2,0.4,A100,8\n\
                    gpt-a,8,16,2,1024,16,12,1024,2,2,2,0.3,A100,8\n\
                    gpt-a,8,32,2,1024,16,12,1024,2,2,2,0.5,A100,8\n";
        let set = parse("vtrain_single", text).unwrap();
        assert_eq!(set.jobs.len(), 2);
        assert_eq!(set.jobs[0].name, "gpt-a@16");
        assert_eq!(set.jobs[0].rows.len(), 2);
        let row = &set.jobs[0].rows[0];
        assert_eq!(row.plan.to_string(), "dp2-tp1-pp2-mb4-ga2-gc");
        assert_eq!(row.line, 2);
        assert_eq!(set.jobs[1].rows[0].plan.ga, 8);
        let bad = text.replace("0.3,A100", "-1,A100");
        assert_eq!(parse("x", &bad).unwrap_err().line, 3);
        let bad = text.replace("1,2,2,0.4", "1,3,2,0.4");
        assert!(parse("x", &bad).unwrap_err().message.contains("is not gpus"));
    }
}
