//! Plots of the evaluation: predicted vs measured iteration time, log-log.

use std::path::Path;

use plotters::prelude::*;
use rubick_io::plot::{Figure, PALETTE, drawing_error, legend, write_figure};

use crate::evaluate::EvaluatedRow;

struct Scatter<'a>(&'a [EvaluatedRow]);

impl Figure for Scatter<'_> {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, plotters::coord::Shift>) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static,
    {
        draw(root, self.0)
    }
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, plotters::coord::Shift>, rows: &[EvaluatedRow]) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let err = drawing_error::<DB::ErrorType>;
    root.fill(&WHITE).map_err(err)?;
    let lo = rows.iter().flat_map(|r| [r.measured_s, r.predicted_s]).fold(f64::INFINITY, f64::min).max(1e-4) * 0.8;
    let hi = rows.iter().flat_map(|r| [r.measured_s, r.predicted_s]).fold(0.0, f64::max).max(lo * 10.0) * 1.25;
    let mut chart = ChartBuilder::on(&root)
        .caption("rubick-fit: predicted vs measured iteration time", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((lo..hi).log_scale(), (lo..hi).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("measured iteration time (s)")
        .y_desc("predicted iteration time (s)")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    chart.draw_series(LineSeries::new([(lo, lo), (hi, hi)], BLACK.mix(0.5))).map_err(err)?;
    let mut families: Vec<&str> = rows.iter().map(|r| r.family.as_str()).collect();
    families.sort_unstable();
    families.dedup();
    for (i, family) in families.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let points = rows.iter().filter(|r| r.family == *family);
        chart
            .draw_series(points.map(|r| {
                let style = if r.fitted { colour.filled() } else { colour.mix(0.7).stroke_width(1) };
                Circle::new((r.measured_s, r.predicted_s), if r.fitted { 5 } else { 3 }, style)
            }))
            .map_err(err)?
            .label(family.to_string())
            .legend(move |(x, y)| Circle::new((x, y), 4, colour.filled()));
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Writes the plot as SVG or PNG (by extension), atomically.
pub fn predicted_vs_measured(path: &Path, rows: &[EvaluatedRow]) -> anyhow::Result<()> {
    write_figure(path, (900, 720), &Scatter(rows))
}
