//! `rubick-plan curves`: every job's resource sensitivity curve, as a table and a plot.

use std::fmt::Write as _;
use std::path::PathBuf;

use plotters::prelude::*;
use rubick_core::Cluster;
use rubick_io::cli::Outcome;
use rubick_io::files::write_output;
use rubick_io::plot::{Figure, PALETTE, drawing_error, legend, write_figure};
use rubick_model::belief::Belief;
use rubick_planner::curves::{CurvePoint, Evaluator};

use crate::round::job_inputs;
use crate::schedule::PlannerArgs;
use rubick_io::beliefs::{ModelSource, job_params};

#[derive(Debug, clap::Args)]
pub struct CurvesArgs {
    /// A JobBatch or a Job (YAML), `-` for stdin
    pub jobs: PathBuf,
    /// The Cluster (YAML)
    #[arg(long)]
    pub cluster: PathBuf,
    /// Table of every point (CSV), `-` for stdout
    #[arg(short, long, default_value = "-")]
    pub output: PathBuf,
    /// Plot of the curves (.png or .svg): one line per job, throughput normalised to
    /// the job's request
    #[arg(long)]
    pub plot: Option<PathBuf>,
    #[command(flatten)]
    pub planner: PlannerArgs,
}

/// One job's curve for the plot: best normalised throughput per GPU count.
struct Line {
    name: String,
    points: Vec<(f64, f64)>,
}

struct CurvesFigure {
    cluster: String,
    lines: Vec<Line>,
}

/// GPU counts worth a label: the powers of two.
fn key_points(max: f64) -> Vec<f64> {
    let mut points = Vec::new();
    let mut x = 1.0;
    while x <= max {
        points.push(x);
        x *= 2.0;
    }
    points
}

impl Figure for CurvesFigure {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, plotters::coord::Shift>) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static,
    {
        let err = drawing_error::<DB::ErrorType>;
        root.fill(&WHITE).map_err(err)?;
        let all = self.lines.iter().flat_map(|l| l.points.iter());
        let x_max = all.clone().map(|p| p.0).fold(2.0, f64::max) * 1.1;
        let y_max = all.map(|p| p.1).fold(1.0, f64::max) * 1.1;
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("Resource sensitivity curves on {}", self.cluster), ("sans-serif", 22))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d((0.9..x_max).log_scale().with_key_points(key_points(x_max)), 0.0..y_max)
            .map_err(err)?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .x_desc("GPUs (best plan, cores and bandwidth class at each count)")
            .y_desc("throughput / throughput of the request")
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        chart.draw_series(LineSeries::new([(0.9, 1.0), (x_max, 1.0)], BLACK.mix(0.3))).map_err(err)?;
        for (i, line) in self.lines.iter().enumerate() {
            let colour = PALETTE[i % PALETTE.len()];
            chart
                .draw_series(LineSeries::new(line.points.iter().copied(), colour.stroke_width(2)))
                .map_err(err)?
                .label(line.name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2)));
            chart.draw_series(line.points.iter().map(|&p| Circle::new(p, 3, colour.filled()))).map_err(err)?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
        root.present().map_err(err)?;
        Ok(())
    }
}

pub fn run(args: &CurvesArgs) -> anyhow::Result<Outcome> {
    rubick_io::cli::ensure_one_stdin(&[args.jobs.as_path(), args.cluster.as_path()])?;
    for out in std::iter::once(&args.output).chain(args.plot.as_ref()) {
        rubick_io::cli::ensure_not_an_input(out, &[args.jobs.as_path(), args.cluster.as_path()])?;
    }
    let cluster: Cluster = crate::load_cluster(&args.cluster)?;
    let jobs = crate::load_jobs(&args.jobs)?;
    let config = args.planner.config(&jobs);
    let reference = args.planner.reference()?;
    let source = ModelSource { jobs_path: Some(&args.jobs), reference: reference.as_ref() };
    let params = job_params(&jobs, &cluster, &source)?;
    let jobs = jobs.into_iter().zip(params.into_iter().map(Belief::from)).collect();
    let inputs = job_inputs(&args.jobs, jobs, &cluster, &config, None)?;
    let mut evaluator = Evaluator::new(&cluster, &config);
    evaluator.cross_splits = true;
    let mut csv = String::from("job,node_group,gpus,cpus,bandwidth,plan,throughput,normalized,pareto\n");
    let mut lines = Vec::new();
    for input in &inputs {
        let mut points: Vec<CurvePoint> = Vec::new();
        let curves = evaluator.job_curves(input, Some(&mut points));
        let req = curves.request_throughput;
        for p in &points {
            let _ = writeln!(
                csv,
                "{},{},{},{},{},{},{:.6},{:.4},{}",
                input.job.name,
                cluster.node_groups[p.group].name,
                p.gpus,
                p.cpus,
                p.class.as_str(),
                p.plan,
                p.throughput,
                p.throughput / req,
                p.pareto
            );
        }
        let mut best: Vec<(f64, f64)> = Vec::new();
        for p in points.iter().filter(|p| p.pareto) {
            let y = p.throughput / req;
            match best.iter_mut().find(|b| b.0 == f64::from(p.gpus)) {
                Some(b) => b.1 = b.1.max(y),
                None => best.push((f64::from(p.gpus), y)),
            }
        }
        best.sort_by(|a, b| a.0.total_cmp(&b.0));
        if points.is_empty() {
            tracing::warn!("{}: no feasible plan on this cluster", input.job.name);
        }
        lines.push(Line { name: input.job.name.clone(), points: best });
    }
    write_output(&args.output, rubick_io::Format::Csv, csv.as_bytes())?;
    if let Some(plot) = &args.plot {
        write_figure(plot, (1000, 720), &CurvesFigure { cluster: cluster.name.clone(), lines })?;
        tracing::info!("wrote {}", plot.display());
    }
    Ok(Outcome::Done)
}
