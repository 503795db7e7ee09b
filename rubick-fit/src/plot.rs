//! Plots of the evaluation: predicted vs measured iteration time, log-log.

use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::evaluate::EvaluatedRow;

/// DejaVu Sans, bundled so that plots need no system fonts (licence beside it).
static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
static REGISTER: Once = Once::new();

fn register_font() {
    REGISTER.call_once(|| {
        if plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_err() {
            tracing::warn!("the bundled font could not be loaded; plot text may be missing");
        }
    });
}

const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, plotters::coord::Shift>, rows: &[EvaluatedRow]) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("drawing the plot: {e}");
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
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Writes the plot as SVG or PNG (by extension), atomically.
pub fn predicted_vs_measured(path: &Path, rows: &[EvaluatedRow]) -> anyhow::Result<()> {
    register_font();
    let size = (900, 720);
    match path.extension().and_then(|e| e.to_str()) {
        Some("svg") => {
            let mut svg = String::new();
            draw(SVGBackend::with_string(&mut svg, size).into_drawing_area(), rows)?;
            rubick_io::write_atomic(path, svg.as_bytes())?;
        }
        Some("png") => {
            let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            let tmp = tempfile::Builder::new().prefix(".plot.").suffix(".png").tempfile_in(dir)?;
            draw(BitMapBackend::new(tmp.path(), size).into_drawing_area(), rows)?;
            tmp.persist(path).map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.error))?;
        }
        _ => anyhow::bail!("{}: expected a .png or .svg plot file", path.display()),
    }
    Ok(())
}
