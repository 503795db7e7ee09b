//! The figures of `simulate` and `compare`: JCT CDFs, GPUs in use, a Gantt chart.

use plotters::prelude::*;
use rubick_io::plot::{Figure, PALETTE, drawing_error, index_label, legend, log_ticks, tick_label};

/// The corners of an empirical CDF drawn as steps: flat from each job's completion time
/// to the next, rising at each (`values` in any order).
pub(super) fn cdf_steps(values: &[f64], floor: f64) -> Vec<(f64, f64)> {
    let mut sorted: Vec<f64> = values.iter().map(|v| v.max(floor)).collect();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len().max(1) as f64;
    let mut points = Vec::with_capacity(2 * sorted.len());
    for (k, v) in sorted.iter().enumerate() {
        points.push((*v, k as f64 / n));
        points.push((*v, (k + 1) as f64 / n));
    }
    points
}

pub(super) struct CdfFigure {
    pub series: Vec<(String, Vec<f64>)>,
}

impl Figure for CdfFigure {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, plotters::coord::Shift>) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static,
    {
        let err = drawing_error::<DB::ErrorType>;
        root.fill(&WHITE).map_err(err)?;
        let all = self.series.iter().flat_map(|(_, v)| v.iter().copied());
        let lo = all.clone().fold(f64::INFINITY, f64::min).max(1.0);
        let hi = all.fold(10.0, f64::max) * 1.2;
        let mut chart = ChartBuilder::on(&root)
            .caption("Job completion time (CDF)", ("sans-serif", 22))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(55)
            .build_cartesian_2d(
                (lo.min(hi / 10.0)..hi).log_scale().with_key_points(log_ticks(lo.min(hi / 10.0), hi)),
                0.0..1.0,
            )
            .map_err(err)?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .x_desc("JCT (s)")
            .y_desc("share of jobs")
            .x_label_formatter(&|x| tick_label(*x))
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        for (i, (label, values)) in self.series.iter().enumerate() {
            let colour = PALETTE[i % PALETTE.len()];
            let points = cdf_steps(values, lo);
            chart
                .draw_series(LineSeries::new(points, colour.stroke_width(2)))
                .map_err(err)?
                .label(label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2)));
        }
        legend(&mut chart, SeriesLabelPosition::LowerRight)?;
        root.present().map_err(err)?;
        Ok(())
    }
}

/// One bar per job: queueing (thin, grey) then running (by model), in submit order.
pub(super) struct GanttFigure<'a> {
    pub jobs: &'a [rubick_sim::JobResult],
}

impl Figure for GanttFigure<'_> {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, plotters::coord::Shift>) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static,
    {
        let err = drawing_error::<DB::ErrorType>;
        root.fill(&WHITE).map_err(err)?;
        let mut order: Vec<&rubick_sim::JobResult> = self.jobs.iter().collect();
        order.sort_by(|a, b| a.submit_s.total_cmp(&b.submit_s).then(a.name.cmp(&b.name)));
        let end = order.iter().filter_map(|j| j.finish_s).fold(1.0, f64::max) / 3600.0;
        let n = order.len().max(1) as f64;
        let mut models: Vec<&str> = order.iter().map(|j| j.model.as_str()).collect();
        models.sort_unstable();
        models.dedup();
        let mut chart = ChartBuilder::on(&root)
            .caption("Jobs over time (grey: queued; colour: holding GPUs, by model)", ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(55)
            .build_cartesian_2d(0.0..end * 1.02, 0.0..n)
            .map_err(err)?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .x_desc("time (h)")
            .x_label_formatter(&|x| tick_label(*x))
            .y_desc("job (submission order)")
            .y_label_formatter(&|y| index_label(*y))
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        chart
            .draw_series(order.iter().enumerate().map(|(i, j)| {
                let until = j.first_start_s.or(j.finish_s).unwrap_or(j.submit_s);
                let y = i as f64;
                Rectangle::new(
                    [(j.submit_s / 3600.0, y + 0.45), (until / 3600.0, y + 0.55)],
                    RGBColor(170, 170, 170).filled(),
                )
            }))
            .map_err(err)?;
        for (m, model) in models.iter().enumerate() {
            let colour = PALETTE[m % PALETTE.len()];
            let bars = order.iter().enumerate().filter(|(_, j)| j.model == *model).filter_map(|(i, j)| {
                let (start, finish) = (j.first_start_s?, j.finish_s?);
                let y = i as f64;
                Some(Rectangle::new([(start / 3600.0, y + 0.1), (finish / 3600.0, y + 0.9)], colour.filled()))
            });
            chart
                .draw_series(bars)
                .map_err(err)?
                .label(model.to_string())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
        }
        // Small traces: each row names its job and the GPUs it held on average.
        if order.len() <= 60 {
            chart
                .draw_series(order.iter().enumerate().map(|(i, j)| {
                    let held_h = match (j.first_start_s, j.finish_s) {
                        (Some(s), Some(f)) if f > s => (f - s) / 3600.0,
                        _ => 0.0,
                    };
                    let gpus =
                        if held_h > 0.0 { format!(" (~{:.0} GPUs)", j.gpu_hours / held_h) } else { String::new() };
                    let x = j.first_start_s.unwrap_or(j.submit_s) / 3600.0;
                    Text::new(format!("{}{gpus}", j.name), (x, i as f64 + 0.98), ("sans-serif", 11).into_font())
                }))
                .map_err(err)?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
        root.present().map_err(err)?;
        Ok(())
    }
}

pub(super) struct UsageFigure<'a> {
    pub usage: &'a [(f64, u32)],
    pub total: u32,
}

