//! `status --plot`: what the cluster did, per job — its runs over time, each coloured
//! by its plan, the wait before its first start in grey, a black mark at every stop
//! (preemption or reconfiguration).

use plotters::prelude::*;
use rubick_io::plot::{Figure, PALETTE, drawing_error, legend};

/// One run of a job: its plan, and when it started and ended (Unix seconds).
#[derive(Debug, Clone, PartialEq)]
pub struct RunSpan {
    pub plan: String,
    pub gpus: u32,
    pub start_s: f64,
    pub end_s: f64,
    /// Ended by a stop (preemption, reconfiguration), not on its own.
    pub stopped: bool,
}

/// One job's row.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRow {
    pub name: String,
    pub submitted_s: f64,
    pub runs: Vec<RunSpan>,
}

/// The figure: one row per job in submission order.
#[derive(Debug)]
pub struct RunsFigure<'a> {
    pub jobs: &'a [JobRow],
    pub now_s: f64,
}

impl Figure for RunsFigure<'_> {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, plotters::coord::Shift>) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static,
    {
        let err = drawing_error::<DB::ErrorType>;
        root.fill(&WHITE).map_err(err)?;
        let t0 = self.jobs.iter().map(|j| j.submitted_s).fold(self.now_s, f64::min);
        let minutes = |t: f64| (t - t0) / 60.0;
        // Up to the last thing that happened: now while a job waits or runs.
        let busy =
            self.jobs.iter().any(|j| j.runs.is_empty() || j.runs.iter().any(|r| !r.stopped && r.end_s >= self.now_s));
        let last = self.jobs.iter().flat_map(|j| j.runs.iter().map(|r| r.end_s)).fold(t0, f64::max);
        let end = minutes(if busy { self.now_s } else { last }).max(1e-3);
        let n = self.jobs.len().max(1) as f64;
        let mut plans: Vec<&str> = self.jobs.iter().flat_map(|j| j.runs.iter().map(|r| r.plan.as_str())).collect();
        plans.sort_unstable();
        plans.dedup();
        let names: Vec<String> = self.jobs.iter().map(|j| j.name.clone()).collect();
        let mut chart = ChartBuilder::on(&root)
            .caption("Runs over time (grey: waiting; colour: the run's plan; black: stopped)", ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(40)
            .build_cartesian_2d(0.0..end * 1.02, 0.0..n)
            .map_err(err)?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .x_desc("minutes since the first submission")
            .y_desc("job (submission order)")
            .y_labels(0)
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        // Each row's job name at its left end.
        chart
            .draw_series(names.iter().enumerate().map(|(i, name)| {
                Text::new(name.clone(), (end * 0.005, i as f64 + 0.95), ("sans-serif", 13).into_font())
            }))
            .map_err(err)?;
        chart
            .draw_series(self.jobs.iter().enumerate().map(|(i, j)| {
                let until = j.runs.first().map_or(self.now_s, |r| r.start_s);
                let y = i as f64;
                Rectangle::new(
                    [(minutes(j.submitted_s), y + 0.4), (minutes(until), y + 0.5)],
                    RGBColor(170, 170, 170).filled(),
                )
            }))
            .map_err(err)?;
        for (p, plan) in plans.iter().enumerate() {
            let colour = PALETTE[p % PALETTE.len()];
            let bars = self.jobs.iter().enumerate().flat_map(|(i, j)| {
                j.runs.iter().filter(|r| r.plan == *plan).map(move |r| {
                    let y = i as f64;
                    Rectangle::new([(minutes(r.start_s), y + 0.1), (minutes(r.end_s), y + 0.75)], colour.filled())
                })
            });
            let gpus = self.jobs.iter().flat_map(|j| &j.runs).find(|r| r.plan == *plan).map_or(0, |r| r.gpus);
            chart
                .draw_series(bars)
                .map_err(err)?
                .label(format!("{plan} ({gpus} GPUs)"))
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
        }
        chart
            .draw_series(self.jobs.iter().enumerate().flat_map(|(i, j)| {
                j.runs.iter().filter(|r| r.stopped).map(move |r| {
                    let (x, y) = (minutes(r.end_s), i as f64);
                    Rectangle::new([(x - end * 0.002, y + 0.1), (x + end * 0.002, y + 0.9)], BLACK.filled())
                })
            }))
            .map_err(err)?;
        legend(&mut chart, SeriesLabelPosition::LowerRight)?;
        root.present().map_err(err)?;
        Ok(())
    }
}