impl Figure for UsageFigure<'_> {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, plotters::coord::Shift>) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static,
    {
        let err = drawing_error::<DB::ErrorType>;
        root.fill(&WHITE).map_err(err)?;
        let end = self.usage.last().map_or(1.0, |u| u.0 / 3600.0).max(0.1);
        let mut chart = ChartBuilder::on(&root)
            .caption("GPUs in use", ("sans-serif", 22))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(55)
            .build_cartesian_2d(0.0..end, 0.0..f64::from(self.total) * 1.05)
            .map_err(err)?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .x_desc("time (h)")
            .y_desc("GPUs")
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        chart
            .draw_series(LineSeries::new(self.usage.iter().map(|&(t, g)| (t / 3600.0, f64::from(g))), PALETTE[0]))
            .map_err(err)?;
        root.present().map_err(err)?;
        Ok(())
    }
}

/// Jobs by their restarts (the last bar: that many or more), one bar group per run: a
/// histogram of the share of jobs.
pub(super) struct RestartsFigure {
    /// (label, jobs by restarts as `SimulationSummary::restart_counts`).
    pub series: Vec<(String, Vec<u64>)>,
}

impl Figure for RestartsFigure {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, plotters::coord::Shift>) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static,
    {
        let err = drawing_error::<DB::ErrorType>;
        root.fill(&WHITE).map_err(err)?;
        let buckets = self.series.iter().map(|(_, c)| c.len()).max().unwrap_or(1).max(1);
        let shares: Vec<Vec<f64>> = self
            .series
            .iter()
            .map(|(_, c)| {
                let n = c.iter().sum::<u64>().max(1) as f64;
                c.iter().map(|&k| k as f64 / n).collect()
            })
            .collect();
        let top = shares.iter().flatten().copied().fold(0.0, f64::max).max(0.01);
        let last = buckets - 1;
        let mut chart = ChartBuilder::on(&root)
            .caption("Restarts per job (share of jobs; the last bar: that many or more)", ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(55)
            .build_cartesian_2d(-0.5..(buckets as f64 - 0.5), 0.0..top * 1.1)
            .map_err(err)?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .x_desc("restarts")
            .y_desc("share of jobs")
            .x_labels(buckets)
            .x_label_formatter(&|x| {
                let k = x.round() as usize;
                if k == last { format!("{k}+") } else { format!("{k}") }
            })
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        let width = 0.8 / self.series.len().max(1) as f64;
        for (i, ((label, _), shares)) in self.series.iter().zip(&shares).enumerate() {
            let colour = PALETTE[i % PALETTE.len()];
            let left = -0.4 + width * i as f64;
            chart
                .draw_series(shares.iter().enumerate().map(|(k, &s)| {
                    let x = k as f64 + left;
                    Rectangle::new([(x, 0.0), (x + width, s)], colour.filled())
                }))
                .map_err(err)?
                .label(label.clone())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)?;
        root.present().map_err(err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svg(figure: &impl Figure) -> String {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("figure.svg");
        rubick_io::plot::write_figure(&path, (900, 600), figure).unwrap();
        std::fs::read_to_string(path).unwrap()
    }

    /// The labels of an SVG's text elements.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| Some(t.split_once('>')?.1.split_once("</text>")?.0.trim().to_owned()))
            .collect()
    }

    #[test]
    fn a_cdf_is_steps_with_ticks_below_a_thousand_seconds() {
        assert_eq!(cdf_steps(&[300.0, 100.0], 1.0), [(100.0, 0.0), (100.0, 0.5), (300.0, 0.5), (300.0, 1.0)]);
        let jct = vec![320.0, 450.0, 610.0, 900.0, 1500.0, 2100.0, 2900.0, 4000.0, 5200.0, 6600.0];
        let labels = texts(&svg(&CdfFigure { series: vec![("rubick".into(), jct)] }));
        assert!(labels.iter().any(|l| l == "500"), "a tick below 1,000 s: {labels:?}");
        assert!(labels.iter().any(|l| l == "2,000"), "{labels:?}");
    }

    #[test]
    fn the_gantt_labels_jobs_by_whole_numbers() {
        let jobs: Vec<rubick_sim::JobResult> = (0..120)
            .map(|i| rubick_sim::JobResult {
                name: format!("j{i}"),
                model: "bert".into(),
                submit_s: f64::from(i) * 60.0,
                first_start_s: Some(f64::from(i) * 60.0 + 30.0),
                finish_s: Some(f64::from(i) * 60.0 + 600.0),
                restarts: 0,
                pauses: 0,
                plan_changes: 0,
                gpu_hours: 1.0,
                restart_gpu_hours: 0.0,
                guaranteed: false,
                violation_s: 0.0,
                basis_s: [0.0; 3],
            })
            .collect();
        let labels = texts(&svg(&GanttFigure { jobs: &jobs }));
        assert!(labels.iter().any(|l| l == "100"), "{labels:?}");
        assert!(!labels.iter().any(|l| l.ends_with(".0")), "{labels:?}");
    }
}
